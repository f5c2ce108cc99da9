"""A float64 layer computes and differentiates in float64.

The NumPy oracle works in float64; with the weights and inputs exactly
representable in float32 (as everywhere in these tests), a float64 layer
must agree with it to float64 precision, gradients included. Until this
test, the BPTT's sums over time (kernel and bias gradients) were always
taken in float32, so a float64 layer's gradients were off by about 1e-7
(1e-7 against Keras's float64 LSTM and GRU) while its outputs were exact.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from birnn_cases import CELLS, TRAINING_MODES, make_case
from helpers import MASK_4x6 as MASK, assert_all_close, to_numpy

# float64 round-off is ~1e-16; the float32 sums this guards against were off by ~1e-7.
ATOL, RTOL = 1e-11, 1e-9


@pytest.mark.slow(reason="eager, graph and gradients in float64, ~5 s; test_a_float64_recurrent_has_float64_gradients stays fast")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_outputs_and_gradients_match_the_oracle_to_float64_precision(float64_policy, cell_name, graph):
    case = make_case(cell_name, "projection_softmax", return_state=True)
    assert case.layer.forward_layer.cell.kernel.dtype == "float64"
    outputs = case.layer(tf.constant(case.x, tf.float64), mask=MASK)
    assert {t.dtype for t in keras.tree.flatten(outputs)} == {tf.float64}
    assert_all_close(to_numpy(outputs), case.oracle(MASK), atol=ATOL, rtol=RTOL)
    d_output = case.random_d_output()
    expected = case.oracle_grads(d_output, MASK)
    for training in TRAINING_MODES:
        actual = case.tf_grads(d_output, MASK, graph=graph, training=training)
        assert actual["fw"]["kernel"].dtype == np.float64
        case.assert_grads_match(actual, expected, atol=ATOL, rtol=RTOL)


def test_a_float64_recurrent_has_float64_gradients(float64_policy):
    """`kb.Recurrent` on its own against Keras's LSTM with the same weights
    (the other oracle): a training loss's gradients agree to float64
    precision."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 9, 2))
    layer = kb.Recurrent(kb.LSTMCell(5), return_sequences=True)
    keras_layer = keras.layers.LSTM(5, return_sequences=True)
    layer(x), keras_layer(x)
    keras_layer.set_weights(layer.get_weights())
    target = rng.normal(size=(3, 9, 5))
    grads = []
    for candidate in (layer, keras_layer):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((candidate(x, training=True) - target) ** 2)
        grads.append(tape.gradient(loss, candidate.trainable_variables))
    for ours, theirs in zip(*grads):
        assert ours.dtype == tf.float64
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-12, rtol=1e-10)
