"""The engines' contract: what a direction is, what a call asks, what an
engine and a plan are.

A direction is a cell's pure step maths, its weights as tensors of the
backend, its per-step inputs and its initial states. A `Call` holds the
directions of one call of the loop and how they are to be run. An
`Engine` (the TensorFlow engine, `recurrence.tensorflow` behind
`engine.TensorFlowEngine`; the scan engine,
`recurrence.scan`; a vendor engine, `recurrence.vendor`) says whether it
can run a call and runs it, returning one `DirectionResult` per direction
and recording the `Plan` it followed for `loop_report()`.
`recurrence.engine` is the one place that picks an engine for a call.
"""

from typing import Any, List, NamedTuple, Optional, Protocol, Sequence

from keras_birnn.cells.step_math import StepMath

Tensor = Any  # a tensor of the backend


class Direction(NamedTuple):
    """One recurrence to run.

    Attributes:
        math: The cell's step maths (`RecurrentCell.step_math()`).
        inputs: `[batch, time, features]`, padding already zeroed.
        kernel, input_bias: Input projection `x_t kernel + input_bias`.
        recurrent_kernel, recurrent_bias: The weights the step maths use.
        initial_states: list of `[batch, units]` tensors.
        reverse: Iterate from the last step to the first; outputs stay
            aligned with the input positions. A loop built for either
            order (`DirectionSpec.runtime_order`) is told the order as a
            tensor beside the direction (`runtime_orders`), not here.
        state_mask: Optional recurrent-dropout mask `[batch, units]`.
    """

    math: StepMath
    inputs: Tensor
    kernel: Tensor
    input_bias: Optional[Tensor]
    recurrent_kernel: Tensor
    recurrent_bias: Optional[Tensor]
    initial_states: Sequence[Tensor]
    reverse: bool = False
    state_mask: Optional[Tensor] = None


class DirectionResult(NamedTuple):
    outputs: Optional[Tensor]  # [batch, time, units], zeros where masked
    final_states: List[Tensor]


class Plan(Protocol):
    """How an engine runs one call, as `loop_report()["plans"]` records it.

    Implemented by `recurrence.scan.ScanPlan`, `recurrence.vendor.common.VendorPlan`
    and the TensorFlow engine's `recurrence.tensorflow.plan.LoopPlan`.
    """

    def describe(self) -> dict:
        """The plan as a flat dict: `"path"` (the engine, or on TensorFlow
        its path), `"form"`, and what else the engine decided."""


class PlanRecorder(Protocol):
    """What records a call's plan: the calling layer's
    `compile_policy.ShapeCounter`."""

    def note_plan(self, plan: Plan) -> None:
        """Records that `plan` ran."""


class Call(NamedTuple):
    """One call of the loop: the directions and how to run them.

    Attributes:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).
        bptt: (TensorFlow) keep what the hand-written BPTT needs during
            the forward loop (training).
        counter: Where the engine records its plan, or None.
    """

    directions: Sequence[Direction]
    mask: Optional[Tensor] = None
    return_sequences: bool = True
    bptt: bool = False
    counter: Optional[PlanRecorder] = None


class Engine(Protocol):
    """A way to run calls over time. Every engine gives the same numbers
    (the NumPy oracle tests run on every backend); they differ in speed and
    in which calls they take.

    Attributes:
        name: The engine's name, as `loop_report()` shows it ("scan",
            "vendor", "tensorflow").
    """

    name: str

    def reason_not_eligible(self, call: Call) -> Optional[str]:
        """Why this engine cannot run `call`, or None if it can."""

    def run(self, call: Call, passed_over: str = "") -> List[DirectionResult]:
        """Plans `call`, records the plan in `call.counter` (if any) and runs
        it. `passed_over`: why the engines tried before this one did not
        run the call (recorded where the plan has room for it). Returns one
        `DirectionResult` per direction."""
