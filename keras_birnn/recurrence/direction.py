"""What a direction is: the one thing every engine runs.

A direction is a cell's pure step maths, its weights as tensors of the
backend, its per-step inputs and its initial states. Both engines (the
TensorFlow one, `recurrence.tensorflow.dispatch`, and the portable one,
`recurrence.scan`) take a list of directions and return one
`DirectionResult` each.
"""

from typing import Any, List, NamedTuple, Optional, Sequence

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
            tensor beside the direction (`_orders`), not here.
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


def is_bidirectional_pair(directions: Sequence[Direction]) -> bool:
    """A forward and then a reversed direction over one input tensor with
    the same weight shapes and dtype: what a fused kernel's bidirectional
    call runs in one (each fused engine adds its own kernel check)."""
    if len(directions) != 2:
        return False
    a, b = directions
    return (not a.reverse and b.reverse and a.inputs is b.inputs
            and a.recurrent_kernel.shape == b.recurrent_kernel.shape and a.kernel.dtype == b.kernel.dtype)


class FusedPlan(NamedTuple):
    """What `loop_report()["plans"]` records for a call on a fused engine:
    its kernel and layout, e.g. `"torch.gru bidirectional packed"`."""

    form: str

    def describe(self) -> dict:
        return {"path": "fused", "form": self.form}
