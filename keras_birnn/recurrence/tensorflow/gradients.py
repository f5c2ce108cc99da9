"""The gradients: the hand-written BPTT's sums over time, and its own
(differentiable) gradient.

After the backward loop (`loops.backward_loop`) has recorded every step's
gate gradients, every gradient that is a sum over time (input and recurrent
kernels, biases) and the inputs' gradient are single large matmuls over all
steps at once, outside the compiled loop (BRNN, BPTT and boundary states).
Differentiating those gradients again (a gradient penalty) goes through
autodiff of the plain forward loop (`differentiable_bptt`).
"""

from typing import Callable, List, Sequence

import tensorflow as tf

from keras_birnn.cells.step_math import column_sum
from keras_birnn.recurrence.tensorflow.layout import Direction, LoopKey, swap_batch_and_time
from keras_birnn.recurrence.tensorflow.loops import plain_loop
from keras_birnn.recurrence.tensorflow.timeloop import padded_to_all, visited_span, only_visited


def _accumulation_dtype(dtype) -> tf.DType:
    """The dtype the sums over time are taken in: at least float32 (in
    float16 a long sum over time loses precision), and never narrower than
    the layer's own (a float64 layer keeps float64 gradients)."""
    dtype = tf.as_dtype(dtype)
    return dtype if dtype.size >= 4 else tf.float32


def differentiable_bptt(key: LoopKey, fast_gradients: Callable, flat: list, mask: tf.Tensor, d_flat_out: list, *,
                        constant: set, xla_caller: bool) -> list:
    """The gradients of the non-constant inputs, by the fast hand-written
    BPTT; differentiating them again (a gradient penalty, a persistent tape
    asked twice) goes through `_autodiff_gradients` instead, which
    TensorFlow can differentiate to any order (the compiled loops cannot be
    differentiated at all)."""
    n = len(flat)

    @tf.custom_gradient
    def bptt(*flat_and_d_out):
        d_out = [tf.stop_gradient(g) for g in flat_and_d_out[n:]]

        def second_order(*upstream):
            with tf.GradientTape() as tape:
                slots = _distinct(flat_and_d_out, tape)
                first = _autodiff_gradients(key, slots[:n], mask, slots[n:], constant=constant, xla_caller=xla_caller)
            upstream = [tf.zeros_like(f) if u is None else u for u, f in zip(upstream, first)]
            return tape.gradient(first, slots, output_gradients=upstream)

        return fast_gradients(d_out), second_order

    return bptt(*flat, *d_flat_out)


def _autodiff_gradients(key: LoopKey, flat: list, mask: tf.Tensor, d_flat_out: list, *, constant: set,
                        xla_caller: bool) -> list:
    """What the BPTT computes, by autodiff through the forward loop run as
    plain TensorFlow (slower; used only to differentiate gradients)."""
    with tf.GradientTape() as tape:
        flat = _distinct(flat, tape)
        flat_out = plain_loop(key, flat, mask, xla=xla_caller)
    variables = [t for k, t in enumerate(flat) if k not in constant]
    return tape.gradient(
        flat_out, variables, output_gradients=d_flat_out, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )


def _distinct(tensors: Sequence[tf.Tensor], tape: tf.GradientTape) -> list:
    """A watched copy of each tensor: one tensor may fill several slots (both
    directions read the same inputs), and a tape asked for the gradient of
    each slot would give every one of them the sum over all."""
    copies = [tf.identity(t) for t in tensors]
    tape.watch(copies)
    return copies


def bulk_gradients(directions: Sequence[Direction], memory, records, d_initial, mask, *,
                   xla_caller: bool) -> List[tf.Tensor]:
    """After the BPTT loop: every gradient that is a sum over time, as one
    large matmul over all the steps the loops visited (`visited_span`; the others'
    records are zeros, and their inputs' gradients are zeros), laid out as
    `layout.flatten` lays out the directions."""
    steps = tf.shape(directions[0].inputs)[1]
    # Inside an XLA-compiled caller a slice's size must be a constant: there
    # the sums run over every step, the skipped ones adding zeros.
    span = visited_span(None if xla_caller else mask, steps)
    grads = []
    for d, kept, record, d_init in zip(directions, memory, records, d_initial):
        inputs_tm = only_visited(swap_batch_and_time(d.inputs), span)
        record = only_visited(record, span)
        flat_record = tf.reshape(record, [-1, record.shape[-1]])
        flat_dp = d.math.input_gradient(flat_record)
        d_inputs = tf.reshape(tf.matmul(flat_dp, d.kernel, transpose_b=True), tf.shape(inputs_tm))
        grads.append(swap_batch_and_time(padded_to_all(d_inputs, span, steps)))
        grads.append(_summed_matmul(tf.reshape(inputs_tm, [-1, d.kernel.shape[0]]), flat_dp, d.kernel.dtype))
        if d.input_bias is not None:
            accumulate = _accumulation_dtype(flat_dp.dtype)
            grads.append(tf.cast(column_sum(tf.cast(flat_dp, accumulate)), d.input_bias.dtype))
        grads.extend(_recurrent_gradients(d, only_visited(kept[1], span), flat_record))
        grads.extend(d_init)
    return grads


def _summed_matmul(a: tf.Tensor, b: tf.Tensor, dtype) -> tf.Tensor:
    """`a^T b`, a sum over every step and row (`_accumulation_dtype`)."""
    accumulate = _accumulation_dtype(b.dtype)
    return tf.cast(tf.matmul(tf.cast(a, accumulate), tf.cast(b, accumulate), transpose_a=True), dtype)


def _recurrent_gradients(d: Direction, incoming_h: tf.Tensor, flat_record: tf.Tensor) -> List[tf.Tensor]:
    """The recurrent kernel's (and bias's) gradient from the incoming states
    kept by the forward loop, summed over all steps in one matmul."""
    h_in = incoming_h if d.state_mask is None else incoming_h * d.state_mask
    accumulate = _accumulation_dtype(flat_record.dtype)
    h_in = tf.cast(tf.reshape(h_in, [-1, d.recurrent_kernel.shape[0]]), accumulate)
    d_kernel, d_bias = d.math.kernel_gradient(h_in, tf.cast(flat_record, accumulate))
    grads = [tf.cast(d_kernel, d.recurrent_kernel.dtype)]
    if d.recurrent_bias is not None:
        grads.append(tf.cast(d_bias, d.recurrent_bias.dtype))
    return grads
