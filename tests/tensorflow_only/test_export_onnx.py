"""ONNX conversion of an exported SavedModel (tf2onnx, onnxruntime): both
directions' outputs match Keras, right-padded batches included.

tf2onnx turns a TensorArray written inside a `While` into an ONNX `Loop`
scan output in iteration order, ignoring the index written at; the forward
loop writes its outputs at the iteration so that the converted graph is
right (`recurrence.tensorflow.timeloop.in_time_order`). Skipped where tf2onnx or onnxruntime is
not installed.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from export_cases import CELLS, F, U, assert_outputs_match, boundary_states, heads_and_stacks, merge_modes, randomize
from keras_birnn.export.saved_model import LENGTHS_KEY, SIGNATURE_DEFAULT, SIGNATURE_UNPADDED

tf2onnx = pytest.importorskip("tf2onnx")
ort = pytest.importorskip("onnxruntime")
from tf2onnx import tf_loader  # noqa: E402

# Keras notes that the outer model keeps no mask when the reference calls
# pass `mask=`; irrelevant here.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Layer 'functional.*was passed an input with a mask:UserWarning"),
    pytest.mark.slow(reason="every test converts with tf2onnx and runs onnxruntime, 12-130 s each"),
]


def _convert(path, signature):
    graph_def, inputs, outputs, rename = tf_loader.from_saved_model(
        path, None, None, signatures=[signature], return_tensors_to_rename=True
    )
    proto, _ = tf2onnx.convert.from_graph_def(
        graph_def, input_names=inputs, output_names=outputs, opset=17, tensors_to_rename=rename
    )
    return proto


def _session(path, signature):
    return ort.InferenceSession(_convert(path, signature).SerializeToString())


def _loops(graph) -> int:
    """`Loop` nodes in an ONNX graph and its subgraphs (`If` branches, loop bodies)."""
    count = 0
    for node in graph.node:
        count += node.op_type == "Loop"
        for attribute in node.attribute:
            count += sum(_loops(g) for g in [attribute.g] if attribute.HasField("g")) + sum(map(_loops, attribute.graphs))
    return count


@pytest.mark.parametrize("head", ["tagger", "sentence"])
def test_plain_from_keras_is_exact(head):
    """The route tf2onnx documents first, `tf2onnx.convert.from_keras` with
    no context of ours, on a model whose layers ran in this process before
    (their inference loops traced and cached): the converter's trace is
    planned as an export's (`recurrence.tensorflow.plan`), and onnxruntime serves
    Keras's numbers, right-padded rows of several lengths, batch 1 and an
    unseen length included."""
    inputs = keras.Input((None, F))
    masked = keras.layers.Masking(0.0)(inputs)
    bi = kb.Bidirectional(kb.GRUCell(U), return_sequences=head == "tagger")
    model = keras.Model(inputs, keras.layers.Dense(3)(bi(masked)))
    randomize(model, seed=7)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 11, F)).astype(np.float32)
    x[np.arange(11)[None, :] >= np.array([11, 7, 3, 1])[:, None]] = 0.0
    model.predict(x, verbose=0)  # the in-process inference loops come first
    spec = [tf.TensorSpec([None, None, F], tf.float32, name="x")]
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    session = ort.InferenceSession(proto.SerializeToString())
    for batch in (x, x[:1, :6], rng.normal(size=(2, 23, F)).astype(np.float32)):
        served = session.run(None, {session.get_inputs()[0].name: batch})[0]
        np.testing.assert_allclose(served, model(batch).numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lockstep", [False, True], ids=["loop_per_direction", "lockstep_directions"])
def test_onnx_matches_keras_on_both_signatures(tmp_path, lockstep):
    """Exported as TF Serving gets it (a loop per direction) and under
    `kb.lockstep_directions()` (one loop, which onnxruntime runs faster:
    docs/deploy.md): both convert to as many ONNX `Loop`s and serve Keras's
    numbers through both signatures."""
    keras.utils.set_random_seed(0)
    features = keras.Input((None, F))
    model = keras.Model(features, kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(features))
    with kb.lockstep_directions() if lockstep else contextlib.nullcontext():
        path = kb.export_saved_model(model, tmp_path, version=1)
    assert _loops(_convert(path, SIGNATURE_UNPADDED).graph) == (1 if lockstep else 2)
    rng = np.random.default_rng(0)

    unpadded = _session(path, SIGNATURE_UNPADDED)
    for batch, time in [(2, 5), (3, 9)]:
        x = rng.normal(size=(batch, time, F)).astype("float32")
        got = unpadded.run(None, {unpadded.get_inputs()[0].name: x})[0]
        np.testing.assert_allclose(got, model(x), atol=1e-5)

    padded = _session(path, SIGNATURE_DEFAULT)
    names = {i.name.split(":")[0]: i.name for i in padded.get_inputs()}
    # The last batch is padded beyond its longest row: the loop skips those steps.
    for lengths, time in [([5, 3], 5), ([9, 4, 1], 9), ([3, 2, 1], 7)]:
        lengths = np.asarray(lengths, "int32")
        mask = np.arange(time)[None] < lengths[:, None]
        x = rng.normal(size=(len(lengths), time, F)).astype("float32")
        x = np.where(mask[..., None], x, 0).astype("float32")
        got = padded.run(None, {names["inputs"]: x, names[LENGTHS_KEY]: lengths})[0]
        np.testing.assert_allclose(got, model(x, mask=tf.constant(mask)), atol=1e-5)


def _cells(features):
    return [kb.Bidirectional(CELLS[cell](), return_sequences=True)(features) for cell in sorted(CELLS)]


def _states_heads_and_stacks(features):
    return boundary_states(features) + heads_and_stacks(features)


@pytest.mark.parametrize(
    "build", [_cells, merge_modes, _states_heads_and_stacks], ids=["cells", "merge_modes", "states_heads"]
)
def test_onnx_matches_keras_for_every_cell_merge_and_head(tmp_path, build):
    """Every cell and merge mode, the boundary states, the pooling heads and
    the stacks, through the padded signature: every output at every valid
    position (rows of length 0 included)."""
    keras.utils.set_random_seed(0)
    features = keras.Input((None, F))
    model = randomize(keras.Model(features, build(features)))
    session = _session(kb.export_saved_model(model, tmp_path, version=1), SIGNATURE_DEFAULT)
    names = {i.name.split(":")[0]: i.name for i in session.get_inputs()}
    order = sorted(session.get_outputs(), key=lambda o: int(o.name.split(":")[0].rsplit("_", 1)[1]))
    rng = np.random.default_rng(1)
    for time in (5, 8):
        lengths = np.array([time, 2, 0], "int32")
        mask = np.arange(time)[None] < lengths[:, None]
        x = rng.normal(size=(3, time, F)).astype("float32")
        got = session.run([o.name for o in order], {names["inputs"]: x, names[LENGTHS_KEY]: lengths})
        assert_outputs_match(got, model(x, mask=tf.constant(mask)), mask, f"T={time}")


def test_onnx_left_padding_and_holes_from_the_ids(tmp_path):
    """Padding marked by id 0 of an Embedding(mask_zero=True): left-padded
    rows and rows with holes, through the signature without `lengths`."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, F, mask_zero=True)(ids)
    tags = kb.Bidirectional(kb.LSTMCell(U), return_sequences=True, merge_mode="projection", projection_units=2)(x)
    sentence = kb.Bidirectional(kb.GRUCell(U))(x)
    model = randomize(keras.Model(ids, [tags, sentence]))
    session = _session(kb.export_saved_model(model, tmp_path, version=1, lengths_input=False), SIGNATURE_DEFAULT)
    order = sorted(session.get_outputs(), key=lambda o: int(o.name.split(":")[0].rsplit("_", 1)[1]))
    rng = np.random.default_rng(2)
    for time in (5, 8):
        steps = np.arange(time)[None]
        for valid in (steps >= np.array([[0], [time - 2], [time]]), steps % 3 != 1):
            x = np.where(valid, rng.integers(1, 10, valid.shape), 0).astype("int32")
            got = session.run([o.name for o in order], {session.get_inputs()[0].name: x})
            assert_outputs_match(got, model(x), valid, f"T={time}")
