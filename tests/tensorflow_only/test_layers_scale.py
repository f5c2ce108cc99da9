"""Scale and numerical robustness (issue 7): long sequences, large inputs,
low-precision policies, all against the NumPy oracle (float64) or, for the
low-precision policies, the same layer under float32.

The loop is a `tf.while_loop` (no Python recursion, no unrolling) whose BPTT
keeps a fixed amount per step, so memory grows linearly with T
(benchmarks/README.md, "Memory"); the 20,000-step test bounds it.
"""

import numpy as np
import pytest
import tensorflow as tf
import keras

import keras_birnn as kb
import reference as ref
from birnn_cases import CELLS as CASE_CELLS
from helpers import f32 as _f32

F, U = 3, 8
# birnn_cases's cells (name -> oracle cell, its kwargs, factory of units),
# the simple RNN with its default tanh.
CELLS = {name: CASE_CELLS[name] for name in ("simple_tanh", "gru_reset_after", "gru_reset_before", "lstm")}
# Long runs share one shape (XLA compiles once per input shape): batch 2,
# row 1 right-padded.
B, T_LONG = 2, 1000
MASK_LONG = np.arange(T_LONG)[None, :] < np.array([T_LONG, T_LONG - 77])[:, None]
UNIT_ROUNDOFF = {"mixed_float16": 2.0**-11, "mixed_bfloat16": 2.0**-8}


def _layer(cell_name, seed, **kwargs):
    """A built bidirectional layer with oracle weights; (layer, fw, bw)."""
    cell, cell_kwargs, make = CELLS[cell_name]
    rng = np.random.default_rng(seed)
    reset_after = cell_kwargs.get("reset_after", True)
    fw = _f32(ref.random_params(cell, F, U, rng, reset_after=reset_after))
    bw = _f32(ref.random_params(cell, F, U, rng, reset_after=reset_after))
    bi = kb.Bidirectional(make(U), **kwargs)
    bi.build((None, None, F))
    bi.set_weights(ref.keras_bidirectional_weights(fw, bw))
    return bi, fw, bw


def _train_step(bi, x, mask, d_outputs):
    """A training call (the BPTT path) and the gradients of
    sum(outputs * d_outputs) for the weights (forward kernel, recurrent
    kernel, bias, then backward's) and the inputs; all as float32 NumPy.
    Low-precision outputs are checked to be in the compute dtype."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = bi(x, mask=mask, training=True)
        outputs = y if isinstance(y, (list, tuple)) else [y]
        assert all(o.dtype == bi.compute_dtype for o in outputs)
        loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32) * d) for o, d in zip(outputs, d_outputs)])
    grads = tape.gradient(loss, bi.trainable_variables + [x])
    as_np = lambda t: tf.cast(t, tf.float32).numpy()  # noqa: E731
    return [as_np(o) for o in outputs], [as_np(g) for g in grads]


def _peak_rss_mb_reset():
    """Resets the kernel's peak-RSS counter; returns the resident MB, or
    None where /proc/self/clear_refs is not available."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return _status_mb("VmRSS")


def _status_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return None


# --- 20,000 steps ---------------------------------------------------------------------------

T_HUGE = 20_000
WINDOW, WARMUP = 40, 150  # gradient windows and the steps the oracle replays before them
FW_AT, BW_AT = 12_000, 6_000
# Measured 184 MB in a fresh process, XLA compilation included (the loop's
# own share is ~1.5 KB per step, 30 MB); anything quadratic in T would need
# at least 20,000^2 floats = 1.6 GB.
MEMORY_BOUND_MB = 400


@pytest.mark.slow
def test_twenty_thousand_steps_forward_and_backward_with_gradients():
    """T = 20,000, both directions, training call with gradients.

    Values: the whole sequences and final states against the oracle.
    Gradients: the loss reads the forward outputs on [12000, 12040) and the
    backward ones on [6000, 6040) only. The BPTT walks all 20,000 steps; the
    oracle replays each direction over its window plus 150 steps before it
    (in its reading order), started from the layer's own state there. What
    flows further back is below 1e-7 (asserted on the oracle), so the
    weights' and inputs' gradients must equal the oracle's, and the inputs'
    gradient must vanish outside the replayed spans.
    """
    bi, fw, bw = _layer("gru_reset_after", seed=80, merge_mode=None, return_sequences=True, return_state=True)
    rng = np.random.default_rng(81)
    x = rng.normal(size=(B, T_HUGE, F)).astype(np.float32)
    mask = np.ones((B, T_HUGE), bool)
    mask[1, T_HUGE - 1000:] = False
    d_f, d_b = np.zeros((B, T_HUGE, U), np.float32), np.zeros((B, T_HUGE, U), np.float32)
    d_f[:, FW_AT:FW_AT + WINDOW] = rng.normal(size=(B, WINDOW, U))
    d_b[:, BW_AT:BW_AT + WINDOW] = rng.normal(size=(B, WINDOW, U))

    before = _peak_rss_mb_reset()
    (out_f, out_b, fin_f, fin_b), grads = _train_step(bi, x, mask, [d_f, d_b])
    if before is not None:
        grown = _status_mb("VmHWM") - before
        assert grown < MEMORY_BOUND_MB, f"a 20,000-step training call took {grown:.0f} MB"
    for g in grads:
        assert np.isfinite(g).all()

    ref_f, ref_fin_f = ref.run_direction("gru", fw, x, mask, reverse=False)
    ref_b, ref_fin_b = ref.run_direction("gru", bw, x, mask, reverse=True)
    for actual, expected in ((out_f, ref_f), (out_b, ref_b), (fin_f, ref_fin_f[0]), (fin_b, ref_fin_b[0])):
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)

    start, stop = FW_AT - WARMUP, FW_AT + WINDOW
    g_f = ref.direction_grads("gru", fw, x[:, start:stop], d_f[:, start:stop],
                              initial_state=[out_f[:, start - 1]])
    start_b, stop_b = BW_AT, BW_AT + WINDOW + WARMUP
    g_b = ref.direction_grads("gru", bw, x[:, start_b:stop_b], d_b[:, start_b:stop_b], reverse=True,
                              initial_state=[out_b[:, stop_b]])
    for g in (g_f, g_b):  # the truncation is sound: nothing left to flow further
        assert np.abs(g["initial"][0]).max() < 1e-7 * np.abs(g["x"]).max()
    expected = [g_f[k] for k in ("kernel", "recurrent_kernel", "bias")]
    expected += [g_b[k] for k in ("kernel", "recurrent_kernel", "bias")]
    for actual, e in zip(grads[:6], expected):
        np.testing.assert_allclose(actual, e, atol=1e-4 * np.abs(e).max(), rtol=1e-4)
    d_x = grads[6]
    np.testing.assert_allclose(d_x[:, start:stop], g_f["x"], atol=1e-6, rtol=1e-4)
    np.testing.assert_allclose(d_x[:, start_b:stop_b], g_b["x"], atol=1e-6, rtol=1e-4)
    outside = np.ones(T_HUGE, bool)
    outside[start:stop] = outside[start_b:stop_b] = False
    assert np.abs(d_x[:, outside]).max() < 1e-7


# --- large inputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("cell_name", list(CELLS))
def test_large_inputs_saturate_without_nan(cell_name):
    """Inputs of magnitude 1e4 over 1,000 steps drive tanh and sigmoid deep
    into saturation (and the LSTM cell state up to ~T): outputs and
    gradients stay finite and equal the oracle's (whose sigmoid cannot
    overflow). Gradients are compared relative to their largest entry."""
    cell, cell_kwargs, _ = CELLS[cell_name]
    bi, fw, bw = _layer(cell_name, seed=82, return_sequences=True)
    rng = np.random.default_rng(83)
    x = (1e4 * rng.normal(size=(B, T_LONG, F))).astype(np.float32)
    d = rng.normal(size=(B, T_LONG, 2 * U)).astype(np.float32)
    (y,), grads = _train_step(bi, x, MASK_LONG, [d])
    assert np.isfinite(y).all() and all(np.isfinite(g).all() for g in grads)
    expected, _, _ = ref.bidirectional(cell, fw, bw, x, MASK_LONG, **cell_kwargs)
    np.testing.assert_allclose(y, expected, atol=1e-3, rtol=0)
    assert np.abs(y).max() > 0.99, "inputs this large must saturate"
    oracle = ref.bidirectional_grads(cell, fw, bw, x, d, MASK_LONG, **cell_kwargs)
    expected = [oracle[side][k] for side in ("fw", "bw") for k in ("kernel", "recurrent_kernel", "bias")]
    for actual, e in zip(grads, expected + [oracle["x"]]):
        np.testing.assert_allclose(actual, e, atol=1e-3 * np.abs(e).max(), rtol=0)


# --- low-precision policies ------------------------------------------------------------------


def _under_policy(policy, cell_name, seed, x, d):
    """(float32 outputs and gradients, low-precision ones, output dtype) of
    the same weights; restores the float32 policy whatever happens."""
    reference, _, _ = _layer(cell_name, seed, return_sequences=True)
    exact = _train_step(reference, x, MASK_LONG, [d])
    try:
        keras.mixed_precision.set_global_policy(policy)
        low = kb.Bidirectional(CELLS[cell_name][2](U), return_sequences=True)
        low.build((None, None, F))
        low.set_weights(reference.get_weights())
        result = _train_step(low, x, MASK_LONG, [d])
        dtype = tf.as_dtype(low.compute_dtype)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return exact, result, dtype


@pytest.mark.slow(reason="long runs under two policies, ~3.5 s")
@pytest.mark.parametrize("cell_name", ["gru_reset_after", "lstm"])
@pytest.mark.parametrize("policy", list(UNIT_ROUNDOFF))
def test_low_precision_long_runs_track_float32(policy, cell_name):
    """1,000 steps under mixed_float16 / mixed_bfloat16 at ordinary input
    magnitudes: finite, outputs within 8 unit roundoffs of float32 at every
    position (the recurrence damps rounding errors, it does not accumulate
    them), the inputs' and input kernels' gradients within 8 u of their
    largest entry."""
    u = UNIT_ROUNDOFF[policy]
    rng = np.random.default_rng(84)
    x = rng.normal(size=(B, T_LONG, F)).astype(np.float32)
    d = rng.normal(size=(B, T_LONG, 2 * U)).astype(np.float32)
    (exact_y, exact_g), (low_y, low_g), dtype = _under_policy(policy, cell_name, 85, x, d)
    assert dtype.name == policy.split("_")[1]
    assert np.isfinite(low_y[0]).all() and all(np.isfinite(g).all() for g in low_g)
    np.testing.assert_allclose(low_y[0], exact_y[0], atol=8 * u, rtol=0)
    for index in (0, 3, 6):  # forward kernel, backward kernel, inputs
        scale = np.abs(exact_g[index]).max()
        np.testing.assert_allclose(low_g[index], exact_g[index], atol=8 * u * scale, rtol=0)


@pytest.mark.parametrize("policy", list(UNIT_ROUNDOFF))
def test_low_precision_recurrent_gradients_over_long_runs(policy):
    """The recurrent kernel's and bias's gradients, sums over 1,000 steps,
    within 4 unit roundoffs u of their largest float32 entry, as the input
    kernel's are: the BPTT sums over time in float32 (it summed in the
    compute dtype before: 8.8 u in float16, 14.5 u in bfloat16)."""
    u = UNIT_ROUNDOFF[policy]
    rng = np.random.default_rng(84)
    x = rng.normal(size=(B, T_LONG, F)).astype(np.float32)
    d = rng.normal(size=(B, T_LONG, 2 * U)).astype(np.float32)
    (_, exact_g), (_, low_g), _ = _under_policy(policy, "gru_reset_after", 85, x, d)
    for index in (1, 2, 4, 5):
        scale = np.abs(exact_g[index]).max()
        np.testing.assert_allclose(low_g[index], exact_g[index], atol=4 * u * scale, rtol=0)


@pytest.mark.parametrize("cell_name", ["gru_reset_after", "lstm"])
@pytest.mark.parametrize("policy", list(UNIT_ROUNDOFF))
def test_low_precision_large_inputs_stay_finite(policy, cell_name):
    """Inputs of magnitude 1e4 over 1,000 steps under mixed_float16 /
    mixed_bfloat16: no NaN or inf in outputs or gradients, outputs within
    the activations' range, and equal to float32's wherever the units are
    saturated. At this magnitude the low-precision input projection is off
    by ~5 (float16) or ~40 (bfloat16) in absolute terms, so a unit whose
    pre-activation is that close to 0 can differ by O(1): such positions
    must stay rare (< 1%)."""
    u = UNIT_ROUNDOFF[policy]
    rng = np.random.default_rng(86)
    x = (1e4 * rng.normal(size=(B, T_LONG, F))).astype(np.float32)
    d = rng.normal(size=(B, T_LONG, 2 * U)).astype(np.float32)
    (exact_y, _), (low_y, low_g), _ = _under_policy(policy, cell_name, 87, x, d)
    assert np.isfinite(low_y[0]).all() and all(np.isfinite(g).all() for g in low_g)
    assert np.abs(low_y[0]).max() <= 1.0
    off = np.abs(low_y[0] - exact_y[0]) > 8 * u
    assert off.mean() < 0.01, f"{off.mean():.2%} of the outputs differ from float32 by more than 8 u"
