"""`run`: a call's plan executed, from its directions to the loops that
run them, and the custom gradient around those loops.

`plan.plan` decides everything about the call; this module only carries it
out: forward-mode derivatives and exported serving graphs run plain
forward loops (`loops.plain_loop`, `compiled.serving_loop`); everything
else runs the loops under `tf.custom_gradient` (`_differentiable_loop`),
plain or XLA-compiled, the compiled form chosen per shape by the layer's
count on the counted path (`compile_policy`).
"""

import functools
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from keras_birnn.recurrence.tensorflow import bucketing
from keras_birnn.recurrence import compile_policy
from keras_birnn.recurrence.cache import LOOPS
from keras_birnn.recurrence.tensorflow.compiled import chosen_loop_functions, loop_functions, serving_loop
from keras_birnn.recurrence.tensorflow.gradients import differentiable_bptt
from keras_birnn.recurrence.tensorflow.layout import (
    Direction,
    DirectionResult,
    LoopKey,
    flatten,
    flatten_outputs,
    loop_key,
    state_mask_positions,
    unflatten_outputs,
)
from keras_birnn.recurrence.tensorflow.loops import plain_loop
from keras_birnn.recurrence.tensorflow.plan import (
    Build,
    Caller,
    EmptyCase,
    LoopPlan,
    Memory,
    Path,
    Rows,
    Runner,
    TimePadding,
    counted_form,
    plan,
)


def run(
    directions: Sequence[Direction],
    mask: Optional[tf.Tensor] = None,
    return_sequences: bool = True,
    bptt: bool = False,
    counter: Optional[compile_policy.ShapeCounter] = None,
) -> List[DirectionResult]:
    """Runs every direction over the whole sequence, as `plan.plan` decides.

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
    flat = flatten(directions)
    call_plan = plan(directions, flat, mask, return_sequences=return_sequences, bptt=bptt, counted=counter is not None)
    if call_plan.rows is Rows.VALID:
        compact, compact_mask, rows = bucketing.valid_rows(directions, mask)
        results = _run_padded(call_plan, compact, compact_mask, return_sequences=return_sequences, counter=counter)
        return bucketing.restore_rows(results, directions, rows)
    return _run_padded(call_plan, directions, mask, return_sequences=return_sequences, counter=counter, flat=flat)


def _run_padded(call_plan: LoopPlan, directions, mask, *, return_sequences: bool, counter,
                flat=None) -> List[DirectionResult]:
    """The loops, on inputs padded at the end as the plan says
    (`bucketing.pad_time`: to the bucket length, or a zero-length sequence
    to one masked step), which leaves them at least one step and so no
    zero-length `tf.cond`; outputs cropped back to the real length."""
    if call_plan.padding is TimePadding.NONE:
        return _run_plan(call_plan, directions, mask, return_sequences=return_sequences, counter=counter, flat=flat)
    at_least_one = call_plan.padding is TimePadding.ONE_STEP
    directions, mask, steps = bucketing.pad_time(directions, mask, call_plan.config, at_least_one=at_least_one)
    results = _run_plan(call_plan, directions, mask, return_sequences=return_sequences, counter=counter)
    return bucketing.crop_time(results, steps)


def _run_plan(call_plan: LoopPlan, directions, mask, *, return_sequences: bool, counter,
              flat=None) -> List[DirectionResult]:
    """The planned loops on `directions` (`flat`: their `flatten`, when
    the caller has it for these very directions)."""
    flat = flatten(directions) if flat is None else flat
    key = loop_key(directions, has_mask=mask is not None, return_sequences=return_sequences,
                   keep=call_plan.memory is Memory.KEEP)
    no_mask = tf.zeros([0], tf.bool)  # a tensor placeholder keeps one signature
    runner = _runner(call_plan, key, directions, counter)

    def loop():
        return runner(flat, mask if mask is not None else no_mask)

    def no_steps():
        # A zero-length sequence: nothing read, so the boundary states stand.
        sequences = [tf.zeros_like(d.inputs[:, :, :1]) * tf.expand_dims(d.initial_states[0], 1) for d in directions]
        return flatten_outputs(sequences, [d.initial_states for d in directions], return_sequences)

    # XLA cannot compile a loop body over a zero-length axis, so the empty
    # case never reaches it (`plan._empty_case`).
    if call_plan.empty_case is EmptyCase.BRANCH:
        flat_out = tf.cond(tf.shape(directions[0].inputs)[1] > 0, loop, no_steps)
    elif call_plan.empty_case is EmptyCase.STATIC and directions[0].inputs.shape[1] == 0:
        flat_out = no_steps()
    else:
        flat_out = loop()
    return unflatten_outputs(flat_out, directions, return_sequences)


def _runner(call_plan: LoopPlan, key: LoopKey, directions, counter) -> Callable:
    """The function `runner(flat, mask)` running the loops as planned; an
    eager counted call's form is chosen here, by the layer's count."""
    if call_plan.counted and call_plan.caller is Caller.EAGER:  # the count decides now
        batch, steps = tf.shape(directions[0].inputs)[:2]
        compiled = bool(counter.decide(batch, steps, training=key.keep, config=call_plan.config))
        call_plan = counted_form(call_plan, compiled)
    if counter is not None:
        counter.note_plan(call_plan)
    build = call_plan.build()
    if call_plan.runner is Runner.PLAIN_OPS:
        if call_plan.path is Path.FORWARD_ONLY:
            return serving_loop(key, build)
        return functools.partial(plain_loop, key, xla=build.xla_caller)
    if call_plan.runner is Runner.COUNTED_FUNCTION:
        batch, steps = tf.unstack(tf.shape(directions[0].inputs)[:2])
        decide = functools.partial(counter.decide, batch, steps, training=key.keep, config=call_plan.config)
        return functools.partial(_counted_runner(key, build), decide)
    if call_plan.runner is Runner.COMPILED_FUNCTION:
        return _compiled_runner(key, build)
    return functools.partial(_differentiable_loop, key, build)


def _counted_runner(key: LoopKey, build: Build) -> Callable:
    """`_compiled_runner` choosing at run time, per call, between the
    XLA-compiled loops and the plain ones: `decide()` (the layer's count,
    built in the caller's graph, where the layer's table is) says which."""

    def make():
        return tf.function(
            lambda flat, mask, use_compiled: _differentiable_loop(key, build, flat, mask, use_compiled),
            reduce_retracing=True,
            autograph=False,
        )

    runner = LOOPS.get(("counted-runner", key, build), make)
    return lambda decide, flat, mask: runner(flat, mask, decide())


def _compiled_runner(key: LoopKey, build: Build) -> Callable:
    # A plain tf.function holding the custom gradient, around XLA-compiled
    # loops: TensorFlow differentiates this function, never an XLA one.
    def make():
        return tf.function(functools.partial(_differentiable_loop, key, build), reduce_retracing=True,
                           autograph=False)

    return LOOPS.get(("compiled-runner", key, build), make)


def _differentiable_loop(key: LoopKey, build: Build, flat, mask, use_compiled=None):
    """The loops under `tf.custom_gradient`, from outside: TensorFlow never
    differentiates a loop, nor an XLA-compiled function (which it cannot do
    when the gradient needs the loop's TensorLists), it only calls them.

    With `key.keep` (training) the forward loop keeps what BPTT needs;
    without it (inference) it keeps nothing, and a gradient asked for anyway
    recomputes the forward loop first. The state masks (recurrent dropout)
    are constants. The BPTT is itself differentiable (`differentiable_bptt`), for gradient
    penalties and other derivatives of gradients. With `use_compiled` (a
    bool tensor), every loop is a `tf.cond` between its XLA-compiled and
    plain forms."""
    if use_compiled is None:
        forward, recompute, backward = loop_functions(key, build)
    else:
        forward, recompute, backward = chosen_loop_functions(key, build, use_compiled)
    constant = state_mask_positions(key.specs)

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
            grads = iter(differentiable_bptt(key, fast_gradients, list(originals), mask, d_flat_out, constant=constant,
                                             xla_caller=build.xla_caller))
            return [None if k in constant else next(grads) for k in range(len(originals))]

        return flat_out, grad

    return recurrence(*flat)
