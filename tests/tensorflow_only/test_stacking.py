"""kb.stacked_bidirectional / kb.StackedBidirectional: seed 000's "stack two
BiGRU layers" exercise, and the stack against a NumPy oracle built layer by
layer from `ref.bidirectional`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
import reference as ref
from head_cases import B, F, extra_padding, padded_inputs
from helpers import MASK_5x6 as MASK, assert_all_close, f32, in_graph, keras_round_trip


def test_seed_exercise_two_stacked_bigrus():
    stack = kb.stacked_bidirectional("gru", units=(64, 64), reset_after=False)
    table = stack.summary_table(input_width=32)
    first, second = table
    assert (first["input_width"], first["output_width"], first["params"]) == (32, 128, 37_248)
    # The second layer reads the first's concatenation: input 128. Its count,
    # from the GRU formula: 2 directions x 3 gates x (input + recurrent + bias).
    second_params = 2 * 3 * (128 * 64 + 64 * 64 + 64)
    assert (second["input_width"], second["output_width"], second["params"]) == (128, 128, second_params)
    assert second_params == 74_112
    assert table.total_params == stack.count_params() == 37_248 + 74_112
    assert stack.compute_output_shape((None, None, 32)) == (None, None, 128)
    assert all(not bi.forward_layer.cell.reset_after for bi in stack.bidirectionals)
    printed = str(table)
    for text in ("bidirectional_0", "bidirectional_1", "37,248", "74,112", "111,360"):
        assert text in printed, printed
    # A NumPy count of the actual weights agrees.
    assert [sum(w.size for w in bi.get_weights()) for bi in stack.bidirectionals] == [37_248, 74_112]


# --- the oracle ---------------------------------------------------------------


def np_layer_norm(y, gamma, beta, epsilon=1e-3):
    mean = y.mean(-1, keepdims=True)
    var = y.var(-1, keepdims=True)
    return (y - mean) / np.sqrt(var + epsilon) * gamma + beta


def stack_with_oracle(cell, units, features=F, seed=0, kb_cell=None, oracle_kwargs=None, **kwargs):
    """A built stack with random weights and its NumPy value oracle(x, mask);
    `kb_cell` (a cell template) and `oracle_kwargs` (the oracle's cell
    arguments) for cells other than `cell`'s defaults."""
    stack = kb.stacked_bidirectional(kb_cell or cell, units, **kwargs)
    stack.build((None, None, features))
    rng = np.random.default_rng(seed + 100)
    layers = []
    width = features
    for k, bi in enumerate(stack.bidirectionals):
        fw = f32(ref.random_params(cell, width, units[k], seed + 2 * k))
        bw = f32(ref.random_params(cell, width, units[k], seed + 2 * k + 1))
        bi.set_weights(ref.keras_bidirectional_weights(fw, bw))
        norm = None
        out_width = 2 * units[k] if kwargs.get("merge_mode", "concat") == "concat" else units[k]
        if kwargs.get("layer_norm"):
            gamma = rng.uniform(0.5, 1.5, out_width).astype("float32")
            norm = [gamma, rng.uniform(-0.5, 0.5, out_width).astype("float32")]
            stack.norms[k].set_weights(norm)
        layers.append((fw, bw, norm))
        width = out_width
    merge_mode = kwargs.get("merge_mode", "concat")
    return_sequences = kwargs.get("return_sequences", True)
    residual = kwargs.get("residual", False)

    def oracle(x, mask):
        h = np.where(mask[..., None], x, 0.0)
        for k, (fw, bw, norm) in enumerate(layers):
            per_position = return_sequences or k < len(layers) - 1
            y, _, _ = ref.bidirectional(
                cell, fw, bw, h, mask, merge_mode, return_sequences=per_position, **(oracle_kwargs or {})
            )
            wants = residual[k] if isinstance(residual, (list, tuple)) else residual
            if wants and per_position and y.shape[-1] == h.shape[-1]:
                y = y + h
            if norm is not None:
                y = np_layer_norm(y, *norm)
            valid = mask[..., None] if per_position else mask.any(1)[:, None]
            h = np.where(valid, y, 0.0)
        return h

    return stack, oracle


CONFIGS = {
    "gru_concat": ("gru", (4, 4), dict()),
    "lstm_residual_norm": ("lstm", (4, 4), dict(residual=True, layer_norm=True)),
    "simple_ave_three_layers_sentence": (
        "simple", (4, 4, 2), dict(merge_mode="ave", residual=True, layer_norm=True, return_sequences=False)
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_stack_matches_oracle_eager_graph_and_padding_length(name):
    cell, units, kwargs = CONFIGS[name]
    stack, oracle = stack_with_oracle(cell, units, **kwargs)
    x = padded_inputs(seed=1, fill=np.nan)  # NaN in padded slots never reaches an output
    expected = oracle(np.nan_to_num(x), MASK)
    eager = stack(x, mask=MASK)
    assert_all_close(eager, expected, atol=3e-5)
    assert_all_close(in_graph(stack, x, mask=MASK), expected, atol=3e-5)
    # Masks flow: the stack's output mask is its input mask (sequences only).
    output_mask = stack.compute_mask(x, tf.constant(MASK))
    if kwargs.get("return_sequences", True):
        np.testing.assert_array_equal(np.asarray(output_mask), MASK)
    else:
        assert output_mask is None
    if name == "lstm_residual_norm":
        return  # (padding length: checked on the other two, to keep the suite fast)
    x_long, mask_long = extra_padding(x, MASK, extra=3, fill=np.nan)
    long_out = np.asarray(stack(x_long, mask=mask_long))
    if kwargs.get("return_sequences", True):
        assert np.all(long_out[:, -3:] == 0)
        long_out = long_out[:, :-3]
    assert_all_close(long_out, expected, atol=3e-5)


def test_every_layer_keeps_a_user_activation():
    """Each layer (both directions) is a copy of the template cell that keeps
    its function: an unregistered user function, which a copy made through
    a saved config would lose."""
    from tensorflow_only.test_cells_activations import SIGMOID_2X, SOFTER_TANH, sigmoid, softer_tanh

    template = kb.GRUCell(4, activation=softer_tanh, recurrent_activation=sigmoid)
    oracle_kwargs = {"activation": SOFTER_TANH, "recurrent_activation": SIGMOID_2X}
    stack, oracle = stack_with_oracle("gru", (4, 3), kb_cell=template, oracle_kwargs=oracle_kwargs)
    x = padded_inputs(seed=2)
    assert_all_close(stack(x, mask=MASK), oracle(x, MASK), atol=3e-5)


def test_residual_rules():
    # Layer 0 maps 3 -> 8 features (no skip possible), layer 1 maps 8 -> 8.
    stack = kb.stacked_bidirectional("gru", units=(4, 4), residual=True)
    assert [row["residual"] for row in stack.summary_table(input_width=F)] == [False, True]
    explicit = kb.stacked_bidirectional("gru", units=(4, 4), residual=[False, True])
    assert [row["residual"] for row in explicit.summary_table(input_width=F)] == [False, True]
    with pytest.raises(ValueError, match=r"residual\[0\] is True .* input width is 3 and its output width 8"):
        kb.stacked_bidirectional("gru", units=(4, 4), residual=[True, True]).build((None, None, F))
    with pytest.raises(ValueError, match="residual=True but no layer has equal input and output widths"):
        kb.stacked_bidirectional("gru", units=(4,), residual=True).build((None, None, F))
    with pytest.raises(ValueError, match="sentence vector"):
        kb.stacked_bidirectional(
            "gru", units=(4, 4), residual=[False, True], return_sequences=False
        ).build((None, None, F))
    # Input width 8 = 2 * 4: every layer can be residual.
    both = kb.stacked_bidirectional("gru", units=(4, 4), residual=True)
    assert [row["residual"] for row in both.summary_table(input_width=8)] == [True, True]


def test_dropout_between_layers_only_in_training():
    stack, oracle = stack_with_oracle("gru", (4, 4), dropout=0.5, recurrent_dropout=0.3)
    assert len(stack.dropouts) == 1  # between the two layers, not before or after
    assert all(bi.forward_layer.cell.recurrent_dropout == 0.3 for bi in stack.bidirectionals)
    x = padded_inputs(seed=2)
    expected = oracle(x, MASK)
    assert_all_close(stack(x, mask=MASK), expected, atol=3e-5)
    assert_all_close(stack(x, mask=MASK, training=False), expected, atol=3e-5)
    trained = np.asarray(stack(x, mask=MASK, training=True))
    assert np.abs(trained - expected)[MASK].max() > 1e-3
    assert np.all(trained[~MASK] == 0) and np.all(np.isfinite(trained))


def test_cell_template_and_config():
    template = kb.GRUCell(7, reset_after=False, activation="relu")
    # Equal widths: see the loop key's shape relaxation (`recurrence.tensorflow.layout`; two
    # layers of one cell type but different widths share a compiled loop).
    stack = kb.stacked_bidirectional(template, units=(3, 3), merge_mode="mul", name="encoder")
    stack.build((None, None, F))
    cells = [bi.forward_layer.cell for bi in stack.bidirectionals] + [bi.backward_layer.cell for bi in stack.bidirectionals]
    assert [c.units for c in cells] == [3, 3, 3, 3]
    assert all(not c.reset_after and c.activation is keras.activations.relu for c in cells)
    assert [(row["input_width"], row["output_width"]) for row in stack.summary_table()] == [(F, 3), (3, 3)]
    # cell kwargs override the template's configuration.
    tanh = kb.stacked_bidirectional(template, units=(3,), activation="tanh")
    assert tanh.bidirectionals[0].forward_layer.cell.activation is keras.activations.tanh
    # get_config / from_config rebuild the same stack, weights aside.
    clone = kb.StackedBidirectional.from_config(stack.get_config())
    clone.build((None, None, F))
    clone.set_weights(stack.get_weights())
    x = padded_inputs(seed=3)
    assert_all_close(clone(x, mask=MASK), stack(x, mask=MASK), atol=0)
    assert clone.name == "encoder" and clone.merge_mode == "mul"


def test_invalid_arguments():
    cases = [
        (dict(merge_mode=None), "do not give one tensor to stack on"),
        (dict(merge_mode="projection"), "do not give one tensor to stack on"),
        (dict(cell="transformer"), "cell"),
        (dict(units=()), "units"),
        (dict(units=(4, 0)), "units"),
        (dict(dropout=1.0), "dropout"),
        (dict(residual=[True]), "residual"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            kb.stacked_bidirectional(**kwargs)
    with pytest.raises(TypeError, match="keras_birnn cell"):
        kb.stacked_bidirectional(cell=keras.layers.Dense(3))


def test_summary_table_needs_a_width():
    with pytest.raises(ValueError, match="input_width"):
        kb.stacked_bidirectional("gru", units=(4,)).summary_table()


@pytest.mark.slow(reason="saves, reloads and trains a stack, ~15 s")
def test_stack_keras_round_trip_and_one_fit_step(tmp_path):
    stack, oracle = stack_with_oracle("gru", (4, 4), residual=True, layer_norm=True, dropout=0.25)
    inputs = keras.Input((None, F))
    sequence = stack(keras.layers.Masking(0.0)(inputs))
    pooled = kb.MaskedMeanPooling()(sequence)  # reads the mask the stack propagates
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(pooled))
    x = padded_inputs(seed=4)
    loaded = keras_round_trip(model, str(tmp_path / "stack.keras"), x)
    features = keras.Model(loaded.inputs[0], loaded.get_layer("out").input)(x)
    seq = oracle(x, MASK)
    expected = np.stack([seq[b, MASK[b]].mean(0) if MASK[b].any() else np.zeros(seq.shape[-1]) for b in range(B)])
    assert_all_close(features, expected, atol=3e-5)
    assert isinstance(loaded.layers[2], kb.StackedBidirectional)
    assert [r["residual"] for r in loaded.layers[2].summary_table()] == [False, True]

    y = np.random.default_rng(5).uniform(-1, 1, (B, 1)).astype("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = model.predict(x, verbose=0)
    weights_before = [w.copy() for w in model.get_weights()]
    history = model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False)
    # Dropout is active in fit, so the step's loss is not `before`'s (the
    # next test checks the fit loss exactly, without dropout).
    assert np.isfinite(history.history["loss"][0])
    changed = [not np.array_equal(a, b) for a, b in zip(weights_before, model.get_weights())]
    assert all(changed), changed
    after = model.predict(x, verbose=0)
    assert np.all(np.isfinite(after)) and not np.allclose(after, before)


@pytest.mark.slow(reason="a fit step against the oracle, ~6 s")
def test_fit_step_loss_matches_oracle_without_dropout():
    stack, oracle = stack_with_oracle("gru", (4, 4), merge_mode="sum", return_sequences=False)
    inputs = keras.Input((None, F))
    model = keras.Model(inputs, stack(keras.layers.Masking(0.0)(inputs)))
    x = padded_inputs(seed=6)
    y = np.random.default_rng(7).uniform(-1, 1, (B, 4)).astype("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_allclose(history.history["loss"][0], np.mean((oracle(x, MASK) - y) ** 2), rtol=1e-5)


def test_dtype_reaches_every_layer():
    """`kb.stacked_bidirectional(..., dtype="mixed_bfloat16")` is the stack's
    policy, not a cell setting: every layer computes in bfloat16, keeps
    float32 weights, and the output is the float32 oracle's to bfloat16
    precision."""
    stack, oracle = stack_with_oracle("gru", (4, 4), seed=7, dtype="mixed_bfloat16")
    assert stack.dtype_policy.name == "mixed_bfloat16"
    for layer in stack.bidirectionals:
        assert layer.dtype_policy.name == "mixed_bfloat16"
        assert layer.forward_layer.compute_dtype == "bfloat16"
        assert all(w.dtype == "float32" for w in layer.weights)
    x = padded_inputs(seed=8)
    expected = oracle(x, MASK)
    got = stack(x, mask=MASK)
    assert got.dtype == tf.bfloat16
    got = np.asarray(tf.cast(got, tf.float32))
    np.testing.assert_allclose(got, expected, atol=5e-2)
    assert np.abs(got - expected).max() > 1e-5  # it did compute in bfloat16
