"""Which loops XLA compiles: the shapes that recur, not every shape met.

XLA compiles one program per input shape. On 2 CPU cores a 64-unit
bidirectional layer's training program for one shape takes 0.3-0.4 s to
compile, and then saves 0.02-0.07 ms per time step over the plain
TensorFlow loop
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
`AUTO_COMPILE_STEPS` time steps at the shape (calls times time size): the
rule of renting until the rent paid equals the price of buying (at most
about twice the best choice in hindsight where the threshold is the
price over the rent), with the price (a compilation) and the rent (the
plain loop's extra time per step) measured by
`benchmarks/bench_compile_cost.py`, and the threshold at the low end of
their measured ratio (benchmarks/README.md says why). At most `max_compiled_shapes` shapes per layer are ever
compiled; the rest stay plain. The choice changes neither numbers beyond
float rounding nor gradients: both paths are the same traced loops and
the same hand-written BPTT (the NumPy oracle tests run on both).

Inference calls in a graph traced for any sequence length (`predict` or
`evaluate` on batches of varying length, a serving function) are not
counted by default: they run plain loops (the "inference" path of
`loop_report()`), without time buckets: compiled inference pays for its
compilation only after hundreds of calls at one shape, which bucketed
lengths rarely reach (`counts_inference`). Inference traced for one length (a fixed-shape
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

import contextlib
import threading
from typing import Dict, List, Optional, Union

import tensorflow as tf

_FLAG = 1 << 62  # marks a shape's "compiled" entry
_PROMOTED = -1  # the key counting the shapes compiled so far


# Time steps a layer runs at one shape before compiling it, by default:
# a compilation's cost over the plain loop's extra cost per step, both
# measured on 2 cores (benchmarks/README.md, "What a compilation costs and
# saves": 5,100-17,600 steps, median about 9,500), taken at the low end
# because whole models showed larger rents. 12,000 until the two
# directions of a bidirectional layer shared one XLA program, which halved
# the cost and left the steady-state steps as they were.
AUTO_COMPILE_STEPS = 6_000


class _Settings:
    compile_after = "auto"
    max_compiled_shapes = 16


@contextlib.contextmanager
def compilation(compile_after: Union[int, str, None] = None, max_compiled_shapes: Optional[int] = None):
    """Sets when loops traced inside the `with` block are compiled.

    Args:
        compile_after: A loop shape runs XLA-compiled from the time a
            layer meets it for the `compile_after`-th time (1: at once);
            before that it runs as plain TensorFlow. `"auto"` (the
            default): once the layer has run `AUTO_COMPILE_STEPS` time
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
    if compile_after is not None and compile_after != "auto" and not _is_count(compile_after, minimum=1):
        raise ValueError(f'`compile_after` must be an integer >= 1 or "auto", received {compile_after!r}.')
    if max_compiled_shapes is not None and not _is_count(max_compiled_shapes, minimum=0):
        raise ValueError(f"`max_compiled_shapes` must be an integer >= 0, received {max_compiled_shapes!r}.")
    previous = (_Settings.compile_after, _Settings.max_compiled_shapes)
    if compile_after is not None:
        _Settings.compile_after = compile_after
    if max_compiled_shapes is not None:
        _Settings.max_compiled_shapes = max_compiled_shapes
    try:
        yield
    finally:
        _Settings.compile_after, _Settings.max_compiled_shapes = previous


def _is_count(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def settings() -> dict:
    """The settings in force: `{"compile_after": ..., "max_compiled_shapes": ...}`."""
    return {"compile_after": _Settings.compile_after, "max_compiled_shapes": _Settings.max_compiled_shapes}


def calls_before_compiled(steps):
    """How many calls at a shape of `steps` time steps (after time buckets,
    at least 1) a layer makes before that shape runs compiled, under the
    settings in force: a Python int for an int, a tensor for a tensor (the
    layer's count, in its graph)."""
    if _Settings.compile_after != "auto":
        return _Settings.compile_after
    return (AUTO_COMPILE_STEPS + steps - 1) // steps


def counts_inference(static_length: bool) -> bool:
    """Whether an inference call in a graph is counted (and compiled once
    its shape recurs): under an explicit `compile_after`, or when the graph
    was traced for one sequence length (`static_length`). An inference
    graph traced for any length runs plain loops, uncounted and without
    time buckets: compiled inference loops pay for their compilation only
    after hundreds of calls at one shape (benchmarks/README.md, "The
    counted path at inference"), which lengths spread over time buckets
    rarely reach."""
    return _Settings.compile_after != "auto" or static_length


class ShapeCounter:
    """One layer's count of the loop shapes it met, and which it compiled.

    A `tf.lookup` table created outside any function, so every graph that
    calls the layer (`fit`, `evaluate`, `predict`) reads and updates the
    same counts; TensorFlow runs the operations on one table in program
    order. Not tracked, so a SavedModel never holds it (exports trace the
    loops without it, see `recurrence.run`).
    """

    def __init__(self):
        self._table = None
        self._lock = threading.Lock()
        self.traced_paths: Dict[str, int] = {}

    def __deepcopy__(self, memo):
        return ShapeCounter()  # a copied layer starts counting afresh

    def note_path(self, path: str) -> None:
        """Records, when a loop is traced or called eagerly, how it was built."""
        self.traced_paths[path] = self.traced_paths.get(path, 0) + 1

    def _lookup_table(self):
        with self._lock:
            if self._table is None:
                with tf.init_scope():
                    self._table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
        return self._table

    def decide(self, batch: tf.Tensor, steps: tf.Tensor, training: bool) -> tf.Tensor:
        """Counts one call at this shape; True where it runs compiled."""
        table = self._lookup_table()
        key = tf.cast(steps, tf.int64) * (1 << 32) + tf.cast(batch, tf.int64) * 2 + int(training)
        keys = tf.stack([key, key + _FLAG, tf.constant(_PROMOTED, tf.int64)])
        count, flag, promoted = tf.unstack(table.lookup(keys), num=3)
        count += 1
        threshold = calls_before_compiled(tf.maximum(tf.cast(steps, tf.int64), 1))
        promote = (flag == 0) & (count >= threshold) & (promoted < _Settings.max_compiled_shapes)
        compiled = (flag > 0) | promote
        update = table.insert(keys, tf.stack([count, tf.cast(compiled, tf.int64), promoted + tf.cast(promote, tf.int64)]))
        with tf.control_dependencies([update]):
            return tf.identity(compiled)

    def report(self) -> dict:
        """The shapes met and how each ran (read eagerly)."""
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
        return {"traced": dict(self.traced_paths), "shapes": shapes}


class LoopReporting:
    """For layers that run loops: their `ShapeCounter` and `loop_report()`."""

    @property
    def shape_counter(self) -> ShapeCounter:
        counter = self.__dict__.get("_shape_counter")
        if counter is None:
            # Set past the layer's attribute tracking: nothing to save or export.
            counter = self.__dict__["_shape_counter"] = ShapeCounter()
        return counter

    def loop_report(self) -> dict:
        """How this layer's loops ran.

        Returns:
            A dict with `"traced"`: how the loops were built, each time a
            graph was traced or an eager call made (`"counted"`: chosen per
            call at run time; `"inference"`: plain loops, uncounted, for
            inference traced for any length; `"compiled"`: XLA for a static shape or an
            export; `"plain"`: under `kb.xla_disabled()`; `"inside-xla"`:
            part of an XLA-compiled caller; `"higher-order"`,
            `"forward-mode"`: for derivatives of derivatives;
            `"forward-only"`: traced for an export), with counts;
            and `"shapes"`: per loop shape met by counted calls (`batch`,
            `time` after time buckets, `training`), its `calls` and whether
            it now runs `compiled`.

        Example:

        ```python
        model.fit(dataset, epochs=2)
        bi.loop_report()["shapes"][:1]
        # [{'batch': 32, 'time': 24, 'training': True, 'calls': 212, 'compiled': True}]
        ```
        """
        return self.shape_counter.report()
