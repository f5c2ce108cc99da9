"""Packing a masked batch for the fused engines, in `keras.ops`.

A fused recurrent kernel (PyTorch's, cuDNN's) runs each row over its first
`length` steps. A mask of any pattern (right or left padding, holes, rows
without a valid step) maps onto that exactly: each row's valid steps move
to the front, in time order (a forward direction) or in reverse time order
(a reversed one: the row reversed within its own length), the kernel runs,
and each output moves back to the position it came from.

Both moves are one gather along time with a per-row permutation:
`destinations[b, t]` is where position `t` of row `b` goes (valid steps to
`0 .. length-1`, masked ones after them, each group in order), and its
inverse (`argsort`, exact on distinct integers) brings the steps there.
"""

from typing import Any, Tuple

from keras import ops

Tensor = Any  # a tensor of the backend


def destinations(mask: Tensor, reverse: bool = False) -> Tuple[Tensor, Tensor]:
    """`(destinations [B, T] int32, lengths [B] int32)` for a bool mask
    (see the module's doc); `reverse`: valid steps land last-first."""
    valid = ops.cast(mask, "int32")
    lengths = ops.sum(valid, axis=1)
    rank = ops.cumsum(valid, axis=1) - 1
    if reverse:
        rank = ops.expand_dims(lengths, 1) - 1 - rank
    masked_rank = ops.expand_dims(lengths, 1) + ops.cumsum(1 - valid, axis=1) - 1
    return ops.where(mask, rank, masked_rank), lengths


def _along_time(x: Tensor, indices: Tensor) -> Tensor:
    return ops.take_along_axis(x, ops.expand_dims(indices, -1), axis=1)


def to_front(x: Tensor, destination: Tensor) -> Tensor:
    """`x [B, T, F]` with each row's steps moved to their destinations."""
    return _along_time(x, ops.cast(ops.argsort(destination, axis=1), "int32"))


def to_positions(y: Tensor, destination: Tensor, mask: Tensor) -> Tensor:
    """Inverse of `to_front` for the kernel's outputs `[B, T, H]`, zeros at
    masked positions."""
    return _along_time(y, destination) * ops.cast(ops.expand_dims(mask, -1), y.dtype)
