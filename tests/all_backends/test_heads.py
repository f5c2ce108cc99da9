"""The sentence heads, the nested encoder, the stacked builders and the
direction diagnostics on every backend, against the NumPy oracle.

Runs on TensorFlow, JAX and PyTorch (`KERAS_BACKEND`; CI runs all three):
the four pooling heads on every mask pattern (right, left, holes, fully
masked rows), eager and traced (`portable.traced`), with gradients by the
backend's autodiff against central differences of the float64 oracle;
`kb.NestedEncoder` and `kb.StackedBidirectional` against `ref.bidirectional`;
and the layer contract (`fit` lowers the loss, `predict`, `.keras` files).
Imports no TensorFlow (`tests/backend_harness.py`).
"""

import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from head_cases import F, U, bidirectional, extra_padding, padded_inputs
from helpers import MASK_4x6, MASK_5x6, PADDING_PATTERNS_4x6, assert_all_close, f32, keras_round_trip
from backend_harness import to_numpy, traced, value_and_gradients

MASKS = dict(PADDING_PATTERNS_4x6, mixed=MASK_4x6, unmasked=None)
D = 4  # the pooled sequences' features (two directions of 2)

# --- the NumPy oracle of the heads (float64) -------------------------------------------------------


def _valid(mask, seq):
    return np.ones(seq.shape[:2], bool) if mask is None else np.asarray(mask, bool)


def np_mean(seq, mask):
    mask = _valid(mask, seq)
    return np.stack([seq[b, mask[b]].mean(0) if mask[b].any() else np.zeros(seq.shape[-1]) for b in range(len(seq))])


def np_max(seq, mask):
    mask = _valid(mask, seq)
    return np.stack([seq[b, mask[b]].max(0) if mask[b].any() else np.zeros(seq.shape[-1]) for b in range(len(seq))])


def np_attention(seq, mask, kernel, bias, score_kernel):
    """(pooled, weights): the additive attention's masked softmax."""
    mask = _valid(mask, seq)
    seq = np.where(mask[..., None], seq, 0.0)
    scores = np.tanh(seq @ kernel + bias) @ score_kernel[:, 0]
    weights = np.zeros(mask.shape)
    for b in range(len(seq)):
        if mask[b].any():
            e = np.exp(scores[b, mask[b]] - scores[b, mask[b]].max())
            weights[b, mask[b]] = e / e.sum()
    return np.einsum("bt,btd->bd", weights, seq), weights


def np_final(seq, mask):
    """[first half at the last valid step, second half at the first]."""
    mask, half = _valid(mask, seq), seq.shape[-1] // 2
    out = np.zeros((len(seq), seq.shape[-1]))
    for b in range(len(seq)):
        steps = np.flatnonzero(mask[b])
        if steps.size:
            out[b] = np.concatenate([seq[b, steps[-1], :half], seq[b, steps[0], half:]])
    return out


class PairedFinalStatePooling(keras.layers.Layer):
    """`kb.FinalStatePooling` on the pair [h_f, h_b] = the two halves of one
    tensor: `portable.traced` and `value_and_gradients` take one input."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.head = kb.FinalStatePooling()
        self.supports_masking = True

    def build(self, input_shape):
        self.head.build([input_shape, input_shape])

    def call(self, inputs, mask=None):
        half = inputs.shape[-1] // 2
        return self.head([inputs[..., :half], inputs[..., half:]], mask=None if mask is None else [mask, mask])

    def compute_mask(self, inputs, mask=None):
        return None


def head_and_oracle(kind, width=D, seed=5):
    """A head built for `width` features and `oracle(seq, mask,
    params=None)`, the float64 value of its (first) output; `params`
    replaces the attention's weights."""
    plain = {"mean": (kb.MaskedMeanPooling, np_mean), "max": (kb.MaskedMaxPooling, np_max),
             "final": (PairedFinalStatePooling, np_final)}
    if kind in plain:
        head, oracle = plain[kind][0](), plain[kind][1]
        head.build((None, None, width))
        return head, lambda s, m, params=None: oracle(s, m)
    head = kb.AttentionPooling(3, return_weights=True)
    head.build((None, None, width))
    rng = np.random.default_rng(seed)
    head.set_weights([rng.uniform(-1, 1, w.shape).astype("float32") for w in head.get_weights()])
    weights = [np.float64(w) for w in head.get_weights()]
    return head, lambda s, m, params=None: np_attention(s, m, *(params or weights))[0]


HEADS = ("mean", "max", "attention", "final")


def _pooled(outputs):
    """The pooled vector of a head's outputs (the attention's come with its weights)."""
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def poisoned_sequence(mask, seed=0):
    """`[4, 6, D]` float32 with NaN in every padded slot."""
    seq = np.random.default_rng(seed).uniform(-1, 1, (4, 6, D)).astype("float32")
    return seq if mask is None else np.where(mask[..., None], seq, np.nan).astype("float32")


# --- the heads against the oracle ------------------------------------------------------------------


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("kind", HEADS)
def test_head_matches_oracle_eager_and_traced(kind, mask_name):
    """NaN in padded slots never reaches the output; rows with no valid
    position give zeros; traced with unknown batch and time on TensorFlow."""
    mask = MASKS[mask_name]
    head, oracle = head_and_oracle(kind)
    seq = poisoned_sequence(mask)
    expected = oracle(np.nan_to_num(seq).astype(np.float64), mask)
    eager, graph = to_numpy(head(seq, mask=mask)), traced(head, seq, mask)
    assert_all_close(_pooled(eager), expected, atol=2e-6)
    assert_all_close(_pooled(graph), expected, atol=2e-6)
    if kind == "attention":  # the weights too: exactly 0 at padded positions
        weights = np_attention(np.nan_to_num(seq), mask, *[np.float64(w) for w in head.get_weights()])[1]
        assert_all_close([eager[1], graph[1]], [weights, weights], atol=2e-6)
        assert mask is None or np.all(eager[1][~mask] == 0)


def _numeric_gradients(f, arrays, eps=1e-6):
    """Central differences of the scalar `f(*arrays)` (float64) with respect
    to each array."""
    arrays = [np.array(a, np.float64) for a in arrays]
    gradients = []
    for a in arrays:
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            saved = a[i]
            a[i] = saved + eps
            up = f(*arrays)
            a[i] = saved - eps
            down = f(*arrays)
            a[i] = saved
            g[i] = (up - down) / (2 * eps)
        gradients.append(g)
    return gradients


@pytest.mark.parametrize("mask_name", ["mixed", "holes", "unmasked"])
@pytest.mark.parametrize("kind", HEADS)
def test_head_gradients_match_central_differences(kind, mask_name):
    """The backend's gradients (inputs and weights) against central
    differences of the float64 oracle; exact zeros at padded slots."""
    mask = MASKS[mask_name]
    head, oracle = head_and_oracle(kind)
    seq = poisoned_sequence(mask, seed=1)
    d_out = np.random.default_rng(2).uniform(-1, 1, (4, D))
    weights = keras.ops.convert_to_tensor(d_out.astype("float32"))
    value, gradients = value_and_gradients(head, lambda out: keras.ops.sum(_pooled(out) * weights), seq, mask)
    clean = np.nan_to_num(seq)
    params = [np.float64(w) for w in head.get_weights()]
    loss = lambda s, *p: float(np.sum(oracle(s, mask, list(p) or None) * d_out))  # noqa: E731
    np.testing.assert_allclose(value, loss(clean, *params), rtol=1e-5, atol=1e-5)
    expected = _numeric_gradients(loss, [clean] + params)
    assert all(np.all(np.isfinite(g)) for g in gradients)
    assert_all_close(gradients, expected, atol=2e-4, rtol=1e-3)
    if mask is not None:
        assert np.all(gradients[0][~mask] == 0)


@pytest.mark.parametrize("kind", HEADS)
def test_empty_batch_and_zero_length_rows(kind):
    """A batch of no rows pools to `[0, width]`, and rows of no steps
    (masked) to zeros, eagerly on every backend."""
    head, _ = head_and_oracle(kind)
    empty_batch, no_steps = np.zeros((0, 6, D), "float32"), np.zeros((3, 0, D), "float32")
    assert _pooled(to_numpy(head(empty_batch, mask=np.zeros((0, 6), bool)))).shape == (0, D)
    assert _pooled(to_numpy(head(empty_batch))).shape == (0, D)
    if kind != "final":  # (no step holds a final state)
        assert np.all(_pooled(to_numpy(head(no_steps, mask=np.zeros((3, 0), bool)))) == np.zeros((3, D)))


def test_final_state_pooling_reads_every_form():
    """The return_state list (even: the merge_mode=None pair leads; LSTM: h,
    not c), the pair of final states, and the pair of sequences, against
    the recurrences' own final states."""
    x = padded_inputs(seed=3)
    layer, oracle = bidirectional("lstm", merge_mode=None, return_sequences=True, return_state=True)
    outputs = layer(x, mask=MASK_5x6)
    h_f, h_b, state_h_f, _, state_h_b, _ = outputs
    _, fin_f, fin_b = oracle(x, MASK_5x6)
    expected = np.concatenate([fin_f[0], fin_b[0]], -1)
    assert_all_close(to_numpy(kb.FinalStatePooling()([state_h_f, state_h_b])), expected, atol=2e-5)
    expected[~MASK_5x6.any(1)] = 0  # (the states of an empty row are its initial ones: zeros here)
    masks = [MASK_5x6, MASK_5x6] + [None] * 4
    assert_all_close(to_numpy(kb.FinalStatePooling()(outputs, mask=masks)), expected, atol=2e-5)
    pair = to_numpy(kb.FinalStatePooling()([h_f, h_b], mask=[MASK_5x6, MASK_5x6]))
    assert_all_close(pair, expected, atol=2e-5)


# --- the heads in models: oracle, .keras file, fit -------------------------------------------------


def heads_model():
    """Input -> Masking(0) -> kb.Bidirectional -> every head, as one model;
    returns (model, oracle(x, mask) of its outputs)."""
    inputs = keras.Input((None, F))
    masked = keras.layers.Masking(0.0)(inputs)
    bi, oracle = bidirectional("gru", return_sequences=True)
    pair_layer, pair_oracle = bidirectional("lstm", seed=4, merge_mode=None, return_sequences=True)
    sequence = bi(masked)
    attention, attention_oracle = head_and_oracle("attention", width=2 * U)
    outputs = [kb.MaskedMeanPooling()(sequence), kb.MaskedMaxPooling()(sequence), attention(sequence)[0],
               kb.FinalStatePooling()(pair_layer(masked))]

    def model_oracle(x, mask):
        seq = oracle(x, mask)[0]
        _, fin_f, fin_b = pair_oracle(x, mask)
        final = np.where(mask.any(1)[:, None], np.concatenate([fin_f[0], fin_b[0]], -1), 0.0)
        return [np_mean(seq, mask), np_max(seq, mask), attention_oracle(seq, mask), final]

    return keras.Model(inputs, outputs), model_oracle


def test_heads_in_a_model_match_oracle_and_round_trip(tmp_path):
    """Keras hands the propagated mask to each head: the model's outputs
    are the oracle's, whatever the padding length, and a `.keras` file
    reloads them exactly."""
    model, oracle = heads_model()
    x = padded_inputs(seed=6)
    expected = oracle(x, MASK_5x6)
    assert_all_close(model.predict(x, verbose=0), expected, atol=2e-5)
    longer, _ = extra_padding(x, MASK_5x6)
    assert_all_close(to_numpy(model(longer)), expected, atol=2e-5)
    keras_round_trip(model, str(tmp_path / "heads.keras"), x)


@pytest.mark.parametrize("kind", HEADS)
def test_each_head_fit_lowers_the_loss(kind):
    """A tiny model (Masking -> head -> Dense) trains: the loss falls and
    every weight, the attention's included, moves."""
    head, _ = head_and_oracle(kind)
    inputs = keras.Input((None, D))
    pooled = _pooled(head(keras.layers.Masking(0.0)(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    x = np.where(MASK_5x6[..., None], np.random.default_rng(7).uniform(-1, 1, MASK_5x6.shape + (D,)), 0.0)
    y = np.random.default_rng(8).uniform(-1, 1, (len(x), 1))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [np.copy(w) for w in model.get_weights()]
    losses = model.fit(x.astype("float32"), y.astype("float32"), epochs=5, batch_size=len(x), verbose=0)
    assert losses.history["loss"][-1] < losses.history["loss"][0]
    assert all(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


# --- kb.NestedEncoder ------------------------------------------------------------------------------

ITEMS, ELEMENTS = 3, 5


def nested_mask():
    """[2, items, elements]: a full item, right padding, a hole, left
    padding, one valid element, and items with none (between valid ones
    and at the end); extents 1 to 5, so that every length group has items."""
    mask = np.zeros((2, ITEMS, ELEMENTS), bool)
    mask[0, 0] = True
    mask[0, 1, [0, 2]] = True
    mask[0, 2, :2] = True
    mask[1, 0, [1, 3]] = True
    mask[1, 2, 4] = True
    return mask


def nested_oracle(oracle, x, mask):
    """The oracle over every item; zeros for items with no valid element."""
    flat_x, flat_mask = x.reshape(-1, ELEMENTS, F), mask.reshape(-1, ELEMENTS)
    out = oracle(flat_x, flat_mask)[0]
    return np.where(flat_mask.any(1)[:, None], out, 0.0).reshape(x.shape[0], ITEMS, -1)


@pytest.mark.parametrize("cell, merge_mode, length_groups, training", [
    ("gru", "concat", 3, None), ("gru", "concat", 3, True), ("lstm", "sum", 1, None),
])
def test_nested_encoder_matches_oracle(cell, merge_mode, length_groups, training):
    """Every grouping (inference groups from `grouped_from_items` valid
    items: here 0, so always) gives the oracle's numbers; so does a model's
    `predict` (traced); the output mask marks items with a valid element."""
    encoder, oracle = bidirectional(cell, merge_mode=merge_mode)
    nested = kb.NestedEncoder(encoder, length_groups=length_groups)
    x = np.random.default_rng(9).normal(size=(2, ITEMS, ELEMENTS, F)).astype("float32")
    mask = nested_mask()
    expected = nested_oracle(oracle, x, mask)
    with kb.configure_loops(grouped_from_items=0):
        assert_all_close(to_numpy(nested(x, mask=mask, training=training)), expected)
    assert np.all(to_numpy(nested(x, mask=mask))[1, 1] == 0)
    np.testing.assert_array_equal(to_numpy(nested.compute_mask(x, mask)), mask.any(-1))
    inputs, masks = keras.Input((None, None, F)), keras.Input((None, None), dtype="bool")
    model = keras.Model([inputs, masks], nested(inputs, mask=masks))
    assert_all_close(model.predict([x, mask], verbose=0), expected)


def test_nested_encoder_without_mask_and_on_no_items():
    encoder, oracle = bidirectional("gru")
    nested = kb.NestedEncoder(encoder)
    x = np.random.default_rng(10).normal(size=(2, ITEMS, ELEMENTS, F)).astype("float32")
    expected = nested_oracle(oracle, x, np.ones((2, ITEMS, ELEMENTS), bool))
    assert_all_close(to_numpy(nested(x)), expected)
    no_rows = np.zeros((0, ITEMS, ELEMENTS, F), "float32")
    assert to_numpy(nested(no_rows, mask=np.zeros((0, ITEMS, ELEMENTS), bool))).shape == (0, ITEMS, 2 * U)


def test_character_model_fits_and_round_trips(tmp_path):
    """Embedded characters (mask_zero) -> NestedEncoder -> mean over words:
    fit lowers the loss, a `.keras` file reloads it exactly."""
    chars = keras.Input((None, None), dtype="int32")
    x = keras.layers.Embedding(20, F, mask_zero=True)(chars)
    words = kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(3)))(x)
    model = keras.Model(chars, keras.layers.Dense(1)(kb.MaskedMeanPooling()(words)))
    rng = np.random.default_rng(11)
    ids = rng.integers(1, 20, size=(8, 4, 6))
    ids[:, 3] = 0  # a padding word in every sentence
    ids[:, :, 4:] = 0
    y = rng.uniform(-1, 1, (8, 1)).astype("float32")
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    losses = model.fit(ids, y, epochs=4, batch_size=8, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    keras_round_trip(model, str(tmp_path / "nested.keras"), ids)


# --- kb.stacked_bidirectional / kb.StackedBidirectional ------------------------------------------


def np_layer_norm(y, gamma, beta, epsilon=1e-3):
    return (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + epsilon) * gamma + beta


def stack_and_oracle(cell, units, seed=0, **kwargs):
    """A built `kb.stacked_bidirectional` with random weights and
    `oracle(x, mask)`: `ref.bidirectional` layer by layer, with the
    residuals, layer normalizations and zeroed padding of the stack."""
    stack = kb.stacked_bidirectional(cell, units, **kwargs)
    stack.build((None, None, F))
    rng, layers, width = np.random.default_rng(seed + 100), [], F
    merge_mode = kwargs.get("merge_mode", "concat")
    for k, bi in enumerate(stack.bidirectionals):
        fw, bw = (f32(ref.random_params(cell, width, units[k], seed + 2 * k + d)) for d in (0, 1))
        bi.set_weights(ref.keras_bidirectional_weights(fw, bw))
        width = 2 * units[k] if merge_mode == "concat" else units[k]
        norm = None
        if kwargs.get("layer_norm"):
            norm = [rng.uniform(0.5, 1.5, width).astype("float32"), rng.uniform(-0.5, 0.5, width).astype("float32")]
            stack.norms[k].set_weights(norm)
        layers.append((fw, bw, norm))

    def oracle(x, mask):
        h = np.where(mask[..., None], x, 0.0)
        for k, (fw, bw, norm) in enumerate(layers):
            per_position = kwargs.get("return_sequences", True) or k < len(layers) - 1
            y = ref.bidirectional(cell, fw, bw, h, mask, merge_mode, return_sequences=per_position)[0]
            if stack.residual_used[k]:
                y = y + h
            if norm is not None:
                y = np_layer_norm(y, *norm)
            h = np.where(mask[..., None] if per_position else mask.any(1)[:, None], y, 0.0)
        return h

    return stack, oracle


STACKS = {
    "gru_concat": ("gru", (4, 4), dict()),
    "lstm_residual_norm": ("lstm", (4, 4), dict(residual=True, layer_norm=True)),
    "simple_ave_sentence": ("simple", (4, 4, 2), dict(merge_mode="ave", residual=True, layer_norm=True,
                                                      return_sequences=False)),
}


@pytest.mark.parametrize("name", list(STACKS))
def test_stack_matches_oracle_eager_and_traced(name):
    cell, units, kwargs = STACKS[name]
    stack, oracle = stack_and_oracle(cell, units, **kwargs)
    x = padded_inputs(seed=1, fill=np.nan)  # NaN in padded slots never reaches an output
    expected = oracle(np.nan_to_num(x), MASK_5x6)
    assert_all_close(to_numpy(stack(x, mask=MASK_5x6)), expected, atol=3e-5)
    assert_all_close(traced(stack, x, MASK_5x6), expected, atol=3e-5)
    output_mask = stack.compute_mask(x, MASK_5x6)
    if kwargs.get("return_sequences", True):
        np.testing.assert_array_equal(to_numpy(output_mask), MASK_5x6)
    else:
        assert output_mask is None


def test_stack_gradients_reach_every_layer():
    """Gradients through a residual, normalized stack: finite, exact zeros
    at padded slots, and the loss's change along them matches a step."""
    stack, oracle = stack_and_oracle("gru", (4, 4), residual=True, layer_norm=True)
    x = padded_inputs(seed=2, fill=np.nan)
    _, gradients = value_and_gradients(stack, lambda y: keras.ops.sum(y ** 2), x, MASK_5x6)
    assert all(np.all(np.isfinite(g)) for g in gradients)
    assert np.all(gradients[0][~MASK_5x6] == 0)
    assert all(np.abs(g).max() > 0 for g in gradients)  # every weight of every layer
    clean, eps = np.nan_to_num(x).astype(np.float64), 1e-6
    direction = np.where(MASK_5x6[..., None], np.random.default_rng(3).normal(size=x.shape), 0.0)
    change = (np.sum(oracle(clean + eps * direction, MASK_5x6) ** 2)
              - np.sum(oracle(clean - eps * direction, MASK_5x6) ** 2)) / (2 * eps)
    np.testing.assert_allclose(np.sum(gradients[0] * direction), change, rtol=1e-3, atol=1e-4)


def test_stack_in_a_model_fits_and_round_trips(tmp_path):
    """A stack (dropout, residual, layer normalization) under a mean head:
    its mask reaches the head, predict is the oracle's, fit lowers the
    loss, a `.keras` file reloads it exactly."""
    stack, oracle = stack_and_oracle("gru", (4, 4), residual=True, layer_norm=True, dropout=0.25)
    inputs = keras.Input((None, F))
    pooled = kb.MaskedMeanPooling()(stack(keras.layers.Masking(0.0)(inputs)))
    score = keras.layers.Dense(1)(pooled)
    model = keras.Model(inputs, [pooled, score])
    x = padded_inputs(seed=4)
    assert_all_close(model.predict(x, verbose=0)[0], np_mean(oracle(x, MASK_5x6), MASK_5x6), atol=3e-5)
    keras_round_trip(model, str(tmp_path / "stack.keras"), x)
    trainer = keras.Model(inputs, score)
    y = np.full((len(x), 1), 2.0, "float32")  # a target that five noisy (dropout) steps approach
    trainer.compile(optimizer=keras.optimizers.Adam(0.02), loss="mse")
    before = trainer.evaluate(x, y, verbose=0)  # (dropout makes fit's own losses noisy)
    trainer.fit(x, y, epochs=5, batch_size=len(x), verbose=0)
    assert trainer.evaluate(x, y, verbose=0) < before


# --- kb.diagnostics ------------------------------------------------------------------------------------


def test_direction_norms_and_contributions_match_oracle():
    """Per-position norms of each direction (zeros at padding), from a
    layer and from a model holding it; a projection's two contributions
    add up to its pre-activation."""
    bi, oracle = bidirectional("gru", merge_mode="projection", projection_units=3, return_sequences=True)
    x = padded_inputs(seed=12)
    out_f, _ = ref.run_direction("gru", oracle.fw, x, MASK_5x6)
    out_b, _ = ref.run_direction("gru", oracle.bw, x, MASK_5x6, reverse=True)
    norms = kb.diagnostics.direction_norms(bi, x, mask=MASK_5x6)
    valid = MASK_5x6
    assert_all_close([norms.forward, norms.backward], [np.where(valid, np.linalg.norm(o, axis=-1), 0.0)
                                                       for o in (out_f, out_b)], atol=2e-6)
    np.testing.assert_array_equal(norms.mask, MASK_5x6)
    parts = kb.diagnostics.direction_contributions(bi, x, mask=MASK_5x6)
    projection = oracle.projection
    assert_all_close([parts.forward, parts.backward, parts.bias],
                     [np.where(valid[..., None], out_f @ projection["V_f"], 0.0),
                      np.where(valid[..., None], out_b @ projection["V_b"], 0.0), projection["c"]], atol=2e-6)
    inputs = keras.Input((None, F))
    model = keras.Model(inputs, bi(keras.layers.Masking(0.0)(inputs)))
    from_model = kb.diagnostics.direction_norms(model, x)
    assert_all_close(list(from_model), list(norms), atol=0)
