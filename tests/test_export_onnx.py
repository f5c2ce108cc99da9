"""ONNX conversion of an exported SavedModel (tf2onnx, onnxruntime): both
directions' outputs match Keras, right-padded batches included.

tf2onnx turns a TensorArray written inside a `While` into an ONNX `Loop`
scan output in iteration order, ignoring the index written at; the forward
loop writes its outputs at the iteration so that the converted graph is
right (`recurrence._in_time_order`). Skipped where tf2onnx or onnxruntime is
not installed.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn.export import LENGTHS_KEY, SIGNATURE_DEFAULT, SIGNATURE_UNPADDED

tf2onnx = pytest.importorskip("tf2onnx")
ort = pytest.importorskip("onnxruntime")
from tf2onnx import tf_loader  # noqa: E402

FEATURES, UNITS = 3, 4

# Keras notes that the outer model keeps no mask when the reference calls
# pass `mask=`; irrelevant here.
pytestmark = pytest.mark.filterwarnings("ignore:Layer 'functional.*was passed an input with a mask:UserWarning")


def _session(path, signature):
    graph_def, inputs, outputs, rename = tf_loader.from_saved_model(
        path, None, None, signatures=[signature], return_tensors_to_rename=True
    )
    proto, _ = tf2onnx.convert.from_graph_def(
        graph_def, input_names=inputs, output_names=outputs, opset=17, tensors_to_rename=rename
    )
    return ort.InferenceSession(proto.SerializeToString())


@pytest.mark.parametrize("cell", ["gru"])
def test_onnx_matches_keras(tmp_path, cell):
    keras.utils.set_random_seed(0)
    features = keras.Input((None, FEATURES))
    make = {"gru": kb.GRUCell, "lstm": kb.LSTMCell}[cell]
    outputs = kb.Bidirectional(make(UNITS), return_sequences=True)(features)
    model = keras.Model(features, outputs)
    path = kb.export_saved_model(model, tmp_path, version=1)
    rng = np.random.default_rng(0)

    unpadded = _session(path, SIGNATURE_UNPADDED)
    for batch, time in [(2, 5), (3, 9)]:
        x = rng.normal(size=(batch, time, FEATURES)).astype("float32")
        got = unpadded.run(None, {unpadded.get_inputs()[0].name: x})[0]
        np.testing.assert_allclose(got, model(x), atol=1e-5)

    padded = _session(path, SIGNATURE_DEFAULT)
    names = {i.name.split(":")[0]: i.name for i in padded.get_inputs()}
    # The last batch is padded beyond its longest row: the loop skips those steps.
    for lengths, time in [([5, 3], 5), ([9, 4, 1], 9), ([3, 2, 1], 7)]:
        lengths = np.asarray(lengths, "int32")
        mask = np.arange(time)[None] < lengths[:, None]
        x = rng.normal(size=(len(lengths), time, FEATURES)).astype("float32")
        x = np.where(mask[..., None], x, 0).astype("float32")
        got = padded.run(None, {names["inputs"]: x, names[LENGTHS_KEY]: lengths})[0]
        np.testing.assert_allclose(got, model(x, mask=tf.constant(mask)), atol=1e-5)


CELLS = {
    "simple": lambda: kb.SimpleRNNCell(UNITS),
    "gru_reset_after": lambda: kb.GRUCell(UNITS, reset_after=True),
    "gru_reset_before": lambda: kb.GRUCell(UNITS, reset_after=False),
    "lstm": lambda: kb.LSTMCell(UNITS),
}


def _cells(features):
    return [kb.Bidirectional(CELLS[cell](), return_sequences=True)(features) for cell in sorted(CELLS)]


def _merge_modes(features):
    outputs = []
    for merge in ["concat", "sum", "mul", "ave", None, "projection"]:
        layer = kb.Bidirectional(
            kb.GRUCell(UNITS), merge_mode=merge, return_sequences=True, projection_units=2 if merge == "projection" else None
        )
        y = layer(features)
        outputs += y if merge is None else [y]
    return outputs


def _states_and_heads(features):
    outputs = []
    for state in ["zeros", 0.5, "learned"]:
        outputs.append(kb.Bidirectional(kb.GRUCell(UNITS), return_sequences=True, initial_state=state)(features))
        outputs.append(kb.Bidirectional(kb.LSTMCell(UNITS), initial_state=state)(features))
    seq = kb.Bidirectional(kb.GRUCell(UNITS), return_sequences=True)(features)
    pair = kb.Bidirectional(kb.LSTMCell(UNITS), merge_mode=None, return_sequences=True)(features)
    return outputs + [
        kb.MaskedMeanPooling()(seq),
        kb.MaskedMaxPooling()(seq),
        kb.AttentionPooling(3)(seq),
        kb.FinalStatePooling()(pair),
        kb.StackedBidirectional("gru", units=(UNITS, UNITS), residual=True, layer_norm=True)(features),
        kb.StackedBidirectional("lstm", units=(UNITS, UNITS), return_sequences=False)(features),
    ]


def _randomized(model):
    """Weights (biases and learned boundary states included) away from
    their initial zeros, so that each of them shows in the outputs."""
    rng = np.random.default_rng(0)
    for w in model.weights:
        scale = 0.5 if len(w.shape) < 2 else 1.0 / np.sqrt(w.shape[0])
        w.assign((rng.normal(size=w.shape) * scale).astype(w.dtype))
    return model


@pytest.mark.parametrize("build", [_cells, _merge_modes, _states_and_heads], ids=["cells", "merge_modes", "states_heads"])
def test_onnx_matches_keras_for_every_cell_merge_and_head(tmp_path, build):
    """Every cell and merge mode, the boundary states, the pooling heads and
    the stacks, through the padded signature: every output at every valid
    position (rows of length 0 included)."""
    keras.utils.set_random_seed(0)
    features = keras.Input((None, FEATURES))
    model = _randomized(keras.Model(features, build(features)))
    session = _session(kb.export_saved_model(model, tmp_path, version=1), SIGNATURE_DEFAULT)
    names = {i.name.split(":")[0]: i.name for i in session.get_inputs()}
    order = sorted(session.get_outputs(), key=lambda o: int(o.name.split(":")[0].rsplit("_", 1)[1]))
    rng = np.random.default_rng(1)
    for time in (5, 8):
        lengths = np.array([time, 2, 0], "int32")
        mask = np.arange(time)[None] < lengths[:, None]
        x = rng.normal(size=(3, time, FEATURES)).astype("float32")
        got = session.run([o.name for o in order], {names["inputs"]: x, names[LENGTHS_KEY]: lengths})
        expected = [np.asarray(e) for e in keras.tree.flatten(model(x, mask=tf.constant(mask)))]
        assert len(got) == len(expected)
        for i, (g, e) in enumerate(zip(got, expected)):
            assert g.shape == e.shape, (i, g.shape, e.shape)
            if e.ndim == 3 and e.shape[1] == time:
                g, e = g[mask], e[mask]
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5, err_msg=f"output {i}, T={time}")
