"""kb.diagnostics: per-direction norms (seed 000, figure 17-5), projection
contributions and the PNG plot, against NumPy and against program 095."""

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
import reference as ref
from head_cases import F, U, bidirectional, extra_padding, padded_inputs
from helpers import MASK_5x6 as MASK, keras_round_trip

# --- figure 17-5: program 095 (a BiGRU, hidden 3) -----------------------------


def glibc_rand(seed, count):
    """glibc's rand() after srand(seed) (the TYPE_3 additive generator)."""
    r = [0] * (344 + count)
    r[0] = seed
    for i in range(1, 31):
        hi, lo = divmod(r[i - 1], 127773)
        word = 16807 * lo - 2836 * hi
        r[i] = word + 2147483647 if word < 0 else word
    for i in range(31, 34):
        r[i] = r[i - 31]
    for i in range(34, 344 + count):
        r[i] = (r[i - 31] + r[i - 3]) & 0xFFFFFFFF
    return [v >> 1 for v in r[344:]]


def program_095_weights():
    """gru_init(&fwd_cell); gru_init(&bwd_cell) with srand(42), in float32
    exactly as the C code computes randf()*0.4f-0.2f and randf()*0.2f-0.1f."""
    draws = iter(glibc_rand(42, 2 * 3 * (3 + 9)))
    randf = lambda: np.float32(next(draws)) / np.float32(2147483647)  # noqa: E731
    cells = []
    for _ in range(2):
        w = np.zeros((3, 3), np.float32)  # W_z, W_r, W_s per unit
        u = np.zeros((3, 3, 3), np.float32)  # U_z, U_r, U_s [gate][i][j]
        for i in range(3):
            for g in range(3):
                w[g, i] = randf() * np.float32(0.4) - np.float32(0.2)
            for j in range(3):
                for g in range(3):
                    u[g, i, j] = randf() * np.float32(0.2) - np.float32(0.1)
        # Keras layout: x @ kernel, h @ recurrent_kernel, columns [z | r | h].
        # The C candidate is r_i * sum_j U_s[i][j] h_j: Keras's reset_after=True.
        kernel = w.reshape(1, 9)
        recurrent = np.concatenate([u[g].T for g in range(3)], axis=1)
        cells.append([kernel, recurrent, np.zeros((2, 9), np.float32)])
    return cells[0] + cells[1]


SEQ_095 = np.array([0.5, -0.2, 0.8, 0.1, -0.5, 0.3, 0.9, -0.1], "float32")
# Program 095 compiled with gcc -O0 (glibc rand), printf raised to %.6f:
# |fwd| and |bwd| per position. The book's printed figure came from another
# C library's rand() (0.054/0.056 at t=0), so only the pattern carries over:
# at t=3 the backward state is almost empty while the forward one is not.
FIG_17_5_GLIBC = np.array(
    [
        [0.050084, 0.082574],
        [0.006297, 0.028774],
        [0.083710, 0.110973],
        [0.052278, 0.004918],
        [0.021923, 0.018445],
        [0.019190, 0.098949],
        [0.100454, 0.115374],
        [0.041490, 0.013679],
    ]
)


def test_figure_17_5_direction_norms():
    bi = kb.Bidirectional(kb.GRUCell(3, reset_after=True), return_sequences=True)
    bi.build((None, None, 1))
    bi.set_weights(program_095_weights())
    norms = kb.diagnostics.direction_norms(bi, SEQ_095[None, :, None])
    table = np.stack([norms.forward[0], norms.backward[0]], -1)
    np.testing.assert_allclose(table, FIG_17_5_GLIBC, atol=2e-6)
    assert norms.mask.all()
    assert norms.forward[0, 3] / norms.backward[0, 3] > 10  # one direction carries t=3


# --- norms on padded batches -------------------------------------------------------


def np_norms(cell, oracle, x, mask):
    out_f, _ = ref.run_direction(cell, oracle.fw, x, mask, reverse=False)
    out_b, _ = ref.run_direction(cell, oracle.bw, x, mask, reverse=True)
    return np.linalg.norm(out_f, axis=-1), np.linalg.norm(out_b, axis=-1)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_direction_norms_match_numpy_on_padded_batch(cell):
    bi, oracle = bidirectional(cell, return_sequences=(cell == "gru"))
    x = padded_inputs(seed=1, fill=np.nan)
    clean = np.nan_to_num(x)
    forward, backward = np_norms(cell, oracle, clean, MASK)
    norms = kb.diagnostics.direction_norms(bi, x, mask=MASK)
    np.testing.assert_allclose(norms.forward, forward, atol=2e-6)
    np.testing.assert_allclose(norms.backward, backward, atol=2e-6)
    np.testing.assert_array_equal(norms.mask, MASK)
    assert np.all(np.isfinite(norms.forward)) and np.all(np.isfinite(norms.backward))
    assert np.all(norms.forward[~MASK] == 0) and np.all(norms.backward[~MASK] == 0)
    # Extra padding changes nothing at the valid positions.
    x_long, mask_long = extra_padding(x, MASK, extra=2, fill=np.nan)
    longer = kb.diagnostics.direction_norms(bi, x_long, mask=mask_long)
    np.testing.assert_allclose(longer.forward[:, : MASK.shape[1]], forward, atol=2e-6)
    np.testing.assert_allclose(longer.backward[:, : MASK.shape[1]], backward, atol=2e-6)
    # Without a mask every position is valid.
    unmasked = kb.diagnostics.direction_norms(bi, clean[:1])
    assert unmasked.mask.all()
    np.testing.assert_allclose(
        unmasked.forward, np_norms(cell, oracle, clean[:1], np.ones((1, MASK.shape[1]), bool))[0], atol=2e-6
    )


@pytest.mark.slow(reason="traces every model kind for unknown sizes, ~12 s")
def test_direction_states_in_graph_with_unknown_batch_and_time():
    bi, oracle = bidirectional("gru", return_sequences=True)
    x = padded_inputs(seed=2)

    @tf.function(input_signature=[tf.TensorSpec([None, None, F]), tf.TensorSpec([None, None], tf.bool)])
    def states(inputs, mask):
        return kb.diagnostics.direction_states(bi, inputs, mask)

    forward, backward, mask = states(x, MASK)
    out_f, _ = ref.run_direction("gru", oracle.fw, x, MASK, reverse=False)
    out_b, _ = ref.run_direction("gru", oracle.bw, x, MASK, reverse=True)
    np.testing.assert_allclose(forward.numpy(), out_f, atol=2e-6)
    np.testing.assert_allclose(backward.numpy(), out_b, atol=2e-6)
    np.testing.assert_array_equal(mask.numpy(), MASK)


def test_direction_states_are_the_call_s_directions_and_not_counted():
    """`direction_states` runs the layer's own `run_directions`: the
    layer's unmerged outputs (to float rounding: the call's loop is
    compiled by its own policy), without counting in its `loop_report()`."""
    bi, _ = bidirectional("lstm", merge_mode=None, return_sequences=True)
    x = padded_inputs(seed=3)
    before = bi.loop_report()
    forward, backward, _ = kb.diagnostics.direction_states(bi, x, MASK)
    assert bi.loop_report() == before
    call_forward, call_backward = bi(x, mask=MASK)
    assert bi.loop_report() != before
    np.testing.assert_allclose(forward.numpy(), call_forward.numpy(), atol=1e-6)
    np.testing.assert_allclose(backward.numpy(), call_backward.numpy(), atol=1e-6)


# --- projection contributions -------------------------------------------------------


@pytest.mark.slow(reason="~3 s; test_direction_norms_match_numpy_on_padded_batch stays fast")
def test_direction_contributions_sum_to_the_pre_activation():
    bi, oracle = bidirectional(
        "gru", merge_mode="projection", projection_units=5, projection_activation="softmax", return_sequences=True
    )
    x = padded_inputs(seed=3)
    parts = kb.diagnostics.direction_contributions(bi, x, mask=MASK)
    out_f, _ = ref.run_direction("gru", oracle.fw, x, MASK, reverse=False)
    out_b, _ = ref.run_direction("gru", oracle.bw, x, MASK, reverse=True)
    p = oracle.projection
    np.testing.assert_allclose(parts.forward, out_f @ p["V_f"], atol=2e-6)
    np.testing.assert_allclose(parts.backward, out_b @ p["V_b"], atol=2e-6)
    np.testing.assert_allclose(parts.bias, p["c"], atol=0)
    logits = parts.forward + parts.backward + parts.bias
    probs = np.asarray(bi(x, mask=MASK))
    expected = oracle(x, MASK)[0]
    np.testing.assert_allclose(probs, expected, atol=2e-6)
    softmax = np.exp(logits - logits.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    np.testing.assert_allclose(softmax[MASK], probs[MASK], atol=2e-6)
    assert np.all(parts.forward[~MASK] == 0) and np.all(parts.backward[~MASK] == 0)
    np.testing.assert_array_equal(parts.mask, MASK)
    with pytest.raises(ValueError, match="merge_mode='projection'"):
        kb.diagnostics.direction_contributions(bidirectional("gru")[0], x)


# --- models, stacks, layer selection ------------------------------------------------------


def tokens_batch(vocab=9):
    tokens = np.random.default_rng(4).integers(1, vocab, MASK.shape)
    tokens[~MASK] = 0
    return tokens


@pytest.mark.slow(reason="builds every model and stack, ~9 s")
def test_models_and_stacks(tmp_path):
    tokens = tokens_batch()
    inputs = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(9, F, mask_zero=True, name="embed")(inputs)
    stack = kb.stacked_bidirectional("gru", units=(U, U), name="stack")
    encoded = stack(embedded)
    tagger, oracle = bidirectional(
        "gru", features=2 * U, merge_mode="projection", projection_units=3, return_sequences=True, name="tags"
    )
    model = keras.Model(inputs, tagger(encoded))
    x = np.asarray(model.get_layer("embed")(tokens))

    with pytest.raises(ValueError, match="choose one with `layer=`"):
        kb.diagnostics.direction_norms(model, tokens)
    with pytest.raises(ValueError, match="none of the bidirectional layers"):
        kb.diagnostics.direction_norms(model, tokens, layer="missing")

    # The projection layer on top: its input is the stack's output, its mask
    # the Embedding's, both computed by the model.
    top = kb.diagnostics.direction_contributions(model, tokens, layer="tags")
    seq = np.asarray(stack(x, mask=MASK))
    out_f, _ = ref.run_direction("gru", oracle.fw, seq, MASK, reverse=False)
    np.testing.assert_allclose(top.forward, out_f @ oracle.projection["V_f"], atol=3e-6)
    np.testing.assert_array_equal(top.mask, MASK)
    assert np.array_equal(kb.diagnostics.direction_norms(model, tokens, layer=2).forward,
                          kb.diagnostics.direction_norms(model, tokens, layer="tags").forward)

    # The second layer inside the stack reads the first's concatenated output.
    first = stack.bidirectionals[0]
    first_out = np.asarray(first(x, mask=MASK))
    second_weights = stack.bidirectionals[1].get_weights()
    fw = dict(kernel=second_weights[0], recurrent_kernel=second_weights[1], bias=second_weights[2])
    expected_f = np.linalg.norm(ref.run_direction("gru", fw, first_out, MASK)[0], axis=-1)
    via_model = kb.diagnostics.direction_norms(model, tokens, layer="stack/bidirectional_1")
    via_stack = kb.diagnostics.direction_norms(stack, x, mask=MASK, layer=1)
    np.testing.assert_allclose(via_model.forward, expected_f, atol=3e-6)
    np.testing.assert_allclose(via_stack.forward, expected_f, atol=3e-6)
    np.testing.assert_array_equal(via_model.mask, MASK)

    # A reloaded model gives the same diagnostics.
    loaded = keras_round_trip(model, str(tmp_path / "tagger.keras"), tokens)
    again = kb.diagnostics.direction_norms(loaded, tokens, layer="stack/bidirectional_1")
    np.testing.assert_allclose(again.forward, via_model.forward, atol=0)


# --- the plot ---------------------------------------------------------------------------


def test_plot_direction_norms_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    bi, _ = bidirectional("gru", return_sequences=True)
    path = kb.diagnostics.plot_direction_norms(
        bi, padded_inputs(seed=5), str(tmp_path / "norms.png"), mask=MASK, rows=[1, 3, 4], title="BiGRU"
    )
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    bi, _ = bidirectional("gru", return_sequences=True)
    with pytest.raises(ImportError, match=r"pip install keras-birnn\[plot\]"):
        kb.diagnostics.plot_direction_norms(bi, padded_inputs(seed=5), str(tmp_path / "n.png"))


def test_old_name_inspect_warns_and_is_the_diagnostics_module():
    with pytest.warns(DeprecationWarning, match="kb.diagnostics"):
        old = kb.inspect
    assert old is kb.diagnostics
    with pytest.raises(AttributeError, match="no_such_name"):
        kb.no_such_name
