"""Nested sequences: an encoder run over every valid item of a sequence of
sequences (the characters of each word of a sentence).

`keras.layers.TimeDistributed` over a recurrent layer fails on TensorFlow
when the number of items is unknown (`tf.vectorized_map` cannot vectorize a
while loop's TensorLists, and Keras's own RNNs fail at the gradient), so
character-aware models reshape by hand, and then run the encoder over the
padding items too. `NestedEncoder` does the reshape and runs the encoder
only on the items that have at least one valid element.

Written in `keras.ops`. JAX traces with static shapes (`jax.jit`), where the
number of valid items is unknown until run time: there the encoder runs
over every item in one call, with the same outputs.
"""

from __future__ import annotations

import numbers
from typing import Any, List, Sequence, Tuple

import keras
from keras import ops

from keras_birnn import backend
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.layers.bidirectional import Bidirectional
from keras_birnn.config import loop_config
from keras_birnn.masking import zero_empty_rows
from keras_birnn.layers.pooling import reduce_max
from keras_birnn.layers.recurrent import Recurrent
from keras_birnn.serialization import deserialized

if backend.IS_TENSORFLOW:
    import tensorflow as tf

    from keras_birnn.recurrence.tensorflow.plan import Grouping, plan_groups

Tensor = Any  # a tensor of the backend

# Whether the valid items can be gathered: not where every shape must be
# known when traced (JAX).
GATHERS_VALID_ITEMS: bool = backend.NAME != "jax"


def _select_rows(condition: Tensor, tensors: Sequence[Tensor]) -> Tuple[List[Tensor], Tensor]:
    """(the rows of each of `tensors` where `condition` holds, their indices)."""
    if backend.IS_TENSORFLOW:  # Where and GatherV2, the ops the exported graphs hold
        index = tf.where(condition)[:, 0]
        return [tf.gather(t, index) for t in tensors], index
    index = ops.nonzero(condition)[0]
    return [ops.take(t, index, axis=0) for t in tensors], index


def _scatter_rows(index: Tensor, values: Tensor, rows) -> Tensor:
    """`[rows, width]` zeros with `values[k]` at row `index[k]`."""
    if not isinstance(rows, int):  # a run-time size (TensorFlow): the indices' dtype
        rows = ops.cast(rows, index.dtype)
    return ops.scatter(ops.expand_dims(index, -1), values, (rows, values.shape[-1]))


@keras_birnn_export("keras_birnn.NestedEncoder")
class NestedEncoder(keras.layers.Layer):
    """Encodes each item of a nested sequence to one vector.

    Inputs `[batch, items, elements, features]` (for example embedded
    characters `[batch, words, chars, dim]`) with a mask `[batch, items,
    elements]` (what `Embedding(mask_zero=True)` gives on character ids)
    become `[batch, items, width]`: the encoder's sequence-level output for
    each item, zeros for items with no valid element. The output mask is
    `[batch, items]`: items with at least one valid element.

    Only the valid items are encoded: they are gathered, encoded and
    scattered back, so padding words cost nothing. They are encoded in
    `length_groups` groups by their extent (the position of their last
    valid element): with 3, the items that end within the first quarter of
    the elements, within the first half, and the rest; each group runs over
    its own extent only, so a batch's few long words no longer make every
    short word pay for their length. Inference groups from 256 valid items
    on and encodes fewer in one call (the groups' extra loops cost more
    than they skip for a sentence or two); training and any call under a
    `tf.GradientTape` always group, and a model traced for LiteRT never
    does. The outputs are what reshaping to `[batch * items, elements,
    features]` and calling the encoder gives at the valid items, whatever
    the groups, to float rounding (the encoder ignores an item's masked
    elements, and the elements cut off are masked in every item of the
    group; the groups change only the batch sizes of the matrix products).
    PyTorch groups as TensorFlow does (training always; inference from 256
    valid items). On JAX, whose traced shapes are all static, the encoder
    runs over every item in one call (the same outputs; `length_groups` is
    not used there).

    Args:
        encoder: A `kb.Bidirectional` or `kb.Recurrent` with
            `return_sequences=False` and `return_state=False`.
        length_groups: Int from 1 to 16, default 3: how many groups of item
            extents the encoder is called on; group `k` (from 0) holds the
            items ending within `ceil(elements / 2**(length_groups - 1 - k))`
            elements not in an earlier group. 1: one call over every valid
            item at the full element extent.

    Call arguments:
        inputs: `[batch, items, elements, features]`.
        mask: Optional bool `[batch, items, elements]`.
        training: Passed to the encoder (dropout).

    Example:

    ```python
    chars = keras.Input((None, None), dtype="int32")                 # [batch, words, chars]
    x = keras.layers.Embedding(100, 32, mask_zero=True)(chars)
    words = kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(32)))(x)  # [batch, words, 64]
    ```
    """

    def __init__(self, encoder, length_groups: int = 3, **kwargs):
        super().__init__(**kwargs)
        if isinstance(length_groups, bool) or not isinstance(length_groups, numbers.Integral):
            raise TypeError(f"`length_groups` must be an int, received {length_groups!r}.")
        if not 1 <= length_groups <= 16:
            raise ValueError(f"`length_groups` must be from 1 to 16, received {length_groups!r}.")
        if not isinstance(encoder, (Bidirectional, Recurrent)):
            raise TypeError(f"`encoder` must be a kb.Bidirectional or a kb.Recurrent, received {encoder!r}.")
        if encoder.return_sequences or encoder.return_state:
            raise ValueError(
                "`encoder` must give one vector per item: return_sequences=False and return_state=False, "
                f"received return_sequences={encoder.return_sequences}, return_state={encoder.return_state}."
            )
        if isinstance(encoder, Bidirectional) and encoder.merge_mode is None:
            raise ValueError("`encoder` must merge its two directions, received merge_mode=None.")
        self.encoder = encoder
        self.length_groups = int(length_groups)
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"Layer {self.name!r} expects inputs of rank 4 [batch, items, elements, features], "
                f"received shape {tuple(input_shape)}."
            )
        if not self.encoder.built:
            self.encoder.build((None, input_shape[2], input_shape[3]))

    def call(self, inputs, mask=None, training=None):
        inputs = ops.convert_to_tensor(inputs)
        if len(inputs.shape) != 4:
            raise ValueError(
                f"Layer {self.name!r} expects inputs of rank 4 [batch, items, elements, features], "
                f"received shape {tuple(inputs.shape)}."
            )
        batch, items, elements, features = ops.shape(inputs)
        flat = ops.reshape(inputs, (-1, elements, features))
        if mask is None:  # every item valid and of the same extent
            encoded = self.encoder(flat, training=training)
        else:
            flat_mask = ops.reshape(ops.cast(mask, "bool"), (-1, elements))
            encoded = self._encode_items(flat, flat_mask, training)
        return ops.reshape(encoded, (batch, items, encoded.shape[-1]))

    def _encode_items(self, flat: Tensor, flat_mask: Tensor, training) -> Tensor:
        """Every item encoded: the valid ones gathered and scattered back
        (zeros for the others), or, where the valid items cannot be gathered
        (JAX), every item in one call, those with no valid element zeroed."""
        if not GATHERS_VALID_ITEMS:
            encoded = self.encoder(flat, mask=flat_mask, training=training)
            return zero_empty_rows(encoded, flat_mask, flat)
        encoded, index = self._encode_valid(flat, flat_mask, training)
        return _scatter_rows(index, encoded, ops.shape(flat)[0])

    def _encode_valid(self, flat, flat_mask, training):
        """(the valid items encoded, their rows in `flat`): in length groups
        when training or under a tape, else (inference) from
        `LoopConfig.grouped_from_items` valid items on, chosen by a `tf.cond`; in one
        call below that, and when traced for LiteRT (no branch there: it
        would hide the weights from the converter; its models run small
        fixed batches). No cond under any tape (one watching only the
        weights too): a cond around the encoder's custom gradient fails to
        differentiate ("_resolve_grad_inputs"). PyTorch runs eagerly: the
        same choice is made in Python, groups when training."""
        elements = ops.shape(flat_mask)[1]  # int32: LiteRT has no int64 FloorDiv
        positions = ops.arange(1, elements + 1, dtype="int32")
        extent = reduce_max(ops.where(flat_mask, positions, ops.zeros_like(positions)), 1, initial=0)  # 0: none valid

        def encode(groups):
            return self._encode_by_extent(flat, flat_mask, extent, elements, training, groups)

        def valid_items():
            return ops.sum(ops.cast(extent > 0, "int32"))

        if not backend.IS_TENSORFLOW:
            grouped = training or int(valid_items()) >= loop_config().grouped_from_items
            return encode(self.length_groups if grouped else 1)
        grouping, threshold = plan_groups(self.length_groups, training)
        if grouping is Grouping.ONE_CALL:
            return encode(1)
        if grouping is Grouping.GROUPS:
            return encode(self.length_groups)
        return ops.cond(valid_items() >= threshold, lambda: encode(self.length_groups), lambda: encode(1))

    def _encode_by_extent(self, flat, flat_mask, extent, elements, training, groups: int):
        """(the valid items encoded in `groups` groups by `extent`, their rows in `flat`)."""
        parts, indices, low = [], [], 0
        for k in range(groups):
            divisor = 2 ** (groups - 1 - k)
            high = (elements + divisor - 1) // divisor  # ceil; the last group: every element
            (items, items_mask), index = _select_rows(
                ops.logical_and(extent > low, extent <= high), (flat, flat_mask)
            )
            if divisor > 1:  # the last group keeps the static element count
                items, items_mask = items[:, :high], items_mask[:, :high]
            parts.append(self.encoder(items, mask=items_mask, training=training))
            indices.append(index)
            low = high
        return ops.concatenate(parts, 0), ops.concatenate(indices, 0)

    def compute_mask(self, inputs, mask=None):
        return None if mask is None else keras.ops.any(keras.ops.cast(mask, "bool"), axis=-1)

    def compute_output_shape(self, input_shape):
        width = self.encoder.compute_output_shape((None, input_shape[2], input_shape[3]))[-1]
        return (input_shape[0], input_shape[1], width)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"encoder": keras.saving.serialize_keras_object(self.encoder),
                       "length_groups": self.length_groups})
        return config

    @classmethod
    def from_config(cls, config: dict) -> "NestedEncoder":
        return cls(**deserialized(config, "encoder"))
