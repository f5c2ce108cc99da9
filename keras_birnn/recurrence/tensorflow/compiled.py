"""The loops as functions: forward, keeping and backward, per loop key,
plain or XLA-compiled, cached so that each loop structure is traced once.

Inside a graph each direction can be its own loop (`_split_loops`),
which TensorFlow's executor runs at the same time as the others; otherwise
all directions advance in lockstep in one loop (`loops.forward_loop`).
"""

import functools
from typing import Callable, Sequence, Tuple

import tensorflow as tf

from keras_birnn.recurrence.cache import LOOPS
from keras_birnn.recurrence.tensorflow.gradients import bulk_gradients
from keras_birnn.recurrence.tensorflow.layout import (
    DirectionSpec,
    LoopKey,
    flatten_outputs,
    group_memory,
    in_runtime_order,
    input_splitter,
    memory_splitter,
    runtime_orders,
    output_splitter,
    unflatten,
    with_order,
)
from keras_birnn.recurrence.tensorflow import loops
from keras_birnn.recurrence.tensorflow.loops import LoopForm
from keras_birnn.recurrence.tensorflow.plan import Build, Form

LoopFunctions = Tuple[Callable, Callable, Callable]

# The plain loops' tf.functions are not inlined into their callers
# (`_shared_leaf` says why).
_NOT_INLINED = {"_noinline": True}


def loop_functions(key: LoopKey, build: Build) -> LoopFunctions:
    """forward(flat, mask) -> (flat outputs, flat memory), the same keeping
    memory, and backward(flat, mask, memory, d_outputs) -> gradients: the
    BPTT loops of `_loops` (cached), then their sums over time
    (`_with_bulk`)."""
    forward, keeping, backward_loops = _loops(key, build)
    return forward, keeping, _with_bulk(key, build, backward_loops)


def _loops(key: LoopKey, build: Build) -> LoopFunctions:
    """The forward and keeping loops, and backward_loops(flat, mask, memory,
    d_outputs) -> (records, d_initial) of every direction, made once per
    loop key and build (`cache.LOOPS`). With XLA, the loops are compiled
    once per loop structure and reused across calls (eagerly too); XLA
    compiles each once per concrete input shape. An inference forward of
    one direction has two XLA loops, for small and large steps
    (`by_batch_size`); every plain loop has two forms, functional and
    lowered (`_loop`). With `build.split`, every direction runs loops of
    its own, which directions of one structure share (`_split_loops`)."""
    return LOOPS.get(("loops", key, build), lambda: _make_loops(key, build))


def _make_loops(key: LoopKey, build: Build) -> LoopFunctions:
    if build.split:
        return _split_loops(key, build)
    xla = build.xla_body

    def training_form(functional: bool) -> LoopForm:
        # A functional loop reads every slice in the step (`_loop`), as XLA's do.
        return LoopForm(xla=xla, xla_reads=xla or functional, lowered=not functional)

    def inference_form(functional: bool) -> LoopForm:
        return LoopForm(xla=xla, xla_reads=xla, read_in_step=functional, lowered=not functional)

    backward_loop = _loop(key, build, "backward", lambda functional: _backward_loop_fn(key, training_form(functional)))
    keeping = _loop(
        key, build, "keeping", lambda functional: _forward_fn(key, training_form(functional), keep_for_bptt=True)
    )
    if key.keep:
        return keeping, keeping, backward_loop
    forward = _loop(
        key, build, "forward", lambda functional: _forward_fn(key, inference_form(functional), keep_for_bptt=False)
    )
    max_inline_batch = _max_inline_batch(key.specs, build) if build.compiles else 0
    if max_inline_batch:
        small_form = LoopForm(xla=xla, xla_reads=xla, read_in_step=True, lowered=True)
        small = _compiled(key, build, "small", _forward_fn(key, small_form, keep_for_bptt=False))
        forward = by_batch_size(max_inline_batch, small=small, large=forward)
    return forward, keeping, backward_loop


def _loop(key: LoopKey, build: Build, role: str, make: Callable[[bool], Callable]) -> Callable:
    """One loop role in the form `build` asks; `make(functional)` builds it.

    Plain loops run as functional `While` ops for small steps (up to
    `functional_step_limit` multiply-adds, and `functional_row_limit`
    per row) and lowered otherwise, chosen by batch size
    (`by_batch_size`); training loops have a functional form only where
    `functional_training_rows` rows would run it (docs/design.md, "The
    loop", says why). A functional loop overlaps nothing across
    iterations, so it reads its slices in the step (all but what a cell
    asks to have materialised). XLA compiles the lowered form's loops (the
    flag means nothing to it)."""
    lowered = _compiled(key, build, role, make(False))
    max_rows = _max_functional_rows(key.specs, build)
    if build.compiles or not max_rows or (key.keep and max_rows < build.functional_training_rows):
        return lowered
    functional = _compiled(key, build, role + "/functional", make(True))
    return by_batch_size(max_rows, small=functional, large=lowered)


def _max_functional_rows(specs: Sequence[DirectionSpec], build: Build) -> int:
    """The most rows for which a plain loop of these directions runs as a
    functional `While` (0: never, its step is too large per row)."""
    per_row = _step_size(specs)
    return 0 if per_row > build.functional_row_limit else build.functional_step_limit // per_row


def serving_loop(key: LoopKey, build: Build) -> Callable:
    """The forward loops of an exported serving graph (`for_export`, plain
    TensorFlow: `loops.plain_loop`), laid out as in-process inference lays
    them out: with `build.split`, a loop per direction, which the executor
    runs at the same time; each a functional `While` where `_loop` would
    choose it for a batch of `functional_training_rows` rows, else lowered.
    The graph does not know its batch, and a `tf.cond` on it would give
    converters two copies to read; the form is only an attribute of the
    `While` op, which converters ignore. Slices are read one iteration
    ahead in both forms: in the step, a LiteRT file no longer failed
    loudly on an empty time axis (docs/deploy.md). For a small layer the
    functional form is what serves fast (the demo's SavedModel;
    benchmarks/README.md, "Design measurements")."""

    def lowered(specs: Sequence[DirectionSpec]) -> bool:
        return _max_functional_rows(specs, build) < build.functional_training_rows

    return functools.partial(loops.plain_loop, key, split=build.split, lowered=lowered, xla=build.xla_caller)


def _forward_fn(key: LoopKey, form: LoopForm, *, keep_for_bptt: bool) -> Callable:
    def forward(flat, mask):
        directions = unflatten(list(flat), key.specs)
        sequences, final_states, memory = loops.forward_loop(
            directions, mask if key.has_mask else None, key.return_sequences, keep_for_bptt=keep_for_bptt,
            form=form, orders=runtime_orders(list(flat), key.specs),
        )
        flat_out = flatten_outputs(sequences, final_states, key.return_sequences)
        return flat_out, [t for kept in memory for t in kept]

    return forward


def _backward_loop_fn(key: LoopKey, form: LoopForm) -> Callable:
    # Named `backward_loop`: the traced function's name says it is BPTT.
    def backward_loop(flat, mask, memory, d_flat_out):
        directions = unflatten(list(flat), key.specs)
        mask = mask if key.has_mask else None
        memory = group_memory(directions, memory)
        return loops.backward_loop(directions, mask, key.return_sequences, memory, d_flat_out, form=form,
                                   orders=runtime_orders(list(flat), key.specs))

    return backward_loop


def _with_bulk(key: LoopKey, build: Build, backward_loops: Callable) -> Callable:
    def backward(flat, mask, memory, d_flat_out):
        # Only the loops are compiled: the sums over time are a few large
        # matmuls that TensorFlow's own kernels run as fast, and leaving
        # them out of XLA shortens the backward pass's compile time. Out of
        # the counted path's `tf.cond` too (`chosen_loop_functions`): one
        # copy serves both forms.
        records, d_initial = backward_loops(flat, mask, memory, d_flat_out)
        directions = unflatten(list(flat), key.specs)
        memory = group_memory(directions, memory)
        return bulk_gradients(directions, memory, records, d_initial, mask if key.has_mask else None,
                              xla_caller=build.xla_caller)

    return backward


def _compiled(key: LoopKey, build: Build, role: str, fn: Callable) -> Callable:
    """`fn` as `build.form` asks: XLA (compiled), FUNCTION (a plain
    tf.function, not inlined, as the inference path's loops), INLINE (ops
    in the caller's graph), SHARED / SHARED_XLA (the plain and XLA forms
    of the counted path, around one traced function per role,
    `_shared_leaf`)."""
    form = build.form
    if form is Form.INLINE:
        return fn
    if form in (Form.SHARED, Form.SHARED_XLA):
        plain = _shared_leaf((key, role, build._replace(form=Form.SHARED)), fn)
        if form is Form.SHARED:
            return plain
        return tf.function(lambda *args: plain(*args), jit_compile=True, reduce_retracing=True, autograph=False)
    attributes = _NOT_INLINED if form is Form.FUNCTION else None
    return tf.function(fn, jit_compile=form is Form.XLA, reduce_retracing=True, autograph=False,
                       experimental_attributes=attributes)


def _shared_leaf(key: tuple, fn: Callable) -> Callable:
    """One plain `tf.function` per loop role and structure, which the plain
    form calls directly and the XLA form calls inside its own compiled
    function: tracing a loop (not compiling it) is most of a new
    signature's graph-building time, and a graph holding both forms traced
    each loop twice. (A small layer's plain form also has functional
    loops, `_loop`, each one more leaf.) Not inlined: TensorFlow
    instantiates and optimises a leaf once for all its calls, where
    inlined copies are each optimised again, which grew a tagger's
    training graph and its first step (benchmarks/README.md, "The first
    step")."""
    return LOOPS.get(("leaf",) + key, lambda: tf.function(
        fn, reduce_retracing=True, autograph=False, experimental_attributes=_NOT_INLINED))


def chosen_loop_functions(key: LoopKey, build: Build, use_compiled: tf.Tensor) -> LoopFunctions:
    """`loop_functions`' three functions, each running the XLA-compiled
    loops where `use_compiled` holds and the plain ones elsewhere (in a
    graph XLA compiles a branch only when it runs). Both forms call the
    same traced loops (`_shared_leaf`), so a new signature is traced once;
    only the loops are under the `tf.cond`, not backward's sums over time."""
    compiled = _loops(key, build._replace(form=Form.SHARED_XLA))
    plain = _loops(key, build._replace(form=Form.SHARED))

    def choose(k):
        return lambda *args: tf.cond(use_compiled, lambda: compiled[k](*args), lambda: plain[k](*args))

    return choose(0), choose(1), _with_bulk(key, build, choose(2))


def _max_inline_batch(specs: Sequence[DirectionSpec], build: Build) -> int:
    """The largest batch for which the inline-read loop is used (0: never):
    only one direction per loop (the bidirectional layer's concurrent parts,
    or `kb.Recurrent`); a loop of several directions in lockstep has too
    many kernels per step. Such a step has at most 8 XLA kernels, which XLA's CPU runtime then runs in
    order on the calling thread instead of handing them to TensorFlow's
    intra-op pool: faster for small steps, slower once one thread's matmuls
    are too slow (`inline_step_limit`)."""
    return build.inline_step_limit // _step_size(specs) if len(specs) == 1 else 0


def _step_size(specs: Sequence[DirectionSpec]) -> int:
    """Multiply-adds per row of one step's matmuls, over the loop's directions
    (at least 1: the limits are divided by it, and a layer of zero units
    has no matmul)."""
    size = 0
    for spec in specs:
        kernel_shape, recurrent_shape = spec.shapes
        size += (kernel_shape[0] + recurrent_shape[0]) * recurrent_shape[1]
    return max(size, 1)


def by_batch_size(max_batch: int, small: Callable, large: Callable) -> Callable:
    """A loop function calling `small` up to `max_batch` rows, else
    `large` (the batch is that of the first direction's inputs, first in
    `flat`): decided when traced if the batch size is known then, by a
    `tf.cond` otherwise (in a graph only the branch taken is ever compiled
    by XLA; inside an XLA-compiled caller both are, as part of it)."""

    def chosen(flat, *rest):
        if max_batch <= 0:
            return large(flat, *rest)
        batch = flat[0].shape[0]
        if batch is not None:
            return (small if batch <= max_batch else large)(flat, *rest)
        return tf.cond(tf.shape(flat[0])[0] <= max_batch, lambda: small(flat, *rest), lambda: large(flat, *rest))

    return chosen


def _split_loops(key: LoopKey, build: Build) -> LoopFunctions:
    """`_loops`' three functions, made of one direction's loops each: in a
    graph TensorFlow's executor runs the directions' loops at the same time.

    Loops built as functions (any form but INLINE) take their direction's
    order as a tensor (`layout.with_order`), so the directions of a
    bidirectional layer with one cell structure call the same functions:
    each traced once, and XLA compiles one program per shape for both
    directions rather than one per direction (benchmarks/README.md, "What a
    compilation costs and saves")."""
    runtime_order = build.form is not Form.INLINE
    part_specs = [in_runtime_order(spec) if runtime_order else spec for spec in key.specs]
    one_loop = build._replace(split=False)
    parts = [_loops(key._replace(specs=(spec,)), one_loop) for spec in part_specs]
    splitter = input_splitter(key.specs)
    memories = memory_splitter(key.specs)
    outputs = output_splitter(key.specs, key.return_sequences)

    def inputs(flat):
        return [with_order(p, s) if runtime_order else p for p, s in zip(splitter(flat), key.specs)]

    def forward_fn(which):
        def forward(flat, mask):
            flat_out, memory = [], []
            for part, flat_part in zip(parts, inputs(flat)):
                part_out, part_memory = part[which](flat_part, mask)
                flat_out.extend(part_out)
                memory.extend(part_memory)
            return flat_out, memory

        return forward

    def backward_loops(flat, mask, memory, d_flat_out):
        records, d_initial = [], []
        pieces = zip(parts, inputs(flat), memories(memory), outputs(d_flat_out))
        for part, flat_part, part_memory, part_d_out in pieces:
            part_records, part_d_initial = part[2](flat_part, mask, part_memory, part_d_out)
            records.extend(part_records)
            d_initial.extend(part_d_initial)
        return records, d_initial

    return forward_fn(0), forward_fn(1), backward_loops
