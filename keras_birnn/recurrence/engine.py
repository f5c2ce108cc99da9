"""`run`: the one place that picks the engine for the backend.

TensorFlow runs the TensorFlow engine (`dispatch.run`: the loop plan,
compiled loops, time buckets, the hand-written BPTT, exports); JAX and
PyTorch run the portable engine (`portable.run`: a masked `keras.ops.scan`
differentiated by the backend's autodiff). Both give the same numbers (the
NumPy oracle tests run on every backend).
"""

from typing import List, Optional, Sequence

from keras_birnn import backend
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
        from keras_birnn.recurrence import dispatch

        return dispatch.run(directions, mask, return_sequences, bptt=bptt, counter=counter)
    from keras_birnn.recurrence import portable

    return portable.run(directions, mask, return_sequences, counter=counter)
