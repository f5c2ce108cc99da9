"""Bidirectional RNN speed: keras_birnn vs keras.layers.Bidirectional vs PyTorch.

Peers are interleaved round by round in one process, so every ratio compares
measurements taken under the same machine load. In each round every peer
makes one untimed call and then one timed call: a training loop calls the
same step over and over, and the first call right after another library's
measured up to 1.8 times slower for keras_birnn and 1.6 times for Keras.
Prints median and min-max milliseconds per batch, ratios to keras_birnn,
keras_birnn's and Keras's ratios to the arithmetic floor (the recurrence's
FLOPs at the best matmul rate measured here), and each peer's first call
(tracing and compilation included), measured in a fresh process per peer.

PyTorch in the same process slows TensorFlow's loops (both Keras's and
ours) by up to 2x, pauses or not, so `--no-torch` measures the TensorFlow
peers alone.

    python benchmarks/bench_bidirectional.py                 # full table
    python benchmarks/bench_bidirectional.py --quick         # a smoke run
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_birnn as kb  # noqa: E402
from keras_birnn.recurrence import compile_policy  # noqa: E402

SHAPES = {"textbook": (64, 100, 32, 64), "large": (32, 200, 128, 256), "quick": (4, 6, 3, 5)}  # batch, time, input, hidden
GATES = {"gru": 3, "lstm": 4, "simple": 1}
KERAS_LAYERS = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM, "simple": keras.layers.SimpleRNN}
OUR_CELLS = {"gru": kb.GRUCell, "lstm": kb.LSTMCell, "simple": kb.SimpleRNNCell}


def recurrence_flops(cell, batch, time_steps, features, units):
    """Multiply-adds x 2 of both directions' input and recurrent matmuls."""
    return 2 * 2 * time_steps * batch * (features + units) * GATES[cell] * units


def best_matmul_rate(rounds=5, sizes=(1024, 2048)):
    """Best FLOP/s of large square float32 matmuls on this machine (the
    floor's rate): the larger size reaches a higher rate here."""
    best = 0.0
    for n in sizes:
        a = tf.random.normal([n, n])
        mm = tf.function(lambda a=a: tf.matmul(a, a))
        mm()
        best = max(best, 2 * n**3 / min(_timed(mm) for _ in range(rounds)))
    return best


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    if hasattr(result, "numpy"):
        result.numpy()
    return time.perf_counter() - start


def keras_model(cell, units, features, ours):
    if ours:
        layer = kb.Bidirectional(OUR_CELLS[cell](units), return_sequences=True)
    else:
        layer = keras.layers.Bidirectional(KERAS_LAYERS[cell](units, return_sequences=True))
    inputs = keras.Input((None, features))
    return keras.Model(inputs, layer(inputs))


def tf_runners(model, x, y, jit):
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)

    @tf.function(jit_compile=jit)
    def infer(x):
        return model(x, training=False)

    @tf.function(jit_compile=jit)
    def train(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return lambda: infer(x), lambda: train(x, y)


def torch_runners(cell, x, y, units):
    import torch

    torch.set_num_threads(2)
    cls = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM, "simple": torch.nn.RNN}[cell]
    net = cls(x.shape[-1], units, batch_first=True, bidirectional=True)
    optimizer = torch.optim.Adam(net.parameters(), 1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def infer():
        with torch.no_grad():
            return net(tx)[0]

    def train():
        optimizer.zero_grad()
        loss = torch.mean((net(tx)[0] - ty) ** 2)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return infer, train


def peers_for(cell, shape, with_torch):
    batch, time_steps, features, units = shape
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, time_steps, features)).astype("float32")
    y = rng.normal(size=(batch, time_steps, 2 * units)).astype("float32")
    keras_net = keras_model(cell, units, features, ours=False)
    peers = {
        "keras": tf_runners(keras_net, x, y, jit=False),
        "keras_jit": tf_runners(keras_net, x, y, jit=True),
        "keras_birnn": tf_runners(keras_model(cell, units, features, ours=True), x, y, jit=False),
    }
    if with_torch:
        peers["torch"] = torch_runners(cell, x, y, units)
    return peers


def measure(peers, mode, rounds, steps, warmup=2):
    """Steady-state times. keras_birnn's warm-up runs until the shape is
    XLA-compiled (the loops run plain until a layer has run enough steps at
    a shape: keras_birnn.recurrence.compile_policy)."""
    index = 0 if mode == "infer" else 1
    for name, fns in peers.items():
        calls = warmup + (compile_policy.calls_before_compiled(steps) if name == "keras_birnn" else 0)
        for _ in range(calls):
            _timed(fns[index])
    times = {name: [] for name in peers}
    for _ in range(rounds):
        for name, fns in peers.items():
            _timed(fns[index])  # settles this peer's threads after the previous peer's
            times[name].append(_timed(fns[index]))
    return times


def report_row(label, times, floor_s):
    ours = statistics.median(times["keras_birnn"])
    cells = []
    for name, ts in times.items():
        med = statistics.median(ts)
        cells.append(f"{name} {1e3 * med:8.2f} ms [{1e3 * min(ts):.2f}-{1e3 * max(ts):.2f}] x{med / ours:4.2f}")
    keras_floor = statistics.median(times["keras"]) / floor_s
    print(f"{label:26s} " + " | ".join(cells) + f" | ours/floor x{ours / floor_s:.2f} | keras/floor x{keras_floor:.2f}",
          flush=True)


def first_call(peer, shape_name, cell, mode):
    """Seconds of `peer`'s first call (tracing and compiling included), in a
    fresh process so that nothing was compiled or warmed before it; the
    model is built before the clock starts."""
    command = [sys.executable, __file__, "--first-call-of", peer, shape_name, cell, mode]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=dict(os.environ))
    return float(out.stdout.strip().splitlines()[-1])


def _first_call_child(peer, shape_name, cell, mode):
    batch, time_steps, features, units = SHAPES[shape_name]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, time_steps, features)).astype("float32")
    y = rng.normal(size=(batch, time_steps, 2 * units)).astype("float32")
    if peer == "torch":
        fns = torch_runners(cell, x, y, units)
    else:
        model = keras_model(cell, units, features, ours=peer == "keras_birnn")
        fns = tf_runners(model, x, y, jit=peer == "keras_jit")
    print(_timed(fns[0 if mode == "infer" else 1]))


def report_first_calls(peer_names, shape_name, cell, mode):
    seconds = {peer: first_call(peer, shape_name, cell, mode) for peer in peer_names}
    cells = " | ".join(f"{peer} {s:6.2f} s" for peer, s in seconds.items())
    ratio = seconds["keras_birnn"] / seconds["keras"]
    print(f"{shape_name} {cell} {mode:5s} first call: {cells} | ours/keras x{ratio:.2f}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", nargs="+", default=["textbook", "large"])
    parser.add_argument("--cells", nargs="+", default=["gru", "lstm", "simple"])
    parser.add_argument("--modes", nargs="+", default=["infer", "train"])
    parser.add_argument("--quick", action="store_true", help="tiny shape, 2 rounds")
    parser.add_argument("--no-first-call", action="store_true", help="skip the fresh-process first calls")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out even when it is installed")
    parser.add_argument("--first-call-of", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_call_of:
        return _first_call_child(*args.first_call_of)
    if args.quick:
        args.shapes, args.rounds = ["quick"], 2
    with_torch = False
    if not args.no_torch:
        try:
            import torch  # noqa: F401

            with_torch = True
        except ImportError:
            pass
    rate = best_matmul_rate()
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, best matmul {rate / 1e9:.1f} GFLOP/s, "
          f"{os.cpu_count()} CPUs, "
          f"torch {'yes' if with_torch else 'not installed'}; times: median [min-max] over {args.rounds} rounds; "
          "xN = peer time / keras_birnn time")
    for shape_name in args.shapes:
        for cell in args.cells:
            peers = peers_for(cell, SHAPES[shape_name], with_torch)
            flops = recurrence_flops(cell, *SHAPES[shape_name])
            for mode in args.modes:
                floor = flops / rate * (3 if mode == "train" else 1)
                report_row(f"{shape_name} {cell} {mode}", measure(peers, mode, args.rounds, SHAPES[shape_name][1]), floor)
            del peers
    if args.no_first_call:
        return
    names = ["keras", "keras_jit", "keras_birnn"] + (["torch"] if with_torch else [])
    for shape_name in args.shapes:
        for cell in args.cells:
            for mode in args.modes:
                report_first_calls(names, shape_name, cell, mode)


if __name__ == "__main__":
    main()
