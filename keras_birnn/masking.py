"""Masks and lengths: validation, conversion, and keeping padding inert."""

from typing import Optional, Tuple

import tensorflow as tf


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


def dense_sequence_and_mask(inputs, mask):
    """`(inputs, mask)` with a `tf.RaggedTensor` batch `[batch, (time),
    features]` padded with zeros to its longest row, and the mask of its
    rows' lengths (combined with `mask`, which may be ragged too, as an
    `Embedding(mask_zero=True)` on ragged ids makes it). Dense inputs pass
    unchanged (a ragged mask is made dense)."""
    if not isinstance(inputs, tf.RaggedTensor):
        return inputs, dense_mask(mask)
    return inputs.to_tensor(), ragged_mask(inputs, mask)


def ragged_mask(inputs, mask=None):
    """The mask `dense_sequence_and_mask` gives these inputs (for
    `compute_mask`: the layers' outputs are dense and carry it)."""
    mask = dense_mask(mask)
    if not isinstance(inputs, tf.RaggedTensor):
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
    if isinstance(mask, tf.RaggedTensor):
        return mask.to_tensor(default_value=tf.zeros([], mask.dtype))
    return mask


def lengths_to_mask(lengths, max_length) -> tf.Tensor:
    """Right-padding mask `[batch, max_length]` from per-row lengths.

    Lengths are clipped to `[0, max_length]` (a negative length gives an
    empty row, a too large one a full row), as in the serving signature.
    """
    return tf.sequence_mask(lengths, max_length)


def zero_padding(inputs, mask) -> tf.Tensor:
    """Replaces padded positions by zeros.

    Anything in a padded slot, NaN included, must not reach a valid output or
    a gradient: `where` drops it in the forward pass, and its gradient sends
    exact zeros (not 0 * NaN) back to the padded slots.
    """
    if mask is None:
        return inputs
    return tf.where(tf.expand_dims(mask, -1), inputs, tf.zeros_like(inputs))


def reverse_within_lengths(sequences, lengths) -> tf.Tensor:
    """Reverses each row's first `lengths[b]` steps, leaving padding in place.

    Lengths are clipped to `[0, time]`, like `lengths_to_mask`'s.
    """
    lengths = tf.cast(lengths, tf.int64)
    lengths = tf.clip_by_value(lengths, 0, tf.shape(sequences, out_type=tf.int64)[1])
    return tf.reverse_sequence(sequences, lengths, seq_axis=1, batch_axis=0)


def check_sequence_input(inputs, layer_name: str) -> tf.Tensor:
    """Inputs must be float `[batch, time, features]`."""
    inputs = tf.convert_to_tensor(inputs)
    if inputs.shape.rank != 3:
        raise ValueError(
            f"Layer {layer_name!r} expects inputs of rank 3 [batch, time, features], "
            f"received shape {inputs.shape}."
        )
    if not inputs.dtype.is_floating:
        raise TypeError(
            f"Layer {layer_name!r} expects float inputs, received dtype {inputs.dtype.name}. "
            "Embed integer tokens first (e.g. keras.layers.Embedding)."
        )
    return inputs


def sequence_input(inputs, mask, layer_name: str) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
    """`(inputs, mask)` as a layer's `call` reads them: a ragged batch
    padded, its rows' lengths as the mask (`dense_sequence_and_mask`), the
    inputs checked (`check_sequence_input`), the mask checked against them
    (`validate_mask`)."""
    inputs, mask = dense_sequence_and_mask(inputs, mask)
    inputs = check_sequence_input(inputs, layer_name)
    return inputs, validate_mask(mask, inputs)


def zero_empty_rows(output: tf.Tensor, mask: Optional[tf.Tensor], inputs: tf.Tensor) -> tf.Tensor:
    """Zeros the sequence-level output of rows that have no valid step
    (fully masked rows, or every row of a zero-length sequence)."""
    if mask is None:
        if inputs.shape[1] is not None and inputs.shape[1] > 0:
            return output
        return tf.where(tf.shape(inputs)[1] > 0, output, tf.zeros_like(output))
    has_steps = tf.reduce_any(mask, axis=1, keepdims=True)
    return tf.where(has_steps, output, tf.zeros_like(output))
