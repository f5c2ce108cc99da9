"""Losses whose mean is over the global batch, on one device or many.

Keras reduces a loss on each replica of a `tf.distribute` strategy by
itself: `"sum_over_batch_size"` divides the replica's sum by the
replica's own count (of rows, or of valid positions when the output
carries a mask), then by the number of replicas. Where the replicas hold
different counts (a tagger's shards never hold as many valid tokens) the
mean of the replicas' means is not the batch's mean, and training drifts
from single-device training. `global_mean` divides each replica's sum by
the count summed over all replicas instead, so the gradients the
strategy sums are those of the batch's mean. On JAX's
`keras.distribution` one program sees the global batch, and on one
device there is nothing to sum: the count is the local one.

`kb.TokenCrossentropy` is the masked per-position cross-entropy of a
softmax tagger, averaged over the valid positions of the global batch;
`kb.CRFLoss` averages its per-row values over the global batch's rows
with the same function.
"""

from __future__ import annotations

from typing import Any, Optional

import keras
from keras import ops

from keras_birnn import tf_internal
from keras_birnn.api_export import keras_birnn_export

Tensor = Any  # a tensor of the backend


def replicas_in_sync() -> int:
    """How many replicas a `tf.distribute` strategy runs this call on (1
    off TensorFlow, outside a strategy, or in its cross-replica context)."""
    if keras.backend.backend() != "tensorflow":
        return 1
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def global_mean(total: Tensor, count: Tensor) -> Tensor:
    """This replica's share of the batch's mean: `total / count`, the count
    summed over every replica in sync (0 where the batch has no count).

    The shares of all replicas sum to the mean over the global batch, as
    the strategy's gradient all-reduce sums them. Returned as Keras's
    reduction would return it before its own scaling by the number of
    replicas: callers bypass that scaling."""
    count = ops.cast(count, total.dtype)
    if replicas_in_sync() > 1:
        import tensorflow as tf

        # The count is a constant of the batch: no gradient flows through it.
        count = tf.distribute.get_replica_context().all_reduce("sum", tf.stop_gradient(count))
    return ops.divide_no_nan(total, count)


def _valid_weights(y_pred, sample_weight, shape) -> Tensor:
    """Per-position weights: `sample_weight`, else the output's Keras mask,
    else ones; float32 of `shape`."""
    if sample_weight is not None:
        weights = ops.convert_to_tensor(sample_weight)
    else:
        mask = tf_internal.keras_mask(y_pred)
        weights = ops.ones(shape) if mask is None else mask
    weights = ops.cast(weights, "float32")
    if len(weights.shape) == len(shape) + 1 and weights.shape[-1] == 1:
        weights = weights[..., 0]
    return ops.broadcast_to(weights, shape)


@keras_birnn_export("keras_birnn.TokenCrossentropy")
class TokenCrossentropy(keras.losses.Loss):
    """Sparse categorical cross-entropy averaged over the valid positions
    of the global batch.

    A masked per-position loss for taggers: each position's cross-entropy
    is weighed by `sample_weight` (`[batch, time]`, 0 at padding), else by
    the prediction's Keras mask, and the weighted sum is divided by the sum
    of the weights over the whole batch. Under a `tf.distribute` strategy
    the divisor is summed over the replicas (`global_mean`), so two
    replicas holding 47 and 8 valid tokens train exactly as one device
    holding all 55; Keras's `"sparse_categorical_crossentropy"` divides by
    each replica's own count.

    Args:
        from_logits: Whether `y_pred` holds logits rather than
            probabilities.
        name: Name of the loss.
        dtype: Dtype of the returned loss (default: Keras's floatx).

    Example:

    >>> words = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 8, mask_zero=True)(words)
    >>> model = keras.Model(words, keras.layers.Dense(3, activation="softmax")(x))
    >>> model.compile("adam", loss=kb.TokenCrossentropy())   # a softmax tagger
    >>> x = np.array([[5, 6, 7], [8, 0, 0]]); tags = np.array([[0, 1, 2], [1, 0, 0]])
    >>> history = model.fit(x, tags, sample_weight=(x != 0), verbose=0)   # 0 at padding
    """

    def __init__(self, from_logits: bool = False, name: str = "token_crossentropy", dtype=None):
        super().__init__(name=name, reduction="sum_over_batch_size", dtype=dtype)
        self.from_logits = from_logits

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_true = ops.convert_to_tensor(y_true)
        if len(y_true.shape) == len(y_pred.shape):  # a trailing axis of size 1
            y_true = ops.squeeze(y_true, axis=-1)
        weights = _valid_weights(y_pred, sample_weight, ops.shape(y_true))
        values = ops.sparse_categorical_crossentropy(
            ops.cast(y_true, "int32"), ops.convert_to_tensor(y_pred), from_logits=self.from_logits)
        values = ops.cast(values, "float32")
        loss = global_mean(ops.sum(values * weights), ops.sum(weights))
        return ops.cast(loss, self.dtype)

    def call(self, y_true, y_pred):
        """Unweighted per-position cross-entropy (`__call__` reduces it)."""
        return ops.sparse_categorical_crossentropy(y_true, y_pred, from_logits=self.from_logits)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"from_logits": self.from_logits})
        config.pop("reduction", None)
        return config


def mean_over_rows(values: Tensor, mask: Tensor, sample_weight: Optional[Tensor], reduction) -> Optional[Tensor]:
    """Per-row values (`[batch]`, weighed by `sample_weight`) summed and
    divided by the global batch's rows that hold a valid position of
    `mask` (`[batch, time]`); None for a reduction other than
    `"sum_over_batch_size"` (Keras's own applies). A row with no valid
    position is padding: a batch padded with such rows to split evenly
    over processes has the mean of the batch without them."""
    if reduction not in ("sum_over_batch_size", "mean"):
        return None
    if sample_weight is not None:
        values = values * ops.reshape(ops.cast(sample_weight, values.dtype), ops.shape(values))
    rows = ops.sum(ops.cast(ops.any(ops.cast(mask, "bool"), axis=-1), values.dtype))
    return global_mean(ops.sum(values), rows)
