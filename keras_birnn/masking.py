"""Masks and lengths: validation, conversion, and keeping padding inert."""

from typing import Optional

import tensorflow as tf


def validate_mask(mask, inputs) -> Optional[tf.Tensor]:
    """Returns `mask` as a bool `[batch, time]` tensor, or None.

    Raises:
        ValueError: if the mask's rank or static shape does not fit `inputs`.
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
    return mask if mask.dtype == tf.bool else tf.not_equal(mask, 0)


def lengths_to_mask(lengths, max_length) -> tf.Tensor:
    """Right-padding mask `[batch, max_length]` from per-row lengths."""
    return tf.sequence_mask(lengths, max_length)


def mask_to_lengths(mask) -> tf.Tensor:
    """Number of valid steps per row (holes count as invalid)."""
    return tf.reduce_sum(tf.cast(mask, tf.int32), axis=-1)


def zero_padding(inputs, mask) -> tf.Tensor:
    """Replaces padded positions by zeros.

    Anything in a padded slot, NaN included, must not reach a valid output or
    a gradient: `where` drops it in the forward pass, and its gradient sends
    exact zeros (not 0 * NaN) back to the padded slots.
    """
    if mask is None:
        return inputs
    return tf.where(mask[..., None], inputs, tf.zeros_like(inputs))


def reverse_within_lengths(sequences, lengths) -> tf.Tensor:
    """Reverses each row's first `lengths[b]` steps, leaving padding in place."""
    return tf.reverse_sequence(sequences, tf.cast(lengths, tf.int64), seq_axis=1, batch_axis=0)
