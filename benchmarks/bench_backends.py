"""Bidirectional GRU/LSTM on any Keras backend: keras_birnn against Keras's layers (and torch.nn).

Runs under KERAS_BACKEND=tensorflow, jax or torch.
Contenders, all on the current backend and device:
- keras: `keras.layers.Bidirectional(keras.layers.GRU/LSTM(H, return_sequences=True))`,
  called as a user calls a layer, `layer(x, mask=mask)` with the mask built
  from the lengths (unmasked cases: `layer(x)`). Which of Keras's engines ran
  (fused cuDNN, its fused fallback, or the generic step loop `rnn`) is read
  off the backend's rnn functions on one untimed call and printed per case.
- kb: `keras_birnn.Bidirectional(keras_birnn.GRUCell/LSTMCell(H),
  return_sequences=True)` with Keras's weights, called exactly as Keras's
  layer is on the same backend (same `mask=`, same step functions below).
  On TensorFlow it runs kb's TensorFlow engine; on PyTorch the vendor
  engine (PyTorch's own kernels on packed sequences,
  `keras_birnn.recurrence.vendor.torch_kernels`); on JAX cuDNN's LSTM on a GPU
  (`vendor.jax_kernels`), else the scan engine (`keras_birnn.recurrence.scan`:
  a masked `lax.scan` per direction); the engine is printed per case.
  keras_birnn is the one Python imports (a scratch copy first on
  PYTHONPATH is measured instead; the header prints its path), else, where
  none is installed (the GPU machine), this checkout's.
- torch.nn (torch backend only): `torch.nn.GRU/LSTM(bidirectional=True,
  batch_first=True)` with Keras's weights copied in; masked cases go through
  `pack_padded_sequence` (lengths on the CPU, `enforce_sorted=False`) and
  `pad_packed_sequence(total_length=T)`, both inside the timed step.
Ratios are against kb (`/kb`: a contender's median over kb's; above 1, kb
is faster). On JAX and PyTorch nothing here imports TensorFlow (the GPU
machine has none).

Cases: BiGRU and BiLSTM; shapes textbook (B64 T100 D32 H64) and large
(B32 T200 D128 H256); unmasked, and masked with right padding and lengths
drawn uniformly from 30-100% of T (seed 1); a training step (forward, then
the gradients of all weights of the sum of squared outputs at valid steps;
no optimizer) and inference (forward). Case names read
`bigru/textbook/masked/train`; `--cases` takes comma-separated fnmatch
patterns (`--cases 'bilstm/*/masked/*'`).

How each backend is run, as a Keras user gets it (Keras's layer and kb's
alike):
- torch: eager (Keras's default on torch); training under autograd with
  `torch.autograd.grad`, inference under `torch.no_grad()`; timed between
  `torch.cuda.synchronize()` calls on a GPU.
- jax: `jax.jit` over `layer.stateless_call` with the trainable values
  passed in (what `jit_compile` gives in `fit`/`predict`), `jax.grad` for
  training; timed to `jax.block_until_ready`.
- tensorflow: `tf.function` (no XLA: Keras's own choice for its RNN
  layers), `tf.GradientTape`; results converted to NumPy.

Each series reports the first call (tracing, compiling, cuDNN set-up; on
torch, which has nothing to compile, the untimed checks ran the same
layers just before, so its first call is a warm one) apart from the
median of the timed steps, which follow `--warmup` untimed
calls; a series stops repeating once `--max-seconds` are spent on it
after its first call (the count of timed steps is printed).
`--time-budget` skips the cases left once the whole run has spent that
long, so the summary and JSON are still written before an outer `timeout`
(the JSON is also rewritten after every case). `--threads N` caps the
threads of every framework's kernels (default: the framework's own, all
cores): on a shared CPU, kernel threads that lose their core made single
steps 10-100x slower at random (a 2-core machine under load 4-8:
torch.nn's textbook BiGRU forward took a 140 ms median with 2 threads, 17
ms with 1).

Exactness, per cell, shape and masking, with the timed layers' weights
(biases made non-zero): every contender's forward outputs against a
float64 NumPy oracle in Keras's layout, max |diff| at valid steps (padded
outputs must be zero); kb's weight gradients (its timed training step's
results) against Keras's, relative to their largest entry; on torch also
Keras against torch.nn directly (outputs, and the weights' gradients
mapped to torch.nn's layout, relative to their largest entry), which is
what makes the timing comparison fair; and for the masked cases, that the
mask changed Keras's outputs (keras(mask) against keras(x) at valid
steps), so the masked path really ran.

Precision: TF32 is off (`torch.backends.cuda.matmul.allow_tf32 = False`,
`torch.backends.cudnn.allow_tf32 = False`, `jax_default_matmul_precision =
'highest'`, TensorFlow's `enable_tensor_float_32_execution(False)`); the
header prints what is in force.

    KERAS_BACKEND=torch python benchmarks/bench_backends.py --json torch.json
    KERAS_BACKEND=jax python benchmarks/bench_backends.py --cases 'bigru/*'
    python benchmarks/bench_backends.py --quick          # tiny shapes, a few repeats (CPU tests)
    bash benchmarks/gpu_run.sh                           # on a CUDA machine: torch, then jax, within 8 minutes
"""

import argparse
import fnmatch
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

SHAPES = {"textbook": (64, 100, 32, 64), "large": (32, 200, 128, 256)}  # batch, time, input, hidden
QUICK_SHAPES = {"quick": (4, 8, 3, 5)}
CELLS = ("bigru", "bilstm")
MASKINGS = ("unmasked", "masked")
MODES = ("train", "infer")
LENGTH_SEED, DATA_SEED, WEIGHT_SEED = 1, 0, 2
MIN_FRACTION = 0.3  # lengths uniform in [ceil(0.3 T), T]


# --- the backend and its precision ------------------------------------------------------------------


def limit_threads(threads):
    """Before the framework is imported: at most `threads` threads for a
    step's kernels (None: the framework's default, all cores). On a shared
    CPU, spinning kernel threads that lose their core make every
    contender's times erratic; one thread each keeps the comparison
    steady. Returns the header's line."""
    if threads is None:
        return "framework default"
    os.environ["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op pool (set again below)
    os.environ["TF_NUM_INTRAOP_THREADS"] = os.environ["TF_NUM_INTEROP_THREADS"] = str(threads)
    flags = f"--xla_cpu_multi_thread_eigen={'false' if threads == 1 else 'true'} intra_op_parallelism_threads={threads}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    return f"{threads} (OMP_NUM_THREADS, torch.set_num_threads, TF_NUM_INTRAOP_THREADS, XLA_FLAGS {flags})"


def set_up_backend(threads=None):
    """Imports the backend's framework, turns TF32 off, and returns the
    header's facts (backend, versions, device, precision, threads)."""
    threads_line = limit_threads(threads)
    import keras

    backend = keras.backend.backend()
    info = {"backend": backend, "keras": keras.__version__, "numpy": np.__version__,
            "python": platform.python_version()}
    info["threads"] = threads_line
    if backend == "torch":
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        info["threads"] += f"; torch.get_num_threads()={torch.get_num_threads()}"
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        info["torch"] = torch.__version__
        info["device"] = (f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available()
                          else f"cpu ({os.cpu_count()} cores)")
        info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        info["precision"] = (f"torch.backends.cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                             f"torch.backends.cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}")
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):  # the newer switch these set
            info["precision"] += (f" (cuda.matmul.fp32_precision={torch.backends.cuda.matmul.fp32_precision!r}, "
                                  f"cudnn.fp32_precision={getattr(torch.backends.cudnn, 'fp32_precision', '?')!r})")
    elif backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")
        info["jax"] = jax.__version__
        info["device"] = ", ".join(str(d) for d in jax.devices())
        precision = getattr(jax.config, "jax_default_matmul_precision", "highest (set; not read back)")
        info["precision"] = f"jax_default_matmul_precision={precision!r}"
    elif backend == "tensorflow":
        import tensorflow as tf

        if threads is not None:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        tf.config.experimental.enable_tensor_float_32_execution(False)
        info["tensorflow"] = tf.__version__
        gpus = tf.config.list_physical_devices("GPU")
        info["device"] = ", ".join(g.name for g in gpus) if gpus else f"cpu ({os.cpu_count()} cores)"
        info["precision"] = ("tf.config.experimental.tensor_float_32_execution_enabled()="
                             f"{tf.config.experimental.tensor_float_32_execution_enabled()}")
    else:
        raise SystemExit(f"bench_backends: backend {backend!r} is not one of tensorflow, jax, torch")
    return info


def torch_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def synchronizer(backend):
    """A function that waits until a step's results exist (and returns
    nothing): the clock stops after it."""
    if backend == "torch":
        import torch

        if torch.cuda.is_available():
            return lambda result: torch.cuda.synchronize()
        return lambda result: None
    if backend == "jax":
        import jax

        return lambda result: jax.block_until_ready(result)
    import keras

    return lambda result: [np.asarray(t) for t in keras.tree.flatten(result)]


def warm_device(backend):
    """One small matmul, so that no case pays for starting the device."""
    import keras

    a = keras.ops.ones((256, 256))
    synchronizer(backend)(keras.ops.matmul(a, a))


def to_numpy(value):
    """Any backend's tensor (or a Keras variable) as a NumPy array."""
    import keras

    if hasattr(value, "detach"):  # torch
        return value.detach().cpu().numpy()
    return keras.ops.convert_to_numpy(value)


# --- data, weights and the NumPy oracle -------------------------------------------------------------


def lengths_for(batch, time_steps):
    rng = np.random.default_rng(LENGTH_SEED)
    return rng.integers(math.ceil(MIN_FRACTION * time_steps), time_steps + 1, size=batch).astype(np.int64)


def inputs_for(batch, time_steps, features):
    return np.random.default_rng(DATA_SEED).normal(size=(batch, time_steps, features)).astype(np.float32)


def keras_layer(cell, shape):
    """Keras's Bidirectional layer, built, its biases made non-zero (Keras
    starts them at zero; the exactness check should see them)."""
    import keras

    batch, time_steps, features, units = shape
    keras.utils.set_random_seed(WEIGHT_SEED)
    rnn = {"bigru": keras.layers.GRU, "bilstm": keras.layers.LSTM}[cell](units, return_sequences=True)
    layer = keras.layers.Bidirectional(rnn)
    layer.build((batch, time_steps, features))
    rng = np.random.default_rng(WEIGHT_SEED)
    for direction in (layer.forward_layer, layer.backward_layer):
        bias = direction.cell.bias
        bias.assign(rng.uniform(-0.2, 0.2, size=tuple(bias.shape)).astype(np.float32))
    return layer


def direction_weights(layer):
    """[(kernel, recurrent_kernel, bias)] of the forward and backward
    directions of Keras's layer, as NumPy arrays in Keras's layout."""
    return [tuple(to_numpy(w) for w in (d.cell.kernel, d.cell.recurrent_kernel, d.cell.bias))
            for d in (layer.forward_layer, layer.backward_layer)]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _step(cell, weights, x_t, state):
    """One step of Keras's GRU (reset_after=True; gates z, r, h; bias
    [input; recurrent]) or LSTM (gates i, f, c, o), in float64."""
    kernel, recurrent, bias = weights
    units = recurrent.shape[0]
    h = state[0]
    if cell == "bigru":
        xs, hs = x_t @ kernel + bias[0], h @ recurrent + bias[1]
        z = _sigmoid(xs[:, :units] + hs[:, :units])
        r = _sigmoid(xs[:, units:2 * units] + hs[:, units:2 * units])
        candidate = np.tanh(xs[:, 2 * units:] + r * hs[:, 2 * units:])
        h = z * h + (1.0 - z) * candidate
        return h, (h,)
    gates = x_t @ kernel + h @ recurrent + bias
    i, f, g, o = (gates[:, k * units:(k + 1) * units] for k in range(4))
    c = _sigmoid(f) * state[1] + _sigmoid(i) * np.tanh(g)
    h = _sigmoid(o) * np.tanh(c)
    return h, (h, c)


def oracle(cell, weights, x, lengths):
    """Masked bidirectional outputs [B, T, 2H] in float64: each direction
    reads only a row's valid steps (the backward one from its own last valid
    step), and padded outputs are zero. lengths=None: every step is valid."""
    batch, time_steps, _ = x.shape
    x = x.astype(np.float64)
    valid = np.ones((batch, time_steps), bool) if lengths is None else np.arange(time_steps)[None] < lengths[:, None]
    halves = []
    for weights_d, order in zip(weights, (range(time_steps), reversed(range(time_steps)))):
        weights_d = [w.astype(np.float64) for w in weights_d]
        units = weights_d[1].shape[0]
        state = tuple(np.zeros((batch, units)) for _ in range(1 if cell == "bigru" else 2))
        out = np.zeros((batch, time_steps, units))
        for t in order:
            h, new_state = _step(cell, weights_d, x[:, t], state)
            m = valid[:, t:t + 1]
            state = tuple(np.where(m, n, s) for n, s in zip(new_state, state))
            out[:, t] = np.where(m, h, 0.0)
        halves.append(out)
    return np.concatenate(halves, -1)


def valid_steps(batch, time_steps, lengths):
    if lengths is None:
        return np.ones((batch, time_steps), bool)
    return np.arange(time_steps)[None] < lengths[:, None]


def largest_difference(ours, reference, valid):
    """max |ours - reference| at valid steps; inf if any padded output of
    ours is not zero (a masked layer must give zeros there)."""
    ours = np.asarray(ours, np.float64)
    if np.any(ours[~valid] != 0.0):
        return float("inf")
    return float(np.max(np.abs(ours - reference)[valid]))


# --- torch.nn with Keras's weights ----------------------------------------------------------------


def torch_gate_order(cell, units):
    """Columns of a Keras GRU matrix in torch.nn.GRU's gate order: Keras
    stores z, r, h; torch r, z, n (n is Keras's h with reset_after=True:
    r multiplies the recurrent product plus its bias). LSTM: i, f, c, o in
    both."""
    if cell == "bilstm":
        return np.arange(4 * units)
    z, r, h = (np.arange(k * units, (k + 1) * units) for k in range(3))
    return np.concatenate([r, z, h])


def torch_layout(cell, kernel, recurrent, bias):
    """Keras (kernel [D, G*H], recurrent [H, G*H], bias) as torch.nn's
    (weight_ih [G*H, D], weight_hh [G*H, H], bias_ih, bias_hh). Keras's GRU
    bias is [input; recurrent] = torch's (bias_ih, bias_hh); an LSTM has one
    bias, given to bias_ih, with bias_hh zero. Linear, so it also maps the
    gradients (an LSTM's bias_hh gradient equals bias_ih's)."""
    order = torch_gate_order(cell, recurrent.shape[0])
    w_ih, w_hh = kernel[:, order].T, recurrent[:, order].T
    if cell == "bigru":
        return w_ih, w_hh, bias[0][order], bias[1][order]
    return w_ih, w_hh, bias[order], np.zeros_like(bias[order])


def torch_module(cell, layer, device):
    import torch

    weights = direction_weights(layer)
    features, units = weights[0][0].shape[0], weights[0][1].shape[0]
    module = {"bigru": torch.nn.GRU, "bilstm": torch.nn.LSTM}[cell](
        features, units, batch_first=True, bidirectional=True)
    with torch.no_grad():
        for suffix, weights_d in zip(("", "_reverse"), weights):
            for name, value in zip(("weight_ih", "weight_hh", "bias_ih", "bias_hh"), torch_layout(cell, *weights_d)):
                getattr(module, f"{name}_l0{suffix}").copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return module.to(device)


def torch_nn_peer(cell, layer, x, lengths, valid):
    """(train, infer) steps of torch.nn with Keras's weights: packed when
    lengths are given, plain otherwise."""
    import torch

    device = torch_device()
    module = torch_module(cell, layer, device)
    params = list(module.parameters())
    x_t = torch.from_numpy(x).to(device)
    time_steps = x.shape[1]
    cpu_lengths = None if lengths is None else torch.from_numpy(lengths)  # pack_padded_sequence wants them on the CPU
    valid_t = None if valid is None else torch.from_numpy(valid[..., None].astype(np.float32)).to(device)

    def forward():
        if cpu_lengths is None:
            return module(x_t)[0]
        packed = torch.nn.utils.rnn.pack_padded_sequence(x_t, cpu_lengths, batch_first=True, enforce_sorted=False)
        out, _ = module(packed)
        return torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=time_steps)[0]

    def train():
        y = forward()
        loss = torch.sum(torch.square(y if valid_t is None else y * valid_t))
        return torch.autograd.grad(loss, params)

    def infer():
        with torch.no_grad():
            return forward()

    return train, infer, module


# --- the timed steps of Keras's layers (and kb's) --------------------------------------------------


def keras_steps(backend, layer, x, mask, valid):
    """(train, infer): zero-argument steps of `layer` on this backend.
    mask and valid are NumPy arrays (bool [B, T], float [B, T, 1]) or None."""
    import keras

    x_k = keras.ops.convert_to_tensor(x)
    mask_k = None if mask is None else keras.ops.convert_to_tensor(mask)
    valid_k = None if valid is None else keras.ops.convert_to_tensor(valid[..., None].astype(np.float32))
    call_kwargs = {} if mask_k is None else {"mask": mask_k}

    if backend == "torch":
        import torch

        params = [v.value for v in layer.trainable_variables]

        def train():
            y = layer(x_k, training=True, **call_kwargs)
            loss = torch.sum(torch.square(y if valid_k is None else y * valid_k))
            return torch.autograd.grad(loss, params)

        def infer():
            with torch.no_grad():
                return layer(x_k, training=False, **call_kwargs)

        return train, infer

    if backend == "jax":
        import jax
        import jax.numpy as jnp

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def forward(trainable, x, mask, training):
            kwargs = {} if mask is None else {"mask": mask}
            return layer.stateless_call(trainable, non_trainable, x, training=training, **kwargs)[0]

        def loss(trainable, x, mask, valid):
            y = forward(trainable, x, mask, True)
            return jnp.sum(jnp.square(y if valid is None else y * valid))

        grad_step = jax.jit(jax.grad(loss))
        infer_step = jax.jit(functools.partial(forward, training=False))
        return (lambda: grad_step(trainable, x_k, mask_k, valid_k),
                lambda: infer_step(trainable, x_k, mask_k))

    import tensorflow as tf

    @tf.function
    def tf_train_step(x, mask, valid):
        kwargs = {} if mask is None else {"mask": mask}
        with tf.GradientTape() as tape:
            y = layer(x, training=True, **kwargs)
            loss = tf.reduce_sum(tf.square(y if valid is None else y * valid))
        return tape.gradient(loss, layer.trainable_variables)

    @tf.function
    def tf_infer_step(x, mask):
        kwargs = {} if mask is None else {"mask": mask}
        return layer(x, training=False, **kwargs)

    return lambda: tf_train_step(x_k, mask_k, valid_k), lambda: tf_infer_step(x_k, mask_k)


def kb_layer(cell, keras_bidirectional):
    """kb's Bidirectional with Keras's weights (kb keeps Keras's layout and order)."""
    import keras_birnn as kb

    units = keras_bidirectional.forward_layer.cell.units
    layer = kb.Bidirectional({"bigru": kb.GRUCell, "bilstm": kb.LSTMCell}[cell](units), return_sequences=True)
    layer.build((None, None, keras_bidirectional.forward_layer.cell.kernel.shape[0]))
    layer.set_weights(keras_bidirectional.get_weights())
    return layer


def kb_engine(layer):
    """The engines kb's layer ran so far, from its `loop_report()`: path
    and form of each plan (e.g. 'vendor torch.gru bidirectional packed';
    for the scan engine, why no vendor engine ran the call)."""
    seen = set()
    for plan in layer.loop_report().get("plans", []):
        why = f" (why not vendor: {plan['why not vendor']})" if plan.get("why not vendor") else ""
        seen.add(f"{plan['path']} {plan.get('form', '')}{why}".strip())
    return "; ".join(sorted(seen)) or "none seen"


def relative_difference(ours, theirs):
    """max |ours - theirs| over lists of arrays (gradients in the same
    order and shapes), relative to the largest entry of theirs."""
    ours, theirs = [to_numpy(g) for g in ours], [to_numpy(g) for g in theirs]
    assert [g.shape for g in ours] == [g.shape for g in theirs], ([g.shape for g in ours], [g.shape for g in theirs])
    scale = max(float(np.max(np.abs(g))) for g in theirs)
    return max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(ours, theirs)) / scale


def keras_forward(backend, layer, x, mask):
    """One eager forward pass of Keras's layer (for the checks), as NumPy."""
    import keras

    kwargs = {} if mask is None else {"mask": keras.ops.convert_to_tensor(mask)}
    if backend == "torch":
        import torch

        with torch.no_grad():
            return to_numpy(layer(keras.ops.convert_to_tensor(x), **kwargs))
    return to_numpy(layer(keras.ops.convert_to_tensor(x), **kwargs))


def keras_engine(backend, layer, x, mask):
    """Which of Keras's RNN functions ran on one eager forward pass: the
    backend's public `rnn`/`gru`/`lstm`/`bidirectional_*` (the layers call
    them through `keras.src.backend`) and its private fused paths
    (`_cudnn_*`, `_fallback_*`), in call order; a trailing '!' marks one that
    raised (Keras then falls back). 'rnn' is the generic step loop."""
    import importlib

    from keras.src import backend as keras_backend

    module = importlib.import_module(f"keras.src.backend.{backend}.rnn")
    calls, patched = [], []

    def wrap(owner, name):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            index = len(calls) - 1
            try:
                return original(*args, **kwargs)
            except Exception:
                calls[index] = name + "!"
                raise

        setattr(owner, name, wrapper)
        patched.append((owner, name, original))

    for name in ("rnn", "gru", "lstm", "bidirectional_gru", "bidirectional_lstm"):
        if hasattr(keras_backend, name):
            wrap(keras_backend, name)
    for name in dir(module):
        if name.startswith(("_cudnn", "_fallback")) and callable(getattr(module, name)):
            wrap(module, name)
    try:
        keras_forward(backend, layer, x, mask)
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
    seen = []
    for name in calls:
        if name not in seen:
            seen.append(name)
    return " ".join(seen) if seen else "none seen"


def torch_checks(cell, layer, module, x, lengths):
    """Keras against torch.nn on the torch backend, same weights: max |diff|
    of the outputs at valid steps, and of the weights' gradients (the loss
    of the training step) relative to their largest entry."""
    import keras
    import torch

    device = torch_device()
    batch, time_steps, _ = x.shape
    valid = valid_steps(batch, time_steps, lengths)
    valid_t = torch.from_numpy(valid[..., None].astype(np.float32)).to(device)
    kwargs = {} if lengths is None else {"mask": keras.ops.convert_to_tensor(valid)}
    y_keras = layer(keras.ops.convert_to_tensor(x), **kwargs)
    keras_grads = torch.autograd.grad(torch.sum(torch.square(y_keras * valid_t)),
                                      [v.value for v in layer.trainable_variables])
    x_t = torch.from_numpy(x).to(device)
    if lengths is None:
        y_torch = module(x_t)[0]
    else:
        packed = torch.nn.utils.rnn.pack_padded_sequence(x_t, torch.from_numpy(lengths), batch_first=True,
                                                         enforce_sorted=False)
        y_torch = torch.nn.utils.rnn.pad_packed_sequence(module(packed)[0], batch_first=True,
                                                         total_length=time_steps)[0]
    torch_grads = torch.autograd.grad(torch.sum(torch.square(y_torch * valid_t)), list(module.parameters()))
    outputs = float(np.max(np.abs(to_numpy(y_keras) - to_numpy(y_torch))[valid]))
    # Keras's gradients, direction by direction (kernel, recurrent, bias), in torch's layout and order.
    keras_grads = [to_numpy(g) for g in keras_grads]
    mapped = []
    for d in range(2):
        kernel, recurrent, bias = keras_grads[3 * d:3 * d + 3]
        w_ih, w_hh, b_ih, b_hh = torch_layout(cell, kernel, recurrent, bias)
        mapped += [w_ih, w_hh, b_ih, b_ih if cell == "bilstm" else b_hh]
    names = [name for name, _ in module.named_parameters()]
    assert len(names) == len(mapped), names
    scale = max(float(np.max(np.abs(to_numpy(g)))) for g in torch_grads)
    gradients = max(float(np.max(np.abs(m - to_numpy(g)))) for m, g in zip(mapped, torch_grads)) / scale
    return outputs, gradients


# --- timing ----------------------------------------------------------------------------------------


def measure(step, sync, repeats, warmup, max_seconds):
    """First call apart, then `warmup` untimed calls, then up to `repeats`
    timed ones, stopping once `max_seconds` are spent after the first call
    (at least one timed call)."""
    clock = time.perf_counter
    start = clock()
    sync(step())
    first = clock() - start
    start = clock()
    for _ in range(warmup):
        if clock() - start > max_seconds / 3:
            break
        sync(step())
    times = []
    while len(times) < repeats and (not times or clock() - start < max_seconds):
        t0 = clock()
        sync(step())
        times.append(clock() - t0)
    return {"first_ms": 1e3 * first, "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
            "max_ms": 1e3 * max(times), "repeats": len(times), "seconds": first + clock() - start}


# --- the run ---------------------------------------------------------------------------------------


def failure(what, error):
    """Prints a failure's traceback and returns its one-line summary."""
    print(f"  error in {what}: {error!r}", flush=True)
    traceback.print_exc(file=sys.stdout)
    return repr(error)


def case_names(shapes):
    return [f"{c}/{s}/{m}/{mode}" for s in shapes for c in CELLS for m in MASKINGS for mode in MODES]


def selected(name, patterns):
    return not patterns or any(fnmatch.fnmatch(name, p) for p in patterns)


def fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def run(args):
    info = set_up_backend(args.threads)
    backend = info["backend"]
    import importlib.util

    if importlib.util.find_spec("keras_birnn") is None:  # not installed (the GPU machine): this checkout's
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import keras_birnn

    info["keras_birnn"] = os.path.dirname(os.path.abspath(keras_birnn.__file__))  # a scratch copy shows here
    shapes = QUICK_SHAPES if args.quick else SHAPES
    patterns = [p.strip() for p in args.cases.split(",") if p.strip()] if args.cases else []
    names = [n for n in case_names(shapes) if selected(n, patterns)]
    peers = ["keras", "kb"] + (["torch.nn"] if backend == "torch" else [])
    reference = "kb"
    sync = synchronizer(backend)
    warm_device(backend)

    print(f"bench_backends: backend {backend}, keras {info['keras']}, "
          + ", ".join(f"{k} {info[k]}" for k in ("torch", "jax", "tensorflow") if k in info)
          + f", numpy {info['numpy']}, python {info['python']}")
    print(f"device: {info['device']}" + (f" (cuDNN {info['cudnn']})" if info.get("cudnn") else ""))
    print(f"precision: TF32 off: {info['precision']}")
    print(f"threads: {info['threads']}")
    print(f"kb: keras_birnn from {info['keras_birnn']}")
    budget = "none" if args.time_budget is None else f"{args.time_budget:g} s"
    print(f"cases: {len(names)}; repeats {args.repeats}, warm-up {args.warmup}, at most {args.max_seconds:g} s "
          f"a series after its first call, run budget {budget}; lengths uniform in {MIN_FRACTION:.0%}-100% of T "
          "(right padding)")
    print()
    header = f"{'case':<30} {'peer':<9} {'first ms':>10} {'median ms':>10} {'min-max ms':>19} {'n':>4}"
    if reference:
        header += f"  {'/' + reference:>10}"
    print(header, flush=True)

    report = {"info": info, "args": vars(args), "rows": [], "checks": [], "skipped": [], "errors": []}
    started = time.perf_counter()

    def over_budget():
        return args.time_budget is not None and time.perf_counter() - started > args.time_budget

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)

    groups = {}
    for name in names:
        cell, shape, masking, mode = name.split("/")
        groups.setdefault((cell, shape, masking), []).append(mode)
    for (cell, shape_name, masking), modes in groups.items():
        if over_budget():
            report["skipped"] += [f"{cell}/{shape_name}/{masking}/{m}" for m in modes]
            continue
        batch, time_steps, features, units = shape = shapes[shape_name]
        layer = keras_layer(cell, shape)
        x = inputs_for(batch, time_steps, features)
        lengths = lengths_for(batch, time_steps) if masking == "masked" else None
        valid = valid_steps(batch, time_steps, lengths)
        mask = valid if lengths is not None else None
        expected = oracle(cell, direction_weights(layer), x, lengths)

        # The timed steps, then exactness: every peer against the oracle at valid steps. A failing check
        # or series is reported and the run goes on (the GPU run happens once).
        case = f"{cell}/{shape_name}/{masking}"
        check = {"case": case}
        steps = {}
        try:
            steps["keras"] = keras_steps(backend, layer, x, mask, None if lengths is None else valid)
            if backend == "torch":
                train, infer, module = torch_nn_peer(cell, layer, x, lengths, None if lengths is None else valid)
                steps["torch.nn"] = (train, infer)
            ours = kb_layer(cell, layer)
            steps["kb"] = keras_steps(backend, ours, x, mask, None if lengths is None else valid)
            check["engine"] = keras_engine(backend, layer, x, mask)
            y_keras = keras_forward(backend, layer, x, mask)
            check["keras_vs_oracle"] = largest_difference(y_keras, expected, valid)
            if lengths is not None:
                # The mask must matter: without it, the backward direction reads the padding.
                y_unmasked = keras_forward(backend, layer, x, None)
                check["keras_mask_effect"] = float(np.max(np.abs(y_keras - y_unmasked)[valid]))
            if backend == "torch":
                check["torch.nn_vs_oracle"] = largest_difference(to_numpy(infer()), expected, valid)
                check["keras_vs_torch.nn"], check["grads_keras_vs_torch.nn_rel"] = torch_checks(
                    cell, layer, module, x, lengths)
            check["kb_vs_oracle"] = largest_difference(keras_forward(backend, ours, x, mask), expected, valid)
            check["kb_engine"] = kb_engine(ours)
        except Exception as error:  # noqa: BLE001  (reported, and the run goes on)
            check["error"] = failure(case, error)
        report["checks"].append(check)
        diffs = ", ".join(f"{k.replace('_vs_', ' vs ')} {v:.1e}" for k, v in check.items()
                          if k.endswith(("_vs_oracle", "_vs_torch.nn")))
        extra = ""
        if "grads_keras_vs_torch.nn_rel" in check:
            extra += f"; weight gradients keras vs torch.nn {check['grads_keras_vs_torch.nn_rel']:.1e} of the largest"
        if "keras_mask_effect" in check:
            extra += f"; mask honoured: keras(mask) vs keras(x) {check['keras_mask_effect']:.2f}"
        print(f"  check {case}: outputs max |diff| at valid steps: {diffs or '-'}{extra}")
        print(f"  keras engine: {check.get('engine', '-')}; kb engine: {check.get('kb_engine', '-')}", flush=True)

        for mode in modes:
            name = f"{cell}/{shape_name}/{masking}/{mode}"
            if over_budget():
                report["skipped"].append(name)
                continue
            results = {}
            for peer in peers:
                if peer not in steps:
                    continue
                try:
                    results[peer] = measure(steps[peer][0 if mode == "train" else 1], sync, args.repeats,
                                            args.warmup, args.max_seconds)
                except Exception as error:  # noqa: BLE001  (reported, and the run goes on)
                    report["errors"].append({"case": name, "peer": peer, "error": failure(f"{name} {peer}", error)})
            for peer, r in results.items():
                ratio = r["median_ms"] / results[reference]["median_ms"] if reference in results else None
                row = {"case": name, "cell": cell, "shape": shape_name, "batch": batch, "time": time_steps,
                       "features": features, "units": units, "masking": masking, "mode": mode, "peer": peer,
                       **r, "reference": reference, "ratio": ratio}
                report["rows"].append(row)
                line = (f"{name:<30} {peer:<9} {fmt(r['first_ms']):>10} {fmt(r['median_ms'], 2):>10} "
                        f"{fmt(r['min_ms'], 2) + '-' + fmt(r['max_ms'], 2):>19} {r['repeats']:>4}")
                if ratio is not None:
                    line += f"  {'x' + format(ratio, '.2f'):>10}"
                print(line, flush=True)
            if mode == "train" and "keras" in results and "kb" in results:
                # The timed training steps' own results (already compiled): kb's weight gradients against Keras's.
                try:
                    check["grads_kb_vs_keras_rel"] = relative_difference(steps["kb"][0](), steps["keras"][0]())
                    print(f"  check {case}: weight gradients kb vs keras "
                          f"{check['grads_kb_vs_keras_rel']:.1e} of the largest", flush=True)
                except Exception as error:  # noqa: BLE001  (reported, and the run goes on)
                    report["errors"].append({"case": name, "peer": "kb", "error": failure(f"{name} gradients", error)})
            save()
        save()

    summarize(report, reference)
    report["seconds"] = time.perf_counter() - started
    save()
    print(f"\ntotal {report['seconds']:.1f} s" + (f"; skipped (run budget): {', '.join(report['skipped'])}"
                                                   if report["skipped"] else ""))
    failed = [c["case"] for c in report["checks"] if "error" in c] + [f"{e['case']} {e['peer']}"
                                                                     for e in report["errors"]]
    if failed:
        print(f"failed (tracebacks above): {', '.join(failed)}")
    return report


def summarize(report, reference):
    """Per cell, shape and mode: every other contender / reference (kb) for
    masked and unmasked, and each contender's masked / unmasked."""
    rows = {(r["cell"], r["shape"], r["mode"], r["masking"], r["peer"]): r["median_ms"] for r in report["rows"]}
    keys = sorted({k[:3] for k in rows}, key=lambda k: (list(SHAPES).index(k[1]) if k[1] in SHAPES else -1, k))
    peers = sorted({k[4] for k in rows}, key=lambda p: (p != "keras", p != reference, p))
    if not keys:
        return
    print("\nsummary (median ms ratios)")
    columns = []
    for peer in peers:
        if reference and peer != reference:
            columns += [(f"{peer}/{reference} unmasked", (peer, reference, "unmasked")),
                        (f"{peer}/{reference} masked", (peer, reference, "masked"))]
    columns += [(f"{p} masked/unmasked", (p,)) for p in peers]
    width = max([22] + [len(title) + 2 for title, _ in columns])
    print(f"{'cell/shape/mode':<26}" + "".join(f"{title:>{width}}" for title, _ in columns))
    summary = []
    for cell, shape, mode in keys:
        line, entry = f"{cell + '/' + shape + '/' + mode:<26}", {"case": f"{cell}/{shape}/{mode}"}
        for title, spec in columns:
            if len(spec) == 3:  # peer / peer, one masking
                a, b = (rows.get((cell, shape, mode, spec[2], peer)) for peer in spec[:2])
            else:  # masked / unmasked, one peer
                a, b = (rows.get((cell, shape, mode, masking, spec[0])) for masking in ("masked", "unmasked"))
            value = a / b if a and b else None
            entry[title] = value
            line += f"{('x' + format(value, '.2f')) if value else '-':>{width}}"
        summary.append(entry)
        print(line)
    report["summary"] = summary


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few repeats (CPU tests)")
    parser.add_argument("--cases", default="", help="comma-separated fnmatch patterns of case names, "
                        "e.g. 'bigru/textbook/*' or '*/masked/train'")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per series (default 30; 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after the first (default 2)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop repeating a series once this long was spent on it after its first call "
                        "(default 10; 5 with --quick)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="skip the cases left once the run has spent this many seconds")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for a step's kernels (default: the framework's, all cores); "
                        "1 keeps times steady on a shared CPU")
    parser.add_argument("--json", default=None, help="write rows, checks and the header's facts here")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 30
    if args.max_seconds is None:
        args.max_seconds = 5.0 if args.quick else 10.0
    return args


if __name__ == "__main__":
    run(parse_args())
    sys.stdout.flush()
