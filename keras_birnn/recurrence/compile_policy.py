"""Which loops XLA compiles: the shapes that recur, not every shape met.

XLA compiles one program per input shape. A compilation costs far more
than the time it then saves per time step over the plain TensorFlow loop
(benchmarks/README.md, "What a compilation costs and saves"): a shape must
come back for thousands of steps before its compilation has paid. A
layer that meets a new shape at nearly every batch (a character encoder
whose batch is the number of words in the batch, a last partial batch,
lengths beyond the time buckets) would spend its time compiling programs
it uses once.

So each layer counts, at run time, the loop shapes it meets (batch size,
time size after `bucketing`, training or inference), and runs a shape's
loops as plain TensorFlow until it has met that shape `compile_after`
times; from then on that shape runs XLA-compiled. By default
(`compile_after="auto"`) that is once the layer has run
`auto_compile_steps` time steps at the shape (calls times time size,
`kb.LoopConfig`): the
rule of renting until the rent paid equals the price of buying (at most
about twice the best choice in hindsight where the threshold is the
price over the rent), with the price (a compilation) and the rent (the
plain loop's extra time per step) measured by
`benchmarks/bench_compile_cost.py`, and the threshold at the low end of
their measured ratio (same section). At most `max_compiled_shapes` shapes per layer are ever
compiled; the rest stay plain. The choice changes neither numbers beyond
float rounding nor gradients: both paths are the same traced loops and
the same hand-written BPTT (the NumPy oracle tests run on both).

Inference calls in a graph traced for any sequence length (`predict` or
`evaluate` on batches of varying length, a serving function) are not
counted by default: they run plain loops (the "inference" path of
`loop_report()`), without time buckets: compiled inference pays for its
compilation only after hundreds of calls at one shape, which bucketed
lengths rarely reach (`recurrence.tensorflow.plan.counts_inference`). Inference traced for one length (a fixed-shape
function, `predict` on batches padded to one length) and, under an
explicit `compile_after`, every inference call are counted like training
calls.

Counting happens in graphs and in eager calls alike, static shapes
included: `model.fit` first traces the exact shape of its first batch,
which may never come again. The counts are per layer, so two identical,
seeded runs make the same choices and stay bitwise identical. Exports
(a SavedModel being written) trace fixed loops, without counts.

`Bidirectional.loop_report()` / `Recurrent.loop_report()` show the shapes
a layer met, how often, and which it compiled.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Dict, List, Optional, Union

from keras_birnn import backend
from keras_birnn.config import LoopConfig, configure_loops, loop_config

if backend.IS_TENSORFLOW:  # the counts live in a TensorFlow table (the scan engine only notes plans)
    import tensorflow as tf

_FLAG = 1 << 62  # marks a shape's "compiled" entry
_PROMOTED = -1  # the key counting the shapes compiled so far
_SHAPES = -2  # the key counting the shapes counted so far
# Where an uncounted shape's entries go, so that the table stays bounded.
_SPARE_KEYS = (-3, -4, -5, -6)


@contextlib.contextmanager
def compilation(compile_after: Union[int, str, None] = None, max_compiled_shapes: Optional[int] = None):
    """Sets when loops traced inside the `with` block are compiled, in this
    context (thread) only: a shorthand for `kb.configure_loops`.

    Args:
        compile_after: A loop shape runs XLA-compiled from the time a
            layer meets it for the `compile_after`-th time (1: at once);
            before that it runs as plain TensorFlow. `"auto"` (the
            default): once the layer has run `auto_compile_steps` time
            steps at that shape.
        max_compiled_shapes: At most this many shapes per layer are
            compiled (0: none).

    Read when functions are traced, like `kb.xla_disabled()`.

    Example:

    ```python
    with kb.compilation(compile_after=1):
        model.fit(dataset)      # every shape compiled when first met
    ```
    """
    changes = {}
    if compile_after is not None:
        changes["compile_after"] = compile_after
    if max_compiled_shapes is not None:
        changes["max_compiled_shapes"] = max_compiled_shapes
    with configure_loops(**changes):
        yield


def settings() -> dict:
    """The compile settings in force: `{"compile_after": ..., "max_compiled_shapes": ...}`."""
    config = loop_config()
    return {"compile_after": config.compile_after, "max_compiled_shapes": config.max_compiled_shapes}


def calls_before_compiled(steps, config: Optional[LoopConfig] = None):
    """How many calls at a shape of `steps` time steps (after time buckets,
    at least 1) a layer makes before that shape runs compiled, under
    `config` (default: the one in force): a Python int for an int, a tensor
    for a tensor (the layer's count, in its graph)."""
    config = config or loop_config()
    if config.compile_after != "auto":
        return config.compile_after
    return (config.auto_compile_steps + steps - 1) // steps


class ShapeCounter:
    """One layer's count of the loop shapes it met, and which it compiled.

    A `tf.lookup` table created outside any function, so every graph that
    calls the layer (`fit`, `evaluate`, `predict`) reads and updates the
    same counts; TensorFlow runs the operations on one table in program
    order. Not tracked, so a SavedModel never holds it (exports trace the
    loops without it, see `recurrence.run`). Bounded: at most
    `max_counted_shapes` shapes are counted (a later new shape runs plain,
    uncounted), so a server meeting ever new shapes keeps a table of fixed
    size.
    """

    def __init__(self):
        self._table = None
        self._lock = threading.Lock()
        self._plans: Dict[tuple, int] = {}

    def __deepcopy__(self, memo):
        return ShapeCounter()  # a copied layer starts counting afresh

    def note_plan(self, plan) -> None:
        """Records, when a loop is traced or called eagerly, the plan it ran."""
        described = tuple(plan.describe().items())
        with self._lock:
            self._plans[described] = self._plans.get(described, 0) + 1

    def _lookup_table(self):
        with self._lock:
            if self._table is None:
                with tf.init_scope():
                    self._table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
        return self._table

    def decide(self, batch: tf.Tensor, steps: tf.Tensor, *, training: bool, config: LoopConfig) -> tf.Tensor:
        """Counts one call at this shape; True where it runs compiled. A
        shape first met once `max_counted_shapes` are counted is not
        counted (its entries go to spare keys) and runs plain."""
        table = self._lookup_table()
        key = tf.cast(steps, tf.int64) * (1 << 32) + tf.cast(batch, tf.int64) * 2 + int(training)
        keys = tf.stack([key, key + _FLAG, tf.constant(_PROMOTED, tf.int64), tf.constant(_SHAPES, tf.int64)])
        count, flag, promoted, shapes = tf.unstack(table.lookup(keys), num=4)
        counted = (count > 0) | (shapes < config.max_counted_shapes)
        threshold = calls_before_compiled(tf.maximum(tf.cast(steps, tf.int64), 1), config)
        promote = counted & (flag == 0) & (count + 1 >= threshold) & (promoted < config.max_compiled_shapes)
        compiled = (flag > 0) | promote
        values = tf.stack([count + 1, tf.cast(compiled, tf.int64), promoted + tf.cast(promote, tf.int64),
                           shapes + tf.cast(count == 0, tf.int64)])
        update = table.insert(tf.where(counted, keys, tf.constant(_SPARE_KEYS, tf.int64)), values)
        with tf.control_dependencies([update]):
            return tf.identity(compiled)

    def report(self) -> dict:
        """The plans that ran and the shapes met, and how each ran (read eagerly)."""
        shapes: List[dict] = []
        if self._table is not None:
            keys, values = (t.numpy().tolist() for t in self._table.export())
            entries = dict(zip(keys, values))
            for key, count in sorted(entries.items()):
                if key < 0 or key & _FLAG:
                    continue
                shapes.append(
                    {
                        "batch": (key >> 1) & 0x7FFFFFFF,
                        "time": key >> 32,
                        "training": bool(key & 1),
                        "calls": count,
                        "compiled": bool(entries.get(key | _FLAG, 0)),
                    }
                )
        with self._lock:
            plans = [dict(described, calls=calls) for described, calls in self._plans.items()]
        traced: Dict[str, int] = {}
        for p in plans:
            traced[p["path"]] = traced.get(p["path"], 0) + p["calls"]
        return {"traced": traced, "plans": plans, "shapes": shapes}
