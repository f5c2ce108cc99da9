"""`kb.CRFLoss`: the negative log-likelihood of the gold tags under a `kb.CRF`.

The loss reads the CRF's scores from the decoded tags the layer returned
(`keras_birnn.crf.layer.crf_scores`) and computes the exact NLL with
`keras_birnn.crf.maths.negative_log_likelihood`.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from keras_birnn import tf_internal
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.crf.layer import attached_scores, crf_scores
from keras_birnn.crf.maths import negative_log_likelihood
from keras_birnn.losses import mean_over_rows

Tensor = Any  # a tensor of the backend


def _shapes_only() -> bool:
    """Whether Keras runs the caller for output shapes and dtypes only
    (`keras.SymbolicScope`): on JAX and PyTorch, `fit` and `evaluate` build
    the compiled loss on placeholders for the model's outputs, which carry
    no scores, before the first step."""
    # (A Keras that moves its private scope answers False: the missing-scores error.)
    return tf_internal.in_symbolic_scope()


def _gold_tags(y_true, emissions) -> Tensor:
    """Integer labels `[batch, time]` (a trailing axis of size 1 is dropped)."""
    y_true = ops.convert_to_tensor(y_true)
    if len(y_true.shape) == 3 and y_true.shape[-1] == 1:
        y_true = y_true[..., 0]
    if len(y_true.shape) != 2:
        raise ValueError(
            "kb.CRFLoss expects integer tags y_true of shape [batch, time], received shape "
            f"{tuple(y_true.shape)} (emissions {tuple(emissions.shape)})."
        )
    return ops.cast(y_true, "int32")


@keras_birnn_export("keras_birnn.CRFLoss")
class CRFLoss(keras.losses.Loss):
    """Negative log-likelihood of the gold tags under a `kb.CRF` head.

    One value per row (0 for a row with no valid position; labels at masked
    positions are ignored), then the reduction: by default the mean over
    the batch's rows that hold a valid position (a row of padding alone
    counts for nothing), the global batch's under a `tf.distribute` strategy
    (`keras_birnn.losses.global_mean`), so shards of unequal rows train as
    one device; any other reduction is Keras's. `sample_weight` weighs rows
    (`[batch]`).

    `y_pred` must be the output of a `kb.CRF` layer (the decoded tags,
    which carry the CRF's scores; see `kb.CRF`); `y_true` holds integer
    tags `[batch, time]`.

    Args:
        reduction: As for any Keras loss (`"sum_over_batch_size"`, `"sum"`,
            `None`, ...).
        name: Name of the loss.
        dtype: Dtype of the returned loss (default: Keras's floatx).

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 8, mask_zero=True)(tokens)
    >>> model = keras.Model(tokens, kb.CRF(3)(keras.layers.Dense(3)(x)))
    >>> model.compile("adam", loss=kb.CRFLoss())   # model ends in kb.CRF
    """

    def __init__(self, reduction="sum_over_batch_size", name: str = "crf_loss", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Read the scores before Keras converts y_pred (a cast would drop them).
        if attached_scores(y_pred) is None and _shapes_only():
            # Keras only reads the shape and dtype: one placeholder NLL per row.
            nll = ops.sum(ops.zeros_like(y_pred, "float32"), axis=-1)
            return super().__call__(nll, nll, sample_weight)
        scores = crf_scores(y_pred)
        tags = _gold_tags(y_true, scores.emissions)
        nll = negative_log_likelihood(
            scores.emissions, tags, scores.mask, scores.transitions, scores.start, scores.end
        )
        # The mean over the global batch's rows, also across the replicas
        # of a strategy whose shards differ in rows; any other reduction is
        # Keras's own, with its distribution scaling (see `call`).
        mean = mean_over_rows(nll, scores.mask, sample_weight, self.reduction)
        if mean is not None:
            return ops.cast(mean, self.dtype)
        return super().__call__(nll, nll, sample_weight)

    def call(self, y_true, y_pred):
        """The per-row NLL computed in `__call__`, unchanged."""
        return y_pred
