"""`run`: from a call's directions to the loops that run them, and the
custom gradient around those loops.

A call takes one path (`_path`): forward-mode derivatives and exported
serving graphs run plain forward loops (`loops._plain_loop`,
`compiled._serving_loop`); everything else runs the loops
under `tf.custom_gradient` (`_differentiable_loop`), plain or XLA-compiled,
the compiled form chosen per shape by the layer's count in the "counted"
path (`compile_policy`).
"""

import functools
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from keras_birnn import bucketing, compile_policy
from keras_birnn._tf_internal import carries_tangents, in_save_context, may_differentiate_twice
from keras_birnn.recurrence.compiled import _chosen_loop_functions, _clear_caches, _loop_functions, _serving_loop
from keras_birnn.recurrence.gradients import _bptt
from keras_birnn.recurrence.layout import (
    Direction,
    DirectionResult,
    LoopKey,
    _flatten,
    _flatten_outputs,
    _loop_key,
    _state_mask_positions,
    _unflatten_outputs,
)
from keras_birnn.recurrence.loops import _plain_loop
from keras_birnn.recurrence.switches import (
    _XLA,
    _CompactRows,
    _CustomGradient,
    _loops_may_branch,
    _in_xla,
    _runs_concurrently,
)


def run(
    directions: Sequence[Direction],
    mask: Optional[tf.Tensor] = None,
    return_sequences: bool = True,
    bptt: bool = False,
    counter: Optional[compile_policy.ShapeCounter] = None,
) -> List[DirectionResult]:
    """Runs every direction over the whole sequence.

    Args:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).
        bptt: Keep what the hand-written BPTT needs during the forward loop
            (training). Without it a gradient is still exact, at the price
            of running the forward loop again.
        counter: The calling layer's `compile_policy.ShapeCounter`: with
            it, loops whose shapes can change run XLA-compiled only for
            the shapes that recur (`compile_policy`); without it, they
            always run compiled while XLA is on.
    """
    if mask is not None and not return_sequences and _CompactRows.enabled and not _in_xla():
        # Rows without a valid step (padding words of a character encoder)
        # are left out of sequence-level encoders' loops. Not for per-step
        # outputs, whose rows are rarely empty (the gather and scatter would
        # slow a tagger's training step), nor inside XLA (the count of rows
        # left is dynamic), nor when tracing for LiteRT (`_rows_kept`).
        compact, compact_mask, rows = bucketing.valid_rows(directions, mask)
        results = _run_bucketed(compact, compact_mask, return_sequences, bptt, counter)
        return bucketing.restore_rows(results, directions, rows)
    return _run_bucketed(directions, mask, return_sequences, bptt, counter)


def _run_bucketed(directions, mask, return_sequences, bptt, counter) -> List[DirectionResult]:
    path = _path(directions, _flatten(directions), counter, bptt)
    if _compiles_per_length(directions, path):
        return _run_padded(path, directions, mask, return_sequences, bptt, counter, at_least_one=False)
    return _run(path, directions, mask, return_sequences, bptt, counter)


def _run_padded(path, directions, mask, return_sequences, bptt, counter, at_least_one: bool) -> List[DirectionResult]:
    """The loops on inputs padded at the end (`bucketing.pad_time`: to the
    bucket length, or to one step if there is none), which leaves them at
    least one step, so without the zero-length `tf.cond`; outputs cropped
    back to the real length."""
    directions, mask, steps = bucketing.pad_time(directions, mask, at_least_one=at_least_one)
    flat = _flatten(directions)
    results = _run_path(path, directions, flat, mask, return_sequences, bptt, counter, empty_case=False)
    return bucketing.crop_time(results, steps)


# The paths whose loops XLA compiles (`_runner`): on them a graph traced
# with an unknown time size would compile a program per length.
_COMPILING_PATHS = ("counted", "compiled", "higher-order")


def _compiles_per_length(directions: Sequence[Direction], path: str) -> bool:
    """Whether the loops about to be built are XLA programs that would each
    be compiled again for every new sequence length: on a compiling path,
    in a graph traced with an unknown time size (eager calls and an
    XLA-compiled caller have static shapes). Those run on time buckets
    (`bucketing`)."""
    return path in _COMPILING_PATHS and directions[0].inputs.shape[1] is None and not tf.executing_eagerly()


def _run(path, directions, mask, return_sequences, bptt, counter) -> List[DirectionResult]:
    flat = _flatten(directions)
    if _recorded_twice(path, directions, flat):
        # The zero-length `tf.cond` below cannot hold a custom gradient that
        # a persistent or nested tape records ("Could not find external
        # tensor capture"): a zero-length sequence gets one masked step
        # instead (exact: a masked step reads nothing), and no cond.
        return _run_padded(path, directions, mask, return_sequences, bptt, counter, at_least_one=True)
    return _run_path(path, directions, flat, mask, return_sequences, bptt, counter, _loops_may_branch())


def _recorded_twice(path: str, directions, flat) -> bool:
    """Whether this graph call's custom gradient (every path but the plain
    TensorFlow loops of forward mode and exports) is recorded by a tape
    that may differentiate it again, with an unknown time size: the case
    the zero-length `tf.cond` cannot hold."""
    if path in ("forward-mode", "forward-only") or not _loops_may_branch() or tf.executing_eagerly():
        return False
    return directions[0].inputs.shape[1] is None and may_differentiate_twice(flat)


def _run_path(path, directions, flat, mask, return_sequences, bptt, counter, empty_case) -> List[DirectionResult]:
    key = _loop_key(directions, mask is not None, return_sequences, bptt)
    no_mask = tf.zeros([0], tf.bool)  # a tensor placeholder keeps one signature
    split = len(directions) > 1 and _runs_concurrently()
    if counter is not None:
        counter.note_path(path)
    runner = _runner(path, key, split, directions, counter)

    def loop():
        return runner(flat, mask if mask is not None else no_mask)

    def no_steps():
        # A zero-length sequence: nothing read, so the boundary states stand.
        sequences = [tf.zeros_like(d.inputs[:, :, :1]) * tf.expand_dims(d.initial_states[0], 1) for d in directions]
        return _flatten_outputs(sequences, [d.initial_states for d in directions], return_sequences)

    # XLA cannot compile a loop body over a zero-length axis, so the empty
    # case never reaches it (a static check eagerly, a tf.cond in graphs).
    # Traced for LiteRT (`_no_empty_case`) there is no cond: the converter
    # then sees the weights as constants in the loop body and multiplies
    # with FULLY_CONNECTED instead of BATCH_MATMUL.
    steps = directions[0].inputs.shape[1]
    if steps is None and not empty_case:
        flat_out = loop()
    elif steps is None:
        flat_out = tf.cond(tf.shape(directions[0].inputs)[1] > 0, loop, no_steps)
    else:
        flat_out = loop() if steps > 0 else no_steps()
    return _unflatten_outputs(flat_out, directions, return_sequences)


def _path(directions, flat, counter, bptt: bool) -> str:
    """How the loops of this call are built (`compile_policy` explains
    "counted" and "inference"); `counter.note_path` records it for
    `loop_report()`."""
    if carries_tangents(flat):
        # TensorFlow pushes tangents through a plain loop's ops, but not
        # through a custom gradient (it would silently report no tangent).
        return "forward-mode"
    if not _CustomGradient.enabled:
        return "forward-only"
    if not _XLA.enabled:
        return "plain"
    if _in_xla():
        return "inside-xla"
    eager = tf.executing_eagerly()
    if not eager and may_differentiate_twice(flat):
        return "higher-order"
    # A SavedModel cannot hold the layer's counts: exports trace fixed loops.
    # Static shapes are counted too: `model.fit` traces its first batch's
    # shape, which may never come again, before relaxing it.
    if counter is None or in_save_context():
        return "compiled"
    static_length = directions[0].inputs.shape[1] is not None
    if not eager and not bptt and not compile_policy.counts_inference(static_length):
        return "inference"
    return "counted"


def _runner(path: str, key: LoopKey, split: bool, directions, counter) -> Callable:
    """The function `runner(flat, mask)` running the loops on `path`."""
    if path == "forward-mode":
        return functools.partial(_plain_loop, key)
    if path == "forward-only":
        return _serving_loop(key, split)
    if path == "inference":
        # Plain loops as cached functions (traced once per loop structure),
        # with a custom gradient for a tape that asks anyway.
        return functools.partial(_differentiable_loop, key, "function", split)
    if path == "counted" and tf.executing_eagerly():
        compiled = bool(counter.decide(*tf.shape(directions[0].inputs)[:2], key.keep))
        return functools.partial(_differentiable_loop, key, "shared-xla" if compiled else "shared", split)
    if path == "counted":
        decide = functools.partial(counter.decide, *tf.unstack(tf.shape(directions[0].inputs)[:2]), key.keep)
        return functools.partial(_counted_runner(key, split), decide)
    if path == "compiled":
        return _compiled_runner(key, split)
    # Eagerly the custom gradient goes on the tape directly: a gradient
    # taken through the cached tf.function after it had been traced in
    # another graph (model.fit) failed with "TensorList crossing the
    # XLA/TF boundary". So it does in graphs where a gradient may be
    # differentiated again: the second-order gradient (`_bptt`) must be
    # built in the caller's graph, which a function's gradient is not.
    return functools.partial(_differentiable_loop, key, _XLA.enabled, split)


@functools.lru_cache(maxsize=None)
def _counted_runner(key: LoopKey, split: bool) -> Callable:
    """`_compiled_runner` choosing at run time, per call, between the
    XLA-compiled loops and the plain ones: `decide()` (the layer's count,
    built in the caller's graph, where the layer's table is) says which."""
    runner = tf.function(
        lambda flat, mask, use_compiled: _differentiable_loop(key, None, split, flat, mask, use_compiled),
        reduce_retracing=True,
        autograph=False,
    )
    return lambda decide, flat, mask: runner(flat, mask, decide())


@functools.lru_cache(maxsize=None)
def _compiled_runner(key: LoopKey, split: bool) -> Callable:
    # A plain tf.function holding the custom gradient, around XLA-compiled
    # loops: TensorFlow differentiates this function, never an XLA one.
    runner = functools.partial(_differentiable_loop, key, True, split)
    return tf.function(runner, reduce_retracing=True, autograph=False)


def _clear_loop_caches() -> None:
    """Drops every cached loop and runner, so that loops are built afresh
    under changed limits (tests, `benchmarks/bench_loop_forms.py`)."""
    _clear_caches()
    _counted_runner.cache_clear()
    _compiled_runner.cache_clear()


def _differentiable_loop(key: LoopKey, xla, split: bool, flat, mask, use_compiled=None):
    """The loops under `tf.custom_gradient`, from outside: TensorFlow never
    differentiates a loop, nor an XLA-compiled function (which it cannot do
    when the gradient needs the loop's TensorLists), it only calls them.

    With `key.keep` (training) the forward loop keeps what BPTT needs;
    without it (inference) it keeps nothing, and a gradient asked for anyway
    recomputes the forward loop first. The state masks (recurrent dropout)
    are constants. The BPTT is itself differentiable (`_bptt`), for gradient
    penalties and other derivatives of gradients. With `use_compiled` (a
    bool tensor), every loop is a `tf.cond` between its XLA-compiled and
    plain forms."""
    if use_compiled is None:
        forward, recompute, backward = _loop_functions(key, xla, split)
    else:
        forward, recompute, backward = _chosen_loop_functions(key, split, use_compiled)
    constant = _state_mask_positions(key.specs)

    @tf.custom_gradient
    def recurrence(*originals):
        # stop_gradient: an active tape must not record the loops themselves
        # (it would ask the XLA function for its TensorList intermediates);
        # `grad` below is the only way back.
        flat_inputs = [tf.stop_gradient(t) for t in originals]
        flat_out, memory = forward(flat_inputs, mask)

        def fast_gradients(d_flat_out):
            kept = memory if key.keep else recompute(flat_inputs, mask)[1]
            return backward(flat_inputs, mask, kept, d_flat_out)

        def grad(*d_flat_out):
            d_flat_out = [tf.zeros_like(o) if g is None else g for g, o in zip(d_flat_out, flat_out)]
            grads = iter(_bptt(key, fast_gradients, list(originals), mask, d_flat_out, constant))
            return [None if k in constant else next(grads) for k in range(len(originals))]

        return flat_out, grad

    return recurrence(*flat)
