"""Independent NumPy (float64) oracle for bidirectional RNN maths.

Covers SimpleRNN, GRU (both reset conventions) and LSTM cells in Keras's
weight layout, masking that carries state through masked steps, the
Bidirectional merge modes (plus a BRNN output projection, seed 002) and a
hand-written BPTT (seed 001). Must not import TensorFlow or Keras: it is the
yardstick the library is measured against.
"""

import numpy as np

_GATES = {"simple": 1, "gru": 3, "lstm": 4}
_N_STATES = {"simple": 1, "gru": 1, "lstm": 2}
_CELL_KWARGS = {"activation", "recurrent_activation", "reset_after", "state_mask"}
MERGE_MODES = ("concat", "sum", "mul", "ave", None, "projection")
# The merge cases the tests run: name -> (merge_mode, projection_activation).
MERGES = {
    "concat": ("concat", None),
    "sum": ("sum", None),
    "mul": ("mul", None),
    "ave": ("ave", None),
    "none": (None, None),
    "projection_softmax": ("projection", "softmax"),
}


# ----------------------------------------------------------------------------
# Activations: (f, df/dz) pairs, derivative taken w.r.t. the pre-activation.
# ----------------------------------------------------------------------------

def _sigmoid(z):
    # tanh form avoids overflow in exp for large |z|.
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _dsigmoid(z):
    s = _sigmoid(z)
    return s * (1.0 - s)


ACTIVATIONS = {
    "tanh": (np.tanh, lambda z: 1.0 - np.tanh(z) ** 2),
    "sigmoid": (_sigmoid, _dsigmoid),
    "relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(np.float64)),
    "linear": (lambda z: z, np.ones_like),
    # Keras 3 hard_sigmoid = relu6(z + 3) / 6.
    "hard_sigmoid": (
        lambda z: np.clip(z / 6.0 + 0.5, 0.0, 1.0),
        lambda z: ((z > -3.0) & (z < 3.0)) / 6.0,
    ),
}


def get_activation(act):
    """Resolve a name, None (= linear, as in Keras) or an (f, df_dz) pair."""
    if act is None:
        return ACTIVATIONS["linear"]
    if isinstance(act, str):
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {act!r}")
        return ACTIVATIONS[act]
    if isinstance(act, (tuple, list)) and len(act) == 2 and all(map(callable, act)):
        return tuple(act)
    raise ValueError("activation must be a name, None or a (f, df_dz) pair")


# ----------------------------------------------------------------------------
# Configuration and parameter helpers
# ----------------------------------------------------------------------------

def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _gru_reset_after(bias, reset_after):
    """Infer/validate the GRU convention from the bias shape."""
    if bias is None:
        return True if reset_after is None else bool(reset_after)
    inferred = bias.ndim == 2
    if reset_after is not None and bool(reset_after) != inferred:
        raise ValueError(f"reset_after={reset_after} but bias shape {bias.shape}")
    return inferred


def _config(cell, params, cell_kwargs):
    """Validate inputs and bundle everything a step function needs."""
    if cell not in _GATES:
        raise ValueError(f"cell must be one of {sorted(_GATES)}, got {cell!r}")
    unknown = set(cell_kwargs) - _CELL_KWARGS
    if unknown:
        raise TypeError(f"unknown cell kwargs {sorted(unknown)}")
    p = {k: _f64(params.get(k)) for k in ("kernel", "recurrent_kernel", "bias")}
    units = p["recurrent_kernel"].shape[0]
    width = _GATES[cell] * units
    if p["kernel"].shape[1] != width or p["recurrent_kernel"].shape != (units, width):
        raise ValueError("kernel/recurrent_kernel shapes do not match the cell")
    reset_after = False
    if cell == "gru":
        reset_after = _gru_reset_after(p["bias"], cell_kwargs.get("reset_after"))
    if p["bias"] is not None:
        want = (2, width) if reset_after else (width,)
        if p["bias"].shape != want:
            raise ValueError(f"bias shape {p['bias'].shape}, expected {want}")
    return dict(
        cell=cell, p=p, units=units, reset_after=reset_after,
        act=get_activation(cell_kwargs.get("activation", "tanh")),
        rec=get_activation(cell_kwargs.get("recurrent_activation", "sigmoid")),
        # Recurrent dropout: [B, U] scaling the state where it enters the
        # recurrent matmul only (the carried state stays whole), as Keras.
        state_mask=_f64(cell_kwargs.get("state_mask")),
    )


def _dropped(cfg, h):
    """The state as the recurrent matmul reads it."""
    return h if cfg["state_mask"] is None else h * cfg["state_mask"]


def _undropped(cfg, dh):
    """Gradient w.r.t. the dropped state, taken back to the state itself."""
    return dh if cfg["state_mask"] is None else dh * cfg["state_mask"]


def random_params(cell, input_dim, units, rng, reset_after=True, use_bias=True, scale=0.5):
    """Uniform(-scale, scale) weights in Keras layout; rng is a Generator or seed."""
    rng = np.random.default_rng(rng)
    width = _GATES[cell] * units
    bias = None
    if use_bias:
        shape = (2, width) if (cell == "gru" and reset_after) else (width,)
        bias = rng.uniform(-scale, scale, shape)
    return dict(
        kernel=rng.uniform(-scale, scale, (input_dim, width)),
        recurrent_kernel=rng.uniform(-scale, scale, (units, width)),
        bias=bias,
    )


def random_projection(units, out_dim, rng, scale=0.5):
    """Random BRNN output projection dict(V_f, V_b, c) in Dense layout."""
    rng = np.random.default_rng(rng)
    return dict(
        V_f=rng.uniform(-scale, scale, (units, out_dim)),
        V_b=rng.uniform(-scale, scale, (units, out_dim)),
        c=rng.uniform(-scale, scale, (out_dim,)),
    )


def count_params(params):
    """Number of scalars in a params dict (None entries count as zero)."""
    return sum(int(np.size(v)) for v in params.values() if v is not None)


def keras_bidirectional_weights(fw_params, bw_params):
    """Weights in Keras Bidirectional.get_weights() order (bias omitted if None)."""
    out = []
    for p in (fw_params, bw_params):
        out += [p[k] for k in ("kernel", "recurrent_kernel", "bias") if p.get(k) is not None]
    return out


# ----------------------------------------------------------------------------
# Cell steps. step(cfg, x, states) -> (new_states, cache);
# back(cfg, cache, d_new_states) -> (dx, d_prev_states, grads).
# ----------------------------------------------------------------------------

def _preact(p, x, h):
    a = x @ p["kernel"] + h @ p["recurrent_kernel"]
    return a if p["bias"] is None else a + p["bias"]


def _dense_back(p, x, h, da):
    """Grads of a = x W + h U + b given dL/da (shared by simple RNN and LSTM)."""
    grads = dict(
        kernel=x.T @ da,
        recurrent_kernel=h.T @ da,
        bias=None if p["bias"] is None else da.sum(0),
    )
    return da @ p["kernel"].T, da @ p["recurrent_kernel"].T, grads


def _simple_step(cfg, x, states):
    hm = _dropped(cfg, states[0])
    a = _preact(cfg["p"], x, hm)
    return [cfg["act"][0](a)], (x, hm, a)


def _simple_back(cfg, cache, d_new):
    x, hm, a = cache
    dx, dh, grads = _dense_back(cfg["p"], x, hm, d_new[0] * cfg["act"][1](a))
    return dx, [_undropped(cfg, dh)], grads


def _lstm_step(cfg, x, states):
    h, c = states
    hm = _dropped(cfg, h)
    a = _preact(cfg["p"], x, hm)
    ai, af, ag, ao = np.split(a, 4, axis=-1)
    sig, act = cfg["rec"][0], cfg["act"][0]
    i, f, g, o = sig(ai), sig(af), act(ag), sig(ao)
    c_new = f * c + i * g
    h_new = o * act(c_new)
    return [h_new, c_new], (x, hm, c, a, i, f, g, o, c_new)


def _lstm_back(cfg, cache, d_new):
    x, hm, c, a, i, f, g, o, c_new = cache
    dh_new, dc_new = d_new
    act, dact = cfg["act"]
    d_o = dh_new * act(c_new)
    dc = dc_new + dh_new * o * dact(c_new)
    ai, af, ag, ao = np.split(a, 4, axis=-1)
    dsig = cfg["rec"][1]
    da = np.concatenate(
        [dc * g * dsig(ai), dc * c * dsig(af), dc * i * dact(ag), d_o * dsig(ao)], axis=-1
    )
    dx, dh, grads = _dense_back(cfg["p"], x, hm, da)
    return dx, [_undropped(cfg, dh), dc * f], grads


def _gru_step(cfg, x, states):
    p, h, units = cfg["p"], states[0], cfg["units"]
    b = p["bias"]
    b_in = 0.0 if b is None else (b[0] if cfg["reset_after"] else b)
    xi = x @ p["kernel"] + b_in
    uk = p["recurrent_kernel"]
    hm = _dropped(cfg, h)
    if cfg["reset_after"]:
        # Reset gate multiplies the (biased) recurrent product: Keras/CuDNN form.
        rec = hm @ uk + (0.0 if b is None else b[1])
    else:
        # Classic form (seed 000): z, r blocks only; h block needs r first.
        rec = hm @ uk[:, : 2 * units]
    sig = cfg["rec"][0]
    z = sig(xi[:, :units] + rec[:, :units])
    r = sig(xi[:, units : 2 * units] + rec[:, units : 2 * units])
    if cfg["reset_after"]:
        a_h = xi[:, 2 * units :] + r * rec[:, 2 * units :]
    else:
        a_h = xi[:, 2 * units :] + (r * hm) @ uk[:, 2 * units :]
    hh = cfg["act"][0](a_h)
    cache = (x, h, hm, xi, rec, z, r, a_h, hh)
    return [z * h + (1.0 - z) * hh], cache


def _gru_back(cfg, cache, d_new):
    x, h, hm, xi, rec, z, r, a_h, hh = cache
    p, units, dh_new = cfg["p"], cfg["units"], d_new[0]
    dsig = cfg["rec"][1]
    da_h = dh_new * (1.0 - z) * cfg["act"][1](a_h)
    da_z = dh_new * (h - hh) * dsig(xi[:, :units] + rec[:, :units])
    dsig_r = dsig(xi[:, units : 2 * units] + rec[:, units : 2 * units])
    uk = p["recurrent_kernel"]
    if cfg["reset_after"]:
        da_r = da_h * rec[:, 2 * units :] * dsig_r
        d_rec = np.concatenate([da_z, da_r, da_h * r], axis=-1)
        d_uk, dh = hm.T @ d_rec, d_rec @ uk.T
    else:
        d_rh = da_h @ uk[:, 2 * units :].T
        da_r = d_rh * hm * dsig_r
        d_zr = np.concatenate([da_z, da_r], axis=-1)
        d_uk = np.concatenate([hm.T @ d_zr, (r * hm).T @ da_h], axis=-1)
        dh = d_zr @ uk[:, : 2 * units].T + d_rh * r
    d_xi = np.concatenate([da_z, da_r, da_h], axis=-1)
    grads = dict(kernel=x.T @ d_xi, recurrent_kernel=d_uk, bias=None)
    if p["bias"] is not None:
        grads["bias"] = np.stack([d_xi.sum(0), d_rec.sum(0)]) if cfg["reset_after"] else d_xi.sum(0)
    return d_xi @ p["kernel"].T, [_undropped(cfg, dh) + dh_new * z], grads


_STEP = {"simple": _simple_step, "gru": _gru_step, "lstm": _lstm_step}
_BACK = {"simple": _simple_back, "gru": _gru_back, "lstm": _lstm_back}


# ----------------------------------------------------------------------------
# One direction: forward pass and BPTT
# ----------------------------------------------------------------------------

def _mask_bool(mask, batch, steps):
    if mask is None:
        return np.ones((batch, steps), dtype=bool)
    m = np.asarray(mask).astype(bool)
    if m.shape != (batch, steps):
        raise ValueError(f"mask shape {m.shape}, expected {(batch, steps)}")
    return m


def _states_or_zeros(states, cfg, batch):
    """Copy of the given states (None entries or None list -> zeros)."""
    n = _N_STATES[cfg["cell"]]
    states = list(states) if states is not None else [None] * n
    if len(states) != n:
        raise ValueError(f"{cfg['cell']} needs {n} state arrays, got {len(states)}")
    zeros = np.zeros((batch, cfg["units"]))
    return [zeros.copy() if s is None else np.array(s, dtype=np.float64) for s in states]


def _time_order(steps, reverse):
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _forward(cfg, x, mask, reverse, initial_state):
    """Run one direction; also return per-step caches and the bool mask."""
    batch, steps, _ = x.shape
    m = _mask_bool(mask, batch, steps)
    states = _states_or_zeros(initial_state, cfg, batch)
    outputs = np.zeros((batch, steps, cfg["units"]))
    caches = [None] * steps
    for t in _time_order(steps, reverse):
        new, caches[t] = _STEP[cfg["cell"]](cfg, x[:, t], states)
        valid = m[:, t, None]
        # np.where (not arithmetic blending) so masked rows can never leak.
        states = [np.where(valid, n, s) for n, s in zip(new, states)]
        outputs[:, t] = np.where(valid, states[0], 0.0)
    return outputs, states, caches, m


def run_direction(cell, params, x, mask=None, reverse=False, initial_state=None, **cell_kwargs):
    """Run one RNN direction over x [B,T,F].

    Returns (outputs [B,T,U], zeros where masked; final_states list).
    reverse=True iterates t=T-1..0 with outputs kept aligned to input positions.
    """
    cfg = _config(cell, params, cell_kwargs)
    outputs, states, _, _ = _forward(cfg, _f64(x), mask, reverse, initial_state)
    return outputs, states


def direction_grads(cell, params, x, d_outputs, mask=None, reverse=False,
                    initial_state=None, d_final_states=None, **cell_kwargs):
    """Hand-written BPTT for one direction.

    Loss = sum(outputs * d_outputs) + sum_k sum(final_states[k] * d_final_states[k]).
    Returns dict(kernel, recurrent_kernel, bias, x, initial=[dL/d initial state]).
    """
    cfg = _config(cell, params, cell_kwargs)
    x = _f64(x)
    _, _, caches, m = _forward(cfg, x, mask, reverse, initial_state)
    d_states = _states_or_zeros(d_final_states, cfg, x.shape[0])
    grads = {k: None if v is None else np.zeros_like(v) for k, v in cfg["p"].items()}
    dx = np.zeros_like(x)
    # Walk time in the opposite order to the forward pass of this direction.
    for t in reversed(_time_order(x.shape[1], reverse)):
        valid = m[:, t, None]
        if d_outputs is not None:
            d_states[0] = d_states[0] + np.where(valid, d_outputs[:, t], 0.0)
        # Masked rows feed zero into the step, so they add nothing to weights/x.
        d_step = [np.where(valid, d, 0.0) for d in d_states]
        dx[:, t], d_prev, g = _BACK[cfg["cell"]](cfg, caches[t], d_step)
        for k, v in g.items():
            if v is not None:
                grads[k] += v
        # A masked step is the identity on the state: gradient passes through.
        d_states = [np.where(valid, dp, d) for dp, d in zip(d_prev, d_states)]
    return dict(grads, x=dx, initial=d_states)


# ----------------------------------------------------------------------------
# Merge (and its backward)
# ----------------------------------------------------------------------------

def _projection_act(name):
    if name in (None, "linear"):
        return None
    if name == "softmax":
        return "softmax"
    raise ValueError(f"projection_activation must be None/'linear'/'softmax', got {name!r}")


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _project_logits(h_f, h_b, projection):
    p = {k: _f64(projection[k]) for k in ("V_f", "V_b", "c")}
    return h_f @ p["V_f"] + h_b @ p["V_b"] + p["c"], p


def merge(h_f, h_b, merge_mode, projection=None, projection_activation=None):
    """Combine forward/backward states ([..., U] each); None -> [h_f, h_b]."""
    h_f, h_b = _f64(h_f), _f64(h_b)
    if merge_mode == "concat":
        return np.concatenate([h_f, h_b], axis=-1)
    if merge_mode == "sum":
        return h_f + h_b
    if merge_mode == "mul":
        return h_f * h_b
    if merge_mode == "ave":
        return 0.5 * (h_f + h_b)
    if merge_mode is None:
        return [h_f, h_b]
    if merge_mode == "projection":
        if projection is None:
            raise ValueError("merge_mode='projection' needs projection=dict(V_f, V_b, c)")
        logits, _ = _project_logits(h_f, h_b, projection)
        act = _projection_act(projection_activation)
        return _softmax(logits) if act == "softmax" else logits
    raise ValueError(f"unknown merge_mode {merge_mode!r}")


def _projection_back(h_f, h_b, d_out, projection, projection_activation):
    logits, p = _project_logits(h_f, h_b, projection)
    dz = _f64(d_out)
    if _projection_act(projection_activation) == "softmax":
        y = _softmax(logits)
        dz = y * (dz - (dz * y).sum(axis=-1, keepdims=True))
    units, out_dim = p["V_f"].shape
    # Weights are shared over batch (and time): sum over all leading axes.
    flat = dz.reshape(-1, out_dim)
    d_proj = dict(
        V_f=h_f.reshape(-1, units).T @ flat,
        V_b=h_b.reshape(-1, units).T @ flat,
        c=flat.sum(0),
    )
    return dz @ p["V_f"].T, dz @ p["V_b"].T, d_proj


def merge_grads(h_f, h_b, d_out, merge_mode, projection=None, projection_activation=None):
    """Backprop d_out through merge: returns (d_h_f, d_h_b, d_projection or None)."""
    h_f, h_b = _f64(h_f), _f64(h_b)
    if merge_mode is None:
        return _f64(d_out[0]), _f64(d_out[1]), None
    d_out = _f64(d_out)
    if merge_mode == "concat":
        units = h_f.shape[-1]
        return d_out[..., :units], d_out[..., units:], None
    if merge_mode == "sum":
        return d_out, d_out, None
    if merge_mode == "mul":
        return d_out * h_b, d_out * h_f, None
    if merge_mode == "ave":
        return 0.5 * d_out, 0.5 * d_out, None
    if merge_mode == "projection":
        return _projection_back(h_f, h_b, d_out, projection, projection_activation)
    raise ValueError(f"unknown merge_mode {merge_mode!r}")


# ----------------------------------------------------------------------------
# Bidirectional wrapper
# ----------------------------------------------------------------------------

def _zero_masked(y, mask):
    """Zero the merged output at masked positions (pair-aware for merge None)."""
    if mask is None:
        return y
    valid = np.asarray(mask).astype(bool)[..., None]
    if isinstance(y, (list, tuple)):
        return [np.where(valid, _f64(v), 0.0) for v in y]
    return np.where(valid, _f64(y), 0.0)


def bidirectional(cell, fw_params, bw_params, x, mask=None, merge_mode="concat",
                  projection=None, projection_activation=None, return_sequences=True,
                  fw_initial=None, bw_initial=None, **cell_kwargs):
    """Bidirectional RNN forward pass.

    Returns (output, fw_final_states, bw_final_states). return_sequences=False
    merges the forward state after the last valid step with the backward state
    after the first valid step.
    """
    out_f, fin_f = run_direction(cell, fw_params, x, mask, False, fw_initial, **cell_kwargs)
    out_b, fin_b = run_direction(cell, bw_params, x, mask, True, bw_initial, **cell_kwargs)
    if return_sequences:
        y = merge(out_f, out_b, merge_mode, projection, projection_activation)
        y = _zero_masked(y, mask)
    else:
        y = merge(fin_f[0], fin_b[0], merge_mode, projection, projection_activation)
    return y, fin_f, fin_b


def _weight_grads(g):
    return {k: g[k] for k in ("kernel", "recurrent_kernel", "bias")}


def bidirectional_grads(cell, fw_params, bw_params, x, d_output, mask=None, merge_mode="concat",
                        projection=None, projection_activation=None, return_sequences=True,
                        fw_initial=None, bw_initial=None, **cell_kwargs):
    """Gradients of L = sum(output * d_output) by hand-written BPTT (seed 001).

    Returns dict(fw=..., bw=..., projection=... or None, x=..., fw_initial=[...],
    bw_initial=[...]). For merge_mode=None, d_output is a pair.
    """
    x = _f64(x)
    out_f, fin_f = run_direction(cell, fw_params, x, mask, False, fw_initial, **cell_kwargs)
    out_b, fin_b = run_direction(cell, bw_params, x, mask, True, bw_initial, **cell_kwargs)
    merge_args = (merge_mode, projection, projection_activation)
    if return_sequences:
        # Output is forced to zero at masked positions, so their d_output is inert.
        d_f, d_b, d_proj = merge_grads(out_f, out_b, _zero_masked(d_output, mask), *merge_args)
        seq_f, seq_b, fin_df, fin_db = d_f, d_b, None, None
    else:
        d_f, d_b, d_proj = merge_grads(fin_f[0], fin_b[0], d_output, *merge_args)
        # Only h of the final state reaches the output; LSTM's c gets zero.
        pad = [None] * (len(fin_f) - 1)
        seq_f, seq_b, fin_df, fin_db = None, None, [d_f] + pad, [d_b] + pad
    g_f = direction_grads(cell, fw_params, x, seq_f, mask, False, fw_initial, fin_df, **cell_kwargs)
    g_b = direction_grads(cell, bw_params, x, seq_b, mask, True, bw_initial, fin_db, **cell_kwargs)
    return dict(
        fw=_weight_grads(g_f), bw=_weight_grads(g_b), projection=d_proj,
        x=g_f["x"] + g_b["x"], fw_initial=g_f["initial"], bw_initial=g_b["initial"],
    )
