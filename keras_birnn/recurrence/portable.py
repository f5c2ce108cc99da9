"""The portable engine: one masked scan in `keras.ops`, for every backend.

JAX and PyTorch run the layers' loops here (TensorFlow runs its own
engine, `recurrence.dispatch`). All directions of a call advance in one
`keras.ops.scan` (on JAX a `lax.scan`: one loop, not one per direction);
a reversed direction reads its inputs flipped in time, so its step `k`
reads position `T - 1 - k`. A masked step is absent: the step's new
states are dropped (`where`, so nothing computed on a padded slot reaches
a state or a gradient) and its output is zero. That is exact for any mask
(right or left padding, holes, rows with no valid step) without moving a
row's steps. The input projection `x kernel + input_bias` is one matmul
over the whole sequence, outside the loop; the gradient is the backend's
autodiff through the scan.
"""

from typing import List, Optional, Sequence

from keras import ops

from keras_birnn.recurrence.direction import Direction, DirectionResult


class PortablePlan:
    """What `loop_report()["plans"]` records for a call on this engine."""

    @staticmethod
    def describe() -> dict:
        return {"path": "portable", "form": "scan"}


def _time_major(x, reverse: bool):
    """`[B, T, ...]` -> `[T, B, ...]`, flipped in time for a reversed direction."""
    x = ops.swapaxes(x, 0, 1)
    return ops.flip(x, axis=0) if reverse else x


def _projected(direction: Direction):
    """The input projection of every step at once, time-major `[T, B, gates*units]`."""
    projected = ops.matmul(direction.inputs, direction.kernel)
    if direction.input_bias is not None:
        projected = projected + direction.input_bias
    return _time_major(projected, direction.reverse)


def _step(directions: Sequence[Direction], has_mask: bool, return_sequences: bool):
    """The scan's body: every direction's step, a masked step kept absent."""

    def step(carry, xs):
        new_carry, outputs = [], []
        for direction, states, x in zip(directions, carry, xs):
            projected, valid = x if has_mask else (x, None)
            new_states, _ = direction.math.forward(
                projected, states, direction.recurrent_kernel, direction.recurrent_bias, direction.state_mask
            )
            if valid is not None:
                keep = ops.expand_dims(valid, -1)
                new_states = [ops.where(keep, new, old) for new, old in zip(new_states, states)]
                output = ops.where(keep, new_states[0], ops.zeros_like(new_states[0]))
            else:
                output = new_states[0]
            new_carry.append(list(new_states))
            outputs.append(output)
        return new_carry, (outputs if return_sequences else None)

    return step


def run(directions: Sequence[Direction], mask=None, return_sequences: bool = True,
        counter=None) -> List[DirectionResult]:
    """Runs every direction over the whole sequence (see the module's doc).

    Args:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).
        counter: The calling layer's `compile_policy.ShapeCounter`, which
            records the plan for `loop_report()`.
    """
    if counter is not None:
        counter.note_plan(PortablePlan)
    initial = [list(d.initial_states) for d in directions]
    if directions[0].inputs.shape[1] == 0:
        return _no_steps(directions, initial, return_sequences)
    xs = []
    for d in directions:
        projected = _projected(d)
        xs.append((projected, _time_major(mask, d.reverse)) if mask is not None else projected)
    final, outputs = ops.scan(_step(directions, mask is not None, return_sequences), initial, xs)
    results = []
    for k, d in enumerate(directions):
        sequence = None
        if return_sequences:
            sequence = ops.swapaxes(ops.flip(outputs[k], axis=0) if d.reverse else outputs[k], 0, 1)
        results.append(DirectionResult(sequence, list(final[k])))
    return results


def _no_steps(directions: Sequence[Direction], initial, return_sequences: bool) -> List[DirectionResult]:
    """A zero-length sequence: nothing read, so the boundary states stand."""
    results = []
    for d, states in zip(directions, initial):
        outputs: Optional[object] = None
        if return_sequences:
            outputs = ops.zeros(tuple(d.inputs.shape[:2]) + (states[0].shape[-1],), d.inputs.dtype)
        results.append(DirectionResult(outputs, states))
    return results
