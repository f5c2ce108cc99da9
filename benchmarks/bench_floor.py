"""How fast can a bidirectional recurrence be on this machine, whatever runs it?

`bench_bidirectional.py` divides the recurrence's FLOPs by the best rate of a
large square matmul. The recurrent matmuls cannot reach that rate: each is a
small `[batch, units] x [units, gates * units]` product that needs the
previous step's result. This script measures the best rate of exactly that
chain (two independent chains, one per direction, as a bidirectional layer
has), keeping nothing but a `tanh` between steps, with XLA (one loop for
both chains, and one loop per chain run concurrently), with plain
TensorFlow and with PyTorch, and prints the achievable floor: the input
projection of all steps at the large-matmul rate plus the recurrent chain at
its measured time. A training step has two such chains (the forward loop and
the BPTT loop, whose `[batch, gates * units] x [gates * units, units]`
products have the same FLOPs) and three more large products (the input
projection's two gradients and the recurrent kernel's gradient summed over
time). No implementation of the layer can beat these floors.

    python benchmarks/bench_floor.py
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench_bidirectional import GATES, SHAPES, _timed, best_matmul_rate  # noqa: E402


def _best(fn, rounds):
    fn()  # trace and compile
    return min(_timed(fn) for _ in range(rounds))


def _chain_setup(batch, units, width):
    """Two recurrent weights `[units, width]` and a start state `[batch, units]`."""
    rng = np.random.default_rng(0)
    weights = [tf.constant(rng.normal(size=(units, width)).astype("float32") * 0.05) for _ in range(2)]
    return weights, tf.constant(rng.normal(size=(batch, units)).astype("float32"))


def _link(h, r, units):
    """One step of a chain: h <- tanh(h R)[:, :units]."""
    return tf.tanh(tf.matmul(h, r))[:, :units]


def tf_chain(batch, steps, units, width, jit):
    """Two independent chains in one loop, `steps` long."""
    weights, start = _chain_setup(batch, units, width)

    @tf.function(jit_compile=jit, autograph=False)
    def chain(h0, r0, r1):
        body = lambda i, a, b: (i + 1, _link(a, r0, units), _link(b, r1, units))  # noqa: E731
        return tf.while_loop(lambda i, *_: i < steps, body, (tf.constant(0), h0, h0))[1:]

    return lambda: chain(start, *weights)[0]


def tf_split_chains(batch, steps, units, width):
    """The two chains as two XLA computations in one graph, which
    TensorFlow's executor runs at the same time (as keras_birnn does)."""
    weights, start = _chain_setup(batch, units, width)

    @tf.function(jit_compile=True, autograph=False)
    def one_chain(h0, r):
        body = lambda i, a: (i + 1, _link(a, r, units))  # noqa: E731
        return tf.while_loop(lambda i, _: i < steps, body, (tf.constant(0), h0))[1]

    @tf.function(autograph=False)
    def chains(h0, r0, r1):
        return one_chain(h0, r0), one_chain(h0, r1)

    return lambda: chains(start, *weights)[0]


def torch_chain(batch, steps, units, width):
    import torch

    torch.set_num_threads(2)
    r0, r1 = (torch.randn(units, width) * 0.05 for _ in range(2))
    h0 = torch.randn(batch, units)

    def chain():
        a = b = h0
        with torch.no_grad():
            for _ in range(steps):
                a = torch.tanh(a @ r0)[:, :units]
                b = torch.tanh(b @ r1)[:, :units]
        return a

    return chain


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", nargs="+", default=["textbook", "large"])
    parser.add_argument("--cells", nargs="+", default=["gru", "lstm"])
    args = parser.parse_args(argv)
    rate = best_matmul_rate()
    print(f"best large matmul {rate / 1e9:.1f} GFLOP/s; recurrent chain: best of XLA (fused, split), TensorFlow, PyTorch")
    for shape_name in args.shapes:
        batch, steps, features, units = SHAPES[shape_name]
        for cell in args.cells:
            width = GATES[cell] * units
            chains = {
                "xla": tf_chain(batch, steps, units, width, True),
                "xla_split": tf_split_chains(batch, steps, units, width),
                "tf": tf_chain(batch, steps, units, width, False),
            }
            try:
                chains["torch"] = torch_chain(batch, steps, units, width)
            except ImportError:
                pass
            seconds = {name: _best(fn, args.rounds) for name, fn in chains.items()}
            chain_s = min(seconds.values())
            recurrent_flops = 2 * 2 * steps * batch * units * width
            input_flops = 2 * 2 * steps * batch * features * width
            naive = (recurrent_flops + input_flops) / rate
            infer_floor = chain_s + input_flops / rate
            train_floor = 2 * chain_s + (3 * input_flops + recurrent_flops) / rate
            detail = " ".join(f"{n} {1e3 * s:.2f} ms" for n, s in seconds.items())
            print(f"{shape_name} {cell}: recurrent chain {detail} -> {recurrent_flops / chain_s / 1e9:.1f} GFLOP/s; "
                  f"achievable floor: inference {1e3 * infer_floor:.2f} ms (x{infer_floor / naive:.2f} the "
                  f"large-matmul floor {1e3 * naive:.2f} ms), training step {1e3 * train_floor:.2f} ms "
                  f"(x{train_floor / (3 * naive):.2f} of {1e3 * 3 * naive:.2f} ms)", flush=True)


if __name__ == "__main__":
    main()
