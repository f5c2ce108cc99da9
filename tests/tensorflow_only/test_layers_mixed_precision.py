"""Mixed precision: float32 variables, low-precision loops, float32-close results.

The oracle is the same layer under the "float32" policy with the same
weights. Tolerances are multiples of the low-precision unit roundoff u
(float16: 2^-11 ~ 4.9e-4; bfloat16: 2^-8 ~ 3.9e-3). Outputs here are of
order 1 (tanh / sigmoid / softmax); every step rounds the state, and the
recurrence damps earlier errors, so the error stays a few u and grows only
slowly with the length. Measured max |y_low - y_32| over these
configurations: at T = 20 (the tests) 3.0 u for float16 and 3.3 u for
bfloat16; at T = 30, 3.3 u and 3.1 u; at T = 200, 4.2 u and 3.8 u (SimpleRNN,
the least damped cell, is the worst). The tests allow 8 u for outputs.
Gradients sum B*T terms computed from rounded states: measured 6.0 u
(float16) and 6.9 u (bfloat16) relative to each gradient's largest entry;
the tests allow 16 u.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn import recurrence

UNIT_ROUNDOFF = {"mixed_float16": 2.0**-11, "mixed_bfloat16": 2.0**-8}
LOW = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
B, T, F = 4, 20, 3

def _lstm_projection(return_state=False):
    return kb.Bidirectional(kb.LSTMCell(8), merge_mode="projection", projection_units=4,
                            projection_activation="softmax", return_sequences=True,
                            initial_state="learned", return_state=return_state)


LAYERS = {
    "gru_concat_tagger": lambda: kb.Bidirectional(kb.GRUCell(8), return_sequences=True),
    "classic_gru_ave_sentence": lambda: kb.Bidirectional(kb.GRUCell(8, reset_after=False), merge_mode="ave",
                                                         initial_state=0.5),
    "lstm_projection_learned_states": lambda: _lstm_projection(return_state=True),
    "simple_reverse_recurrent": lambda: kb.Recurrent(
        kb.SimpleRNNCell(8), reverse=True, return_sequences=True, return_state=True, initial_state=0.5),
}


@pytest.fixture(params=list(UNIT_ROUNDOFF))
def policy(request):
    """Sets the global policy for the test and restores float32 afterwards."""
    try:
        keras.mixed_precision.set_global_policy(request.param)
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def float16_policy():
    """mixed_float16 only: for dtype plumbing, the same for either low precision."""
    try:
        keras.mixed_precision.set_global_policy("mixed_float16")
        yield "mixed_float16"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, F)).astype("float32")
    mask = np.ones((B, T), bool)
    mask[1, 14:] = False   # right padding
    mask[2, :5] = False    # left padding
    mask[3, 6:9] = False   # a hole
    return x, mask


def _float32_twin(factory, policy, seed):
    """The layer built under float32 (random weights), and its weights."""
    keras.mixed_precision.set_global_policy("float32")
    keras.utils.set_random_seed(seed)
    layer = factory()
    layer.build((None, None, F))
    rng = np.random.default_rng(seed)
    # Perturb the initial weights (zero biases and boundary states included).
    layer.set_weights([w + rng.uniform(-0.3, 0.3, w.shape).astype("float32") for w in layer.get_weights()])
    keras.mixed_precision.set_global_policy(policy)
    return layer, layer.get_weights()


class _LoopSpy:
    """Records the dtypes the loop really runs in."""

    def __init__(self, monkeypatch):
        self.dtypes = []
        real = recurrence.run

        def spy(directions, *args, **kwargs):
            for d in directions:
                self.dtypes.append({d.inputs.dtype.name, d.kernel.dtype.name, d.recurrent_kernel.dtype.name}
                                   | {s.dtype.name for s in d.initial_states})
            return real(directions, *args, **kwargs)

        monkeypatch.setattr(recurrence, "run", spy)


@pytest.mark.parametrize("name", list(LAYERS))
def test_float32_variables_low_precision_loop_outputs_close_to_float32(name, policy, monkeypatch):
    reference, weights = _float32_twin(LAYERS[name], policy, seed=31)
    x, mask = _inputs()
    expected = keras.tree.flatten(reference(x, mask=mask))

    layer = LAYERS[name]()
    layer.build((None, None, F))
    layer.set_weights(weights)
    assert {v.dtype for v in layer.weights} == {"float32"}
    assert layer.compute_dtype == LOW[policy]

    spy = _LoopSpy(monkeypatch)
    outputs = keras.tree.flatten(layer(x, mask=mask))
    assert spy.dtypes and all(d == {LOW[policy]} for d in spy.dtypes), spy.dtypes

    tolerance = 8 * UNIT_ROUNDOFF[policy]
    worst = 0.0
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.dtype == LOW[policy]
        error = np.abs(np.asarray(tf.cast(got, tf.float32)) - np.asarray(want))
        worst = max(worst, float(error.max()))
    assert worst <= tolerance, f"max |low - float32| = {worst:.2e} > {tolerance:.2e}"
    assert worst > 0.0  # it really ran in low precision
    # Padding stays exact in low precision too: zeros at padded positions.
    if name == "gru_concat_tagger":
        assert np.all(np.asarray(outputs[0])[~mask] == 0)


@pytest.mark.slow(reason="gradients under each policy, ~4 s")
def test_bptt_gradients_close_to_float32(policy):
    """The training path (hand-written BPTT, `training=True`) in low precision:
    every variable's gradient within 16 u of the float32 one, relative to
    the largest entry of that gradient."""
    factory = _lstm_projection
    reference, weights = _float32_twin(factory, policy, seed=32)
    layer = factory()
    layer.build((None, None, F))
    layer.set_weights(weights)
    x, mask = _inputs(1)
    d_output = tf.constant(np.random.default_rng(2).normal(size=(B, T, 4)), tf.float32)

    def gradients(model):
        with tf.GradientTape() as tape:
            y = model(x, mask=mask, training=True)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * d_output)
        return tape.gradient(loss, model.trainable_variables)

    expected, got = gradients(reference), gradients(layer)
    assert len(got) == len(expected) == 13  # two LSTMs, two learned states each, projection
    for variable, g, e in zip(layer.trainable_variables, got, expected):
        assert g.dtype == tf.float32, variable.path
        scale = float(np.abs(np.asarray(e)).max())
        error = float(np.abs(np.asarray(g) - np.asarray(e)).max())
        assert error <= 16 * UNIT_ROUNDOFF[policy] * scale, (variable.path, error, scale)


@pytest.mark.slow(reason="trains a model, ~9 s")
def test_fit_lowers_the_loss(policy):
    """model.fit under the policy: a low-precision projection tagger with the
    softmax in float32 (Keras's mixed-precision advice). Under mixed_float16
    Keras wraps the optimizer in a LossScaleOptimizer, so the scaled loss's
    gradients pass through the float16 BPTT."""
    keras.utils.set_random_seed(33)
    rng = np.random.default_rng(33)
    tokens = rng.integers(1, 12, size=(8, 9))
    tokens[1, 6:] = 0
    tokens[4, 3:] = 0
    labels = (tokens % 3).astype("int32")
    inputs = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(12, 6, mask_zero=True)(inputs)
    h = kb.Bidirectional(kb.GRUCell(8), merge_mode="projection", projection_units=3,
                         return_sequences=True, initial_state="learned")(h)
    model = keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32")(h))
    assert model.layers[2].compute_dtype == LOW[policy]
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    losses = model.fit(tokens, labels, batch_size=8, epochs=10, shuffle=False, verbose=0).history["loss"]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.6 * losses[0], losses
    assert {v.dtype for v in model.weights} == {"float32"}


def test_wrapper_dtype_governs_its_directions(float16_policy):
    policy = float16_policy
    """`kb.Bidirectional(..., dtype="float32")` under a mixed policy computes in
    float32 (its directions and projection follow it): the float32 layer's
    numbers. A kb.Recurrent passed in keeps its own dtype; its outputs are cast
    to the wrapper's."""
    reference, weights = _float32_twin(_lstm_projection, policy, seed=34)
    x, mask = _inputs(2)
    layer = kb.Bidirectional(kb.LSTMCell(8), merge_mode="projection", projection_units=4,
                             projection_activation="softmax", return_sequences=True,
                             initial_state="learned", dtype="float32")  # _lstm_projection's twin
    layer.build((None, None, F))
    layer.set_weights(weights)
    assert {layer.forward_layer.compute_dtype, layer.backward_layer.compute_dtype, layer.projection.compute_dtype} == {"float32"}
    np.testing.assert_allclose(layer(x, mask=mask), reference(x, mask=mask), atol=1e-6, rtol=1e-6)

    def recurrent_pair():
        return kb.Bidirectional(kb.Recurrent(kb.GRUCell(8)), backward_layer=kb.Recurrent(kb.GRUCell(8), reverse=True),
                                return_sequences=True, return_state=True, dtype="float32")

    twin, pair_weights = _float32_twin(recurrent_pair, policy, seed=35)
    mixed = recurrent_pair()
    mixed.build((None, None, F))
    mixed.set_weights(pair_weights)
    outputs, expected = mixed(x, mask=mask), twin(x, mask=mask)
    assert mixed.forward_layer.compute_dtype == LOW[policy]
    assert len(outputs) == len(expected) == 3
    for got, want in zip(outputs, expected):
        assert got.dtype == tf.float32
        np.testing.assert_allclose(got, want, atol=8 * UNIT_ROUNDOFF[policy], rtol=0)


def test_stack_dtype_governs_its_layers(float16_policy):
    policy = float16_policy
    """`kb.StackedBidirectional(..., dtype="float32")` under a mixed policy:
    the float32 stack's numbers (its layers, dropout and normalization
    follow the stack's policy)."""
    x, mask = _inputs(3)
    make = lambda **kw: kb.StackedBidirectional("gru", units=(4, 4), residual=True, layer_norm=True,  # noqa: E731
                                                merge_mode="sum", **kw)
    keras.mixed_precision.set_global_policy("float32")
    reference = make()
    reference.build((None, None, F))
    keras.mixed_precision.set_global_policy(policy)
    stack = make(dtype="float32")
    stack.build((None, None, F))
    stack.set_weights(reference.get_weights())
    got = stack(x, mask=mask)
    assert got.dtype == tf.float32
    np.testing.assert_allclose(got, reference(x, mask=mask), atol=1e-6, rtol=1e-6)
