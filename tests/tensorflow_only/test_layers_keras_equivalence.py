"""kb.Bidirectional is a drop-in for keras.layers.Bidirectional.

Weights are copied from a `keras.layers.Bidirectional` (randomised first, so
that biases and the LSTM forget gate are not at their defaults), and
outputs and returned states must match to 1e-5 for every Keras merge mode,
with and without a right-padding mask.
"""

import keras
import numpy as np
import pytest

import keras_birnn as kb
from helpers import assert_all_close, in_graph

B, T, F, U = 4, 6, 3, 4

# name -> (Keras layer factory, kb cell factory)
CELLS = {
    "simple_rnn": (lambda **kw: keras.layers.SimpleRNN(U, **kw), lambda: kb.SimpleRNNCell(U)),
    "gru_reset_after": (
        lambda **kw: keras.layers.GRU(U, reset_after=True, **kw),
        lambda: kb.GRUCell(U, reset_after=True),
    ),
    "gru_reset_before": (
        lambda **kw: keras.layers.GRU(U, reset_after=False, **kw),
        lambda: kb.GRUCell(U, reset_after=False),
    ),
    "lstm": (lambda **kw: keras.layers.LSTM(U, **kw), lambda: kb.LSTMCell(U)),
}
KERAS_MERGES = ["concat", "sum", "mul", "ave", None]
# Right padding, lengths 6, 4, 1 and 0.
RIGHT_PADDING = np.arange(T)[None, :] < np.array([T, 4, 1, 0])[:, None]


def _pair(cell_name, merge_mode, return_sequences, return_state=True, seed=0):
    """A Keras Bidirectional with random weights and ours with a copy of them."""
    keras_factory, kb_factory = CELLS[cell_name]
    theirs = keras.layers.Bidirectional(
        keras_factory(return_sequences=return_sequences, return_state=return_state),
        merge_mode=merge_mode,
    )
    theirs.build((None, T, F))
    rng = np.random.default_rng(seed)
    theirs.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in theirs.get_weights()])
    ours = kb.Bidirectional(
        kb_factory(), merge_mode=merge_mode, return_sequences=return_sequences, return_state=return_state
    )
    ours.build((None, None, F))
    ours.set_weights(theirs.get_weights())
    x = rng.normal(size=(B, T, F)).astype(np.float32)
    return theirs, ours, x


def _np(structure):
    return keras.tree.map_structure(np.asarray, structure)


@pytest.mark.parametrize("merge_mode", KERAS_MERGES, ids=str)
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_outputs_and_states_match_keras(cell_name, merge_mode):
    """Without a mask and with right padding (lengths 6, 4, 1, 0), for
    per-position and sentence outputs."""
    for return_sequences in (True, False):
        theirs, ours, x = _pair(cell_name, merge_mode, return_sequences)
        for mask in (None, RIGHT_PADDING):
            expected = _np(theirs(x, mask=mask))
            actual = _np(ours(x, mask=mask))
            # [output] or [forward output, backward output], then forward
            # states, then backward states: Keras's order.
            assert len(actual) == len(expected)
            assert_all_close(actual, expected, atol=1e-5, rtol=1e-5)
            if mask is None:
                unmasked = expected
        # Something to compare: outputs depend on the weights and the mask.
        assert np.abs(unmasked[0]).max() > 0.05
        assert np.abs(expected[0] - unmasked[0]).max() > 1e-3


@pytest.mark.slow(reason="traces both layers, ~3.5 s")
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_matches_keras_in_graph_without_return_state(cell_name):
    """Plain output structure (a pair for merge_mode=None) and a graph run
    with unknown batch and time sizes."""
    for merge_mode in ("concat", None):
        theirs, ours, x = _pair(cell_name, merge_mode, True, return_state=False, seed=1)
        expected = _np(theirs(x, mask=RIGHT_PADDING))
        assert_all_close(_np(in_graph(ours, x, mask=RIGHT_PADDING)), expected, atol=1e-5, rtol=1e-5)
        if merge_mode is None:
            assert isinstance(expected, (list, tuple)) and len(expected) == 2


@pytest.mark.parametrize("cell_name", list(CELLS))
def test_weights_have_keras_shapes_and_order(cell_name):
    theirs, ours, _ = _pair(cell_name, "concat", True)
    fresh = kb.Bidirectional(CELLS[cell_name][1]())
    fresh.build((None, None, F))
    assert [w.shape for w in fresh.get_weights()] == [w.shape for w in theirs.get_weights()]
    # Same names in the same order: forward (kernel, recurrent_kernel, bias),
    # then backward.
    leaf = lambda layer: [w.path.rsplit("/", 1)[-1] for w in layer.weights]  # noqa: E731
    assert leaf(fresh) == leaf(theirs) == ["kernel", "recurrent_kernel", "bias"] * 2
    assert all("forward" in w.path for w in fresh.weights[:3])
    assert all("backward" in w.path for w in fresh.weights[3:])
    # set_weights round trips exactly, and `bi.forward_layer` / `bi.backward_layer` hold them.
    for a, b in zip(ours.get_weights(), theirs.get_weights()):
        np.testing.assert_array_equal(a, b)
    theirs_fw = theirs.forward_layer.cell
    np.testing.assert_array_equal(ours.forward_layer.cell.kernel.numpy(), theirs_fw.kernel.numpy())
    np.testing.assert_array_equal(
        ours.backward_layer.cell.recurrent_kernel.numpy(), theirs.backward_layer.cell.recurrent_kernel.numpy()
    )
    # Same parameter count as Keras.
    assert fresh.count_params() == theirs.count_params()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"unit_forget_bias": False}, {"bias_initializer": "ones"},
     {"bias_initializer": keras.initializers.Constant(0.3)}],
    ids=["default", "no_unit_forget_bias", "ones", "constant"],
)
def test_lstm_starts_from_keras_initial_bias(kwargs):
    """The forget-gate block starts at 1 on top of the bias initializer
    (unless unit_forget_bias=False), exactly as in Keras's LSTM."""
    x = np.zeros((1, 2, F), "float32")
    ours, theirs = kb.Recurrent(kb.LSTMCell(U, **kwargs)), keras.layers.LSTM(U, **kwargs)
    ours(x), theirs(x)
    np.testing.assert_array_equal(ours.cell.bias.numpy(), theirs.cell.bias.numpy())
    # The forget block: 1, or the (zeros) initializer's value without unit_forget_bias.
    expected_forget = 1.0 if kwargs.get("unit_forget_bias", True) else 0.0
    np.testing.assert_array_equal(ours.cell.bias.numpy()[U : 2 * U], expected_forget)
