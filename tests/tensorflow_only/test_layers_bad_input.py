"""The bad-input catalogue (issue 7): one test per row of README.md's
"Bad input" table. Each asserts what the user gets: the exception type and
a message naming the problem, or a defined result checked against the
NumPy oracle. Refusals come with a positive control in the same test or
its neighbour (the same call with a valid input gives the oracle's
numbers), so a test cannot pass by everything failing.

tests/tensorflow_only/test_layers_errors.py holds the constructor and call-argument messages;
this file covers what it does not: sizes known only at run time (graphs),
dtypes that are accepted and cast, lengths, empty batches and sequences,
Keras's own RNN arguments, and tampered `.keras` files.
"""

import copy
import json
import re
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
import reference as ref
from birnn_cases import B, F, T, U, make_case
from helpers import MASK_4x6 as MASK, assert_all_close, cell_params, in_graph, to_numpy
from keras_birnn.masking import lengths_to_mask, reverse_within_lengths

RNG = np.random.default_rng(70)
X = RNG.normal(size=(B, T, F)).astype(np.float32)


def _graph(layer, signature, **call_kwargs):
    """`layer` called inside a tf.function with the given input signature."""
    return tf.function(lambda *args: layer(*args, **call_kwargs), input_signature=signature)


# --- wrong rank, feature size --------------------------------------------------------


@pytest.mark.slow(reason="~3 s")
def test_unknown_rank_is_refused_by_keras_before_the_layer_runs():
    case = make_case("gru_reset_after", "concat")
    unknown_rank = _graph(case.layer, [tf.TensorSpec(None, tf.float32)])
    with pytest.raises(ValueError, match=r"as_list\(\) is not defined on an unknown TensorShape"):
        unknown_rank(case.x)
    # Positive control: rank 3 with unknown batch and time sizes.
    known_rank = _graph(case.layer, [tf.TensorSpec([None, None, F], tf.float32)])
    assert_all_close(known_rank(case.x), case.oracle())


@pytest.mark.parametrize("shape", [(None, 5), (None, None, 3, 2)])
def test_wrong_rank_of_a_functional_input(shape):
    with pytest.raises(ValueError, match=r"expects inputs of rank 3 \[batch, time, features\]") as info:
        kb.Bidirectional(kb.GRUCell(U))(keras.Input(shape[1:]))
    assert str(shape) in str(info.value)


def test_zero_feature_size():
    for make in (lambda: kb.Bidirectional(kb.GRUCell(U)), lambda: kb.Recurrent(kb.LSTMCell(U))):
        with pytest.raises(ValueError, match=r"needs a known, positive feature size") as info:
            make()(np.zeros((B, T, 0), np.float32))
        assert "(4, 6, 0)" in str(info.value)
        with pytest.raises(ValueError, match=r"needs a known, positive feature size"):
            make()(keras.Input((None, 0)))
    case = make_case("lstm", "sum")  # built for F features
    with pytest.raises(ValueError, match=rf"expected axis -1 of input shape to have value {F}"):
        case.layer(np.zeros((B, T, 0), np.float32))
    assert_all_close(case.layer(case.x), case.oracle())


def test_feature_size_mismatch_in_a_graph_is_caught_when_tracing():
    case = make_case("simple_tanh", "ave")
    wrong = _graph(case.layer, [tf.TensorSpec([None, None, F + 1], tf.float32)])
    with pytest.raises(ValueError, match=rf"expected axis -1 of input shape to have value {F}"):
        wrong(np.zeros((B, T, F + 1), np.float32))
    assert_all_close(in_graph(case.layer, case.x), case.oracle())


def test_directions_built_for_different_feature_sizes():
    backward_cell = kb.GRUCell(U)
    backward_cell.build((None, None, F + 2))
    bi = kb.Bidirectional(kb.GRUCell(U), backward_layer=kb.Recurrent(backward_cell, reverse=True))
    with pytest.raises(ValueError, match=rf"was built for {F + 2} features, received input shape \(4, 6, {F}\)"):
        bi(X)
    # Positive control: the same construction with a backward cell built for
    # F features is accepted, and its backward half is that direction alone.
    matching_cell = kb.GRUCell(U)
    matching_cell.build((None, None, F))
    backward = kb.Recurrent(matching_cell, reverse=True, return_sequences=True)
    bi = kb.Bidirectional(kb.GRUCell(U), backward_layer=backward, merge_mode=None, return_sequences=True)
    _, backward_half = bi(X)
    assert_all_close(backward_half, backward(X))
    assert np.abs(np.asarray(backward_half)).max() > 1e-3


# --- dtypes ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_other_float_inputs_run_in_the_layers_compute_dtype(dtype):
    """Any float dtype is accepted and cast to the layer's compute dtype
    (float32 here): the numbers are the oracle's on the cast inputs."""
    case = make_case("gru_reset_before", "projection_softmax", return_state=True)
    x = tf.cast(tf.constant(case.x), dtype)
    y = case.layer(x, mask=MASK)
    assert all(t.dtype == tf.float32 for t in y)
    assert_all_close(to_numpy(y), case.oracle(MASK, x=tf.cast(x, tf.float32).numpy()))


@pytest.mark.parametrize("dtype", [tf.string, tf.complex64])
def test_non_numeric_and_complex_inputs(dtype):
    x = tf.zeros((B, T, F), tf.complex64) if dtype == tf.complex64 else tf.fill((B, T, F), "a")
    for layer in (kb.Bidirectional(kb.GRUCell(U)), kb.Recurrent(kb.GRUCell(U))):
        with pytest.raises(TypeError, match=rf"expects float inputs, received dtype {dtype.name}"):
            layer(x)


def test_integer_functional_input_fails_at_the_first_call():
    """A functional model over an integer `keras.Input` builds (Keras infers
    shapes without calling the layer) and refuses at the first call."""
    inputs = keras.Input((None, F), dtype="int32")
    model = keras.Model(inputs, kb.Bidirectional(kb.GRUCell(U))(inputs))
    with pytest.raises(TypeError, match=r"expects float inputs, received dtype int32.*Embedding"):
        model(np.zeros((B, T, F), np.int32))


# --- masks -------------------------------------------------------------------------------


@pytest.mark.slow(reason="traces each layer for unknown sizes, ~3 s")
@pytest.mark.parametrize("mask_shape", [(1, T), (B, 1), (B, T - 1), (B + 1, T)],
                         ids=["one_row", "one_step", "short", "extra_row"])
@pytest.mark.parametrize("kind", ["Bidirectional", "Recurrent"])
def test_mask_shape_is_checked_when_sizes_are_only_known_at_run_time(kind, mask_shape):
    """In a graph with unknown batch and time sizes the mask's shape can only
    be checked when it runs. (A [1, T] or [B, 1] mask used to broadcast
    silently over the batch or the time axis.)"""
    if kind == "Bidirectional":
        case = make_case("lstm", "concat")
        layer, expected = case.layer, case.oracle(MASK)
    else:
        layer = kb.Recurrent(kb.GRUCell(U), return_sequences=True)
        layer.build((None, None, F))
        params = cell_params(layer.cell)
        expected = ref.run_direction("gru", params, X, MASK)[0]
        case = None
    x = X if case is None else case.x
    run = _graph(layer, [tf.TensorSpec([None, None, F]), tf.TensorSpec([None, None], tf.bool)])
    wrong = np.ones(mask_shape, bool)
    wrong[0, 0] = False
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`mask` must have shape \[batch, time\] of the inputs") as info:
        run(x, wrong)
    assert f"[{mask_shape[0]} {mask_shape[1]}]" in str(info.value)  # the mask's shape
    assert f"[{B} {T}]" in str(info.value)  # the inputs'
    assert_all_close(run(x, MASK), expected)


def test_mask_dtypes():
    """A string mask is refused; any integer mask means "non-zero is valid"."""
    case = make_case("gru_reset_after", "mul")
    with pytest.raises(TypeError, match=r"`mask` must be bool \(or 0/1 integers\), received dtype string"):
        case.layer(case.x, mask=tf.fill((B, T), "1"))
    codes = np.where(MASK, RNG.choice([1, 2, -1, 7], size=MASK.shape), 0)
    for dtype in (np.int8, np.int64, np.uint8):
        assert_all_close(case.layer(case.x, mask=np.abs(codes).astype(dtype)), case.oracle(MASK))
    assert_all_close(case.layer(case.x, mask=codes.astype(np.int32)), case.oracle(MASK))


# --- lengths -----------------------------------------------------------------------------

LENGTHS = np.array([-3, 0, 2, T + 4])


def _clipped(lengths, steps):
    return np.clip(lengths, 0, steps)


def test_lengths_helpers_clip_to_the_time_axis():
    """masking.lengths_to_mask and reverse_within_lengths clip lengths to
    [0, T] (negative: an empty row, too large: the whole row), like the
    serving signature; reverse_within_lengths used to raise TF's
    "seq_lens(0) < 0"."""
    n = _clipped(LENGTHS, T)
    np.testing.assert_array_equal(lengths_to_mask(LENGTHS, T), np.arange(T)[None, :] < n[:, None])
    expected = X.copy()
    for b, k in enumerate(n):
        expected[b, :k] = X[b, :k][::-1]
    np.testing.assert_array_equal(reverse_within_lengths(X, LENGTHS), expected)
    np.testing.assert_array_equal(reverse_within_lengths(X, n), expected)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A float-input tagger and an Embedding(mask_zero) tagger, exported;
    their serving_default signatures and the Keras models."""
    keras.utils.set_random_seed(71)
    out = {}
    for kind in ("float", "tokens"):
        if kind == "float":
            inputs = keras.Input((None, F))
            x = inputs
        else:
            inputs = keras.Input((None,), dtype="int32")
            x = keras.layers.Embedding(10, F, mask_zero=True)(inputs)
        y = kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=3,
                             return_sequences=True)(x)
        model = keras.Model(inputs, y)
        path = kb.export_saved_model(model, str(tmp_path_factory.mktemp("served") / kind), version=1)
        out[kind] = (model, tf.saved_model.load(path).signatures["serving_default"])
    return out


@pytest.mark.slow(reason="the served fixture exports a model, ~11 s")
@pytest.mark.parametrize("kind", ["float", "tokens"])
def test_serving_lengths_are_clipped_to_the_time_axis(served, kind):
    """lengths -3 and T+4 serve as 0 and T: per-position outputs equal the
    Keras model on each row's first min(max(n, 0), T) steps, zeros after."""
    model, serve = served[kind]
    x = X if kind == "float" else RNG.integers(1, 10, size=(B, T)).astype(np.int32)
    got = serve(inputs=tf.constant(x), lengths=tf.constant(LENGTHS, tf.int32))["outputs"].numpy()
    clipped = serve(inputs=tf.constant(x), lengths=tf.constant(_clipped(LENGTHS, T), tf.int32))["outputs"]
    np.testing.assert_array_equal(got, clipped.numpy())
    for b, n in enumerate(_clipped(LENGTHS, T)):
        if n:
            np.testing.assert_allclose(got[b, :n], model(x[b:b + 1, :n])[0], atol=1e-5, rtol=1e-5)
        assert np.all(got[b, n:] == 0.0)


@pytest.mark.slow(reason="the served fixture exports a model, ~8 s")
@pytest.mark.parametrize("size", [1, B + 1])
@pytest.mark.parametrize("kind", ["float", "tokens"])
def test_serving_lengths_must_have_one_entry_per_row(served, kind, size):
    """A `lengths` of another size than the batch is refused. (Size 1 used to
    broadcast silently: every row got the first row's length.)"""
    _, serve = served[kind]
    x = X if kind == "float" else RNG.integers(1, 10, size=(B, T)).astype(np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`lengths` must have one entry per row"):
        serve(inputs=tf.constant(x), lengths=tf.constant([3] * size, tf.int32))


# --- empty batch, zero-length sequences --------------------------------------------------

EMPTY_CASES = [
    ("gru_reset_after", "projection_softmax", True),
    ("lstm", "none", False),
    ("simple_tanh", "concat", False),
    ("gru_reset_before", "ave", True),
]


def _modes(layer, x, mask=None, initial_state=None):
    """The layer's outputs eagerly, in a graph with unknown batch and time
    sizes, and in a training call; as NumPy."""
    kwargs = {} if initial_state is None else {"initial_state": initial_state}
    yield "eager", to_numpy(layer(x, mask=mask, **kwargs))
    yield "training", to_numpy(layer(x, mask=mask, training=True, **kwargs))
    if initial_state is None:
        yield "graph", to_numpy(in_graph(layer, x, mask=mask))


@pytest.mark.slow(reason="eager, graph and gradients on an empty batch, ~6 s")
@pytest.mark.parametrize("cell_name, merge_name, return_sequences", EMPTY_CASES[:2])
def test_empty_batch(cell_name, merge_name, return_sequences):
    """B = 0: outputs and states with a batch of 0 (the oracle's), and zero
    gradients for the weights, with and without a mask."""
    case = make_case(cell_name, merge_name, return_sequences=return_sequences, return_state=True)
    case.x = case.x[:0]
    for mask in (None, MASK[:0]):
        expected = case.oracle(mask)
        for mode, y in _modes(case.layer, case.x, mask):
            assert [a.shape for a in keras.tree.flatten(y)] == [e.shape for e in keras.tree.flatten(expected)]
            assert_all_close(y, expected)
    d_output = keras.tree.map_structure(lambda v: v[:0], case.random_d_output())
    for training in (True, None):
        grads = case.tf_grads(d_output, MASK[:0], training=training)
        case.assert_grads_match(grads, case.oracle_grads(d_output, MASK[:0]))
        assert grads["x"].shape == (0, T, F)


@pytest.mark.parametrize("cell_name, merge_name, return_sequences", EMPTY_CASES)
@pytest.mark.parametrize("initial_state", ["zeros", 0.5])
def test_zero_length_sequences(cell_name, merge_name, return_sequences, initial_state):
    """T = 0: per-position outputs of width 0, sentence outputs zeros (a row
    without valid steps), final states the boundary states; eagerly, in a
    graph with unknown sizes and in training."""
    case = make_case(cell_name, merge_name, return_sequences=return_sequences, return_state=True,
                     initial_state=initial_state)
    case.x = case.x[:, :0]
    boundary = [np.full((B, U), 0.0 if initial_state == "zeros" else initial_state)] * case.n_states
    expected = case.oracle(np.zeros((B, 0), bool), fw_initial=boundary, bw_initial=boundary)
    for mode, y in _modes(case.layer, case.x):
        flat, flat_expected = keras.tree.flatten(y), keras.tree.flatten(expected)
        assert [a.shape for a in flat] == [e.shape for e in flat_expected], mode
        assert_all_close(y, expected)
        for state in flat[len(flat) - 2 * case.n_states:]:
            np.testing.assert_array_equal(state, boundary[0])
        if not return_sequences:
            assert all(np.all(out == 0.0) for out in flat[: len(flat) - 2 * case.n_states])


def test_zero_length_sequences_pass_call_time_and_learned_states_through():
    """T = 0 with a call-time initial state returns it unchanged; with a
    learned boundary state its gradient is the final states' cotangent, and
    the weights get none (the loop never runs)."""
    case = make_case("lstm", "concat", return_state=True)
    given = [RNG.normal(size=(B, U)).astype(np.float32) for _ in range(4)]
    x = case.x[:, :0]
    for mode, y in _modes(case.layer, x, initial_state=given):
        assert_all_close(y[1:], given)
        assert y[0].shape == (B, 0, 2 * U)

    bi = kb.Bidirectional(kb.GRUCell(U), initial_state="learned", return_state=True)
    bi.build((None, None, F))
    states = [bi.forward_layer.boundary.states[0], bi.backward_layer.boundary.states[0]]
    for s in states:
        s.assign(RNG.normal(size=(U,)).astype(np.float32))
    d_f, d_b = RNG.normal(size=(B, U)).astype(np.float32), RNG.normal(size=(B, U)).astype(np.float32)
    for training in (True, None):
        with tf.GradientTape() as tape:
            sentence, h_f, h_b = bi(x, training=training)
            loss = tf.reduce_sum(h_f * d_f) + tf.reduce_sum(h_b * d_b) + tf.reduce_sum(sentence)
        np.testing.assert_array_equal(sentence, np.zeros((B, 2 * U)))
        np.testing.assert_array_equal(h_f, np.broadcast_to(states[0].numpy(), (B, U)))
        grads = tape.gradient(loss, [v.value for v in bi.trainable_variables],  # tf.Variables: ZERO needs
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)  # a tf dtype
        by_name = {v.path: g.numpy() for v, g in zip(bi.trainable_variables, grads)}
        for v, expected in zip(states, (d_f.sum(0), d_b.sum(0))):
            np.testing.assert_allclose(by_name.pop(v.path), expected, atol=1e-6)
        assert all(np.all(g == 0.0) for g in by_name.values())


# --- initial states -----------------------------------------------------------------------


@pytest.mark.slow(reason="traces several graphs, ~3.5 s")
def test_initial_state_batch_must_be_the_inputs():
    """A state whose batch is not the inputs' used to fail inside the XLA
    loop ("Incompatible shapes" / "loop body do not match")."""
    case = make_case("lstm", "none", return_state=True)
    states = [RNG.normal(size=(B, U)).astype(np.float32) for _ in range(4)]
    for batch in (1, B + 1):
        wrong = [s[:1].repeat(batch, 0) for s in states]
        with pytest.raises(ValueError, match=rf"shape \[batch, {U}\] with the inputs' batch size {B}, "
                                             rf"received shape \({batch}, {U}\)"):
            case.layer(case.x, initial_state=wrong)
        run = tf.function(lambda x, s: case.layer(x, initial_state=s),
                          input_signature=[tf.TensorSpec([None, None, F]), [tf.TensorSpec([None, U])] * 4])
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"Each initial state must have shape \[batch, {U}\] with the batch size "
                                 r"of the inputs"):
            run(case.x, wrong)
    expected = case.oracle(MASK, fw_initial=states[:2], bw_initial=states[2:])
    assert_all_close(case.layer(case.x, mask=MASK, initial_state=states), expected)
    assert_all_close(run(case.x, states), case.oracle(None, fw_initial=states[:2], bw_initial=states[2:]))
    # Integer states are cast to the compute dtype.
    ints = [np.round(s * 3).astype(np.int32) for s in states]
    floats = [s.astype(np.float64) for s in ints]
    assert_all_close(case.layer(case.x, mask=MASK, initial_state=ints),
                     case.oracle(MASK, fw_initial=floats[:2], bw_initial=floats[2:]))


@pytest.mark.parametrize("shape", [(U,), (B, 1, U)])
def test_initial_state_of_wrong_rank(shape):
    case = make_case("gru_reset_after", "sum", return_state=True)
    with pytest.raises(ValueError, match=rf"initial state must have shape \[batch, {U}\], received shape "
                                         rf"{re.escape(str(shape))}"):
        case.layer(case.x, initial_state=[np.zeros(shape, np.float32)] * 2)


# --- stateful, streaming, Keras's RNN arguments --------------------------------------------


def test_stateful_in_a_config_is_refused():
    """A config (hand-written or loaded) asking for a stateful bidirectional
    layer is refused like the constructor argument (inside Keras's
    deserialization TypeError); without it, the same config rebuilds the
    layer."""
    case = make_case("gru_reset_after", "concat")
    config = case.layer.get_config()
    clone = kb.Bidirectional.from_config(copy.deepcopy(config))
    clone.build((None, None, F))
    clone.set_weights(case.layer.get_weights())
    assert_all_close(clone(case.x, mask=MASK), case.oracle(MASK))
    with pytest.raises(TypeError, match=r"(?s)Error when deserializing class 'Bidirectional'.*"
                                        r"Exception encountered: A bidirectional layer cannot be stateful"):
        kb.Bidirectional.from_config(dict(copy.deepcopy(config), stateful=True))


@pytest.mark.parametrize("argument", ["stateful", "go_backwards"])
def test_keras_rnn_arguments_on_a_recurrent(argument):
    """kb.Recurrent takes neither `stateful` nor `go_backwards`; the message
    says what to use instead (Keras's own was "Unrecognized keyword
    arguments"). `stateful=False` / `go_backwards=False` are accepted."""
    expected = {"stateful": r"keeps no state between calls.*layer\.step\(x_t, states\)",
                "go_backwards": r"has no `go_backwards`: use reverse=True"}[argument]
    with pytest.raises(ValueError, match=expected):
        kb.Recurrent(kb.GRUCell(U), **{argument: True})
    layer = kb.Recurrent(kb.SimpleRNNCell(U), return_sequences=True, **{argument: False})
    layer.build((None, None, F))
    params = cell_params(layer.cell)
    np.testing.assert_allclose(layer(X, mask=MASK), ref.run_direction("simple", params, X, MASK)[0],
                               atol=1e-5, rtol=1e-5)


def test_keras_bidirectional_cannot_wrap_a_recurrent():
    with pytest.raises(ValueError, match=r"keras\.layers\.Bidirectional cannot wrap a kb\.Recurrent.*"
                                         r"use kb\.Bidirectional"):
        keras.layers.Bidirectional(kb.Recurrent(kb.GRUCell(U), return_sequences=True))


@pytest.mark.parametrize("argument", ["go_backwards", "unroll", "time_major"])
def test_other_keras_rnn_arguments_on_a_bidirectional(argument):
    with pytest.raises(ValueError, match=rf"Unrecognized keyword arguments passed to Bidirectional: "
                                         rf"\{{'{argument}': True\}}"):
        kb.Bidirectional(kb.GRUCell(U), **{argument: True})


# --- tampered .keras files -----------------------------------------------------------------


def _saved_model_files(tmp_path):
    """A small tagger saved to `.keras`: its files, its config, and the
    expected outputs on X."""
    keras.utils.set_random_seed(72)
    inputs = keras.Input((None, F))
    outputs = kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=3,
                               return_sequences=True)(inputs)
    model = keras.Model(inputs, outputs)
    path = str(tmp_path / "clean.keras")
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    return files, json.loads(files["config.json"]), model.predict(X, verbose=0)


def _write(files, config, path):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, json.dumps(config) if name == "config.json" else data)
    return str(path)


def _bidirectional_config(config):
    layer = next(item for item in config["config"]["layers"] if item["class_name"] == "Bidirectional")
    return layer["config"]


def _writes_file(path):
    """A Python lambda that creates `path` when called (the payload; the
    path is a constant of its code, which is what gets marshalled)."""
    return eval(f"lambda x: (open({str(path)!r}, 'w').close(), x)[1]")  # noqa: S307


@pytest.mark.slow(reason="saves and loads a model, ~3 s")
def test_untampered_file_loads_in_safe_mode(tmp_path):
    files, config, expected = _saved_model_files(tmp_path)
    loaded = keras.saving.load_model(_write(files, config, tmp_path / "same.keras"), safe_mode=True)
    np.testing.assert_array_equal(loaded.predict(X, verbose=0), expected)


def test_lambda_layer_is_refused_in_safe_mode_and_never_runs(tmp_path):
    """A Lambda layer (marshalled Python code) spliced in front of the
    recurrence: safe_mode refuses it and the payload never runs. Control:
    with safe_mode=False the same file runs it."""
    sentinel = tmp_path / "lambda_layer_ran"
    inputs = keras.Input((None, F))
    payload = keras.layers.Lambda(_writes_file(str(sentinel)), output_shape=lambda s: s, name="payload")
    outputs = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(payload(inputs))
    path = str(tmp_path / "lambda.keras")
    keras.Model(inputs, outputs).save(path)
    sentinel.unlink(missing_ok=True)  # building the model called it once

    with pytest.raises(ValueError, match=r"deserialization of a `Lambda` layer.*arbitrary code execution"):
        keras.saving.load_model(path, safe_mode=True)
    assert not sentinel.exists()
    keras.saving.load_model(path, safe_mode=False).predict(X, verbose=0)
    assert sentinel.exists(), "control: the payload is live"


@pytest.mark.filterwarnings("ignore:The object being serialized includes a `lambda`")
def test_lambda_activation_in_a_cell_is_refused_in_safe_mode(tmp_path):
    """The GRU cell's `activation` replaced by a marshalled lambda (the cell
    deserializes it through Keras): refused in safe_mode, never run."""
    files, config, _ = _saved_model_files(tmp_path)
    sentinel = tmp_path / "activation_ran"
    cell = _bidirectional_config(config)["layer"]["config"]["cell"]["config"]
    # (Serialized from its source here, so the path is a default argument.)
    payload = lambda x, target=str(sentinel): (open(target, "w").close(), x)[1]  # noqa: E731
    cell["activation"] = keras.saving.serialize_keras_object(payload)
    path = _write(files, config, tmp_path / "lambda_activation.keras")
    with pytest.raises(TypeError, match=r"deserialization of a Python lambda.*arbitrary code execution"):
        keras.saving.load_model(path, safe_mode=True)
    assert not sentinel.exists()
    keras.saving.load_model(path, safe_mode=False).predict(X, verbose=0)
    assert sentinel.exists(), "control: the payload is live"


TAMPERED = {
    # where -> (new value, the message the user gets at the end of Keras's TypeError)
    "layer_is_os_system": (
        ("layer",), {"module": "os", "class_name": "system", "config": {"command": "touch {sentinel}"},
                     "registered_name": None},
        r"Could not locate class 'system'",
    ),
    "activation_is_os_system": (
        ("layer", "config", "cell", "config", "activation"),
        {"module": "os", "class_name": "function", "config": "system", "registered_name": None},
        r"Could not locate function 'system'",
    ),
    "activation_is_builtin_eval": (
        ("layer", "config", "cell", "config", "recurrent_activation"),
        {"module": "builtins", "class_name": "function", "config": "eval", "registered_name": None},
        r"Could not locate function 'eval'",
    ),
    "layer_is_a_keras_dense": (
        ("layer",), {"module": "keras.layers", "class_name": "Dense", "config": {"units": 3},
                     "registered_name": None},
        r"`layer` must be a keras_birnn cell \(e\.g\. kb\.GRUCell\(64\)\) or a kb\.Recurrent",
    ),
    "cell_is_a_keras_gru_cell": (
        ("backward_layer", "config", "cell"),
        {"module": "keras.layers", "class_name": "GRUCell", "config": {"units": U}, "registered_name": None},
        r"`cell` must be a keras_birnn cell",
    ),
    "unknown_merge_mode": (("merge_mode",), "max", r"`merge_mode` must be one of .* received 'max'"),
    "stateful": (("stateful",), True, r"A bidirectional layer cannot be stateful"),
    "negative_units": (("layer", "config", "cell", "config", "units"), -3,
                       r"`units` must be a positive integer, received -3"),
    "dropout_out_of_range": (("layer", "config", "cell", "config", "dropout"), 1.5,
                             r"`dropout` must be in \[0, 1\), received 1\.5"),
    "unknown_initial_state": (("initial_state",), "random", r"`initial_state` must be \"zeros\", \"learned\""),
}


@pytest.mark.parametrize("name", list(TAMPERED))
def test_tampered_config_is_refused_with_the_reason(tmp_path, name):
    """Edited config.json values: Keras refuses modules outside Keras and
    unregistered names, our layers refuse invalid values; the user gets
    Keras's TypeError ("could not be deserialized properly") ending in the
    reason, and nothing runs."""
    files, config, _ = _saved_model_files(tmp_path)
    sentinel = tmp_path / "ran"
    where, value, message = TAMPERED[name]
    value = json.loads(json.dumps(value).replace("{sentinel}", str(sentinel)))
    target = _bidirectional_config(config)
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    path = _write(files, config, tmp_path / f"{name}.keras")
    for safe_mode in (True, False):
        with pytest.raises(TypeError, match=r"could not be deserialized properly") as info:
            keras.saving.load_model(path, safe_mode=safe_mode)
        assert re.search(message, str(info.value).splitlines()[-1]), str(info.value)[-400:]
    assert not sentinel.exists()


def test_ragged_along_features_is_refused():
    nested = tf.RaggedTensor.from_nested_row_lengths(tf.zeros([6]), [[2, 1], [1, 2, 3]])
    layer = kb.Bidirectional(kb.GRUCell(4))
    layer.build((None, None, 3))
    with pytest.raises(ValueError, match="ragged along time only.*ragged_rank 2"):
        layer(nested)
