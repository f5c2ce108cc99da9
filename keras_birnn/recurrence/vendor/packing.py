"""Packing a masked batch for the vendor engines, in `keras.ops`.

A vendor recurrent kernel (PyTorch's, cuDNN's) runs each row over its first
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

from typing import Any, Optional, Tuple

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
    """`x[b, indices[b, t]]` for `x [B, T, F]`, as one row gather of the
    flattened `[B * T, F]` (PyTorch's CPU `take_along_dim`, which
    broadcasts the index to `[B, T, F]`, took 3x PyTorch's own GRU call
    for the textbook shape)."""
    batch, steps, features = ops.shape(x)
    rows = ops.expand_dims(ops.arange(batch, dtype="int32") * steps, 1)
    flat = ops.reshape(indices + rows, (-1,))
    return ops.reshape(ops.take(ops.reshape(x, (-1, features)), flat, axis=0), (batch, steps, features))


def to_front(x: Tensor, destination: Tensor) -> Tensor:
    """`x [B, T, F]` with each row's steps moved to their destinations."""
    return _along_time(x, ops.cast(ops.argsort(destination, axis=1), "int32"))


def to_positions(y: Tensor, destination: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Inverse of `to_front` for the kernel's outputs `[B, T, H]`. Masked
    positions read the outputs past each row's length: zeros where the
    kernel wrote zeros there (PyTorch's unpacked outputs); else pass the
    `mask`, which zeros them."""
    y = _along_time(y, destination)
    # `where`, not a product: what ran past a length may be inf (a relu RNN).
    return y if mask is None else ops.where(ops.expand_dims(mask, -1), y, ops.zeros_like(y))
