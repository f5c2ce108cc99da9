"""What an XLA compilation costs and what it saves: the numbers behind the compile policy.

For one training step of a `kb.Bidirectional(cell(units), return_sequences=True)`
(inside a `tf.function` traced with unknown batch and time sizes, as
`model.fit` traces it), per time bucket: the first call at a new shape with
every shape compiled at once (`kb.compilation(compile_after=1)`: trace
excluded, so that is XLA's compilation), and the steady-state time of a call
run plain and run compiled. `kb.LoopConfig.auto_compile_steps`
is about compile cost / saving per step.

    python benchmarks/bench_compile_cost.py
    python benchmarks/bench_compile_cost.py --cells gru --lengths 20 40 --batch 64
    python benchmarks/bench_compile_cost.py --inference    # inference calls, and the default's uncounted loops

"plain" and "compiled" are the two forms of the counted path, chosen per call
by a `tf.cond`; with `--inference`, "uncounted plain" is what an inference
call runs by default (plain loops, no count, no `tf.cond`).
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_birnn as kb  # noqa: E402
from keras_birnn.recurrence.tensorflow import bucketing
from keras_birnn.recurrence import compile_policy  # noqa: E402

CELLS = {"gru": kb.GRUCell, "lstm": kb.LSTMCell, "simple": kb.SimpleRNNCell}


def training_step(cell: str, units: int, features: int, inference: bool = False):
    keras.utils.set_random_seed(0)
    layer = kb.Bidirectional(CELLS[cell](units), return_sequences=True)
    layer.build((None, None, features))
    spec = [tf.TensorSpec([None, None, features]), tf.TensorSpec([None, None], tf.bool)]

    @tf.function(input_signature=spec)
    def step(x, mask):
        if inference:
            return layer(x, mask=mask, training=False)
        with tf.GradientTape() as tape:
            y = layer(x, mask=mask, training=True)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, layer.trainable_variables)

    return step


def steady_ms(step, x, mask, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        step(x, mask)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def measure(cell: str, length: int, args) -> dict:
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(args.batch, length, args.features)), tf.float32)
    mask = tf.sequence_mask(rng.integers(length // 2, length + 1, args.batch), length)
    result = {}
    rules = [("plain", compile_policy.compilation(compile_after=10**9)),  # counted, never compiled
             ("compiled", compile_policy.compilation(compile_after=1))]
    if args.inference:
        rules.append(("uncounted", compile_policy.compilation()))  # the default for inference: no switch
    for name, rule in rules:
        with rule:
            step = training_step(cell, args.units, args.features, args.inference)
            step.get_concrete_function()  # the trace, not timed
            start = time.perf_counter()
            step(x, mask)
            result[f"{name}_first_s"] = time.perf_counter() - start
            result[f"{name}_ms"] = steady_ms(step, x, mask, args.calls)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["gru", "lstm"], choices=sorted(CELLS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[20, 40, 90])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--inference", action="store_true",
                        help="time an inference call instead (training=False), also with the default rule's "
                             "uncounted plain loops")
    args = parser.parse_args(argv)
    what = "inference call" if args.inference else "training step"
    print(f"{what} of Bidirectional({args.units} units), batch {args.batch}, {args.features} features, "
          f"lengths up to T (half to all valid); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    for cell in args.cells:
        for length in args.lengths:
            r = measure(cell, length, args)
            bucket = int(bucketing.bucket_length(tf.constant(length)))
            compile_s = r["compiled_first_s"] - r["plain_first_s"]
            saved = r["plain_ms"] - r["compiled_ms"]
            calls = 1e3 * compile_s / saved if saved > 0 else float("inf")
            line = (f"{cell:6s} T {length:4d} (bucket {bucket:4d}) | plain {r['plain_ms']:7.2f} ms, compiled "
                    f"{r['compiled_ms']:7.2f} ms (x{r['plain_ms'] / r['compiled_ms']:.2f}) | "
                    f"compilation {compile_s:5.2f} s | pays after {calls:6.0f} calls = {calls * bucket:7.0f} bucket steps")
            if args.inference:
                line += f" | uncounted plain {r['uncounted_ms']:7.2f} ms"
            print(line, flush=True)


if __name__ == "__main__":
    main()
