"""The scan engine: a masked scan in `keras.ops`, for every backend.

JAX and PyTorch run here the loops no vendor engine takes, and every
other backend runs all of them (TensorFlow runs its own engine,
`recurrence.tensorflow`). A reversed direction reads its inputs
flipped in time, so its step `k` reads position `T - 1 - k`. A masked step
is absent: the step's new states are dropped (`where`, so nothing computed
on a padded slot reaches a state or a gradient) and its output is zero.
That is exact for any mask (right or left padding, holes, rows with no
valid step) without moving a row's steps. Gradients are the backend's
autodiff, through the cells' step maths without what the TensorFlow
engine's hand-written BPTT saves (`StepMath.forward(..., with_saved=False)`).

How the loop is laid out differs by backend, each as measured fastest on
a CPU (benchmarks/README.md, "Backends on a CPU: kb against Keras's
layers"):

- PyTorch (eager): the input projection `x kernel + input_bias` is one
  matmul over the whole sequence, outside the loop; the sequences are split
  into steps once (`unstack`, whose gradient is one `stack`: indexing a
  step per iteration, as `keras.ops.scan` does, makes each index's gradient
  a zero-filled copy of the whole sequence), and one Python loop advances
  all directions.
- JAX (XLA): one `keras.ops.scan` (`lax.scan`) per direction, each step
  projecting its own input: on XLA:CPU a step that reads its slice of a
  hoisted `[T, B, gates * units]` projection compiled to code 2-2.6x
  slower than the step's own matmul, and one scan per direction beat one
  scan advancing both.
"""

from typing import List, NamedTuple, Optional, Sequence

import keras
from keras import ops

from keras_birnn import backend
from keras_birnn.recurrence.direction import Call, Direction, DirectionResult

# Whether the input projection is hoisted out of the loop (see above).
HOISTED: bool = backend.NAME != "jax"


class ScanPlan(NamedTuple):
    """What `loop_report()["plans"]` records for a call on this engine,
    with why no vendor engine ran it ("" where none was tried)."""

    why_not_vendor: str = ""

    def describe(self) -> dict:
        form = "hoisted loop" if HOISTED else "scan per direction"
        return {"path": "scan", "form": form, "why not vendor": self.why_not_vendor}


class ScanEngine:
    """The scan engine behind the engines' contract (`direction.Engine`):
    it runs every call."""

    name = "scan"

    def reason_not_eligible(self, call: Call) -> Optional[str]:
        return None

    def run(self, call: Call, passed_over: str = "") -> List[DirectionResult]:
        """Runs `call`, recording `ScanPlan(passed_over)` (see the module's doc)."""
        if call.counter is not None:
            call.counter.note_plan(ScanPlan(passed_over))
        return run(call.directions, call.mask, call.return_sequences)


def _time_major(x, reverse: bool):
    """`[B, T, ...]` -> `[T, B, ...]`, flipped in time for a reversed direction."""
    x = ops.swapaxes(x, 0, 1)
    return ops.flip(x, axis=0) if reverse else x


def _project(direction: Direction, x):
    """`x kernel + input_bias`, for one step `[B, F]` or a sequence."""
    projected = ops.matmul(x, direction.kernel)
    return projected if direction.input_bias is None else projected + direction.input_bias


def _sequence(direction: Direction, mask):
    """What the loop reads of one direction, time-major: its projected (or
    raw) inputs, with the mask if there is one."""
    inputs = _project(direction, direction.inputs) if HOISTED else direction.inputs
    inputs = _time_major(inputs, direction.reverse)
    return inputs if mask is None else (inputs, _time_major(mask, direction.reverse))


def _step(directions: Sequence[Direction], has_mask: bool, return_sequences: bool):
    """The loop's body: every direction's step, a masked step kept absent."""

    def step(carry, xs):
        new_carry, outputs = [], []
        for direction, states, x in zip(directions, carry, xs):
            x, valid = x if has_mask else (x, None)
            projected = x if HOISTED else _project(direction, x)
            new_states, _ = direction.math.forward(
                projected, states, direction.recurrent_kernel, direction.recurrent_bias, direction.state_mask,
                with_saved=False,
            )
            output = new_states[0]
            if valid is not None:
                keep = ops.expand_dims(valid, -1)
                new_states = [ops.where(keep, new, old) for new, old in zip(new_states, states)]
                output = ops.where(keep, new_states[0], ops.zeros_like(new_states[0]))
            new_carry.append(list(new_states))
            outputs.append(output)
        return new_carry, (outputs if return_sequences else None)

    return step


def _eager_loop(step, init, xs):
    """`ops.scan(step, init, xs)` for an eager backend, the sequences split
    into steps once (see the module's doc)."""
    flat = keras.tree.flatten(xs)
    slices = [ops.unstack(x, axis=0) for x in flat]
    carry, ys = init, []
    for t in range(len(slices[0])):
        carry, y = step(carry, keras.tree.pack_sequence_as(xs, [s[t] for s in slices]))
        ys.append(y)
    if ys[0] is None:
        return carry, None
    return carry, keras.tree.map_structure(lambda *y: ops.stack(y, axis=0), *ys)


def _loops(directions: Sequence[Direction], mask, initial, return_sequences: bool):
    """`(final states, time-major outputs or None)` per direction."""
    xs = [_sequence(d, mask) for d in directions]
    if HOISTED:
        final, outputs = _eager_loop(_step(directions, mask is not None, return_sequences), initial, xs)
        return final, (outputs if return_sequences else [None] * len(directions))
    final, outputs = [], []
    for d, states, x in zip(directions, initial, xs):
        f, o = ops.scan(_step([d], mask is not None, return_sequences), [states], [x])
        final.append(f[0])
        outputs.append(None if o is None else o[0])
    return final, outputs


def run(directions: Sequence[Direction], mask=None, return_sequences: bool = True) -> List[DirectionResult]:
    """Runs every direction over the whole sequence (see the module's doc).

    Args:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).

    Returns:
        One `DirectionResult` per direction.
    """
    initial = [list(d.initial_states) for d in directions]
    if directions[0].inputs.shape[1] == 0:
        return _no_steps(directions, initial, return_sequences)
    final, outputs = _loops(directions, mask, initial, return_sequences)
    results = []
    for d, states, sequence in zip(directions, final, outputs):
        if sequence is not None:
            sequence = ops.swapaxes(ops.flip(sequence, axis=0) if d.reverse else sequence, 0, 1)
        results.append(DirectionResult(sequence, list(states)))
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


ENGINE = ScanEngine()
