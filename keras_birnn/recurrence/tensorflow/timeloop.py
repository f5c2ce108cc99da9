"""Time-loop mechanics: which positions a loop visits, in which order, how
each step's slices are read, and the `tf.while_loop` itself.

Masked steps carry the state unchanged and output zeros, which is exact for
right padding, left padding and holes alike, in both directions: a backward
direction simply meets a row's padding before its valid steps. Steps masked
in every row change nothing, so the loops skip them (`visited_span`): a batch
padded beyond its longest row costs no steps for the padding.
"""

from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import tensorflow as tf

from keras_birnn.tf_internal import set_while_lowering
from keras_birnn.recurrence.tensorflow.layout import with_static_shape


class Span(NamedTuple):
    """The time positions a loop visits: `first` to `first + count - 1`."""

    first: Any  # the Python int 0 when every position is visited
    count: Any


class Visit(NamedTuple):
    """The order in which a loop visits a direction's positions: iteration
    `i` at position `base + stride * i`, both computed once before the loop
    (`visiting`), so that a step spends at most two scalar ops on its
    position instead of recomputing it from the span (a plain loop runs op
    by op, and for small steps such ops are a large share of a step). The
    stride is +1 or -1 when the order is fixed where the loop is traced
    (`Direction.reverse`), or a tensor when it is told at run time
    (`layout.runtime_orders`)."""

    base: Any  # the Python int 0, or a scalar tensor
    stride: Any  # 1, -1, or a scalar tensor

    @property
    def runtime(self) -> bool:
        return isinstance(self.stride, tf.Tensor)

    @property
    def descending(self) -> bool:
        """A fixed order visiting positions from the last to the first."""
        return not self.runtime and self.stride < 0


def visiting(directions, span: Span, *, orders=None, backward: bool = False) -> Tuple[List[Visit], Span]:
    """Each direction's `Visit` of the forward loop, or with `backward` of
    the BPTT loop, which walks the forward order back. A direction's order
    is its `reverse`, or the bool tensor `orders[k]` of a loop built for
    either order (`layout.runtime_orders`). With a run-time order the span's
    `first` is then a tensor even without a mask, so that `read_at` reads by
    gather: XLA takes a strided slice's start as a compile-time constant,
    and would make the order one and compile the loop once per direction."""
    visits = []
    for d, order in zip(directions, orders or [None] * len(directions)):
        if order is not None:
            stride = 1 - 2 * tf.cast(order, span.count.dtype)
            base = span.first + tf.where(order, span.count - 1, 0)
            span = span._replace(first=tf.convert_to_tensor(span.first, span.count.dtype))
            if backward:
                base, stride = base + stride * (span.count - 1), -stride
        elif bool(d.reverse) != backward:  # from the last visited position down
            base, stride = _plus(span.first, span.count - 1), -1
        else:
            base, stride = span.first, 1
        visits.append(Visit(base, stride))
    return visits, span


def _plus(base, offset):
    """`base + offset`, without an op for the Python int 0."""
    return offset if isinstance(base, int) and base == 0 else base + offset


def visited_span(mask: Optional[tf.Tensor], steps) -> Span:
    """Every position without a mask; with one, the positions from the first
    that some row has valid to the last (at least one). A step masked in
    every row changes no state and outputs zeros, so skipping it is exact:
    a batch padded beyond its longest row, or to a time bucket
    (`bucketing`), costs no steps for the padding."""
    if mask is None:
        return Span(0, steps)
    positions = tf.range(steps)
    any_valid = tf.reduce_any(mask, axis=0)
    first = tf.reduce_min(tf.where(any_valid, positions, steps))
    last = tf.reduce_max(tf.where(any_valid, positions, -1))
    # No valid step at all: one masked step, so that every loop writes
    # something (a plain TensorArray with nothing written cannot be stacked).
    first = tf.where(last < 0, 0, first)
    return Span(first, tf.maximum(last + 1 - first, 1))


def _visits_all(span: Span) -> bool:
    return isinstance(span.first, int) and span.first == 0


def time_index(visit: Visit, i):
    """The position a direction visits at iteration `i` of the loop its
    `Visit` was made for (`visiting`)."""
    if visit.runtime:
        return visit.base + visit.stride * i
    return visit.base - i if visit.descending else _plus(visit.base, i)


def read_at(sequence_tm: tf.Tensor, t, span: Span, *, xla: bool) -> tf.Tensor:
    """Position `t` of a time-major sequence: a gather, one op where a
    strided slice at a tensor position takes four (its bounds packed), except
    in a loop XLA compiles that visits every position at fixed positions.
    When `t` depends on the mask (`visited_span`) or on a run-time order
    (`visiting`), XLA needs the gather too: it would take the strided
    slice's start as needing a constant, turn the mask (or the order) into
    one and compile the loop again for every new mask."""
    if _visits_all(span) and xla:
        return sequence_tm[t]
    return tf.gather(sequence_tm, t)


def in_time_order(stacked_tm: tf.Tensor, visit: Visit, span: Span, steps,
                   mask_tm: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The outputs the forward loop wrote (`stacked_tm`, time-major; at its
    iterations `i`, or at their positions, `output_index`), each at its
    input position (`time_index`), zeros
    where `mask_tm` (`[T, B, units]`) is False: the loop wrote a masked
    step's carried state, and zeroing every masked position once here
    costs two ops per call instead of two per step. Positions the loop
    skipped (`visited_span`) are masked in every row, so zeros too.

    The loop writes its outputs at the iteration, not at the position:
    converters that turn the loop into an ONNX `Loop` (tf2onnx) make every
    TensorArray write a scan output, stacked in iteration order whatever
    the index written at, and only as long as the loop ran. Written at the
    position, a backward direction's outputs came out reversed in time, and
    a batch padded beyond its longest row came out that much shorter.
    Exact in TensorFlow: a reverse, or a gather, and a select."""
    if visit.runtime:
        ordered = stacked_tm  # written at the positions (`output_index`)
    elif _visits_all(span):
        ordered = tf.reverse(stacked_tm, [0]) if visit.descending else stacked_tm
    else:
        positions = tf.range(steps)
        # The loop's first position is the visit's base (`visiting`).
        iteration = visit.base - positions if visit.descending else positions - visit.base
        # Clipped into the iterations run: a converted loop's stack has only those.
        ordered = tf.gather(stacked_tm, tf.clip_by_value(iteration, 0, span.count - 1))
    return ordered if mask_tm is None else tf.where(mask_tm, ordered, tf.zeros_like(ordered))


def output_index(visit: Visit, i, t):
    """Where the forward loop writes iteration `i`'s output (at position
    `t`): at the iteration (`in_time_order` says why), except in a loop
    whose order is a tensor (`Visit`), which writes at the position and
    needs no reordering: such loops are functions run in process, never
    the exported ones a converter reads."""
    return t if visit.runtime else i


def only_visited(sequence_tm: tf.Tensor, span: Span) -> tf.Tensor:
    """The time-major sequence at the positions the loops visited."""
    if _visits_all(span):
        return sequence_tm
    part = tf.slice(sequence_tm, tf.stack([span.first, 0, 0]), tf.stack([span.count, -1, -1]))
    return with_static_shape(part, [None] + sequence_tm.shape[1:].as_list())


def padded_to_all(sequence_tm: tf.Tensor, span: Span, steps) -> tf.Tensor:
    """`only_visited`'s inverse: zeros at the positions the loops skipped."""
    if _visits_all(span):
        return sequence_tm
    return tf.pad(sequence_tm, [[span.first, steps - span.first - span.count], [0, 0], [0, 0]])


def tensor_array(like: tf.Tensor, steps) -> tf.TensorArray:
    return tf.TensorArray(like.dtype, size=steps, element_shape=like.shape)


Reads = List[Tuple[tf.Tensor, bool]]


def time_loop(span: Span, steps, read: Callable[[Any], Reads], body: Callable, state, *,
              lowered: Optional[bool] = None, bounded: bool = True):
    """`tf.while_loop` over `i` in `[0, span.count)`; `body(i, current, state)`
    gets `current`, the step's slices. `read(i)` returns them as
    `(slice, in_step)` pairs: each is sliced inside the step or read one
    iteration ahead into a loop-carried tensor (`in_step` must not depend
    on `i`).

    In the step, XLA fuses each slice into the kernels that use it, and
    the loop carries nothing extra; read ahead, XLA materialises each slice
    with a copy and copies it again as a loop-carried value. Which is faster
    depends on the loop (benchmarks/README.md, "Design measurements"): training
    loops compiled by XLA slice in the step, except kept memory a cell asks
    to have materialised (`StepMath.materialize_saved`: kernels fused with that
    slice were not vectorised). So do one-direction inference loops with
    small steps, which then have few enough kernels for XLA to run them in
    order on one thread (`LoopConfig.inline_step_limit`). Other inference loops read
    ahead (in the step they were slower at large shapes), and so do loops
    not compiled by XLA.

    `maximum_iterations` is the sequence's length `steps`, never the
    span's count: XLA needs it as a constant, and one computed from the
    mask would make XLA compile the loop again for every new mask. Loops
    no XLA compiles (`bounded` False) go without: the bound costs a plain
    loop a counter, a comparison and a logical and at every iteration.
    The last index, which reading ahead clamps to, is computed once
    before the loop and the next index once per iteration, for the same
    reason.

    `lowered` (True or False) sets the loop's form outside XLA (lowered or
    a functional `While`; `compiled._loop` chooses); None leaves
    TensorFlow's own choice.
    """
    first = read(0)
    flags = [now for _, now in first]

    def ahead(pairs):
        return [s for s, now in pairs if not now]

    def current(i, carried):
        if not any(flags):
            return carried
        carried = iter(carried)
        return [s if now else next(carried) for s, now in read(i)]

    final = span.count - 1

    def cond(i, *_):
        return i < span.count

    def loop_body(i, carried, state):
        state = body(i, current(i, carried), state)
        following = i + 1
        carried = ahead(read(tf.minimum(following, final))) if not all(flags) else []
        return following, carried, state

    start = (tf.constant(0), ahead(first), state)
    last, _, state = tf.while_loop(cond, loop_body, start, maximum_iterations=steps if bounded else None)
    if lowered is not None and tf.is_symbolic_tensor(last):  # an eager loop is no op
        set_while_lowering(last, lowered)
    return state
