"""Self-tests of the NumPy oracle in tests/reference.py.

The oracle's hand-written BPTT is checked against central finite differences,
and its forward pass against the golden numbers of seed 000 (program 092).
"""

import math
import os
import sys

import numpy as np
import pytest

# Import the sibling module whether or not tests/ is a package.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as ref  # noqa: E402
from helpers import MASK_5x5_ONE_HOLE as MASK  # noqa: E402

EPS = 1e-6
RTOL = 1e-6
ATOL = 1e-8  # FD round-off floor for entries that are (near) zero


CELLS = {
    "simple_tanh": ("simple", {"activation": "tanh"}),
    "simple_relu": ("simple", {"activation": "relu"}),
    "gru_reset_after": ("gru", {"reset_after": True}),
    "gru_classic": ("gru", {"reset_after": False}),
    "lstm": ("lstm", {}),
}

MERGES = {**ref.MERGES, "projection_linear": ("projection", None)}


def _problem(cell, cell_kwargs, merge_mode, return_sequences, seed=0, use_bias=True):
    """Random inputs for one bidirectional configuration (all float64)."""
    rng = np.random.default_rng(seed)
    batch, steps, feat, units, out_dim = MASK.shape[0], MASK.shape[1], 2, 2, 3
    reset_after = cell_kwargs.get("reset_after", True)
    n_states = 2 if cell == "lstm" else 1
    kw = dict(
        cell=cell,
        fw_params=ref.random_params(cell, feat, units, rng, reset_after, use_bias),
        bw_params=ref.random_params(cell, feat, units, rng, reset_after, use_bias),
        x=rng.normal(size=(batch, steps, feat)),
        mask=MASK,
        merge_mode=merge_mode,
        projection=ref.random_projection(units, out_dim, rng) if merge_mode == "projection" else None,
        return_sequences=return_sequences,
        fw_initial=[rng.normal(scale=0.5, size=(batch, units)) for _ in range(n_states)],
        bw_initial=[rng.normal(scale=0.5, size=(batch, units)) for _ in range(n_states)],
        **cell_kwargs,
    )
    y = ref.bidirectional(**kw)[0]
    if isinstance(y, list):
        d_out = [rng.normal(size=v.shape) for v in y]
    else:
        d_out = rng.normal(size=y.shape)
    return kw, d_out


def _loss(kw, d_out):
    y = ref.bidirectional(**kw)[0]
    if isinstance(y, list):
        return sum(float(np.sum(a * b)) for a, b in zip(y, d_out))
    return float(np.sum(y * d_out))


def _numeric_grad(kw, d_out, arr):
    """Central differences, perturbing `arr` in place (kw holds a reference)."""
    grad = np.zeros_like(arr)
    for idx in np.ndindex(arr.shape):
        old = arr[idx]
        arr[idx] = old + EPS
        up = _loss(kw, d_out)
        arr[idx] = old - EPS
        down = _loss(kw, d_out)
        arr[idx] = old
        grad[idx] = (up - down) / (2 * EPS)
    return grad


def _pairs(kw, grads):
    """(name, input array, analytic gradient) for every differentiable input."""
    out = [("x", kw["x"], grads["x"])]
    for side in ("fw", "bw"):
        for k in ("kernel", "recurrent_kernel", "bias"):
            if kw[f"{side}_params"][k] is not None:
                out.append((f"{side}.{k}", kw[f"{side}_params"][k], grads[side][k]))
        for i, s in enumerate(kw[f"{side}_initial"]):
            out.append((f"{side}_initial[{i}]", s, grads[f"{side}_initial"][i]))
    if kw["projection"] is not None:
        for k in ("V_f", "V_b", "c"):
            out.append((f"projection.{k}", kw["projection"][k], grads["projection"][k]))
    return out


def _check_all_grads(kw, d_out):
    grads = ref.bidirectional_grads(d_output=d_out, **kw)
    if kw["projection"] is None:
        assert grads["projection"] is None
    for name, arr, analytic in _pairs(kw, grads):
        assert analytic.shape == arr.shape, name
        numeric = _numeric_grad(kw, d_out, arr)
        np.testing.assert_allclose(analytic, numeric, rtol=RTOL, atol=ATOL, err_msg=name)
    return grads


@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("merge_name", list(MERGES))
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_gradients_match_finite_differences(cell_name, merge_name, return_sequences):
    cell, cell_kwargs = CELLS[cell_name]
    merge_mode, proj_act = MERGES[merge_name]
    kw, d_out = _problem(cell, cell_kwargs, merge_mode, return_sequences)
    kw["projection_activation"] = proj_act
    _check_all_grads(kw, d_out)


@pytest.mark.parametrize(
    "cell, cell_kwargs",
    [
        ("simple", {"activation": "sigmoid"}),
        ("simple", {"activation": None}),
        ("gru", {"reset_after": True, "recurrent_activation": "hard_sigmoid"}),
        ("gru", {"reset_after": False, "activation": "relu"}),
        ("lstm", {"activation": "relu", "recurrent_activation": "hard_sigmoid"}),
    ],
)
def test_gradients_other_activations_and_no_bias(cell, cell_kwargs):
    for use_bias in (True, False):
        kw, d_out = _problem(cell, cell_kwargs, "concat", True, seed=3, use_bias=use_bias)
        kw["projection_activation"] = None
        grads = _check_all_grads(kw, d_out)
        assert (grads["fw"]["bias"] is None) == (not use_bias)


@pytest.mark.parametrize("cell_name", list(CELLS))
def test_gradients_with_a_recurrent_dropout_mask(cell_name):
    """The state mask scales the state where the recurrent matmul reads it
    (units 0 dropped in some rows, the rest scaled by 1 / keep)."""
    cell, cell_kwargs = CELLS[cell_name]
    state_mask = np.array([[0.0, 2.5], [2.5, 2.5], [2.5, 0.0], [0.0, 0.0], [2.5, 2.5]])
    kw, d_out = _problem(cell, {**cell_kwargs, "state_mask": state_mask}, "concat", True)
    kw["projection_activation"] = None
    _check_all_grads(kw, d_out)
    undropped = {**kw, "state_mask": None}
    assert not np.allclose(ref.bidirectional(**kw)[0], ref.bidirectional(**undropped)[0])


def test_fully_masked_row_gradients():
    # Row 4 is fully masked: with sequences out it contributes nothing at all;
    # with return_sequences=False its output is the merged initial states.
    for return_sequences in (True, False):
        kw, d_out = _problem("lstm", {}, "sum", return_sequences)
        kw["projection_activation"] = None
        g = ref.bidirectional_grads(d_output=d_out, **kw)
        assert np.all(g["x"][4] == 0.0)
        if return_sequences:
            assert np.all(g["fw_initial"][0][4] == 0.0)
        else:
            np.testing.assert_array_equal(g["fw_initial"][0][4], d_out[4])
            np.testing.assert_array_equal(g["bw_initial"][0][4], d_out[4])


# ----------------------------------------------------------------------------
# Seed 000, program 092 (figure 17-2)
# ----------------------------------------------------------------------------

def _program_092():
    fw_h = np.array([[0.4, 0.1], [-0.1, 0.4]])
    bw_h = np.array([[0.3, -0.1], [0.2, 0.3]])
    # The C code computes sum_j w_h[i][j] h[j], i.e. h @ w_h.T in Keras layout.
    fw = dict(kernel=np.array([[0.5, -0.3]]), recurrent_kernel=fw_h.T, bias=np.zeros(2))
    bw = dict(kernel=np.array([[-0.2, 0.6]]), recurrent_kernel=bw_h.T, bias=np.zeros(2))
    x = np.array([1.0, 0.0, -1.0, 0.5, 2.0]).reshape(1, 5, 1)
    return fw, bw, x


def test_seed_000_program_092_figure_17_2():
    fw, bw, x = _program_092()
    (h_f, h_b), fin_f, fin_b = ref.bidirectional("simple", fw, bw, x, merge_mode=None)
    expected = {
        0: ([0.462, -0.291], [-0.165, 0.519]),
        2: ([-0.425, 0.217], [0.069, -0.482]),
        4: ([0.777, -0.550], [-0.380, 0.834]),
    }
    for t, (f, b) in expected.items():
        np.testing.assert_allclose(h_f[0, t], f, atol=5e-4, err_msg=f"fwd t={t}")
        np.testing.assert_allclose(h_b[0, t], b, atol=5e-4, err_msg=f"bwd t={t}")
    # Final states: forward after t=4, backward after t=0.
    np.testing.assert_array_equal(fin_f[0][0], h_f[0, 4])
    np.testing.assert_array_equal(fin_b[0][0], h_b[0, 0])


def test_seed_000_program_093_concat_and_sum():
    fw, bw, x = _program_092()
    y = ref.bidirectional("simple", fw, bw, x, merge_mode="concat")[0]
    np.testing.assert_allclose(y[0, 0], [0.462, -0.291, -0.165, 0.519], atol=5e-4)
    # Sum collapses +0.462 and -0.165 into +0.297 (section 17.4).
    s = ref.bidirectional("simple", fw, bw, x, merge_mode="sum")[0]
    assert abs(s[0, 0, 0] - 0.297) < 1e-3


def test_seed_000_parameter_table():
    # GRU at input 32 / hidden 64 with the classic single bias: 18,624.
    p = ref.random_params("gru", 32, 64, 0, reset_after=False)
    assert ref.count_params(p) == 18624
    assert 2 * ref.count_params(p) == 37248
    # Keras's default reset_after=True adds a second (recurrent) bias row.
    assert ref.count_params(ref.random_params("gru", 32, 64, 0)) == 18624 + 3 * 64


# ----------------------------------------------------------------------------
# Hand-checked single steps
# ----------------------------------------------------------------------------

def _sig(v):
    return 1.0 / (1.0 + math.exp(-v))


def test_gru_single_step_both_conventions_by_hand():
    u_h, beta, h0, x0 = 0.8, 0.3, 0.6, 0.5
    kernel = np.array([[0.2, -0.1, 0.4]])
    rk = np.array([[0.5, 0.7, u_h]])
    x = np.full((1, 1, 1), x0)
    a_z, a_r = 0.2 * x0 + 0.5 * h0, -0.1 * x0 + 0.7 * h0
    z, r = _sig(a_z), _sig(a_r)
    # reset_after=False: r gates h before the matmul; bias beta on the input side.
    p = dict(kernel=kernel, recurrent_kernel=rk, bias=np.array([0.0, 0.0, beta]))
    hh = math.tanh(0.4 * x0 + r * h0 * u_h + beta)
    out, _ = ref.run_direction("gru", p, x, initial_state=[np.full((1, 1), h0)])
    assert out[0, 0, 0] == pytest.approx(z * h0 + (1 - z) * hh, abs=1e-14)
    # reset_after=True: beta as recurrent bias sits inside the reset product.
    p["bias"] = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, beta]])
    hh = math.tanh(0.4 * x0 + r * (h0 * u_h + beta))
    out, _ = ref.run_direction("gru", p, x, initial_state=[np.full((1, 1), h0)])
    assert out[0, 0, 0] == pytest.approx(z * h0 + (1 - z) * hh, abs=1e-14)


def test_lstm_single_step_by_hand():
    # Zero weights: every gate is sigmoid(0) = 0.5 and the candidate tanh(0) = 0.
    p = dict(kernel=np.zeros((1, 4)), recurrent_kernel=np.zeros((1, 4)), bias=np.zeros(4))
    c0 = 0.8
    out, (h, c) = ref.run_direction(
        "lstm", p, np.ones((1, 1, 1)), initial_state=[np.zeros((1, 1)), np.full((1, 1), c0)]
    )
    assert c[0, 0] == pytest.approx(0.5 * c0, abs=1e-15)
    assert h[0, 0] == pytest.approx(0.5 * math.tanh(0.5 * c0), abs=1e-15)
    # Gate order i, f, c, o: a forget bias of +inf-ish keeps c, others zero.
    p["bias"] = np.array([0.0, 40.0, 0.0, 0.0])
    _, (_, c) = ref.run_direction("lstm", p, np.ones((1, 1, 1)),
                                  initial_state=[np.zeros((1, 1)), np.full((1, 1), c0)])
    assert c[0, 0] == pytest.approx(c0, abs=1e-12)


# ----------------------------------------------------------------------------
# Masking semantics
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("cell", ["simple", "gru", "lstm"])
def test_padding_invariance(cell):
    rng = np.random.default_rng(7)
    fw, bw = ref.random_params(cell, 3, 4, rng), ref.random_params(cell, 3, 4, rng)
    core = rng.normal(size=(3, 3))
    pad = rng.normal(size=(2, 3))  # garbage in padded slots must not matter
    x = np.stack([np.concatenate([core, pad]), np.concatenate([pad, core])])
    mask = np.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=bool)
    y0, f0, b0 = ref.bidirectional(cell, fw, bw, core[None], merge_mode="concat")
    y, f, b = ref.bidirectional(cell, fw, bw, x, mask=mask, merge_mode="concat")
    np.testing.assert_allclose(y[0, :3], y0[0], rtol=0, atol=1e-13)
    np.testing.assert_allclose(y[1, 2:], y0[0], rtol=0, atol=1e-13)
    assert np.all(y[0, 3:] == 0) and np.all(y[1, :2] == 0)
    for states, ref_states in ((f, f0), (b, b0)):
        for s, s0 in zip(states, ref_states):
            np.testing.assert_allclose(s, np.repeat(s0, 2, axis=0), rtol=0, atol=1e-13)
    # return_sequences=False picks fw after last valid, bw after first valid.
    last = ref.bidirectional(cell, fw, bw, x, mask=mask, merge_mode="concat",
                             return_sequences=False)[0]
    np.testing.assert_allclose(last, np.repeat(np.concatenate([y0[0, -1, :4], y0[0, 0, 4:]])[None], 2, 0),
                               rtol=0, atol=1e-13)


def test_hole_carries_state_and_full_mask_keeps_initial():
    rng = np.random.default_rng(11)
    p = ref.random_params("gru", 2, 3, rng)
    x = rng.normal(size=(2, 4, 2))
    init = [rng.normal(size=(2, 3))]
    mask = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], dtype=bool)
    out, fin = ref.run_direction("gru", p, x, mask=mask, initial_state=init)
    ref_out, _ = ref.run_direction("gru", p, x[:1, [0, 2, 3]], initial_state=[init[0][:1]])
    np.testing.assert_allclose(out[0, [0, 2, 3]], ref_out[0], rtol=0, atol=1e-14)
    assert np.all(out[0, 1] == 0) and np.all(out[1] == 0)
    np.testing.assert_array_equal(fin[0][1], init[0][1])
    # Reverse direction of a fully masked row also keeps its initial state.
    _, fin_b = ref.run_direction("gru", p, x, mask=mask, reverse=True, initial_state=init)
    np.testing.assert_array_equal(fin_b[0][1], init[0][1])


def test_merge_modes_and_projection_values():
    h_f, h_b = np.array([[1.0, 2.0]]), np.array([[3.0, -1.0]])
    np.testing.assert_array_equal(ref.merge(h_f, h_b, "concat"), [[1, 2, 3, -1]])
    np.testing.assert_array_equal(ref.merge(h_f, h_b, "sum"), [[4, 1]])
    np.testing.assert_array_equal(ref.merge(h_f, h_b, "mul"), [[3, -2]])
    np.testing.assert_array_equal(ref.merge(h_f, h_b, "ave"), [[2, 0.5]])
    pair = ref.merge(h_f, h_b, None)
    np.testing.assert_array_equal(pair[0], h_f)
    np.testing.assert_array_equal(pair[1], h_b)
    proj = dict(V_f=np.array([[1.0], [0.0]]), V_b=np.array([[0.0], [2.0]]), c=np.array([0.5]))
    # y = h_f @ V_f + h_b @ V_b + c = 1 - 2 + 0.5
    np.testing.assert_allclose(ref.merge(h_f, h_b, "projection", proj), [[-0.5]])
    proj2 = dict(V_f=np.eye(2), V_b=np.zeros((2, 2)), c=np.zeros(2))
    sm = ref.merge(h_f, h_b, "projection", proj2, "softmax")
    np.testing.assert_allclose(sm, [[1 / (1 + math.e), math.e / (1 + math.e)]], atol=1e-15)


def test_keras_weight_order_and_shapes():
    rng = np.random.default_rng(1)
    fw = ref.random_params("gru", 5, 4, rng)
    bw = ref.random_params("gru", 5, 4, rng, use_bias=False)
    w = ref.keras_bidirectional_weights(fw, bw)
    assert [a.shape for a in w] == [(5, 12), (4, 12), (2, 12), (5, 12), (4, 12)]
    assert w[0] is fw["kernel"] and w[3] is bw["kernel"]
    lstm = ref.random_params("lstm", 5, 4, rng)
    assert lstm["bias"].shape == (16,)
    assert ref.random_params("gru", 5, 4, rng, reset_after=False)["bias"].shape == (12,)


def test_bad_arguments_are_rejected():
    p = ref.random_params("gru", 2, 3, 0, reset_after=True)
    x = np.zeros((1, 2, 2))
    with pytest.raises(ValueError):
        ref.run_direction("gru", p, x, reset_after=False)  # bias is [2, 3U]
    with pytest.raises(TypeError):
        ref.run_direction("gru", p, x, go_backwards=True)
    with pytest.raises(ValueError):
        ref.run_direction("lstm", p, x)
    with pytest.raises(ValueError):
        ref.merge(np.zeros(2), np.zeros(2), "max")
