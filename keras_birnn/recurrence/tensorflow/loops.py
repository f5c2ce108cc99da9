"""The forward and backward (BPTT) loops over time, for one or several
directions advancing in the same iteration.

Each step projects its own input (`x_t W + b`) inside the loop rather than
projecting the whole sequence up front: with the per-step reads of
`time_loop`, hoisting the projection was no faster under XLA, and slower
without them (benchmarks/README.md, "Design measurements").

The forward loop can keep, per step, the incoming states and what the
cell's step maths save (the gates' activations or pre-activations, as each
cell chooses, so the backward step needs no matmul to rebuild them). The
backward loop walks every direction back over its own time order (the
forward direction from the last step to the first, the backward one from
the first to the last) and records each step's gate gradients, from which
`gradients.bulk_gradients` sums the weights' gradients.
"""

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from keras_birnn.cells.base import RecurrentCell
from keras_birnn.recurrence.tensorflow.layout import (
    Direction,
    DirectionSpec,
    LoopKey,
    flatten_outputs,
    split_output_grads,
    swap_batch_and_time,
    unflatten,
)
from keras_birnn.recurrence.tensorflow.timeloop import (
    Reads,
    Span,
    tensor_array,
    read_at,
    in_time_order,
    output_index,
    visited_span,
    time_index,
    time_loop,
    visiting,
)

input_projection = RecurrentCell.input_projection


@dataclasses.dataclass(frozen=True)
class LoopForm:
    """How a forward or backward loop is built, apart from what it computes.

    Attributes:
        xla: The loop is compiled by XLA: it may slice at fixed positions
            (`timeloop.read_at`).
        xla_reads: It reads as XLA's loops do (XLA's and functional ones):
            a loop keeping memory for BPTT, and the backward loop, read their
            slices in the step, and the loop is bounded
            (`timeloop.time_loop`).
        read_in_step: The forward loop reads every slice in the step (the
            small-step inference loop).
        lowered: The loop's form outside XLA, lowered or a functional
            `While` (`timeloop.time_loop`); None: TensorFlow's own choice.
        bitcast: Batch and time may be swapped as float64s
            (`layout.swap_batch_and_time`); not where TensorFlow
            differentiates the loop, as a bitcast has no gradient.
    """

    xla: bool = False
    xla_reads: bool = False
    read_in_step: bool = False
    lowered: Optional[bool] = None
    bitcast: bool = True


def plain_loop(
    key: LoopKey,
    flat: Sequence[tf.Tensor],
    mask: tf.Tensor,
    *,
    split: bool = False,
    lowered: Callable[[Sequence[DirectionSpec]], Optional[bool]] = lambda specs: None,
    xla: bool = False,
) -> list:
    """The forward loops as plain TensorFlow ops, without custom gradient or
    XLA: for forward-mode derivatives, which TensorFlow takes op by op, and
    every other graph TensorFlow differentiates itself (second order,
    exported serving graphs, which `compiled.serving_loop` lays out),
    hence with differentiable transposes (no bitcast,
    `layout.swap_batch_and_time`). With `split`, a loop per direction,
    else one for all; `lowered(specs)` gives each loop's form
    (`time_loop`; None: TensorFlow's own choice); `xla`: the caller is
    compiled by XLA."""
    directions = unflatten(list(flat), key.specs)
    groups = [[k] for k in range(len(directions))] if split else [list(range(len(directions)))]
    sequences, final_states = [], []
    for group in groups:
        form = LoopForm(xla=xla, xla_reads=xla, lowered=lowered([key.specs[k] for k in group]), bitcast=False)
        parts, finals, _ = forward_loop(
            [directions[k] for k in group], mask if key.has_mask else None, key.return_sequences,
            keep_for_bptt=False, form=form,
        )
        sequences.extend(parts)
        final_states.extend(finals)
    return flatten_outputs(sequences, final_states, key.return_sequences)


def forward_loop(directions: Sequence[Direction], mask: Optional[tf.Tensor], return_sequences: bool, *,
                 keep_for_bptt: bool, form: LoopForm = LoopForm(),
                 orders: Optional[Sequence[Optional[tf.Tensor]]] = None) -> Tuple[list, list, list]:
    """The forward loop of every direction, all advancing in one iteration.

    Args:
        directions: The directions; they share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs.
        keep_for_bptt: Also keep, per direction, what the backward step
            needs: what the step maths saved and the incoming states (the
            projected inputs are not kept).
        form: How the loop is built (`LoopForm`).
        orders: For a loop built for either order, each direction's order
            (`layout.runtime_orders`).

    Returns:
        Per direction its output sequence (None without
        `return_sequences`), its final states, and (with `keep_for_bptt`)
        its kept memory as time-major stacks.
    """
    inputs_tm = [swap_batch_and_time(d.inputs, form.bitcast) for d in directions]
    steps = tf.shape(inputs_tm[0])[0]
    mask_tm = _step_masks(mask, directions)
    visits, span = visiting(directions, visited_span(mask, steps), orders=orders)
    in_step = form.read_in_step or (keep_for_bptt and form.xla_reads)
    read = _forward_reads(visits, inputs_tm, mask_tm, span, in_step=in_step, xla=form.xla)
    body = _forward_body(directions, visits, has_mask=mask_tm is not None)

    outputs = [tensor_array(d.initial_states[0], steps) for d in directions] if return_sequences else []
    kept = [_memory_arrays(d, steps) for d in directions] if keep_for_bptt else []
    initial = ([list(d.initial_states) for d in directions], outputs, kept)
    final_states, outputs, kept = time_loop(span, steps, read, body, initial, lowered=form.lowered,
                                            bounded=form.xla_reads)
    sequences = [None] * len(directions)
    if outputs:
        masks = mask_tm or [None] * len(directions)
        sequences = [
            swap_batch_and_time(in_time_order(o.stack(), v, span, steps, m), form.bitcast)
            for o, v, m in zip(outputs, visits, masks)
        ]
    memory = [[a.stack() for a in arrays] for arrays in kept]
    return sequences, [list(s) for s in final_states], memory


def _step_masks(mask: Optional[tf.Tensor], directions) -> Optional[List[tf.Tensor]]:
    """Per direction, the mask time-major and as wide as its states
    `[T, B, units]` (None without a mask). Broadcast once before the loop:
    TensorFlow's select with a `[B, 1]` condition takes its broadcasting
    path at every step, slower than a select of equal shapes
    (benchmarks/README.md, "Design measurements")."""
    if mask is None:
        return None
    mask_tm = tf.expand_dims(tf.transpose(mask), -1)
    by_width = {}
    for d in directions:
        # The units, always static (a state passed in may not know its width).
        width = d.recurrent_kernel.shape[0]
        if width not in by_width:
            shape = tf.concat([tf.shape(mask_tm)[:2], [width]], 0)
            by_width[width] = tf.broadcast_to(mask_tm, shape)
    return [by_width[d.recurrent_kernel.shape[0]] for d in directions]


def _forward_reads(visits, inputs_tm, mask_tm, span: Span, *, in_step: bool, xla: bool) -> Callable[..., Reads]:
    """`read(i)` for `time_loop`: per direction its input, then the mask."""

    def read(i):
        current = []
        for k, visit in enumerate(visits):
            t = time_index(visit, i)
            current.append((read_at(inputs_tm[k], t, span, xla=xla), in_step))
            if mask_tm is not None:
                current.append((read_at(mask_tm[k], t, span, xla=xla), in_step))
        return current

    return read


def _forward_body(directions, visits, *, has_mask: bool) -> Callable:
    """`body(i, current, state)` for `time_loop`: one step of every direction."""

    def body(i, current, state):
        states, outputs, kept = state
        current = iter(current)
        new_states, new_outputs, new_kept = [], [], []
        for k, (d, visit) in enumerate(zip(directions, visits)):
            t = time_index(visit, i)
            x_t, valid = next(current), next(current) if has_mask else None
            stepped, emitted, memory = _forward_step(d, x_t, valid, states[k])
            new_states.append(stepped)
            if outputs:
                # Put in time order after the loop (`in_time_order`).
                new_outputs.append(outputs[k].write(output_index(visit, i, t), emitted))
            if kept:
                new_kept.append([a.write(t, m) for a, m in zip(kept[k], memory)])
        return new_states, new_outputs, new_kept

    return body


def _forward_step(d: Direction, x_t: tf.Tensor, valid: Optional[tf.Tensor], states) -> Tuple[list, tf.Tensor, list]:
    """One direction's step: its new states, its output and what to keep."""
    projected = input_projection(x_t, d.kernel, d.input_bias)
    stepped, saved = d.math.forward(projected, states, d.recurrent_kernel, d.recurrent_bias, d.state_mask)
    if valid is not None:
        # A masked step carries its states and outputs them: zeroed after
        # the loop, all steps at once (`in_time_order`).
        stepped = [tf.where(valid, s, old) for s, old in zip(stepped, states)]
    return stepped, stepped[0], [saved] + list(states)


def _memory_arrays(d: Direction, steps) -> List[tf.TensorArray]:
    batch = d.initial_states[0].shape[0]
    saved_shape = [batch, d.math.saved_width(d.recurrent_kernel.shape[0])]
    saved = tf.TensorArray(d.inputs.dtype, size=steps, element_shape=saved_shape)
    return [saved] + [tensor_array(s, steps) for s in d.initial_states]


def backward_loop(directions: Sequence[Direction], mask: Optional[tf.Tensor], return_sequences: bool, memory: list,
                  d_flat_out: list, *, form: LoopForm = LoopForm(),
                  orders: Optional[Sequence[Optional[tf.Tensor]]] = None) -> Tuple[list, list]:
    """The BPTT loop: each direction walks back over its own time order.

    Args:
        directions, mask, return_sequences, orders: As `forward_loop` had them.
        memory: Per direction, what the forward loop kept (`layout.group_memory`).
        d_flat_out: The outputs' gradients, laid out as `layout.flatten_outputs`.
        form: How the loop is built (`LoopForm`; `read_in_step` means
            nothing here).

    Returns:
        Per direction the time-major stack of the cell's per-step records
        (from which the bulk gradients are summed), and the initial states'
        gradients.
    """
    steps = tf.shape(directions[0].inputs)[1]
    mask_tm = _step_masks(mask, directions)
    visits, span = visiting(directions, visited_span(mask, steps), orders=orders, backward=True)
    output_grads = split_output_grads(directions, return_sequences, d_flat_out)
    d_seq_tm = [None if g is None else swap_batch_and_time(g, form.bitcast) for g, _ in output_grads]
    # Transposed once, before the loop: a transpose inside the step's
    # matmul made training steps slower (benchmarks/README.md, "Design measurements").
    transposed_kernels = [tf.transpose(d.recurrent_kernel) for d in directions]

    read = _backward_reads(directions, visits, memory, d_seq_tm, mask_tm, span, in_step=form.xla_reads, xla=form.xla)
    body = _backward_body(directions, visits, memory, d_seq_tm, transposed_kernels, has_mask=mask_tm is not None)
    records = [_record_array(d, steps) for d in directions]
    initial = ([final for _, final in output_grads], records)
    d_states, records = time_loop(span, steps, read, body, initial, lowered=form.lowered, bounded=form.xla_reads)
    return [a.stack() for a in records], d_states


def _backward_reads(directions, visits, memory, d_seq_tm, mask_tm, span: Span, *, in_step: bool,
                    xla: bool) -> Callable[..., Reads]:
    """`read(i)` for `time_loop`: per direction its kept memory, output
    gradient and mask, in the step inside XLA except memory the cell wants
    materialised (`StepMath.materialize_saved`)."""

    def read(i):
        current = []
        for k, (d, visit) in enumerate(zip(directions, visits)):
            t = time_index(visit, i)
            saved, *incoming = memory[k]
            current.append((read_at(saved, t, span, xla=xla), in_step and not d.math.materialize_saved))
            current.extend((read_at(m, t, span, xla=xla), in_step) for m in incoming)
            if d_seq_tm[k] is not None:
                current.append((read_at(d_seq_tm[k], t, span, xla=xla), in_step))
            if mask_tm is not None:
                current.append((read_at(mask_tm[k], t, span, xla=xla), in_step))
        return current

    return read


def _backward_body(directions, visits, memory, d_seq_tm, transposed_kernels, *, has_mask: bool) -> Callable:
    """`body(i, current, state)` for `time_loop`: one BPTT step of every direction."""

    def body(i, current, state):
        d_states, records = state
        current = iter(current)
        new_states, new_records = [], []
        for k, (d, visit) in enumerate(zip(directions, visits)):
            t = time_index(visit, i)
            kept = [next(current) for _ in memory[k]]
            d_seq = None if d_seq_tm[k] is None else next(current)
            valid = next(current) if has_mask else None
            record, d_prev = _backward_step(d, transposed_kernels[k], kept, d_seq, valid, d_states[k])
            new_states.append(d_prev)
            new_records.append(records[k].write(t, record))
        return new_states, new_records

    return body


def _backward_step(d: Direction, transposed_kernel, kept, d_seq, valid, d_state) -> Tuple[tf.Tensor, list]:
    """One direction's BPTT step: its record and its incoming states' gradients."""
    d_new = list(d_state)
    if d_seq is not None:
        d_new[0] = d_new[0] + d_seq
    if valid is not None:
        d_new = [tf.where(valid, g, tf.zeros_like(g)) for g in d_new]
    saved, *incoming = kept
    record, d_prev = d.math.backward(incoming, saved, transposed_kernel, d.state_mask, d_new)
    if valid is not None:
        # A masked step passed its state through: so does its gradient.
        d_prev = [tf.where(valid, g, old) for g, old in zip(d_prev, d_state)]
    return record, d_prev


def _record_array(d: Direction, steps) -> tf.TensorArray:
    width = d.math.record_width(d.recurrent_kernel.shape[0])
    return tf.TensorArray(d.inputs.dtype, size=steps, element_shape=[d.inputs.shape[0], width])
