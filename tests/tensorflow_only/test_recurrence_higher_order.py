"""Gradients of gradients and forward-mode derivatives.

A gradient penalty (the norm of the input gradient, differentiated with
respect to the weights), a persistent tape asked twice, a Hessian-vector
product and `tf.autodiff.ForwardAccumulator` all differentiate through the
layer in ways the first-order BPTT does not: they failed with "TensorList
crossing the XLA/TF boundary" (second order) or returned no tangent at all
(forward mode). The oracles: Keras's layers with the same weights (which
TensorFlow differentiates op by op), central differences of the first-order
gradient, and the adjoint identity <J v, u> = <v, J^T u>. Everything runs in
float64 so that the tolerances can be tight.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from helpers import MASK_3x5 as MASK

B, T, F, U = 3, 5, 2, 3

CELLS = {
    "gru": (lambda: kb.GRUCell(U), lambda: keras.layers.GRU(U, return_sequences=True)),
    "gru_reset_before": (
        lambda: kb.GRUCell(U, reset_after=False),
        lambda: keras.layers.GRU(U, reset_after=False, return_sequences=True),
    ),
    "lstm": (lambda: kb.LSTMCell(U), lambda: keras.layers.LSTM(U, return_sequences=True)),
    "simple": (lambda: kb.SimpleRNNCell(U), lambda: keras.layers.SimpleRNN(U, return_sequences=True)),
}


pytestmark = pytest.mark.usefixtures("float64_policy")  # conftest.py


def _pair(cell_name, seed=0):
    """Ours and Keras's bidirectional layer with the same random weights."""
    ours_cell, keras_cell = CELLS[cell_name]
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(B, T, F)))
    ours = kb.Bidirectional(ours_cell(), return_sequences=True)
    theirs = keras.layers.Bidirectional(keras_cell())
    ours(x), theirs(x)
    weights = [rng.normal(size=w.shape) * 0.5 for w in ours.get_weights()]
    ours.set_weights(weights)
    theirs.set_weights(weights)
    return ours, theirs, x


def _maybe_graph(fn, graph):
    return tf.function(fn) if graph else fn


def _penalty(layer, x, mask=None):
    """sum((d/dx sum(y^2))^2): the input-gradient norm of WGAN-GP and of
    input-gradient regularisation."""
    with tf.GradientTape() as inner:
        inner.watch(x)
        y = tf.reduce_sum(layer(x, mask=mask, training=True) ** 2)
    return tf.reduce_sum(inner.gradient(y, x) ** 2)


def _penalty_gradients(layer, x, mask=None):
    with tf.GradientTape() as outer:
        penalty = _penalty(layer, x, mask)
    return outer.gradient(penalty, layer.trainable_variables)


def _assert_all_close(actual, expected, atol=1e-10, rtol=1e-8):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a is not None
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=atol, rtol=rtol)


@pytest.mark.slow(reason="second-order gradients of every cell, 10-20 s each")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_gradient_penalty_matches_keras(cell_name, graph):
    ours, theirs, x = _pair(cell_name)
    expected = _penalty_gradients(theirs, x)
    actual = _maybe_graph(lambda: _penalty_gradients(ours, x), graph)()
    _assert_all_close(actual, expected)
    assert max(float(tf.reduce_max(tf.abs(g))) for g in expected) > 1e-3  # not a trivial zero


def _assert_penalty_gradients_match_central_differences(layer, x, mask, graph, variables):
    grads = _maybe_graph(lambda: _penalty_gradients(layer, x, mask), graph)()
    for variable, grad in zip(layer.trainable_variables, grads):
        if variable.path not in variables:
            continue
        start = variable.numpy()
        for index in [(0,) * grad.ndim, np.unravel_index(np.argmax(np.abs(grad)), grad.shape)]:
            values = []
            for step in (1e-6, -1e-6):
                moved = start.copy()
                moved[index] += step
                variable.assign(moved)
                values.append(float(_penalty(layer, x, mask)))
            variable.assign(start)
            numeric = (values[0] - values[1]) / 2e-6
            np.testing.assert_allclose(float(grad[index]), numeric, atol=1e-7, rtol=1e-6, err_msg=variable.path)


@pytest.mark.slow(reason="central differences of a second-order gradient, ~15 s")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_gradient_penalty_with_padding_against_central_differences(graph):
    """Masked rows (right padding, left padding with a hole): Keras's
    layers carry outputs through padding, so the oracle is numerical."""
    ours, _, x = _pair("lstm", seed=1)
    paths = [v.path for v in ours.trainable_variables[:3]]
    _assert_penalty_gradients_match_central_differences(ours, x, tf.constant(MASK), graph, paths)


@pytest.mark.slow(reason="second-order gradients through a stack, ~10 s")
def test_gradient_penalty_through_a_stack_with_layer_norm_and_residuals():
    """Keras's own LayerNormalization (tf.nn.moments stops the mean's
    gradient inside the variance) gets second derivatives wrong for every
    layer below it; the stack's does not."""
    x = tf.constant(np.random.default_rng(10).normal(size=(B, T, 4)))
    stack = kb.StackedBidirectional("lstm", units=(2, 2), residual=True, layer_norm=True)
    stack(x)
    lowest = [v.path for v in stack.trainable_variables if "bidirectional_0" in v.path or "layer_norm_0" in v.path]
    _assert_penalty_gradients_match_central_differences(stack, x, tf.constant(MASK), False, lowest)


def test_persistent_tape_asked_twice_matches_keras():
    ours, theirs, x = _pair("gru", seed=2)
    results = []
    for layer in (ours, theirs):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = tf.reduce_sum(layer(x, training=True) ** 2)
            input_gradient = tape.gradient(y, x)
            penalty = tf.reduce_sum(input_gradient**2)
        results.append(tape.gradient(penalty, layer.trainable_variables) + [input_gradient])
        del tape
    _assert_all_close(*results)


@pytest.mark.slow(reason="traces second-order gradients of the loops twice, ~30 s")
@pytest.mark.parametrize("cell_name, xla, masked", [("gru", True, True), ("lstm", True, False), ("gru", False, True)],
                         ids=["gru", "lstm-no-mask", "gru-xla-disabled"])
def test_second_order_in_a_graph_with_unknown_batch_and_time(cell_name, xla, masked):
    """A persistent tape and a gradient penalty inside a `tf.function`
    traced for unknown batch and time sizes (the loops then sit in the
    zero-length `tf.cond`), with right padding, left padding and a hole
    (or no mask), with the default loops and under `kb.xla_disabled()`:
    against the same derivatives taken eagerly and against central
    differences of the penalty; a zero-length batch gives zero gradients."""
    with contextlib.ExitStack() as stack:
        if not xla:
            stack.enter_context(kb.xla_disabled())
        _check_second_order_unknown_sizes(cell_name, masked)


def _check_second_order_unknown_sizes(cell_name, masked):
    ours, _, x = _pair(cell_name, seed=4)
    mask = tf.constant(MASK if masked else np.ones_like(MASK))
    spec = [tf.TensorSpec([None, None, F], tf.float64), tf.TensorSpec([None, None], tf.bool)]

    def both(x, mask):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = tf.reduce_sum(ours(x, mask=mask if masked else None, training=True) ** 2)
            penalty = tf.reduce_sum(tape.gradient(y, x) ** 2)
        return tape.gradient(y, ours.trainable_variables) + tape.gradient(penalty, ours.trainable_variables)

    traced = tf.function(both, input_signature=spec)
    got = traced(x, mask)
    _assert_all_close(got, both(x, mask))
    n = len(ours.trainable_variables)
    variable, index = ours.trainable_variables[1], (0, 0)  # a recurrent kernel
    values = []
    for step in (1e-6, -1e-6):
        start = variable.numpy()
        moved = start.copy()
        moved[index] += step
        variable.assign(moved)
        values.append(float(_penalty(ours, x, mask if masked else None)))
        variable.assign(start)
    numeric = (values[0] - values[1]) / 2e-6
    np.testing.assert_allclose(float(got[n + 1][index]), numeric, atol=1e-7, rtol=1e-6)
    assert abs(numeric) > 1e-4  # not a trivial zero
    empty = traced(tf.zeros([2, 0, F], tf.float64), tf.zeros([2, 0], tf.bool))
    assert all(float(tf.reduce_max(tf.abs(g))) == 0 for g in empty)


@pytest.mark.slow(reason="forward mode in eager and graph per cell, ~4 s")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("cell_name", ["gru", "lstm"])
def test_forward_mode_jvp_matches_keras(cell_name, graph):
    ours, theirs, x = _pair(cell_name, seed=3)
    tangent = tf.constant(np.random.default_rng(4).normal(size=x.shape))

    def jvp(layer):
        with tf.autodiff.ForwardAccumulator(x, tangent) as accumulator:
            y = layer(x)
        return accumulator.jvp(y)

    expected = jvp(theirs)
    _assert_all_close([_maybe_graph(lambda: jvp(ours), graph)()], [expected])


@pytest.mark.slow(reason="forward mode against the gradient, ~4.5 s")
def test_forward_mode_jvp_with_padding_is_the_adjoint_of_the_gradient():
    """<J v, u> = <v, J^T u>, with J^T u the first-order BPTT's input
    gradient (checked against the NumPy oracle elsewhere)."""
    ours, _, x = _pair("lstm", seed=5)
    rng = np.random.default_rng(6)
    tangent = tf.constant(rng.normal(size=x.shape))
    cotangent = tf.constant(rng.normal(size=(B, T, 2 * U)))
    mask = tf.constant(MASK)
    with tf.autodiff.ForwardAccumulator(x, tangent) as accumulator:
        y = ours(x, mask=mask)
    jvp = accumulator.jvp(y)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ours(x, mask=mask)
    vjp = tape.gradient(y, x, output_gradients=cotangent)
    assert jvp is not None
    np.testing.assert_allclose(float(tf.reduce_sum(jvp * cotangent)), float(tf.reduce_sum(tangent * vjp)), rtol=1e-10)
    np.testing.assert_array_equal(np.asarray(jvp)[~MASK], 0.0)  # padding outputs zeros, so no tangent


@pytest.mark.slow(reason="forward-over-backward second order, ~7 s")
def test_hessian_vector_product_forward_over_backward_matches_keras():
    ours, theirs, x = _pair("lstm", seed=7)
    target = tf.constant(np.random.default_rng(8).normal(size=(B, T, 2 * U)))
    products = []
    for layer in (ours, theirs):
        variables = layer.trainable_variables
        backing = [v.value for v in variables]  # the tf.Variables behind Keras's
        directions = [tf.ones_like(v) * 0.1 for v in backing]
        with tf.autodiff.ForwardAccumulator(backing, directions) as accumulator:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum((layer(x, training=True) - target) ** 2)
            gradients = tape.gradient(loss, variables)
        products.append(accumulator.jvp(gradients))
    _assert_all_close(*products)


def test_first_order_training_keeps_the_fast_path(monkeypatch):
    """One tape (what `model.fit` uses) never takes the plain loop: the
    second-order and forward-mode paths cost speed."""
    from keras_birnn import recurrence

    def refuse(*args, **kwargs):
        raise AssertionError("a first-order gradient took the plain loop")

    # Patched where they are read: `run` picks the plain loop in
    # `dispatch`, the BPTT's gradient calls autodiff in `gradients`.
    monkeypatch.setattr(recurrence.tensorflow.dispatch, "plain_loop", refuse)
    monkeypatch.setattr(recurrence.tensorflow.gradients, "_autodiff_gradients", refuse)
    ours, theirs, x = _pair("gru", seed=9)
    results = []
    for layer in (ours, theirs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x, training=True) ** 2)
        results.append(tape.gradient(loss, layer.trainable_variables))
    _assert_all_close(*results)
