"""The forward and backward (BPTT) loops over time, for one or several
directions advancing in the same iteration.

Each step projects its own input (`x_t W + b`) inside the loop rather than
projecting the whole sequence up front: with the per-step reads of
`_time_loop`, hoisting the projection was no faster under XLA, and slower
without them (benchmarks/README.md, "Design measurements").

The forward loop can keep, per step, the incoming states and what the
cell's step maths save (the gates' activations or pre-activations, as each
cell chooses, so the backward step needs no matmul to rebuild them). The
backward loop walks every direction back over its own time order (the
forward direction from the last step to the first, the backward one from
the first to the last) and records each step's gate gradients, from which
`gradients._bulk_gradients` sums the weights' gradients.
"""

from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from keras_birnn.cells.base import RecurrentCell
from keras_birnn.recurrence.tensorflow.layout import (
    Direction,
    DirectionSpec,
    LoopKey,
    _flatten_outputs,
    _split_output_grads,
    _swap_batch_and_time,
    _unflatten,
)
from keras_birnn.recurrence.tensorflow.timeloop import (
    Reads,
    _Span,
    _array,
    _at,
    _in_time_order,
    _output_index,
    _span,
    _time_index,
    _time_loop,
    _visiting,
)

input_projection = RecurrentCell.input_projection


def _plain_loop(
    key: LoopKey,
    flat: Sequence[tf.Tensor],
    mask: tf.Tensor,
    split: bool = False,
    lowered: Callable[[Sequence[DirectionSpec]], Optional[bool]] = lambda specs: None,
    xla: bool = False,
) -> list:
    """The forward loops as plain TensorFlow ops, without custom gradient or
    XLA: for forward-mode derivatives, which TensorFlow takes op by op, and
    every other graph TensorFlow differentiates itself (second order,
    exported serving graphs, which `compiled._serving_loop` lays out),
    hence with differentiable transposes (no bitcast,
    `layout._swap_batch_and_time`). With `split`, a loop per direction,
    else one for all; `lowered(specs)` gives each loop's form
    (`_time_loop`; None: TensorFlow's own choice); `xla`: the caller is
    compiled by XLA."""
    directions = _unflatten(list(flat), key.specs)
    groups = [[k] for k in range(len(directions))] if split else [list(range(len(directions)))]
    sequences, final_states = [], []
    for group in groups:
        parts, finals, _ = _forward_loop(
            [directions[k] for k in group], mask if key.has_mask else None, key.return_sequences, False,
            xla_reads=xla, lowered=lowered([key.specs[k] for k in group]), xla=xla, bitcast=False,
        )
        sequences.extend(parts)
        final_states.extend(finals)
    return _flatten_outputs(sequences, final_states, key.return_sequences)


def _forward_loop(directions, mask, return_sequences, keep_for_bptt, read_in_step=False, xla_reads=False, lowered=None,
                  xla=False, bitcast=True, orders=None):
    """The loop itself. With `keep_for_bptt`, also returns per direction the
    time-major stacks of what the step maths saved and of the incoming states
    (what the backward step needs; the projected inputs are not kept).
    Slices are read in the step with `read_in_step` (the small-step
    inference loop) and, with `xla_reads` (XLA's loops and functional
    ones), when keeping for BPTT (`_time_loop`, which also takes
    `lowered`). `xla`: the loop is compiled by XLA (`timeloop._at`);
    `bitcast`: batch and time may be swapped as float64s (not where
    TensorFlow differentiates the loop); `orders`: a loop built for either
    order is told each direction's (`layout._orders`)."""
    inputs_tm = [_swap_batch_and_time(d.inputs, bitcast) for d in directions]
    steps = tf.shape(inputs_tm[0])[0]
    mask_tm = _step_masks(mask, directions)
    visits, span = _visiting(directions, _span(mask, steps), orders)
    in_step = read_in_step or (keep_for_bptt and xla_reads)
    read = _forward_reads(visits, inputs_tm, mask_tm, span, in_step, xla)
    body = _forward_body(directions, visits, mask_tm is not None)

    outputs = [_array(d.initial_states[0], steps) for d in directions] if return_sequences else []
    kept = [_memory_arrays(d, steps) for d in directions] if keep_for_bptt else []
    initial = ([list(d.initial_states) for d in directions], outputs, kept)
    final_states, outputs, kept = _time_loop(span, steps, read, body, initial, lowered, bounded=xla_reads)
    sequences = [None] * len(directions)
    if outputs:
        masks = mask_tm or [None] * len(directions)
        sequences = [
            _swap_batch_and_time(_in_time_order(o.stack(), v, span, steps, m), bitcast)
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


def _forward_reads(visits, inputs_tm, mask_tm, span: _Span, in_step: bool, xla: bool) -> Callable[..., Reads]:
    """`read(i)` for `_time_loop`: per direction its input, then the mask."""

    def read(i):
        current = []
        for k, visit in enumerate(visits):
            t = _time_index(visit, i)
            current.append((_at(inputs_tm[k], t, span, xla), in_step))
            if mask_tm is not None:
                current.append((_at(mask_tm[k], t, span, xla), in_step))
        return current

    return read


def _forward_body(directions, visits, has_mask: bool) -> Callable:
    """`body(i, current, state)` for `_time_loop`: one step of every direction."""

    def body(i, current, state):
        states, outputs, kept = state
        current = iter(current)
        new_states, new_outputs, new_kept = [], [], []
        for k, (d, visit) in enumerate(zip(directions, visits)):
            t = _time_index(visit, i)
            x_t, valid = next(current), next(current) if has_mask else None
            stepped, emitted, memory = _forward_step(d, x_t, valid, states[k])
            new_states.append(stepped)
            if outputs:
                # Put in time order after the loop (`_in_time_order`).
                new_outputs.append(outputs[k].write(_output_index(visit, i, t), emitted))
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
        # the loop, all steps at once (`_in_time_order`).
        stepped = [tf.where(valid, s, old) for s, old in zip(stepped, states)]
    return stepped, stepped[0], [saved] + list(states)


def _memory_arrays(d: Direction, steps) -> List[tf.TensorArray]:
    batch = d.initial_states[0].shape[0]
    saved_shape = [batch, d.math.saved_width(d.recurrent_kernel.shape[0])]
    saved = tf.TensorArray(d.inputs.dtype, size=steps, element_shape=saved_shape)
    return [saved] + [_array(s, steps) for s in d.initial_states]


def _backward_loop(directions, mask, return_sequences, memory, d_flat_out, xla_reads=False, lowered=None, xla=False,
                   orders=None):
    """Each direction walks back over its own time order; returns per
    direction the time-major stack of the cell's per-step records (from
    which the bulk gradients are summed) and the initial states' gradients."""
    steps = tf.shape(directions[0].inputs)[1]
    mask_tm = _step_masks(mask, directions)
    visits, span = _visiting(directions, _span(mask, steps), orders, backward=True)
    output_grads = _split_output_grads(directions, return_sequences, d_flat_out)
    d_seq_tm = [None if g is None else _swap_batch_and_time(g) for g, _ in output_grads]
    # Transposed once, before the loop: a transpose inside the step's
    # matmul made training steps slower (benchmarks/README.md, "Design measurements").
    transposed_kernels = [tf.transpose(d.recurrent_kernel) for d in directions]

    read = _backward_reads(directions, visits, memory, d_seq_tm, mask_tm, span, xla_reads, xla)
    body = _backward_body(directions, visits, memory, d_seq_tm, mask_tm is not None, transposed_kernels)
    records = [_record_array(d, steps) for d in directions]
    initial = ([final for _, final in output_grads], records)
    d_states, records = _time_loop(span, steps, read, body, initial, lowered, bounded=xla_reads)
    return [a.stack() for a in records], d_states


def _backward_reads(directions, visits, memory, d_seq_tm, mask_tm, span: _Span, in_xla: bool,
                    xla: bool) -> Callable[..., Reads]:
    """`read(i)` for `_time_loop`: per direction its kept memory, output
    gradient and mask, in the step inside XLA except memory the cell wants
    materialised (`StepMath.materialize_saved`)."""

    def read(i):
        current = []
        for k, (d, visit) in enumerate(zip(directions, visits)):
            t = _time_index(visit, i)
            saved, *incoming = memory[k]
            current.append((_at(saved, t, span, xla), in_xla and not d.math.materialize_saved))
            current.extend((_at(m, t, span, xla), in_xla) for m in incoming)
            if d_seq_tm[k] is not None:
                current.append((_at(d_seq_tm[k], t, span, xla), in_xla))
            if mask_tm is not None:
                current.append((_at(mask_tm[k], t, span, xla), in_xla))
        return current

    return read


def _backward_body(directions, visits, memory, d_seq_tm, has_mask: bool, transposed_kernels) -> Callable:
    """`body(i, current, state)` for `_time_loop`: one BPTT step of every direction."""

    def body(i, current, state):
        d_states, records = state
        current = iter(current)
        new_states, new_records = [], []
        for k, (d, visit) in enumerate(zip(directions, visits)):
            t = _time_index(visit, i)
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
