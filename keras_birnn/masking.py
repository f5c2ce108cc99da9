"""Masks and lengths: validation, conversion, and keeping padding inert.

Written in `keras.ops` for every backend. TensorFlow alone has ragged
batches and shapes unknown until run time (a graph traced for any batch
and time), which its branches below handle.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import keras
from keras import ops

from keras_birnn import backend

if backend.IS_TENSORFLOW:
    import tensorflow as tf

Tensor = Any  # a tensor of the backend


def validate_mask(mask, inputs) -> Optional[tf.Tensor]:
    """Returns `mask` as a bool `[batch, time]` tensor, or None.

    Raises:
        ValueError: if the mask's rank or static shape does not fit `inputs`
            (tf.errors.InvalidArgumentError at run time for sizes that are
            only known then).
        TypeError: if the mask is not bool or integer.
    """
    if mask is None:
        return None
    if not backend.IS_TENSORFLOW:
        return _validate_static_mask(mask, inputs)
    mask = tf.convert_to_tensor(mask)
    if mask.dtype != tf.bool and not mask.dtype.is_integer:
        raise TypeError(f"`mask` must be bool (or 0/1 integers), received dtype {mask.dtype.name}.")
    if mask.shape.rank != 2:
        raise ValueError(
            f"`mask` must have shape [batch, time] = {inputs.shape[:2]}, received shape {mask.shape}."
        )
    if not mask.shape.is_compatible_with(inputs.shape[:2]):
        raise ValueError(
            f"`mask` must have shape [batch, time] = {inputs.shape[:2]}, received shape {mask.shape}."
        )
    if not (mask.shape.is_fully_defined() and inputs.shape[:2].is_fully_defined()):
        # Sizes unknown until run time (a graph): check then. A [1, time] or
        # [batch, 1] mask would otherwise broadcast silently over the batch
        # or the time axis.
        check = tf.debugging.assert_equal(
            tf.shape(mask),
            tf.shape(inputs)[:2],
            message="`mask` must have shape [batch, time] of the inputs (shape of the mask, [batch, time] "
            "of the inputs):",
        )
        with tf.control_dependencies([check]):
            mask = tf.identity(mask)
    return mask if mask.dtype == tf.bool else tf.not_equal(mask, 0)


def _validate_static_mask(mask, inputs) -> Tensor:
    """`validate_mask` on JAX and PyTorch, where every shape is known."""
    mask = ops.convert_to_tensor(mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool" and "int" not in dtype:
        raise TypeError(f"`mask` must be bool (or 0/1 integers), received dtype {dtype}.")
    expected = tuple(inputs.shape[:2])
    if tuple(mask.shape) != expected:
        raise ValueError(f"`mask` must have shape [batch, time] = {expected}, received shape {tuple(mask.shape)}.")
    return mask if dtype == "bool" else ops.not_equal(mask, 0)


def dense_sequence_and_mask(inputs, mask):
    """`(inputs, mask)` with a `tf.RaggedTensor` batch `[batch, (time),
    features]` padded with zeros to its longest row, and the mask of its
    rows' lengths (combined with `mask`, which may be ragged too, as an
    `Embedding(mask_zero=True)` on ragged ids makes it). Dense inputs pass
    unchanged (a ragged mask is made dense)."""
    if not backend.is_ragged(inputs):
        return inputs, dense_mask(mask)
    return inputs.to_tensor(), ragged_mask(inputs, mask)


def ragged_mask(inputs, mask=None):
    """The mask `dense_sequence_and_mask` gives these inputs (for
    `compute_mask`: the layers' outputs are dense and carry it)."""
    mask = dense_mask(mask)
    if not backend.is_ragged(inputs):
        return mask
    if inputs.ragged_rank != 1 or inputs.shape.rank != 3:
        raise ValueError(
            "A ragged input must be [batch, (time), features], ragged along time only; received "
            f"shape {inputs.shape} with ragged_rank {inputs.ragged_rank}."
        )
    lengths_mask = tf.sequence_mask(inputs.row_lengths(), inputs.bounding_shape(axis=1))
    if mask is None:
        return lengths_mask
    return tf.logical_and(validate_mask(mask, tf.expand_dims(lengths_mask, -1)), lengths_mask)


def dense_mask(mask):
    """A ragged mask padded with False (zeros); others unchanged."""
    if backend.is_ragged(mask):
        return mask.to_tensor(default_value=tf.zeros([], mask.dtype))
    return mask


def lengths_to_mask(lengths, max_length) -> Tensor:
    """Right-padding mask `[batch, max_length]` from per-row lengths.

    Lengths are clipped to `[0, max_length]` (a negative length gives an
    empty row, a too large one a full row), as in the serving signature.
    """
    if backend.IS_TENSORFLOW:  # one op, which the exports' graphs keep
        return tf.sequence_mask(lengths, max_length)
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    return ops.less(ops.arange(max_length, dtype="int32"), ops.expand_dims(lengths, -1))


def zero_padding(inputs, mask) -> Tensor:
    """Replaces padded positions by zeros.

    Anything in a padded slot, NaN included, must not reach a valid output or
    a gradient: `where` drops it in the forward pass, and its gradient sends
    exact zeros (not 0 * NaN) back to the padded slots.
    """
    if mask is None:
        return inputs
    return ops.where(ops.expand_dims(mask, -1), inputs, ops.zeros_like(inputs))


def reverse_within_lengths(sequences, lengths) -> Tensor:
    """Reverses each row's first `lengths[b]` steps, leaving padding in place.

    Lengths are clipped to `[0, time]`, like `lengths_to_mask`'s.
    """
    if not backend.IS_TENSORFLOW:
        sequences = ops.convert_to_tensor(sequences)
        time = ops.arange(sequences.shape[1], dtype="int32")[None, :]
        lengths = ops.clip(ops.cast(ops.convert_to_tensor(lengths), "int32"), 0, sequences.shape[1])[:, None]
        # Position t of a row reads position lengths - 1 - t inside the row, itself beyond it.
        source = ops.where(time < lengths, lengths - 1 - time, time)
        source = ops.reshape(source, tuple(source.shape) + (1,) * (len(sequences.shape) - 2))
        return ops.take_along_axis(sequences, ops.broadcast_to(source, sequences.shape), axis=1)
    lengths = tf.cast(lengths, tf.int64)
    lengths = tf.clip_by_value(lengths, 0, tf.shape(sequences, out_type=tf.int64)[1])
    return tf.reverse_sequence(sequences, lengths, seq_axis=1, batch_axis=0)


def check_sequence_input(inputs, layer_name: str) -> Tensor:
    """Inputs must be float `[batch, time, features]`."""
    inputs = tf.convert_to_tensor(inputs) if backend.IS_TENSORFLOW else ops.convert_to_tensor(inputs)
    if len(inputs.shape) != 3:
        raise ValueError(
            f"Layer {layer_name!r} expects inputs of rank 3 [batch, time, features], "
            f"received shape {inputs.shape}."
        )
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    if "float" not in dtype:
        raise TypeError(
            f"Layer {layer_name!r} expects float inputs, received dtype {dtype}. "
            "Embed integer tokens first (e.g. keras.layers.Embedding)."
        )
    return inputs


def sequence_input(inputs, mask, layer_name: str) -> Tuple[Tensor, Optional[Tensor]]:
    """`(inputs, mask)` as a layer's `call` reads them: a ragged batch
    padded, its rows' lengths as the mask (`dense_sequence_and_mask`), the
    inputs checked (`check_sequence_input`), the mask checked against them
    (`validate_mask`)."""
    inputs, mask = dense_sequence_and_mask(inputs, mask)
    inputs = check_sequence_input(inputs, layer_name)
    return inputs, validate_mask(mask, inputs)


def zero_empty_rows(output: Tensor, mask: Optional[Tensor], inputs: Tensor) -> Tensor:
    """Zeros the sequence-level output of rows that have no valid step
    (fully masked rows, or every row of a zero-length sequence)."""
    if mask is None:
        if inputs.shape[1] is not None:
            return output if inputs.shape[1] > 0 else ops.zeros_like(output)
        return tf.where(tf.shape(inputs)[1] > 0, output, tf.zeros_like(output))  # (TensorFlow: time unknown)
    has_steps = ops.any(mask, axis=1, keepdims=True)
    return ops.where(has_steps, output, ops.zeros_like(output))
