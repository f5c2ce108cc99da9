"""What every vendor engine shares: eligibility, layout and the run.

A vendor engine runs a call on a recurrent kernel its backend ships
(PyTorch's `torch.gru`/`torch.lstm`/`torch.rnn_*`, cuDNN's LSTM through
`jax.experimental.rnn`), which runs each row of a batch over its first
`length` steps. What does not depend on the backend is here, in
`keras.ops`, written once: the checks every vendor engine makes
(`reason_not_eligible`: the setting, an empty axis, recurrent dropout;
`standard_kernel`: the cell maths and activations a standard kernel
computes), and the run around one kernel call (`VendorEngine`): a forward
and a reversed direction over one input as one bidirectional call, split
after; a reversed direction flipped in time; a masked batch packed
(`packing`) and unpacked; a row without a valid step, which runs one step
(the kernels take lengths >= 1), reset to its boundary states. A backend's
engine (`torch_kernels`, `jax_kernels`) adds its kernel call and its own
checks.

This module imports no backend library: `recurrence.engine` asks
`reason_not_eligible` before it imports a backend's vendor engine.
"""

from typing import List, NamedTuple, Optional, Sequence, Tuple

import keras
from keras import ops

from keras_birnn.cells.derivatives import activation_name
from keras_birnn.cells.gru import GRUMath
from keras_birnn.cells.lstm import LSTMMath
from keras_birnn.cells.simple_rnn import SimpleRNNMath
from keras_birnn.config import loop_config
from keras_birnn.recurrence.direction import Call, Direction, DirectionResult, Tensor
from keras_birnn.recurrence.vendor import packing

# A kernel call's result: outputs `[B, T, directions * units]` and the final
# states, each `[directions, B, units]` (h, or h and c).
KernelResult = Tuple[Tensor, List[Tensor]]


class VendorPlan(NamedTuple):
    """What `loop_report()["plans"]` records for a call on a vendor engine:
    its kernel and layout, e.g. `"torch.gru bidirectional packed"`."""

    form: str

    def describe(self) -> dict:
        return {"path": "vendor", "form": self.form}


def reason_not_eligible(call: Call) -> Optional[str]:
    """What keeps every vendor engine off (None if nothing): the setting,
    an empty batch or time axis (nothing to pack), recurrent dropout (a
    kernel has no per-step state mask)."""
    if not loop_config().vendor_kernels:
        return "LoopConfig.vendor_kernels is off"
    if 0 in tuple(call.directions[0].inputs.shape[:2]):
        return "an empty batch or time axis (nothing to pack)"
    if any(d.state_mask is not None for d in call.directions):
        return "recurrent dropout in effect"
    return None


def standard_kernel(math) -> Tuple[Optional[str], str]:
    """(The standard kernel computing this step maths, or None; why not).

    The kernels, named as PyTorch names them: `"gru"` (gates r, z, n, the
    reset applied after the recurrent matmul, Keras's `reset_after=True`),
    `"lstm"`, `"rnn_tanh"`, `"rnn_relu"`; all with tanh and sigmoid gates.
    """
    gates = activation_name(getattr(math, "recurrent_activation", None))
    act = activation_name(math.activation)
    if isinstance(math, GRUMath):
        if not math.reset_after:
            return None, "GRU with reset_after=False (PyTorch's GRU resets after the matmul)"
        return ("gru", "") if (act, gates) == ("tanh", "sigmoid") else (None, "GRU activations other than tanh/sigmoid")
    if isinstance(math, LSTMMath):
        return ("lstm", "") if (act, gates) == ("tanh", "sigmoid") else (None, "LSTM activations other than tanh/sigmoid")
    if isinstance(math, SimpleRNNMath):
        return (f"rnn_{act}", "") if act in ("tanh", "relu") else (None, f"simple RNN activation {act or 'custom'!r}")
    return None, f"cell maths {type(math).__name__}"


def dtype_reason(direction: Direction, dtypes: Sequence[str], what: str) -> Optional[str]:
    """Why a kernel taking `dtypes` cannot take the direction's (None if it
    can); `what` says which kernels take which dtypes."""
    dtype = keras.backend.standardize_dtype(direction.inputs.dtype)
    return None if dtype in dtypes else f"dtype {direction.inputs.dtype} ({what})"


def is_bidirectional_pair(directions: Sequence[Direction]) -> bool:
    """A forward and then a reversed direction of one standard kernel over
    one input tensor, with the same weight shapes and dtype: what a
    kernel's bidirectional call runs in one."""
    if len(directions) != 2:
        return False
    a, b = directions
    return (not a.reverse and b.reverse and a.inputs is b.inputs
            and a.recurrent_kernel.shape == b.recurrent_kernel.shape and a.kernel.dtype == b.kernel.dtype
            and standard_kernel(a.math)[0] == standard_kernel(b.math)[0])


def stacked_states(directions: Sequence[Direction]) -> List[Tensor]:
    """The initial states as a kernel takes them: `[directions, B, units]`
    each (h, or h and c)."""
    return [ops.stack(states) for states in zip(*(d.initial_states for d in directions))]


def split_pair(outputs: Tensor, final: List[Tensor]) -> List[DirectionResult]:
    """A bidirectional call's result as the forward and the reversed
    direction's: outputs are `[forward units | reversed units]`."""
    units = outputs.shape[-1] // 2
    return [DirectionResult(outputs[..., k * units:(k + 1) * units], [s[k] for s in final]) for k in (0, 1)]


def reset_empty_rows(final: List[Tensor], initial: List[Tensor], lengths: Tensor) -> List[Tensor]:
    """Final states `[directions, B, units]` with rows of no valid step
    (which ran one step) back at their initial states."""
    empty = ops.expand_dims(ops.expand_dims(ops.equal(lengths, 0), 0), -1)
    return [ops.where(empty, s0, s) for s0, s in zip(initial, final)]


class VendorEngine:
    """The run every vendor engine shares (see the module's doc). A backend's
    engine implements `kernel_call`, `kernel_reason`, `kernel_label` and
    `bool_mask`, and may refine `runs_as_pair`, `plan` and `run_one`."""

    name = "vendor"

    def reason_not_eligible(self, call: Call) -> Optional[str]:
        """Why this engine cannot run `call` (None if it can)."""
        return reason_not_eligible(call) or self.kernel_reason(call)

    def kernel_reason(self, call: Call) -> Optional[str]:
        """Why the backend's kernels cannot run `call`, past the checks
        every vendor engine makes (None if they can)."""
        raise NotImplementedError

    def kernel_label(self, call: Call) -> str:
        """The kernel's name in the plan's form, e.g. `"torch.gru"`."""
        raise NotImplementedError

    def kernel_call(self, directions: Sequence[Direction], x: Tensor, lengths: Optional[Tensor],
                    states: List[Tensor], bidirectional: bool) -> KernelResult:
        """One kernel call on `x [B, T, F]`: each row over its first
        `lengths` steps (all >= 1), or over all steps (`lengths` None),
        from `states` (`stacked_states`)."""
        raise NotImplementedError

    def bool_mask(self, mask: Tensor, like: Tensor) -> Tensor:
        """The call's mask as a bool tensor beside `like` (same device)."""
        raise NotImplementedError

    def runs_as_pair(self, directions: Sequence[Direction], mask: Optional[Tensor]) -> bool:
        """Whether the directions run as one bidirectional call."""
        return is_bidirectional_pair(directions)

    def plan(self, call: Call) -> VendorPlan:
        """The plan `run` follows for `call`, for `loop_report()`."""
        pair = " bidirectional" if self.runs_as_pair(call.directions, call.mask) else ""
        return VendorPlan(self.kernel_label(call) + pair + (" packed" if call.mask is not None else ""))

    def run(self, call: Call, passed_over: str = "") -> List[DirectionResult]:
        """Runs an eligible call (`reason_not_eligible` is None): a pair as
        one bidirectional call, else one call per direction."""
        if call.counter is not None:
            call.counter.note_plan(self.plan(call))
        directions = call.directions
        mask = None if call.mask is None else self.bool_mask(call.mask, directions[0].inputs)
        if self.runs_as_pair(directions, mask):
            results = split_pair(*self.in_layout(directions, mask, reverse=False, bidirectional=True))
        else:
            results = [self.run_one(d, mask) for d in directions]
        if not call.return_sequences:
            results = [DirectionResult(None, r.final_states) for r in results]
        return results

    def run_one(self, direction: Direction, mask: Optional[Tensor]) -> DirectionResult:
        """One direction as one kernel call."""
        outputs, final = self.in_layout([direction], mask, reverse=direction.reverse, bidirectional=False)
        return DirectionResult(outputs, [s[0] for s in final])

    def in_layout(self, directions: Sequence[Direction], mask: Optional[Tensor], reverse: bool,
                  bidirectional: bool) -> KernelResult:
        """One kernel call on the directions' shared inputs, laid out for
        the kernel and back: flipped in time for a lone reversed direction,
        or packed (each row's valid steps first, in reverse order for a
        reversed one, a bidirectional kernel reversing each row within its
        length itself); outputs at their positions, zeros where masked."""
        x, states = directions[0].inputs, stacked_states(directions)
        if mask is None:
            outputs, final = self.kernel_call(directions, ops.flip(x, 1) if reverse else x, None, states,
                                              bidirectional)
            return (ops.flip(outputs, 1) if reverse else outputs), final
        destination, lengths = packing.destinations(mask, reverse)
        outputs, final = self.kernel_call(directions, packing.to_front(x, destination), ops.maximum(lengths, 1),
                                          states, bidirectional)
        return packing.to_positions(outputs, destination, mask), reset_empty_rows(final, states, lengths)
