"""Variable length, exactly (issue 2).

Right padding, left padding, holes and fully masked rows give, at every
valid position, what the unpadded sequence gives; padding (even NaN/inf)
never reaches a valid output or a gradient; masks come from Keras layers
and propagate through stacked layers to a masked pooling.
"""

import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from birnn_cases import CELLS, B, F, T, U, make_case
from helpers import MASK_4x6 as MASK, PADDING_PATTERNS_4x6 as PATTERNS, assert_all_close, in_graph, to_numpy

DIAGONAL = list(zip(CELLS, ["projection_softmax", "concat", "none", "sum", "projection_softmax"]))

def _with_garbage(x, mask, values):
    """`x` with the padded positions overwritten by `values` (cycled)."""
    x = x.copy()
    pads = np.argwhere(~mask)
    for k, (b, t) in enumerate(pads):
        x[b, t] = values[k % len(values)]
    return x


def _outputs(layer, x, mask=None):
    """(merged output(s) as a list, forward states, backward states)."""
    y = to_numpy(layer(x, mask=mask))
    n = layer.forward_layer.cell.state_count
    n_out = len(y) - 2 * n
    return y[:n_out], y[n_out:n_out + n], y[n_out + n:]


def _unpadded_oracle(case, x_row):
    """The oracle on one row without its padded steps, in `_outputs` form."""
    y = case.oracle(None, x=x_row)
    n = case.n_states
    return y[: len(y) - 2 * n], y[len(y) - 2 * n : len(y) - n], y[len(y) - n :]


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("cell_name, merge_name", DIAGONAL)
def test_padding_invariance(cell_name, merge_name, pattern):
    """Each row of a padded batch (padding filled with large random values)
    equals that row computed without its padded steps; padded positions
    output zeros; rows without a valid step give zeros and keep the
    boundary state. The unpadded computation is the oracle's (the layer
    equals the oracle on unpadded inputs: test_bidirectional); one test
    below runs the layer itself on each unpadded row."""
    mask = PATTERNS[pattern]
    for return_sequences in (True, False):
        case = make_case(cell_name, merge_name, seed=11, return_sequences=return_sequences, return_state=True)
        rng = np.random.default_rng(0)
        x = _with_garbage(case.x, mask, rng.normal(scale=3.0, size=(20, F)).astype(np.float32))
        out, fw_states, bw_states = _outputs(case.layer, x, mask)
        _check_rows(case, x, mask, out, fw_states + bw_states, lambda b: _unpadded_oracle(case, x[b:b + 1, mask[b]]))
        # The same in a graph with unknown sizes.
        assert_all_close(in_graph(case.layer, x, mask=mask), out + fw_states + bw_states)


def _check_rows(case, x, mask, out, states, alone):
    for b in range(B):
        valid = mask[b]
        if not valid.any():
            for y in out:
                assert np.all(y[b] == 0.0), f"row {b} has no valid step: output must be zeros"
            for s in states:  # the boundary state, untouched
                assert np.all(s[b] == 0.0)
            continue
        y_alone, fw_alone, bw_alone = alone(b)
        for y, y_row in zip(out, y_alone):
            if case.return_sequences:
                np.testing.assert_allclose(y[b, valid], y_row[0], atol=1e-5, rtol=1e-5)
                assert np.all(y[b, ~valid] == 0.0), "padded positions must be zeros"
            else:
                np.testing.assert_allclose(y[b], y_row[0], atol=1e-5, rtol=1e-5)
        for s, s_row in zip(states, fw_alone + bw_alone):
            np.testing.assert_allclose(s[b], s_row[0], atol=1e-5, rtol=1e-5)
    assert all(np.isfinite(y).all() for y in out)


@pytest.mark.parametrize("return_sequences", [True, False], ids=["seq", "last"])
def test_padding_invariance_against_the_layer_on_unpadded_rows(return_sequences):
    """The literal check: the same layer run on each row alone, unpadded."""
    mask = np.concatenate([PATTERNS["right"][:2], PATTERNS["holes"][2:3], PATTERNS["fully_masked"][:1]])
    case = make_case("gru_reset_after", "projection_softmax", seed=11, return_sequences=return_sequences,
                     return_state=True)
    x = _with_garbage(case.x, mask, np.full((1, F), 7.0, np.float32))
    out, fw_states, bw_states = _outputs(case.layer, x, mask)
    _check_rows(case, x, mask, out, fw_states + bw_states, lambda b: _outputs(case.layer, x[b:b + 1, mask[b]]))


@pytest.mark.slow(reason="outputs and gradients in eager and graph, ~5.5 s")
@pytest.mark.parametrize("mask_name", ["mixed", "beyond_longest"])
@pytest.mark.parametrize("cell_name, merge_name", DIAGONAL)
def test_nan_and_inf_in_padding_reach_no_output_or_gradient(cell_name, merge_name, mask_name):
    """NaN/inf in padded slots: outputs and gradients (weights, projection,
    inputs) are finite and equal to those with clean (zero) padding.
    `mixed`: full, right padding, left padding with a hole, fully masked;
    `beyond_longest`: steps masked in every row, which the loops skip."""
    garbage = np.array([[np.nan] * F, [np.inf] * F, [-np.inf, np.nan, 1e30]], np.float32)
    mask = MASK if mask_name == "mixed" else PATTERNS[mask_name]
    # Per-position output through the training path, sentence output through
    # an inference call's gradient.
    for return_sequences, training in ((True, True), (False, None)):
        case = make_case(cell_name, merge_name, seed=12, return_sequences=return_sequences)
        clean = _with_garbage(case.x, mask, np.zeros((1, F), np.float32))
        dirty = _with_garbage(case.x, mask, garbage)
        assert not np.isfinite(dirty).all()
        d_output = case.random_d_output()

        case.x = clean
        clean_out = to_numpy(case.layer(clean, mask=mask))
        clean_grads = case.tf_grads(d_output, mask, training=training)
        case.x = dirty
        dirty_out = to_numpy(case.layer(dirty, mask=mask))
        dirty_graph = to_numpy(in_graph(case.layer, dirty, mask=mask))
        dirty_grads = case.tf_grads(d_output, mask, training=training)
        for g in keras.tree.flatten(dirty_grads):
            assert np.isfinite(g).all()
        case.assert_grads_match(dirty_grads, clean_grads, atol=1e-6, rtol=1e-6)
        assert np.all(dirty_grads["x"][~mask] == 0.0), "padded inputs get no gradient"
        assert all(np.isfinite(y).all() for y in keras.tree.flatten(dirty_out))
        assert_all_close(dirty_out, clean_out, atol=1e-6, rtol=1e-6)
        assert_all_close(dirty_graph, clean_out, atol=1e-6, rtol=1e-6)
        # And both are the oracle's numbers.
        case.x = clean
        assert_all_close(clean_out, case.oracle(mask))
        case.assert_grads_match(clean_grads, case.oracle_grads(d_output, mask))


def test_embedding_mask_zero_in_functional_model():
    """The mask of Embedding(mask_zero=True) reaches kb.Bidirectional."""
    case = make_case("gru_reset_after", "projection_softmax", seed=14, return_sequences=True)
    tokens = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 0, 0, 0], [0, 0, 3, 5, 8, 9], [7, 0, 9, 0, 0, 0]])
    inputs = keras.Input((None,), dtype="int32")
    embedding = keras.layers.Embedding(10, F, mask_zero=True)
    model = keras.Model(inputs, case.layer(embedding(inputs)))
    mask = tokens != 0
    x = embedding.embeddings.numpy()[tokens]
    expected = case.oracle(mask, x=x)
    assert_all_close(model(tokens), expected)
    assert_all_close(model.predict(tokens, verbose=0), expected)
    assert np.abs(case.oracle(None, x=x) - expected).max() > 1e-3  # the mask matters


@pytest.mark.slow(reason="builds and runs a functional model, ~4 s")
def test_keras_masking_layer_in_functional_model():
    case = make_case("lstm", "concat", seed=15, return_sequences=False, return_state=True)
    x = case.x.copy()
    x[1, 4:] = 0.0  # right padding
    x[2, :2] = 0.0  # left padding
    x[3, 3] = 0.0  # a hole
    inputs = keras.Input((None, F))
    model = keras.Model(inputs, case.layer(keras.layers.Masking(mask_value=0.0)(inputs)))
    mask = np.any(x != 0.0, axis=-1)
    assert mask.sum() == B * T - 5
    expected = case.oracle(mask, x=x)
    assert_all_close(model(x), expected)
    assert_all_close(model.predict(x, verbose=0), expected)


@pytest.mark.slow(reason="builds and runs a functional model, ~4.5 s")
def test_mask_propagates_through_two_stacked_layers_to_pooling():
    """Embedding(mask_zero) -> BiGRU -> BiLSTM -> GlobalAveragePooling1D: the
    second layer and the pooling both see the mask (seed 000's stacking and
    sentence classification by pooling)."""
    first = make_case("gru_reset_before", "concat", seed=16, return_sequences=True)
    second = kb.Bidirectional(kb.LSTMCell(U), merge_mode="sum", return_sequences=True)
    second.build((None, None, 2 * U))
    rng = np.random.default_rng(17)
    fw2 = ref.random_params("lstm", 2 * U, U, rng)
    bw2 = ref.random_params("lstm", 2 * U, U, rng)
    second.set_weights(ref.keras_bidirectional_weights(fw2, bw2))

    tokens = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 0, 0, 0], [0, 0, 3, 5, 8, 9], [7, 0, 9, 8, 0, 0]])
    inputs = keras.Input((None,), dtype="int32")
    embedding = keras.layers.Embedding(10, F, mask_zero=True)
    h1 = first.layer(embedding(inputs))
    h2 = second(h1)
    pooled = keras.layers.GlobalAveragePooling1D()(h2)
    model = keras.Model(inputs, [h1, h2, pooled])

    mask = tokens != 0
    x = embedding.embeddings.numpy()[tokens]
    y1 = first.oracle(mask, x=x)
    y2, _, _ = ref.bidirectional("lstm", fw2, bw2, y1, mask, "sum")
    expected_pool = (y2 * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    for got in (model(tokens), model.predict(tokens, verbose=0)):
        got1, got2, got_pool = to_numpy(got)
        np.testing.assert_allclose(got1, y1, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got2, y2, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got_pool, expected_pool, atol=1e-5, rtol=1e-5)
    # Without the mask the second layer and the pooling would differ.
    y2_unmasked, _, _ = ref.bidirectional("lstm", fw2, bw2, y1, None, "sum")
    assert np.abs(y2_unmasked - y2)[mask].max() > 1e-3
    assert np.abs(y2_unmasked.mean(1) - expected_pool).max() > 1e-3


def test_compute_mask():
    x = np.zeros((B, T, F), np.float32)
    seq = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)
    np.testing.assert_array_equal(seq.compute_mask(x, MASK), MASK)
    assert kb.Bidirectional(kb.GRUCell(U)).compute_mask(x, MASK) is None
    pair = kb.Bidirectional(kb.LSTMCell(U), merge_mode=None, return_sequences=True, return_state=True)
    masks = pair.compute_mask(x, MASK)
    assert len(masks) == 2 + 4
    np.testing.assert_array_equal(masks[0], MASK)
    np.testing.assert_array_equal(masks[1], MASK)
    assert masks[2:] == [None] * 4
    rec = kb.Recurrent(kb.GRUCell(U), reverse=True, return_sequences=True)
    np.testing.assert_array_equal(rec.compute_mask(x, MASK), MASK)


def test_integer_mask_is_accepted():
    """A 0/1 integer mask means the same as the bool one."""
    case = make_case("simple_tanh", "ave", seed=18, return_sequences=True)
    expected = case.oracle(MASK)
    assert_all_close(case.layer(case.x, mask=MASK.astype(np.int32)), expected)


@pytest.mark.slow(reason="eager and graph with a projection, ~2.5 s")
def test_directional_projection_alone_keeps_the_mask():
    """kb.DirectionalProjection after merge_mode=None (seed 001's y_t =
    V_f h_f + V_b h_b + c): padded positions give zeros, not activation(c),
    and the mask reaches the pooling after it."""
    case = make_case("lstm", "none", seed=19, return_sequences=True)
    rng = np.random.default_rng(20)
    v_f, v_b = rng.normal(size=(U, 3)).astype("float32"), rng.normal(size=(U, 3)).astype("float32")
    c = rng.uniform(0.5, 1.0, size=3).astype("float32")  # tanh(c) is far from 0
    projection = kb.DirectionalProjection(3, activation="tanh")
    inputs = keras.Input((None, F))
    h_f, h_b = case.layer(keras.layers.Masking(mask_value=0.0)(inputs))
    y = projection(h_f, h_b)
    model = keras.Model(inputs, [y, keras.layers.GlobalAveragePooling1D()(y)])
    projection.set_weights([v_f, v_b, c])

    mask = PATTERNS["holes"]
    x = np.where(mask[..., None], case.x, 0.0).astype("float32")
    f, b = case.oracle(mask, x=x)
    expected = np.tanh(f @ v_f + b @ v_b + c) * mask[..., None]
    expected_pool = expected.sum(1) / mask.sum(1, keepdims=True)
    for got in (model(x), model.predict(x, verbose=0)):
        got_y, got_pool = to_numpy(got)
        np.testing.assert_allclose(got_y, expected, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got_pool, expected_pool, atol=1e-5, rtol=1e-5)
    # Without the mask the padded positions would read tanh(c), far from 0.
    assert np.abs(np.tanh(f @ v_f + b @ v_b + c)[~mask]).min() > 0.4
