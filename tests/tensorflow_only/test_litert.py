"""`kb.export_tflite`: LiteRT flatbuffers of builtin ops only, run in
ai_edge_litert's Interpreter at two time sizes, equal to the Keras model at
every valid position of right-padded batches."""

import numpy as np
import pytest
import tensorflow as tf
import keras

import keras_birnn as kb
from keras_birnn.export.litert import _flatbuffer_op_list, flatbuffer_ops
from export_cases import CELLS, F, U, assert_outputs_match, boundary_states, heads_and_stacks, merge_modes, randomize

litert = pytest.importorskip("ai_edge_litert.interpreter")

# Keras notes that the outer model keeps no mask when the reference calls
# pass `mask=`; irrelevant here.
pytestmark = pytest.mark.filterwarnings("ignore:Layer 'functional.*was passed an input with a mask:UserWarning")

B = 3
TIMES = (5, 8)


def _lengths(T):
    # A full row, a short one and (for the sequence-level encoders) an empty one.
    return np.array([T, 2, 0], np.int32)


def _convert(model, tmp_path, name, **kwargs):
    path = kb.export_tflite(model, str(tmp_path / f"{name}.tflite"), batch_size=B, **kwargs)
    ops = flatbuffer_ops(path)
    assert "WHILE" in ops and not any("FLEX" in op.upper() or "CUSTOM" in op.upper() for op in ops), ops
    return litert.Interpreter(model_path=path)


def _run(interpreter, x, lengths=None):
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    assert set(index) == ({"inputs", "lengths"} if lengths is not None else {"inputs"})
    interpreter.resize_tensor_input(index["inputs"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(index["inputs"], x)
    if lengths is not None:
        interpreter.set_tensor(index["lengths"], lengths)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def _check(model, interpreter, make_inputs, with_lengths=True, reference=None):
    """Outputs equal Keras's at every valid position, at two time sizes."""
    rng = np.random.default_rng(1)
    for T in TIMES:
        x = make_inputs(rng, T)
        if with_lengths:
            lengths = _lengths(T)
            mask = np.arange(T)[None] < lengths[:, None]
            expected = reference(x, mask) if reference else model(x, mask=tf.constant(mask))
            got = _run(interpreter, x, lengths)
        else:
            mask = np.ones((B, T), bool)
            expected = model(x)
            got = _run(interpreter, x)
        assert_outputs_match(got, expected, mask, f"T={T}")


def _floats(rng, T):
    return rng.normal(size=(B, T, F)).astype(np.float32)


@pytest.mark.slow(reason="one LiteRT conversion per cell and merge mode, ~12 s each")
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_cells_and_merge_modes(cell, tmp_path):
    inp = keras.Input((None, F))
    model = randomize(keras.Model(inp, merge_modes(inp, cell)))
    _check(model, _convert(model, tmp_path, cell), _floats)


@pytest.mark.slow(reason="LiteRT conversions, ~11 s")
def test_boundary_states_and_sentence_outputs(tmp_path):
    """Sequence-level outputs run with the row compaction off for LiteRT,
    an empty row among them."""
    inp = keras.Input((None, F))
    model = randomize(keras.Model(inp, boundary_states(inp)))
    _check(model, _convert(model, tmp_path, "states"), _floats)


@pytest.mark.slow(reason="LiteRT conversions of every head and a stack, ~14 s")
def test_pooling_heads_and_stack(tmp_path):
    inp = keras.Input((None, F))
    model = randomize(keras.Model(inp, heads_and_stacks(inp)))
    _check(model, _convert(model, tmp_path, "heads"), _floats)


def _ids_model():
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, F, mask_zero=True)(ids)
    tags = kb.Bidirectional(kb.GRUCell(U), return_sequences=True, merge_mode="projection", projection_units=2)(x)
    sentence = kb.Bidirectional(kb.LSTMCell(U))(x)
    return randomize(keras.Model(ids, [tags, sentence]))


def _ids(rng, T):
    return rng.integers(1, 10, size=(B, T)).astype(np.int32)


def test_integer_ids_with_lengths(tmp_path):
    model = _ids_model()
    interpreter = _convert(model, tmp_path, "ids")
    assert interpreter.get_input_details()[0]["dtype"] == np.int32 or any(
        d["name"] == "inputs" and d["dtype"] == np.int32 for d in interpreter.get_input_details()
    )

    def reference(x, mask):  # Keras on the batch padded with the Embedding's 0
        return model(np.where(mask, x, 0))

    _check(model, interpreter, _ids, reference=reference)


@pytest.mark.slow(reason="LiteRT conversion, ~3.5 s; test_integer_ids_with_lengths stays fast")
def test_integer_ids_padded_with_zeros_without_lengths(tmp_path):
    model = _ids_model()
    interpreter = _convert(model, tmp_path, "ids_only", lengths=False)
    rng = np.random.default_rng(2)
    for T in TIMES:
        x = _ids(rng, T)
        mask = np.arange(T)[None] < _lengths(T)[:, None]
        x = np.where(mask, x, 0).astype(np.int32)
        got = _run(interpreter, x)
        tags, sentence = (np.asarray(e) for e in model(x))
        np.testing.assert_allclose(got[0][mask], tags[mask], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got[1], sentence, atol=1e-5, rtol=1e-5)


@pytest.mark.slow(reason="LiteRT conversion, ~2 s")
def test_without_lengths_every_step_is_valid(tmp_path):
    inp = keras.Input((None, F))
    model = randomize(keras.Model(inp, kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(inp)))
    _check(model, _convert(model, tmp_path, "plain", lengths=False), _floats, with_lengths=False)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(batch_size=0), ValueError, "`batch_size` must be a positive int, received 0"),
        (dict(batch_size=2.0), TypeError, "`batch_size` must be a positive int.*received 2.0"),
        (dict(batch_size=None), TypeError, "`batch_size`.*received None"),
        (dict(batch_size=True), TypeError, "`batch_size`.*received True"),
        (dict(path="model.tfl"), ValueError, "`path` must end in '.tflite', received 'model.tfl'"),
        (dict(path=3), TypeError, "`path` must be a str.*received 3"),
        (dict(lengths="yes"), TypeError, "`lengths` must be True or False, received 'yes'"),
    ],
)
def test_bad_arguments(kwargs, error, match, tmp_path):
    inp = keras.Input((None, F))
    model = keras.Model(inp, kb.Bidirectional(kb.GRUCell(U))(inp))
    arguments = dict(path=str(tmp_path / "m.tflite"), batch_size=1)
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        kb.export_tflite(model, **arguments)


def test_lengths_need_a_sequence_input(tmp_path):
    inp = keras.Input((None, F, 2))
    model = keras.Model(inp, keras.layers.Dense(1)(inp))
    with pytest.raises(ValueError, match="lengths=False"):
        kb.export_tflite(model, str(tmp_path / "m.tflite"))


def test_non_builtin_ops_raise_naming_them(tmp_path, monkeypatch):
    """With the row compaction of sequence-level encoders left on (as it is
    outside export_tflite), the graph needs DynamicPartition: not a builtin."""
    import contextlib

    from keras_birnn.export import litert

    monkeypatch.setattr(litert, "rows_kept", contextlib.nullcontext)
    inp = keras.Input((None, F))
    model = keras.Model(inp, kb.Bidirectional(kb.GRUCell(U), name="sentence_gru")(inp))
    with pytest.raises(
        ValueError, match="not convert to LiteRT builtin ops: .*op DynamicPartition in layer 'sentence_gru'"
    ):
        kb.export_tflite(model, str(tmp_path / "m.tflite"), batch_size=B)
    assert not (tmp_path / "m.tflite").exists()


class _Igamma(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x):
        return tf.math.igamma(tf.abs(x) + 1.0, tf.abs(x) + 1.0)


@pytest.mark.slow(reason="LiteRT conversion, ~2 s")
def test_a_user_layer_with_a_non_builtin_op_is_named(tmp_path):
    """No silent fallback to Flex: the error names the op and its layer."""
    inp = keras.Input((None, F))
    x = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(inp)
    model = keras.Model(inp, _Igamma(name="odd_activation")(x), name="tagger")
    with pytest.raises(ValueError, match="model 'tagger' does not convert.*Igamma.*in layer 'odd_activation'"):
        kb.export_tflite(model, str(tmp_path / "m.tflite"), batch_size=B)


# --- several inputs: word ids and character ids, padding marked by id 0 -------------------------

WORDS, CHARS = 12, 9


def _words_and_chars_model():
    words = keras.Input((None,), dtype="int32", name="words")
    chars = keras.Input((None, None), dtype="int32", name="chars")
    embedded = keras.layers.Embedding(WORDS, F, mask_zero=True)(words)
    letters = keras.layers.Embedding(CHARS, F, mask_zero=True)(chars)
    spelled = kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(U)))(letters)
    x = keras.layers.Concatenate()([embedded, spelled])
    tags = kb.Bidirectional(kb.LSTMCell(U), return_sequences=True, merge_mode="projection", projection_units=3)(x)
    return randomize(keras.Model([words, chars], tags))


def _words_and_chars(rng, valid):
    """Ids where `valid` [B, T] marks the words, 0 elsewhere; words of 1 to
    4 characters in a width of 5."""
    words = np.where(valid, rng.integers(1, WORDS, valid.shape), 0).astype(np.int32)
    spelled = np.arange(5)[None, None] < rng.integers(1, 5, valid.shape)[..., None]
    chars = np.where(valid[..., None] & spelled, rng.integers(1, CHARS, valid.shape + (5,)), 0)
    return words, chars.astype(np.int32)


@pytest.mark.slow(reason="LiteRT conversion, ~5 s")
def test_several_inputs_right_left_padding_and_holes(tmp_path):
    model = _words_and_chars_model()
    path = kb.export_tflite(model, str(tmp_path / "tagger.tflite"), batch_size=B, lengths=False)
    interpreter = litert.Interpreter(model_path=path)
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    assert set(index) == {"words", "chars"}
    rng = np.random.default_rng(3)
    for T in TIMES:
        steps = np.arange(T)[None]
        right = steps < np.array([[T], [2], [0]])
        left = steps >= np.array([[0], [T - 3], [T]])
        holes = right & (steps % 3 != 1)
        for label, valid in [("right", right), ("left", left), ("holes", holes)]:
            words, chars = _words_and_chars(rng, valid)
            for name, x in [("words", words), ("chars", chars)]:
                interpreter.resize_tensor_input(index[name], x.shape)
            interpreter.allocate_tensors()
            interpreter.set_tensor(index["words"], words)
            interpreter.set_tensor(index["chars"], chars)
            interpreter.invoke()
            got = [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]
            assert_outputs_match(got, model((words, chars)), valid, f"{label} T={T}")


def test_several_inputs_refuse_lengths(tmp_path):
    with pytest.raises(ValueError, match=r"`lengths` applies to models with one input.*\['words', 'chars'\]"):
        kb.export_tflite(_words_and_chars_model(), str(tmp_path / "m.tflite"), batch_size=B)


def test_an_empty_time_axis_fails_loudly(tmp_path):
    """Traced without the zero-length branch (which would hide the weights
    from the converter): time 0 with `lengths` stops the interpreter, it
    does not give numbers."""
    inp = keras.Input((None, F))
    model = randomize(keras.Model(inp, kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(inp)))
    interpreter = _convert(model, tmp_path, "empty")
    with pytest.raises(RuntimeError, match="gather index out of bounds"):
        _run(interpreter, np.zeros((B, 0, F), np.float32), np.zeros(B, np.int32))


def test_both_directions_share_one_loop(tmp_path):
    """The interpreter runs one op at a time: a loop per direction (as an
    exported SavedModel has, which TensorFlow runs at the same time) would
    only pay LiteRT's per-step overhead twice, so the file holds one WHILE
    for both directions, and serves the model's numbers."""
    inp = keras.Input((None, F))
    model = randomize(keras.Model(inp, kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(inp)))
    path = kb.export_tflite(model, str(tmp_path / "one_loop.tflite"), batch_size=B)
    ops = _flatbuffer_op_list(path)
    assert ops.count("WHILE") == 1, ops
    _check(model, litert.Interpreter(model_path=path), _floats)


def test_the_loop_multiplies_with_fully_connected(tmp_path):
    """The weights reach the loop body as constants: LiteRT's optimised
    FULLY_CONNECTED, not a BATCH_MATMUL per step."""
    inp = keras.Input((None, F))
    model = randomize(keras.Model(inp, kb.Bidirectional(kb.LSTMCell(U), return_sequences=True)(inp)))
    ops = flatbuffer_ops(kb.export_tflite(model, str(tmp_path / "fc.tflite"), batch_size=B))
    assert "FULLY_CONNECTED" in ops and "BATCH_MATMUL" not in ops, ops
