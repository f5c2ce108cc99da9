"""Plain TensorFlow loops: functional `While` or lowered, by step size.

Outside XLA, TensorFlow runs a `tf.while_loop` either lowered to dataflow
frames (the executor schedules every op of every iteration) or as a
functional `While` op (the step called as one function per iteration).
`kb.LoopConfig.functional_step_limit` picks the
functional form up to that many multiply-adds per step (rows x (features +
units) x gate width, per loop: one direction per loop in graphs), and up to
`functional_row_limit` per row; a training loop only where a batch of
`functional_training_rows` rows would run it. This script times one call of a
`kb.Bidirectional(cell(units), return_sequences=True)` under
`kb.xla_disabled()`, traced with unknown batch and time sizes as
`model.fit` and `predict` trace it, with each form forced (the limit set
to 0 or to infinity), and with the default limit; the three alternate
call by call in one process, in a new random order each round.

    python benchmarks/bench_loop_forms.py                 # training steps (forward and BPTT)
    python benchmarks/bench_loop_forms.py --inference     # inference calls
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_birnn as kb  # noqa: E402
from bench_compile_cost import training_step  # noqa: E402
FORMS = {"lowered": (0, 0), "functional": (10**15, 10**15),
         "default": (kb.loop_config().functional_step_limit, kb.loop_config().functional_row_limit)}
SIZES = [(32, 32), (64, 64), (96, 128), (128, 196), (256, 256)]  # (units, features)
GATES = {"gru": 3, "lstm": 4}


def _traced(cell: str, units: int, features: int, inference: bool, limits: tuple, x, mask):
    """The step traced with every loop form built afresh under `limits`
    (per step, per row)."""
    step_limit, row_limit = limits
    with kb.configure_loops(xla=False, functional_step_limit=step_limit, functional_row_limit=row_limit):
        step = training_step(cell, units, features, inference)
        step.get_concrete_function()
        step(x, mask)
    return step


def measure(cell: str, units: int, features: int, batch: int, args) -> dict:
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(batch, args.length, features)), tf.float32)
    mask = tf.sequence_mask(rng.integers(args.length // 2, args.length + 1, batch), args.length)
    steps = {name: _traced(cell, units, features, args.inference, limit, x, mask) for name, limit in FORMS.items()}
    times = {name: [] for name in steps}
    for _ in range(args.calls):
        # Shuffled: a call measured right after another ran up to 30%
        # faster or slower by its place alone.
        for name in rng.permutation(list(steps)):
            start = time.perf_counter()
            steps[name](x, mask)
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["lstm", "gru"], choices=sorted(GATES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 128, 512])
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--units", nargs="+", type=int, help="only these sizes (units) of the default list")
    parser.add_argument("--inference", action="store_true", help="time inference calls (training=False)")
    args = parser.parse_args(argv)
    what = "inference call" if args.inference else "training step"
    print(f"{what} of Bidirectional(cell(units)) under kb.xla_disabled(), length {args.length} (half to all "
          f"valid), default limits {FORMS['default'][0]:,} multiply-adds per step, {FORMS['default'][1]:,} per row; "
          f"{os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    for cell in args.cells:
        for units, features in [s for s in SIZES if not args.units or s[0] in args.units]:
            for batch in args.batches:
                m = measure(cell, units, features, batch, args)
                per_row = (features + units) * GATES[cell] * units
                madds = batch * per_row
                step_limit, row_limit = FORMS["default"]
                chosen = "functional" if madds <= step_limit and per_row <= row_limit else "lowered"
                print(f"{cell:4s} units {units:3d} features {features:3d} batch {batch:3d} | {madds / 1e6:6.2f} M "
                      f"multiply-adds | lowered {m['lowered']:7.2f} ms, functional {m['functional']:7.2f} ms "
                      f"(x{m['lowered'] / m['functional']:.2f}) | default ({chosen}) {m['default']:7.2f} ms",
                      flush=True)


if __name__ == "__main__":
    main()
