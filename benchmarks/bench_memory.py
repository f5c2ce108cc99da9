"""Peak memory of one training step against sequence length, ours vs Keras.

Each (peer, T) runs in its own fresh process. The kernel's peak-RSS counter
is reset (`/proc/self/clear_refs`) just before the first training step, and
the figure is that step's peak resident memory minus the resident memory
just before it. It includes tracing and compilation, a roughly constant
offset, which cancels in the growth per step of T between two lengths (the
figure that matters). A second step cannot be measured this way: the memory
the first one touched stays resident (TensorFlow's CPU allocations are not
returned to the OS), so the second step's peak above it is ~0 whatever T.

    python benchmarks/bench_memory.py                       # T = 1k, 5k, 20k
    python benchmarks/bench_memory.py --lengths 1000 2000   # other lengths

Peers: keras_birnn (default: one loop per direction, run concurrently),
keras_birnn_lockstep (both directions in one loop, `kb.lockstep_directions`)
and keras.layers.Bidirectional.
"""

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import contextlib, json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import keras, numpy as np, tensorflow as tf
import keras_birnn as kb
peer, cell, steps, batch, features, units = sys.argv[1:7]
steps, batch, features, units = int(steps), int(batch), int(features), int(units)
# keras_birnn_lockstep: both directions in one loop (kb.lockstep_directions)
tracing = kb.lockstep_directions() if peer == "keras_birnn_lockstep" else contextlib.nullcontext()
if peer.startswith("keras_birnn"):
    layer = kb.Bidirectional({"gru": kb.GRUCell, "lstm": kb.LSTMCell}[cell](units), return_sequences=True)
else:
    layer = keras.layers.Bidirectional({"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[cell](units, return_sequences=True))
x = tf.random.normal([batch, steps, features])
layer(x[:, :2])
@tf.function
def step(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(layer(x, training=True)))
    return tape.gradient(loss, layer.trainable_variables)
def status_mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM, the peak RSS
before = status_mb("VmRSS")
with tracing:
    grads = [g.numpy() for g in step(x)]  # traces, compiles and runs one step
after = status_mb("VmHWM")
assert all(np.isfinite(g).all() for g in grads)
print(json.dumps({"before_mb": before, "after_mb": after}))
"""


def measure(peer, cell, steps, batch, features, units):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, peer, cell, str(steps), str(batch), str(features), str(units)],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1][:120]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["after_mb"] - result["before_mb"], None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 5000, 20000])
    parser.add_argument("--cells", nargs="+", default=["gru"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--peers", nargs="+", default=["keras_birnn", "keras_birnn_lockstep", "keras"])
    args = parser.parse_args(argv)
    print(f"peak memory of the first training step (MB above the built model, compilation included), "
          f"batch {args.batch}, input {args.features}, hidden {args.units}")
    for cell in args.cells:
        rows = {}
        for steps in args.lengths:
            for peer in args.peers:
                rows[(peer, steps)] = measure(peer, cell, steps, args.batch, args.features, args.units)
                mb, err = rows[(peer, steps)]
                per_step = "" if mb is None else f"{1024 * mb / steps:7.1f} KB/step"
                print(f"{cell:5s} T={steps:6d} {peer:17s} "
                      + (f"{mb:9.1f} MB {per_step}" if mb is not None else f"failed: {err}"), flush=True)
        ours_peers = [p for p in args.peers if p != "keras"]
        for steps in args.lengths:
            theirs = rows.get(("keras", steps), (None,))[0]
            for peer in ours_peers:
                ours = rows[(peer, steps)][0]
                if ours and theirs:
                    print(f"{cell:5s} T={steps:6d} {peer}/keras memory x{ours / theirs:.2f}")
        lengths = sorted(args.lengths)
        slopes = {}
        for peer in args.peers:
            # Per interval (linear growth: about the same slope in each) and overall.
            for low_t, high_t in list(zip(lengths, lengths[1:])) + [(lengths[0], lengths[-1])]:
                low, high = rows[(peer, low_t)][0], rows[(peer, high_t)][0]
                if low is not None and high is not None and high_t > low_t:
                    slope = 1024 * (high - low) / (high_t - low_t)
                    slopes[(peer, low_t, high_t)] = slope
                    print(f"{cell:5s} {peer:17s} growth {slope:6.1f} KB per step of T (T={low_t}..{high_t})")
        theirs = slopes.get(("keras", lengths[0], lengths[-1]))
        for peer in ours_peers:
            ours = slopes.get((peer, lengths[0], lengths[-1]))
            if ours and theirs:
                print(f"{cell:5s} growth per step of T, {peer}/keras x{ours / theirs:.2f}")


if __name__ == "__main__":
    main()
