"""get_config/from_config for every layer, `.keras` round trips (also with
`safe_mode=True`, no custom objects, and in a fresh process), and training
with `model.fit` (one step checked against the oracle's BPTT)."""


import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from birnn_cases import B, F, T, U, make_case
from helpers import MASK_4x6 as MASK, assert_all_close, keras_round_trip, run_python, to_numpy

X = np.random.default_rng(20).normal(size=(B, T, F)).astype(np.float32)


def _randomize(layer, seed=0):
    """Random weights, so that a copy that drops or reorders any is caught."""
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()])


def _clone(layer, *input_shapes):
    """from_config(get_config()), built for `input_shapes`, with the
    original's weights copied (set_weights refuses any shape mismatch)."""
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    clone.build(*input_shapes)
    clone.set_weights(layer.get_weights())
    return clone


CELL_CONFIGS = {
    "simple_relu_no_bias": lambda: kb.SimpleRNNCell(U, activation="relu", use_bias=False),
    "gru_reset_after": lambda: kb.GRUCell(U, reset_after=True, dropout=0.1, recurrent_dropout=0.2, seed=3),
    "gru_reset_before": lambda: kb.GRUCell(U, reset_after=False, recurrent_activation="hard_sigmoid"),
    "lstm": lambda: kb.LSTMCell(U, unit_forget_bias=False, kernel_regularizer="l2"),
}


CELL_ATTRIBUTES = {
    "simple_relu_no_bias": {"units": U, "activation": "relu", "use_bias": False},
    "gru_reset_after": {"reset_after": True, "dropout": 0.1, "recurrent_dropout": 0.2, "seed": 3},
    "gru_reset_before": {"reset_after": False, "recurrent_activation": "hard_sigmoid"},
    "lstm": {"unit_forget_bias": False},
}


@pytest.mark.parametrize("name", list(CELL_CONFIGS))
def test_cell_config_round_trip(name):
    """One step through the Keras cell protocol: (output, new states)."""
    cell = CELL_CONFIGS[name]()
    cell.build((None, F))
    _randomize(cell)
    clone = _clone(cell, (None, F))
    states = [np.full((B, U), 0.3, np.float32)] * cell.state_count
    out, new_states = cell(X[:, 0], states)
    out_c, new_states_c = clone(X[:, 0], states)
    assert_all_close([out_c, new_states_c], [out, new_states], atol=0, rtol=0)
    # ... and the step is the oracle's.
    kind, kwargs = {"simple_relu_no_bias": ("simple", {"activation": "relu"}),
                    "gru_reset_after": ("gru", {"reset_after": True}),
                    "gru_reset_before": ("gru", {"reset_after": False, "recurrent_activation": "hard_sigmoid"}),
                    "lstm": ("lstm", {})}[name]
    params = {k: None if getattr(cell, k) is None else getattr(cell, k).numpy()
              for k in ("kernel", "recurrent_kernel", "bias")}
    _, final = ref.run_direction(kind, params, X[:, :1], initial_state=states, **kwargs)
    assert_all_close(new_states, final, atol=1e-5, rtol=1e-5)
    # The non-default constructor arguments survive (they shape
    # initialisation and training, not just this step).
    for attribute, value in CELL_ATTRIBUTES[name].items():
        got = getattr(clone, attribute)
        assert (got.__name__ if callable(got) and hasattr(got, "__name__") else got) == value, attribute


RECURRENTS = {
    "reverse_gru_sequences": lambda: kb.Recurrent(kb.GRUCell(U), reverse=True, return_sequences=True),
    "lstm_learned_state": lambda: kb.Recurrent(kb.LSTMCell(U), return_state=True, initial_state="learned"),
    "simple_constant_state": lambda: kb.Recurrent(kb.SimpleRNNCell(U), initial_state=0.5, return_sequences=True),
}


@pytest.mark.parametrize("name", list(RECURRENTS))
def test_recurrent_config_round_trip(name):
    layer = RECURRENTS[name]()
    layer.build((None, None, F))
    _randomize(layer)
    clone = _clone(layer, (None, None, F))
    expected = to_numpy(layer(X, mask=MASK))
    assert_all_close(clone(X, mask=MASK), expected, atol=0, rtol=0)
    for attribute in ("reverse", "initial_state", "return_sequences", "return_state"):
        assert getattr(clone, attribute) == getattr(layer, attribute), attribute


BIDIRECTIONALS = {
    "concat_simple": lambda: kb.Bidirectional(kb.SimpleRNNCell(U, activation="relu"), return_sequences=True),
    "sum_gru_before": lambda: kb.Bidirectional(kb.GRUCell(U, reset_after=False), merge_mode="sum"),
    "mul_gru_state": lambda: kb.Bidirectional(kb.GRUCell(U), merge_mode="mul", return_state=True),
    "ave_lstm_half": lambda: kb.Bidirectional(kb.LSTMCell(U), merge_mode="ave", initial_state=0.5,
                                              return_sequences=True),
    "none_lstm_learned": lambda: kb.Bidirectional(kb.LSTMCell(U), merge_mode=None, initial_state="learned",
                                                  return_sequences=True),
    "projection_softmax": lambda: kb.Bidirectional(
        kb.GRUCell(U), merge_mode="projection", projection_units=5, projection_activation="softmax",
        return_sequences=True),
    "projection_linear_mixed": lambda: kb.Bidirectional(
        kb.Recurrent(kb.GRUCell(U)), backward_layer=kb.Recurrent(kb.LSTMCell(U), reverse=True),
        merge_mode="projection", projection_units=3),
}


@pytest.mark.parametrize("name", list(BIDIRECTIONALS))
def test_bidirectional_config_round_trip(name):
    layer = BIDIRECTIONALS[name]()
    layer.build((None, None, F))
    _randomize(layer)
    clone = _clone(layer, (None, None, F))
    expected = to_numpy(layer(X, mask=MASK))
    assert_all_close(clone(X, mask=MASK), expected, atol=0, rtol=0)
    assert type(clone.backward_layer.cell) is type(layer.backward_layer.cell)
    for attribute in ("merge_mode", "initial_state", "return_sequences", "return_state", "projection_units"):
        assert getattr(clone, attribute) == getattr(layer, attribute), attribute
    if layer.projection is not None:
        assert clone.projection.activation is layer.projection.activation


def test_directional_projection_config_round_trip():
    """kb.DirectionalProjection alone: y = softmax(h_f V_f + h_b V_b + c)."""
    layer = kb.DirectionalProjection(5, activation="softmax")
    layer.build((None, U), (None, U))
    _randomize(layer, seed=27)
    clone = _clone(layer, (None, U), (None, U))
    rng = np.random.default_rng(28)
    h_f, h_b = (rng.normal(size=(B, T, U)).astype(np.float32) for _ in range(2))
    V_f, V_b, c = layer.get_weights()
    expected = ref.merge(h_f, h_b, "projection", dict(V_f=V_f, V_b=V_b, c=c), "softmax")
    np.testing.assert_allclose(clone(h_f, h_b), expected, atol=1e-6)
    np.testing.assert_allclose(layer(h_f, h_b), expected, atol=1e-6)


def test_config_round_trip_reproduces_oracle_numbers():
    """The clone of a projection tagger still gives the oracle's numbers."""
    case = make_case("lstm", "projection_softmax", seed=21, return_sequences=True)
    clone = _clone(case.layer, (None, None, F))
    assert_all_close(clone(case.x, mask=MASK), case.oracle(MASK))


def _every_layer_model():
    """A functional model using every cell, merge mode and boundary state,
    kb.Recurrent in both directions and an explicit backward_layer."""
    inputs = keras.Input((None, F))
    masked = keras.layers.Masking(0.0)(inputs)
    outputs = [
        kb.Bidirectional(kb.SimpleRNNCell(U, activation="relu"), return_sequences=True)(masked),
        kb.Bidirectional(kb.GRUCell(U, reset_after=False), merge_mode="sum")(masked),
        *kb.Bidirectional(kb.GRUCell(U), merge_mode="mul", initial_state="learned", return_state=True)(masked),
        kb.Bidirectional(kb.LSTMCell(U), merge_mode="ave", initial_state=0.5, return_sequences=True)(masked),
        *kb.Bidirectional(kb.SimpleRNNCell(U), merge_mode=None,
                          backward_layer=kb.Recurrent(kb.GRUCell(U, reset_after=False), reverse=True))(masked),
        kb.Bidirectional(kb.LSTMCell(U), merge_mode="projection", projection_units=5,
                         projection_activation="softmax", return_sequences=True)(masked),
        kb.Recurrent(kb.GRUCell(U), reverse=True, return_sequences=True)(masked),
    ]
    model = keras.Model(inputs, outputs)
    _randomize(model, seed=22)
    return model


def _padded_inputs():
    x = X.copy()
    x[1, 4:] = 0.0
    x[2, :2] = 0.0
    x[3, :] = 0.0
    return x


@pytest.mark.slow(reason="saves and loads every layer, ~16 s")
def test_keras_file_round_trip_safe_mode(tmp_path):
    model = _every_layer_model()
    x = _padded_inputs()
    loaded = keras_round_trip(model, str(tmp_path / "every_layer.keras"), x)
    kinds = {type(layer).__name__ for layer in loaded.layers}
    assert {"Bidirectional", "Recurrent"} <= kinds
    assert type(loaded.layers[2]) is kb.Bidirectional
    # Weights came back, in the same order, not re-initialised.
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The loaded projection tagger is the oracle's.
    tagger = next(layer for layer in loaded.layers if getattr(layer, "merge_mode", "") == "projection"
                  and layer.projection.activation.__name__ == "softmax")
    weights = tagger.get_weights()
    fw = dict(zip(("kernel", "recurrent_kernel", "bias"), weights[:3]))
    bw = dict(zip(("kernel", "recurrent_kernel", "bias"), weights[3:6]))
    proj = dict(zip(("V_f", "V_b", "c"), weights[6:]))
    mask = np.any(x != 0.0, axis=-1)
    expected, _, _ = ref.bidirectional("lstm", fw, bw, x, mask, "projection", proj, "softmax")
    np.testing.assert_allclose(tagger(x, mask=mask), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow(reason="a fresh Python process, ~15 s")
def test_keras_file_loads_in_a_fresh_process(tmp_path):
    """Registration happens at `import keras_birnn`: a new interpreter loads
    the file with safe_mode=True and no custom_objects."""
    inputs = keras.Input((None, F))
    h = kb.Bidirectional(kb.GRUCell(U, reset_after=False), initial_state="learned",
                         return_sequences=True)(keras.layers.Masking(0.0)(inputs))
    outputs = kb.Bidirectional(kb.LSTMCell(U), merge_mode="projection", projection_units=3,
                               projection_activation="softmax")(h)
    model = keras.Model(inputs, outputs)
    _randomize(model, seed=26)
    x = _padded_inputs()
    path, x_path, out_path = (str(tmp_path / name) for name in ("fresh.keras", "x.npy", "out.npy"))
    model.save(path)
    np.save(x_path, x)
    run_python(
        f"""
        import numpy as np, keras
        import keras_birnn
        model = keras.saving.load_model({path!r}, safe_mode=True)
        np.save({out_path!r}, model.predict(np.load({x_path!r}), verbose=0))
        """
    )
    np.testing.assert_array_equal(np.load(out_path), model.predict(x, verbose=0))


# --- training -----------------------------------------------------------------------


@pytest.mark.slow(reason="a fit step against the oracle, ~4 s; the config round trips stay fast")
def test_fit_one_sgd_step_is_the_oracle_gradient_step():
    """model.fit (compiled, training=True) moves every weight by
    -lr * dL/dW, with dL/dW from the oracle's BPTT."""
    case = make_case("gru_reset_before", "projection_softmax", seed=23, return_sequences=True)
    inputs = keras.Input((None, F))
    model = keras.Model(inputs, case.layer(keras.layers.Masking(0.0)(inputs)))
    x = case.x.copy()
    x[~MASK] = 0.0
    target = np.random.default_rng(24).uniform(size=(B, T, 5)).astype(np.float32)
    lr = 0.5
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr), loss="mse")
    before = model.get_weights()
    history = model.fit(x, target, batch_size=B, epochs=1, shuffle=False, verbose=0)
    # The output carries the mask, so Keras's mse is the mean over valid
    # positions of the per-position mean over the last axis.
    y = case.oracle(MASK, x=x)
    per_position = np.mean((y - target) ** 2, axis=-1)
    loss = (per_position * MASK).sum() / MASK.sum()
    np.testing.assert_allclose(history.history["loss"][0], loss, rtol=1e-5)
    assert abs(loss - per_position.mean()) > 1e-3  # the mask matters
    d_output = 2.0 * (y - target) / y.shape[-1] * MASK[..., None] / MASK.sum()
    grads = case.oracle_grads(d_output, MASK)
    expected_grads = [grads[s][k] for s in ("fw", "bw") for k in ("kernel", "recurrent_kernel", "bias")]
    expected_grads += [grads["projection"][k] for k in ("V_f", "V_b", "c")]
    for w0, w1, g in zip(before, model.get_weights(), expected_grads):
        np.testing.assert_allclose(w1, w0 - lr * g, atol=1e-5, rtol=1e-4)
    assert max(np.abs(g).max() for g in expected_grads) > 1e-3


@pytest.mark.slow(reason="trains a model, ~11 s")
def test_fit_decreases_the_loss():
    """Two fit steps run; then ~20 steps on the same fixed batch lower the loss."""
    rng = np.random.default_rng(25)
    tokens = rng.integers(1, 10, size=(4, 7))
    tokens[1, 5:] = 0
    tokens[2, :3] = 0
    labels = (tokens > 4).astype(np.float32)[..., None]
    inputs = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(10, F, mask_zero=True)(inputs)
    h = kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=1,
                         projection_activation="sigmoid", return_sequences=True)(h)
    model = keras.Model(inputs, h)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy")
    initial = model.evaluate(tokens, labels, batch_size=4, verbose=0)
    first = model.fit(tokens, labels, batch_size=2, epochs=1, shuffle=False, verbose=0).history["loss"]
    assert np.isfinite(first).all()
    assert model.optimizer.iterations.numpy() == 2
    losses = model.fit(tokens[:2], labels[:2], batch_size=2, epochs=20, verbose=0).history["loss"]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0] and losses[0] < initial
    # predict agrees with a direct call after training.
    assert_all_close(model.predict(tokens, verbose=0), model(tokens), atol=1e-6, rtol=1e-6)



def _seeded_gru():
    return kb.GRUCell(U, reset_after=False, seed=5)


CONFIG_ARGUMENTS = {
    # name -> (the layer around an argument, the argument's name, the argument)
    "recurrent": (kb.Recurrent, "cell", _seeded_gru),
    "bidirectional": (kb.Bidirectional, "layer", _seeded_gru),
    "bidirectional_backward": (
        lambda backward: kb.Bidirectional(kb.GRUCell(U), backward_layer=backward),
        "backward_layer",
        lambda: kb.Recurrent(kb.GRUCell(U), reverse=True),
    ),
    "stack": (lambda cell: kb.StackedBidirectional(cell, units=(U,)), "cell", _seeded_gru),
}


@pytest.mark.parametrize("name", list(CONFIG_ARGUMENTS))
def test_constructors_take_objects_and_from_config_takes_configs(name):
    """Nested layers are deserialised in `from_config` only: a constructor
    handed a config names the argument and says what to do instead, and
    `from_config` rebuilds the same layer from its config."""
    make, argument, nested = CONFIG_ARGUMENTS[name]
    with pytest.raises(TypeError, match=rf"`{argument}` of kb\.\w+ must be an object, received a config"):
        make(keras.saving.serialize_keras_object(nested()))
    layer = make(nested())
    saved = layer.get_config()
    clone = type(layer).from_config(saved)
    assert clone.get_config() == saved
    layer.build((None, None, F))
    clone.build((None, None, F))
    clone.set_weights(layer.get_weights())
    assert_all_close(clone(X, mask=MASK), layer(X, mask=MASK))
