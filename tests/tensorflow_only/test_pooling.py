"""Sentence-level pooling heads and the per-position tagging head, against
NumPy on padded batches (right, left, holes, a fully masked row)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from head_cases import B, F, T, U, bidirectional, extra_padding, padded_inputs
from helpers import MASK_5x6 as MASK, assert_all_close, in_graph, keras_round_trip

# --- NumPy oracles of the heads ----------------------------------------------


def np_mean(seq, mask):
    out = np.zeros((seq.shape[0], seq.shape[-1]))
    for b in range(seq.shape[0]):
        if mask[b].any():
            out[b] = seq[b, mask[b]].mean(0)
    return out


def np_max(seq, mask):
    out = np.zeros((seq.shape[0], seq.shape[-1]))
    for b in range(seq.shape[0]):
        if mask[b].any():
            out[b] = seq[b, mask[b]].max(0)
    return out


def np_attention(seq, mask, kernel, bias, score_kernel):
    seq = np.where(mask[..., None], seq, 0.0)
    scores = np.tanh(seq @ kernel + bias) @ score_kernel[:, 0]
    weights = np.zeros(mask.shape)
    for b in range(seq.shape[0]):
        if mask[b].any():
            e = np.exp(scores[b, mask[b]] - scores[b, mask[b]].max())
            weights[b, mask[b]] = e / e.sum()
    return np.einsum("bt,btd->bd", weights, seq), weights


def np_final(oracle, x, mask):
    """[h_f after the last valid step, h_b after the first]: the oracle's final
    states, computed by running the recurrences (not by indexing)."""
    _, fin_f, fin_b = oracle(x, mask)
    return np.concatenate([fin_f[0], fin_b[0]], -1)


def set_attention_weights(head, seed=5):
    rng = np.random.default_rng(seed)
    head.set_weights([rng.uniform(-1, 1, w.shape).astype("float32") for w in head.get_weights()])
    kernel, bias, score = head.get_weights()
    return kernel, bias, score


# --- building the models ------------------------------------------------------

HEADS = ("final_pair", "final_states", "mean", "max", "attention")


def head_model(kind, cell="gru", seed=0):
    """Input -> Masking(0) -> kb.Bidirectional -> head; returns (model, oracle_fn).

    oracle_fn(x, mask) is the NumPy value of the model's output.
    """
    inputs = keras.Input((None, F))
    masked = keras.layers.Masking(0.0)(inputs)
    if kind == "final_pair":
        bi, oracle = bidirectional(cell, seed=seed, merge_mode=None, return_sequences=True)
        pooled = kb.FinalStatePooling()(bi(masked))
        return keras.Model(inputs, pooled), lambda x, m: np_final(oracle, x, m)
    if kind == "final_states":
        bi, oracle = bidirectional(cell, seed=seed, return_sequences=True, return_state=True)
        pooled = kb.FinalStatePooling()(bi(masked))
        return keras.Model(inputs, pooled), lambda x, m: np_final(oracle, x, m)
    bi, oracle = bidirectional(cell, seed=seed, return_sequences=True)
    seq = lambda x, m: oracle(x, m)[0]  # noqa: E731
    if kind == "mean":
        return keras.Model(inputs, kb.MaskedMeanPooling()(bi(masked))), lambda x, m: np_mean(seq(x, m), m)
    if kind == "max":
        return keras.Model(inputs, kb.MaskedMaxPooling()(bi(masked))), lambda x, m: np_max(seq(x, m), m)
    head = kb.AttentionPooling(5, return_weights=True)
    model = keras.Model(inputs, head(bi(masked)))
    weights = set_attention_weights(head)
    return model, lambda x, m: list(np_attention(seq(x, m), m, *weights))


@pytest.mark.parametrize("kind", HEADS)
def test_head_matches_numpy_eager_graph_and_padding_length(kind):
    model, oracle = head_model(kind, cell="lstm" if kind == "final_states" else "gru")
    x = padded_inputs(seed=1)
    expected = oracle(x, MASK)
    assert_all_close(model(x), expected, atol=2e-5)
    assert_all_close(in_graph(model, x), expected, atol=2e-5)
    # More padding on the right, and the padded batch's rows in another order,
    # change nothing (the oracle runs on the unpadded rows' own lengths).
    x_long, mask_long = extra_padding(x, MASK, extra=3)
    long_out = model(x_long)
    if kind == "attention":  # weights gain zero columns for the extra steps
        long_out = [long_out[0], np.asarray(long_out[1])[:, :T]]
        assert np.all(np.asarray(model(x_long)[1])[:, T:] == 0)
    assert_all_close(long_out, expected, atol=2e-5)
    # The fully masked row gives zeros.
    assert_all_close(keras.tree.flatten(model(x))[0][4], np.zeros_like(keras.tree.flatten(expected)[0][4]), atol=0)


def test_final_state_pooling_picks_positions_not_ends():
    # Left padding and holes: the forward output at the last *valid* step and
    # the backward output at the first valid one, checked by index too.
    bi, oracle = bidirectional("gru", merge_mode=None, return_sequences=True)
    x = padded_inputs(seed=2, fill=np.nan)  # NaN in padding never reaches the output
    h_f, h_b = oracle(np.nan_to_num(x), MASK)[0]
    pooled = kb.FinalStatePooling()(bi(x, mask=MASK), mask=[MASK, MASK]).numpy()
    last = [5, 3, 5, 4]
    first = [0, 0, 2, 1]
    for b in range(4):
        np.testing.assert_allclose(pooled[b, :U], h_f[b, last[b]], atol=2e-5)
        np.testing.assert_allclose(pooled[b, U:], h_b[b, first[b]], atol=2e-5)
    assert np.all(pooled[4] == 0)
    assert_all_close(pooled, np_final(oracle, np.nan_to_num(x), MASK), atol=2e-5)


@pytest.mark.parametrize(
    "cell,merge_mode,return_sequences",
    [("lstm", "concat", False), ("lstm", None, True), ("gru", "projection", True), ("simple", None, False)],
)
def test_final_state_pooling_reads_return_state_lists(cell, merge_mode, return_sequences):
    kwargs = dict(merge_mode=merge_mode, return_sequences=return_sequences, return_state=True)
    if merge_mode == "projection":
        kwargs.update(projection_units=3)
    bi, oracle = bidirectional(cell, **kwargs)
    x = padded_inputs(seed=3)
    outputs = bi(x, mask=MASK)  # eager outputs carry the propagated masks
    expected = np_final(oracle, x, MASK)
    assert_all_close(kb.FinalStatePooling()(outputs), expected, atol=2e-5)
    if merge_mode is None and not return_sequences:
        # merge_mode=None without return_state: the pair of final states.
        plain, _ = bidirectional(cell, merge_mode=None)
        plain.set_weights(bi.get_weights())
        assert_all_close(kb.FinalStatePooling()(plain(x, mask=MASK)), expected, atol=2e-5)


def test_final_state_pooling_state_counts_for_mixed_cells():
    bi = kb.Bidirectional(kb.GRUCell(U), backward_layer=kb.Recurrent(kb.LSTMCell(U), reverse=True),
                          return_state=True, return_sequences=True)
    x = padded_inputs(seed=4)
    outputs = bi(x, mask=MASK)  # [seq, h_f, h_b, c_b]: 4 tensors, odd layout
    h_f, h_b = outputs[1].numpy(), outputs[2].numpy()
    pooled = kb.FinalStatePooling(state_counts=(1, 2))(outputs)
    expected = np.concatenate([h_f, h_b], -1)
    expected[4] = 0
    assert_all_close(pooled, expected, atol=0)
    config = kb.FinalStatePooling(state_counts=(1, 2)).get_config()
    assert kb.FinalStatePooling.from_config(config).state_counts == (1, 2)


@pytest.mark.parametrize("kind", ["final", "mean", "max", "attention"])
def test_heads_nan_in_padding_and_finite_gradients(kind):
    rng = np.random.default_rng(6)
    seq = rng.uniform(-1, 1, (B, T, 4)).astype("float32")
    seq[~MASK] = np.nan
    seq = tf.constant(seq)
    head = {
        "final": kb.FinalStatePooling(),
        "mean": kb.MaskedMeanPooling(),
        "max": kb.MaskedMaxPooling(),
        "attention": kb.AttentionPooling(3),
    }[kind]
    clean = np.where(MASK[..., None], seq.numpy(), 0.0)
    with tf.GradientTape() as tape:
        tape.watch(seq)
        out = head([seq, seq], mask=[MASK, MASK]) if kind == "final" else head(seq, mask=MASK)
        loss = tf.reduce_sum(out * tf.range(1.0, out.shape[-1] + 1.0))
    grad = tape.gradient(loss, seq).numpy()
    assert np.all(np.isfinite(out.numpy())) and np.all(np.isfinite(grad))
    assert np.all(grad[~MASK] == 0)  # padded slots get exact zeros
    assert np.all(out.numpy()[4] == 0)
    if kind == "mean":
        assert_all_close(out, np_mean(clean, MASK), atol=1e-6)
    elif kind == "max":
        assert_all_close(out, np_max(clean, MASK), atol=0)
    elif kind == "attention":
        assert_all_close(out, np_attention(clean, MASK, *head.get_weights())[0], atol=1e-6)


def test_pooling_without_mask_uses_every_position():
    seq = np.random.default_rng(7).uniform(-1, 1, (2, 5, 3)).astype("float32")
    full = np.ones((2, 5), bool)
    assert_all_close(kb.MaskedMeanPooling()(seq), np_mean(seq, full), atol=1e-6)
    assert_all_close(kb.MaskedMaxPooling()(seq), np_max(seq, full), atol=0)
    head = kb.AttentionPooling(2)
    head(seq)
    assert_all_close(head(seq), np_attention(seq, full, *head.get_weights())[0], atol=1e-6)
    assert_all_close(kb.FinalStatePooling()([seq, -seq]), np.concatenate([seq[:, -1], -seq[:, 0]], -1), atol=0)


@pytest.mark.slow(reason="saves, reloads and trains each head, ~5 s")
@pytest.mark.parametrize("kind", HEADS)
def test_head_keras_round_trip_and_one_fit_step(kind, tmp_path):
    model, oracle = head_model(kind)
    pooled = model.outputs[0]
    out = keras.layers.Dense(2, name="out")(pooled)
    trainable = keras.Model(model.inputs, out)
    x = padded_inputs(seed=8)
    loaded = keras_round_trip(trainable, str(tmp_path / f"{kind}.keras"), x)
    # The reloaded head still computes the oracle's value.
    head_out = keras.Model(loaded.inputs[0], loaded.get_layer("out").input)(x)
    assert_all_close(head_out, keras.tree.flatten(oracle(x, MASK))[0], atol=2e-5)

    y = np.random.default_rng(9).uniform(-1, 1, (B, 2)).astype("float32")
    trainable.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = trainable.predict(x, verbose=0)
    weights_before = [w.copy() for w in trainable.get_weights()]
    history = trainable.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_allclose(history.history["loss"][0], np.mean((before - y) ** 2), rtol=1e-5)
    changed = [not np.array_equal(a, b) for a, b in zip(weights_before, trainable.get_weights())]
    assert all(changed), changed  # every weight, the recurrences' included, got a gradient
    assert all(np.all(np.isfinite(w)) for w in trainable.get_weights())


# --- the per-position tagging head ------------------------------------------


def tagger(n_tags=5, vocab=11):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocab, F, mask_zero=True)(tokens)
    tags = kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=n_tags,
                            projection_activation="softmax", return_sequences=True)(x)
    model = keras.Model(tokens, tags)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def tagging_batch(n_tags=5, vocab=11):
    rng = np.random.default_rng(10)
    tokens = rng.integers(1, vocab, MASK.shape)
    tokens[~MASK] = 0
    labels = rng.integers(0, n_tags, MASK.shape)
    return tokens, labels


def np_masked_scores(probs, labels, mask):
    picked = np.take_along_axis(probs.astype(np.float64), labels[..., None], -1)[..., 0]
    loss = -np.log(picked[mask]).mean()
    accuracy = (probs.argmax(-1) == labels)[mask].mean()
    return loss, accuracy


@pytest.mark.slow(reason="trains a tagging head, ~5 s")
def test_tagging_head_loss_and_metrics_exclude_padding():
    model = tagger()
    tokens, labels = tagging_batch()
    probs = model.predict(tokens, verbose=0)
    assert np.all(probs[~MASK] == 0)  # padded positions are zeros, not a distribution
    np.testing.assert_allclose(probs[MASK].sum(-1), 1.0, atol=1e-5)
    loss, accuracy = np_masked_scores(probs, labels, MASK)
    scores = model.evaluate(tokens, labels, batch_size=B, verbose=0, return_dict=True)
    np.testing.assert_allclose(scores["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(scores["accuracy"], accuracy, rtol=1e-6)
    # Labels at padded positions are ignored altogether.
    scrambled = np.where(MASK, labels, (labels + 1) % 5)
    again = model.evaluate(tokens, scrambled, batch_size=B, verbose=0, return_dict=True)
    assert again == scores

    initial = model.get_weights()
    history = model.fit(tokens, labels, batch_size=B, epochs=1, verbose=0, shuffle=False)
    np.testing.assert_allclose(history.history["loss"][0], loss, rtol=1e-5)
    np.testing.assert_allclose(history.history["accuracy"][0], accuracy, rtol=1e-6)
    after = model.predict(tokens, verbose=0)
    assert np_masked_scores(after, labels, MASK)[0] < loss  # the step lowered the masked loss
    # The same step with other labels at padded positions: the same weights.
    stepped = model.get_weights()
    model.set_weights(initial)
    model.fit(tokens, scrambled, batch_size=B, epochs=1, verbose=0, shuffle=False)
    assert_all_close(model.get_weights(), stepped, atol=0, rtol=0)


def test_sequence_heads_accept_the_merge_none_pair():
    rng = np.random.default_rng(11)
    h_f, h_b = (rng.uniform(-1, 1, (B, T, 2)).astype("float32") for _ in range(2))
    both = np.concatenate([h_f, h_b], -1)
    assert_all_close(kb.MaskedMeanPooling()([h_f, h_b], mask=[MASK, MASK]), np_mean(both, MASK), atol=1e-6)
    assert_all_close(kb.MaskedMaxPooling()([h_f, h_b], mask=[MASK, MASK]), np_max(both, MASK), atol=0)
    head = kb.AttentionPooling(3, return_weights=True)
    pooled, weights = head([h_f, h_b], mask=[MASK, MASK])
    expected, expected_weights = np_attention(both, MASK, *head.get_weights())
    assert_all_close([pooled, weights], [expected, expected_weights], atol=1e-6)
    assert head.compute_output_shape([(None, None, 2), (None, None, 2)]) == [(None, 4), (None, None)]
