"""The loop: runs step functions over time, one or several directions at once.

The only module that iterates over time. It knows nothing of Keras layers:
a direction is a pure step function, its per-step inputs and its initial
states. Masked steps carry the state unchanged and output zeros, which is
exact for right padding, left padding and holes alike, in both directions:
a backward direction simply meets a row's padding before its valid steps.
"""

from typing import Callable, List, NamedTuple, Optional, Sequence

import tensorflow as tf

StepFn = Callable[[tf.Tensor, List[tf.Tensor]], List[tf.Tensor]]


class Direction(NamedTuple):
    """One recurrence to run.

    Attributes:
        step: `step(projected_t, states) -> new_states`; the output of a step
            is `new_states[0]`.
        projected: `[batch, time, width]`, the per-step inputs of `step`.
        initial_states: list of `[batch, units]` tensors.
        reverse: Iterate from the last step to the first; outputs stay
            aligned with the input positions.
    """

    step: StepFn
    projected: tf.Tensor
    initial_states: Sequence[tf.Tensor]
    reverse: bool = False


class DirectionResult(NamedTuple):
    outputs: Optional[tf.Tensor]  # [batch, time, units], zeros where masked
    final_states: List[tf.Tensor]


def run(
    directions: Sequence[Direction],
    mask: Optional[tf.Tensor] = None,
    return_sequences: bool = True,
) -> List[DirectionResult]:
    """Advances every direction by one step per loop iteration.

    Args:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).
    """
    time_major = [tf.transpose(d.projected, [1, 0, 2]) for d in directions]
    steps = tf.shape(time_major[0])[0]
    mask_tm = None if mask is None else tf.transpose(mask)[..., None]
    outputs = [
        tf.TensorArray(d.projected.dtype, size=steps, element_shape=d.initial_states[0].shape)
        for d in directions
    ] if return_sequences else []

    def body(i, states, outputs):
        new_states, new_outputs = [], []
        for k, (d, inputs, state) in enumerate(zip(directions, time_major, states)):
            t = steps - 1 - i if d.reverse else i
            stepped = list(d.step(inputs[t], list(state)))
            if mask_tm is not None:
                valid = mask_tm[t]
                stepped = [tf.where(valid, s, old) for s, old in zip(stepped, state)]
                emitted = tf.where(valid, stepped[0], tf.zeros_like(stepped[0]))
            else:
                emitted = stepped[0]
            new_states.append(stepped)
            if outputs:
                new_outputs.append(outputs[k].write(t, emitted))
        return i + 1, new_states, new_outputs

    initial = [list(d.initial_states) for d in directions]
    _, final_states, outputs = tf.while_loop(
        lambda i, *_: i < steps,
        body,
        (tf.constant(0), initial, outputs),
        maximum_iterations=steps,
    )
    return [
        DirectionResult(
            tf.transpose(outputs[k].stack(), [1, 0, 2]) if outputs else None,
            list(final_states[k]),
        )
        for k in range(len(directions))
    ]
