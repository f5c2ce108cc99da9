"""`run`: the one place that picks the engine for the backend.

TensorFlow runs the TensorFlow engine (`dispatch.run`: the loop plan,
compiled loops, time buckets, the hand-written BPTT, exports). JAX and
PyTorch run eligible loops on their fused engine (`fused_torch.run`: PyTorch's
own kernels on packed sequences; `fused_jax.run`: cuDNN's LSTM on a GPU)
and the rest on the portable engine (`portable.run`: a masked
`keras.ops.scan` differentiated by the backend's autodiff), which records
why the fused one was not taken. All give the same numbers (the NumPy
oracle tests run on every backend).
"""

from typing import List, Sequence

from keras_birnn import backend
from keras_birnn.config import loop_config
from keras_birnn.recurrence.direction import Direction, DirectionResult


def run(
    directions: Sequence[Direction],
    mask=None,
    return_sequences: bool = True,
    bptt: bool = False,
    counter=None,
) -> List[DirectionResult]:
    """Runs every direction over the whole sequence.

    Args:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).
        bptt: (TensorFlow) keep what the hand-written BPTT needs during
            the forward loop (training).
        counter: The calling layer's `compile_policy.ShapeCounter`.
    """
    if backend.IS_TENSORFLOW:
        from keras_birnn.recurrence.tensorflow import dispatch

        return dispatch.run(directions, mask, return_sequences, bptt=bptt, counter=counter)
    from keras_birnn.recurrence import scan as portable

    fused = _fused_engine()
    not_fused = _reason_not_fused(directions) or fused.reason_not_fused(directions, mask)
    if not not_fused:
        if counter is not None:
            counter.note_plan(fused.plan(directions, mask))
        return fused.run(directions, mask, return_sequences)
    return portable.run(directions, mask, return_sequences, counter=counter, not_fused=not_fused)


def _reason_not_fused(directions: Sequence[Direction]) -> str:
    """What keeps any fused engine off ("" if nothing): the setting, an
    empty batch or time axis (nothing to pack), recurrent dropout (a fused
    kernel has no per-step state mask)."""
    if not loop_config().fused_kernels:
        return "LoopConfig.fused_kernels is off"
    if 0 in tuple(directions[0].inputs.shape[:2]):
        return "an empty batch or time axis (nothing to pack)"
    if any(d.state_mask is not None for d in directions):
        return "recurrent dropout in effect"
    return ""


def _fused_engine():
    """The backend's fused engine: PyTorch's kernels, or cuDNN's LSTM on JAX."""
    if backend.NAME == "torch":
        from keras_birnn.recurrence.vendor import torch_kernels as fused_torch

        return fused_torch
    from keras_birnn.recurrence.vendor import jax_kernels as fused_jax

    return fused_jax
