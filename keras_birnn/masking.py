"""Masks and lengths: validation, conversion, and keeping padding inert."""

from typing import Optional

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
    return tf.where(mask[..., None], inputs, tf.zeros_like(inputs))


def reverse_within_lengths(sequences, lengths) -> tf.Tensor:
    """Reverses each row's first `lengths[b]` steps, leaving padding in place.

    Lengths are clipped to `[0, time]`, like `lengths_to_mask`'s.
    """
    lengths = tf.cast(lengths, tf.int64)
    lengths = tf.clip_by_value(lengths, 0, tf.shape(sequences, out_type=tf.int64)[1])
    return tf.reverse_sequence(sequences, lengths, seq_axis=1, batch_axis=0)
