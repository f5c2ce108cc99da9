"""The loop: runs cells' step maths over time, one or several directions at once.

The only module that iterates over time. It knows nothing of Keras layers:
a direction is a cell's pure step maths, its weights as tensors, its
per-step inputs and its initial states. All directions advance in the same
loop iteration, so a bidirectional layer pays the loop's per-step overhead
once.

Masked steps carry the state unchanged and output zeros, which is exact for
right padding, left padding and holes alike, in both directions: a backward
direction simply meets a row's padding before its valid steps.

Training uses `run(..., bptt=True)`: the gradient is the hand-written BPTT of
seed 001 instead of autodiff through `tf.while_loop`. The forward loop keeps
only each step's incoming states and its recurrent matmul's result; one
reverse loop then walks every direction back over time (the forward
direction from the last step to the first, the backward one from the first
to the last) and sums the shared weights' gradients over time.
"""

import contextlib
import functools
from typing import Any, List, NamedTuple, Optional, Sequence

import tensorflow as tf


class Direction(NamedTuple):
    """One recurrence to run.

    Attributes:
        math: The cell's step maths (`forward` and `backward`).
        projected: `[batch, time, width]`, each step's input projection.
        recurrent_kernel, recurrent_bias: The weights the step maths use
            (bias may be None).
        initial_states: list of `[batch, units]` tensors.
        reverse: Iterate from the last step to the first; outputs stay
            aligned with the input positions.
        state_mask: Optional recurrent-dropout mask `[batch, units]`.
    """

    math: Any
    projected: tf.Tensor
    recurrent_kernel: tf.Tensor
    recurrent_bias: Optional[tf.Tensor]
    initial_states: Sequence[tf.Tensor]
    reverse: bool = False
    state_mask: Optional[tf.Tensor] = None


class DirectionResult(NamedTuple):
    outputs: Optional[tf.Tensor]  # [batch, time, units], zeros where masked
    final_states: List[tf.Tensor]


def run(
    directions: Sequence[Direction],
    mask: Optional[tf.Tensor] = None,
    return_sequences: bool = True,
    bptt: bool = False,
) -> List[DirectionResult]:
    """Runs every direction over the whole sequence.

    Args:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).
        bptt: Differentiate with the hand-written BPTT (for training);
            otherwise TensorFlow differentiates the loop itself if asked.
    """
    flat, layout = _flatten_inputs(directions)
    static = (tuple(directions_static(d) for d in directions), mask is not None, return_sequences, bptt)
    runner = _compiled_runner(static) if _XLA.enabled else _runner(static)
    flat_out = runner(flat, mask if mask is not None else tf.zeros([0], tf.bool))
    return _unflatten_outputs(flat_out, directions, return_sequences)


def directions_static(d: Direction) -> tuple:
    """What a compiled loop is specialised on: everything but tensor values."""
    return (d.math, d.reverse, d.recurrent_bias is not None, len(d.initial_states), d.state_mask is not None)


class _XLA:
    enabled = True


@contextlib.contextmanager
def xla_disabled():
    """Runs loops as plain TensorFlow graphs instead of XLA clusters (used when
    exporting SavedModels, so that serving needs no XLA JIT)."""
    previous, _XLA.enabled = _XLA.enabled, False
    try:
        yield
    finally:
        _XLA.enabled = previous


def _runner(static):
    specs, has_mask, return_sequences, bptt = static

    def run_flat(flat, mask):
        dirs = _directions_from_flat(list(flat), specs)
        mask = mask if has_mask else None
        if bptt:
            return _run_with_bptt(dirs, mask, return_sequences)
        sequences, final_states, _ = _forward_loop(dirs, mask, return_sequences, keep_for_bptt=False)
        return _flatten_outputs(sequences, final_states, return_sequences)

    return run_flat


@functools.lru_cache(maxsize=None)
def _compiled_runner(static):
    # One XLA-compiled function per loop structure, reused across calls
    # (eagerly too); XLA compiles it once per concrete input shape.
    return tf.function(_runner(static), jit_compile=True, reduce_retracing=True)


def _time_index(direction: Direction, i, steps):
    return steps - 1 - i if direction.reverse else i


def _forward_loop(directions, mask, return_sequences, keep_for_bptt):
    """The loop itself. With `keep_for_bptt`, also returns per direction the
    time-major stacks of incoming states and of the step maths' `saved`."""
    time_major = [tf.transpose(d.projected, [1, 0, 2]) for d in directions]
    steps = tf.shape(time_major[0])[0]
    mask_tm = None if mask is None else tf.transpose(mask)[..., None]

    def array(like):
        return tf.TensorArray(like.dtype, size=steps, element_shape=like.shape)

    outputs = [array(d.initial_states[0]) for d in directions] if return_sequences else []
    kept = []
    if keep_for_bptt:
        kept = [[array(s) for s in d.initial_states] for d in directions]

    def body(i, states, outputs, kept, saved):
        new_states, new_outputs, new_kept, new_saved = [], [], [], []
        for k, d in enumerate(directions):
            t = _time_index(d, i, steps)
            stepped, step_saved = d.math.forward(
                time_major[k][t], states[k], d.recurrent_kernel, d.recurrent_bias, d.state_mask
            )
            emitted = stepped[0]
            if mask_tm is not None:
                valid = mask_tm[t]
                stepped = [tf.where(valid, s, old) for s, old in zip(stepped, states[k])]
                emitted = tf.where(valid, emitted, tf.zeros_like(emitted))
            new_states.append(stepped)
            if outputs:
                new_outputs.append(outputs[k].write(t, emitted))
            if kept:
                new_kept.append([a.write(t, s) for a, s in zip(kept[k], states[k])])
                new_saved.append(saved[k].write(t, step_saved))
        return i + 1, new_states, new_outputs, new_kept, new_saved

    saved = []
    if keep_for_bptt:
        saved = [_saved_array(d, steps) for d in directions]
    _, final_states, outputs, kept, saved = tf.while_loop(
        lambda i, *_: i < steps,
        body,
        (tf.constant(0), [list(d.initial_states) for d in directions], outputs, kept, saved),
        maximum_iterations=steps,
    )
    sequences = [tf.transpose(o.stack(), [1, 0, 2]) for o in outputs] if outputs else [None] * len(directions)
    memory = [([a.stack() for a in kept[k]], saved[k].stack()) for k in range(len(kept))]
    return sequences, [list(s) for s in final_states], memory


def _saved_array(direction: Direction, steps):
    # The step maths decide what they save; its width is that of the
    # recurrent kernel's output.
    width = direction.recurrent_kernel.shape[-1]
    batch = direction.initial_states[0].shape[0]
    return tf.TensorArray(direction.projected.dtype, size=steps, element_shape=[batch, width])


def _flatten_inputs(directions):
    flat, layout = [], []
    for d in directions:
        flat.extend([d.projected, d.recurrent_kernel])
        if d.recurrent_bias is not None:
            flat.append(d.recurrent_bias)
        if d.state_mask is not None:
            flat.append(d.state_mask)
        flat.extend(d.initial_states)
    return flat, layout


def _directions_from_flat(flat, specs):
    rebuilt, pos = [], 0
    for math, reverse, has_bias, n_states, has_state_mask in specs:
        projected, kernel = flat[pos], flat[pos + 1]
        pos += 2
        bias = state_mask = None
        if has_bias:
            bias, pos = flat[pos], pos + 1
        if has_state_mask:
            state_mask, pos = flat[pos], pos + 1
        states = list(flat[pos : pos + n_states])
        pos += n_states
        rebuilt.append(Direction(math, projected, kernel, bias, states, reverse, state_mask))
    return rebuilt


def _flatten_outputs(sequences, final_states, return_sequences):
    flat_out = []
    for seq, states in zip(sequences, final_states):
        flat_out.extend(([seq] if return_sequences else []) + list(states))
    return flat_out


def _unflatten_outputs(flat_out, directions, return_sequences):
    results, pos = [], 0
    for d in directions:
        seq = None
        if return_sequences:
            seq, pos = flat_out[pos], pos + 1
        n = len(d.initial_states)
        results.append(DirectionResult(seq, list(flat_out[pos : pos + n])))
        pos += n
    return results


def _run_with_bptt(directions, mask, return_sequences):
    """The loop under `tf.custom_gradient`; returns the flat outputs.

    The state masks (recurrent dropout) are constants of the gradient.
    """
    differentiable, _ = _flatten_inputs([d._replace(state_mask=None) for d in directions])
    specs = [directions_static(d._replace(state_mask=None)) for d in directions]
    state_masks = [d.state_mask for d in directions]

    @tf.custom_gradient
    def recurrence(*flat_inputs):
        dirs = [
            d._replace(state_mask=m) for d, m in zip(_directions_from_flat(list(flat_inputs), specs), state_masks)
        ]
        sequences, final_states, memory = _forward_loop(dirs, mask, return_sequences, keep_for_bptt=True)

        def grad(*d_flat_out):
            return _backward_loop(dirs, mask, return_sequences, memory, list(d_flat_out))

        return _flatten_outputs(sequences, final_states, return_sequences), grad

    return recurrence(*differentiable)


def _split_output_grads(directions, return_sequences, d_flat_out):
    per_direction, pos = [], 0
    for d in directions:
        d_seq = None
        if return_sequences:
            d_seq, pos = d_flat_out[pos], pos + 1
        n = len(d.initial_states)
        d_final = [
            tf.zeros_like(s) if g is None else g for g, s in zip(d_flat_out[pos : pos + n], d.initial_states)
        ]
        pos += n
        per_direction.append((d_seq, d_final))
    return per_direction


def _backward_loop(directions, mask, return_sequences, memory, d_flat_out):
    """Seed 001's BPTT: each direction walks back over its own time order."""
    steps = tf.shape(directions[0].projected)[1]
    mask_tm = None if mask is None else tf.transpose(mask)[..., None]
    output_grads = _split_output_grads(directions, return_sequences, d_flat_out)
    d_seq_tm = [
        None if g is None else tf.transpose(g, [1, 0, 2]) for g, _ in output_grads
    ]
    projected_tm = [tf.transpose(d.projected, [1, 0, 2]) for d in directions]

    def body(i, d_states, d_projected, d_kernels, d_biases):
        out = ([], [], [], [])
        for k, d in enumerate(directions):
            t = steps - 1 - i if not d.reverse else i
            d_new = list(d_states[k])
            if d_seq_tm[k] is not None:
                d_new[0] = d_new[0] + d_seq_tm[k][t]
            valid = None if mask_tm is None else mask_tm[t]
            if valid is not None:
                d_new = [tf.where(valid, g, tf.zeros_like(g)) for g in d_new]
            incoming, saved = memory[k]
            d_p, d_prev, d_kernel, d_bias = d.math.backward(
                projected_tm[k][t], [s[t] for s in incoming], saved[t],
                d.recurrent_kernel, d.recurrent_bias, d.state_mask, d_new,
            )
            if valid is not None:
                # A masked step passed its state through: so does its gradient.
                d_prev = [tf.where(valid, g, old) for g, old in zip(d_prev, d_states[k])]
            out[0].append(d_prev)
            out[1].append(d_projected[k].write(t, d_p))
            out[2].append(d_kernels[k] + d_kernel)
            out[3].append(d_biases[k] if d_bias is None else d_biases[k] + d_bias)
        return (i + 1,) + out

    d_states = [final for _, final in output_grads]
    d_projected = [
        tf.TensorArray(d.projected.dtype, size=steps, element_shape=projected_tm[k].shape[1:])
        for k, d in enumerate(directions)
    ]
    d_kernels = [tf.zeros_like(d.recurrent_kernel) for d in directions]
    d_biases = [
        tf.zeros_like(d.recurrent_bias) if d.recurrent_bias is not None else tf.zeros([], d.projected.dtype)
        for d in directions
    ]
    _, d_states, d_projected, d_kernels, d_biases = tf.while_loop(
        lambda i, *_: i < steps,
        body,
        (tf.constant(0), d_states, d_projected, d_kernels, d_biases),
        maximum_iterations=steps,
    )
    grads = []
    for k, d in enumerate(directions):
        grads.append(tf.transpose(d_projected[k].stack(), [1, 0, 2]))
        grads.append(d_kernels[k])
        if d.recurrent_bias is not None:
            grads.append(d_biases[k])
        grads.extend(d_states[k])
    return grads
