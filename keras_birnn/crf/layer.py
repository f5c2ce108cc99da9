"""`kb.CRF`: a masked linear-chain conditional random field (CRF) head.

A thin Keras layer around the pure functions of `keras_birnn.crf.maths`
(forward algorithm, Viterbi, marginals, ...), whose module docstring states
the score and the mask rules; see the layer's docstring for how it fits
Keras's `fit`. n-best decoding and path log-probabilities are in
`keras_birnn.crf.decoding`, the tagging schemes of `allowed_transitions` in
`keras_birnn.crf.schemes`, the loss in `keras_birnn.crf.loss`.

This module also owns how the decoded tags carry the scores to the loss
(`CRFScores`, `attach_scores`, `crf_scores`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import initializers, ops

from keras_birnn import backend, tf_internal
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.crf import decoding, maths
from keras_birnn.crf.maths import FORBIDDEN, PAD_TAG  # noqa: F401 (PAD_TAG: the layer's padding tag, documented here)
from keras_birnn.crf.schemes import SCHEMES, scheme_allowed
from keras_birnn.masking import validate_mask
from keras_birnn.serialization import attributes, initializer_configs

Tensor = Any  # a tensor of the backend

ALLOWED_TRANSITIONS = (None,) + SCHEMES
# Attribute of the layer's output (the decoded tags) that carries what the
# loss needs; Keras hands a layer's mask to losses the same way (`_keras_mask`).
SCORES_ATTRIBUTE = "_keras_birnn_crf_scores"


class CRFScores(NamedTuple):
    """What `CRFLoss` reads from the tags a `CRF` layer returned."""

    emissions: Tensor
    mask: Optional[Tensor]
    transitions: Tensor
    start: Tensor
    end: Tensor


# --- the layer ----------------------------------------------------------------


def _check_num_tags(num_tags) -> int:
    if isinstance(num_tags, bool) or not isinstance(num_tags, (int, np.integer)) or num_tags < 2:
        raise ValueError(f"`num_tags` must be an integer >= 2, received {num_tags!r}.")
    return int(num_tags)


def _check_tags(tags, num_tags: int, allowed_transitions) -> Optional[list]:
    if allowed_transitions not in ALLOWED_TRANSITIONS:
        raise ValueError(
            f"`allowed_transitions` must be one of {ALLOWED_TRANSITIONS}, received {allowed_transitions!r}."
        )
    if tags is None:
        if allowed_transitions is not None:
            raise ValueError(f"allowed_transitions={allowed_transitions!r} needs `tags` (the tag names).")
        return None
    if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):
        raise TypeError(f"`tags` must be a list of tag names (strings), received {tags!r}.")
    tags = list(tags)
    if len(tags) != num_tags or len(set(tags)) != len(tags):
        raise ValueError(
            f"`tags` must hold num_tags={num_tags} distinct names, received {len(tags)}: {tags!r}."
        )
    return tags


@keras_birnn_export("keras_birnn.CRF")
class CRF(keras.layers.Layer):
    """Linear-chain CRF head: decoded tags out, exact NLL for training.

    On per-position scores (emissions) `[batch, time, num_tags]`, e.g. a
    `Dense(num_tags)` on a `kb.Bidirectional(..., return_sequences=True)`,
    a CRF scores whole tag sequences: emissions, a transition matrix
    `[num_tags, num_tags]` (`transitions[i, j]`: tag i followed by tag j),
    and start and end scores. Padded positions (right, left or holes) are
    skipped: transitions link consecutive valid positions, the start score
    applies at the first valid position and the end score at the last.

    The layer returns the Viterbi path, int32 `[batch, time]`, in training
    and at inference alike, with `PAD_TAG` (0) at masked positions; it
    keeps the mask. So `model.predict` and an exported SavedModel give
    tags. To train, compile with `kb.CRFLoss()`: the tags tensor also
    carries the layer's emissions (float32), mask and chain parameters for
    the loss, the way Keras hands a layer's mask to a loss (on every
    backend: JAX's traced arrays take no attribute, so there they are held
    by the tensor's id until it is freed); the loss is the exact negative
    log-likelihood (forward algorithm in log space). Hence
    `kb.CRFLoss` needs the CRF layer's output itself as `y_pred` (kb.CRF as
    the model's last layer); for other set-ups use the methods below.

    Why this design: Keras 3 losses receive only `(y_true, y_pred)`, and a
    model's outputs are the same in `fit`, `evaluate` and `predict`.
    Returning the emissions would make `predict` and serving return scores
    instead of tags; switching outputs on `training` would break `evaluate`;
    a wrapper model or `add_loss` would not train with a plain
    `compile(loss=...)`. With tags as the output, the loss stays stateless
    (saved and reloaded in `.keras` files with `safe_mode=True`), and
    `keras.metrics.Accuracy()` gives the masked tag accuracy.

    It runs on every Keras backend, with the same numbers; an exported
    SavedModel needs TensorFlow. The recursions run in float32 (float64
    under a float64 policy): under a mixed policy the layer's own policy
    defaults to the variable dtype, and its weights are never autocast.

    Args:
        num_tags: Number of tags K (>= 2); the emissions' last axis.
        tags: Optional tag names, `num_tags` distinct strings (saved in the
            config; needed by `allowed_transitions`).
        allowed_transitions: None (every transition allowed) or a tagging
            scheme (`keras_birnn.crf.schemes`): `"iob2"` (`O`, `B-X`,
            `I-X`: `I-X` only after `B-X` or `I-X`, never at the start),
            `"iob1"` (`I-X` may begin a chunk; `B-X` only right after `B-X`
            or `I-X`, never at the start) or `"bioes"` (`O`, `B-X`, `I-X`,
            `E-X`, `S-X`: after `B-X` or `I-X` only `I-X` or `E-X` of type X,
            otherwise only `O`, `B-*` or `S-*`; starts with `O`, `B-*` or
            `S-*`, ends with `O`, `E-*` or `S-*`). Forbidden transitions,
            starts and ends score `FORBIDDEN` (-1e9, finite: no NaN), so
            decoding never produces them. Gold paths must obey them too. A
            tag name that does not fit the scheme is a ValueError.
        transitions_initializer: Initializer of the `[K, K]` transitions.
        boundary_initializer: Initializer of the start and end scores.
        **kwargs: Base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        emissions: Float `[batch, time, num_tags]` scores (batch and time
            may be unknown).
        mask: Optional bool `[batch, time]`; Keras passes the propagated
            mask. None: every position is valid.

    Methods (same mask rules, all exact): `decode(emissions, mask)` (the
    call's tags), `top_k(emissions, mask, k)` (the k best paths `[batch, k,
    time]` and their scores `[batch, k]`, best first; or their
    log-probabilities with `log_probabilities=True`), `marginals(emissions,
    mask)` (p(tag at t), `[batch, time, K]`, 0 at masked positions:
    per-token confidence), `path_log_probability(emissions, tags, mask)`
    (log p(path), `[batch]`: a whole path's confidence),
    `log_partition(emissions, mask)` and
    `negative_log_likelihood(emissions, tags, mask)` (`[batch]`).

    Example:

    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(1000, 32, mask_zero=True)(tokens)
    >>> x = kb.Bidirectional(kb.GRUCell(32), return_sequences=True)(x)
    >>> crf = kb.CRF(5, tags=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
    ...              allowed_transitions="iob2")
    >>> emissions = keras.layers.Dense(5)(x)
    >>> tagger = keras.Model(tokens, crf(emissions))
    >>> tagger.compile("adam", loss=kb.CRFLoss(), metrics=[keras.metrics.Accuracy()])
    >>> token_ids = np.array([[4, 9, 2, 0], [7, 3, 0, 0]])    # 0: padding
    >>> tag_ids = np.array([[1, 2, 0, 0], [3, 0, 0, 0]])      # int [batch, time]
    >>> history = tagger.fit(token_ids, tag_ids, epochs=1, verbose=0)
    >>> tags = tagger.predict(token_ids, verbose=0)           # int32 tags, 0 at padding
    >>> tags.shape, tags.dtype, tags[1, 2:]
    ((2, 4), dtype('int32'), array([0, 0], dtype=int32))
    >>> scores = keras.Model(tokens, emissions)(token_ids)
    >>> paths, log_p = crf.top_k(scores, mask=token_ids != 0, k=3, log_probabilities=True)
    >>> paths.shape, bool(np.all(np.exp(log_p) <= 1)), bool(np.all(paths[:, 0] == tags))
    (TensorShape([2, 3, 4]), True, True)
    """

    def __init__(
        self,
        num_tags: int,
        tags: Optional[Sequence[str]] = None,
        allowed_transitions: Optional[str] = None,
        transitions_initializer="zeros",
        boundary_initializer="zeros",
        **kwargs,
    ):
        if kwargs.get("dtype") is None:
            policy = keras.config.dtype_policy()
            if policy.compute_dtype != policy.variable_dtype:
                kwargs["dtype"] = policy.variable_dtype
        super().__init__(**kwargs)
        self.num_tags = _check_num_tags(num_tags)
        self.tags = _check_tags(tags, self.num_tags, allowed_transitions)
        self.allowed_transitions = allowed_transitions
        self.transitions_initializer = initializers.get(transitions_initializer)
        self.boundary_initializer = initializers.get(boundary_initializer)
        self._allowed = scheme_allowed(allowed_transitions, self.tags) if allowed_transitions else None
        self.supports_masking = True

    def _check_shape(self, shape) -> None:
        shape = tuple(shape)
        if len(shape) != 3:
            raise ValueError(
                f"Layer {self.name!r} expects emissions of rank 3 [batch, time, num_tags], "
                f"received shape {shape}."
            )
        if shape[-1] is not None and shape[-1] != self.num_tags:
            raise ValueError(
                f"Layer {self.name!r} expects emissions with num_tags={self.num_tags} scores on "
                f"the last axis, received shape {shape}."
            )

    def build(self, input_shape):
        self._check_shape(input_shape)
        k = self.num_tags
        self.transitions = self.add_weight(
            shape=(k, k), name="transitions", initializer=self.transitions_initializer, autocast=False
        )
        self.start = self.add_weight(
            shape=(k,), name="start", initializer=self.boundary_initializer, autocast=False
        )
        self.end = self.add_weight(
            shape=(k,), name="end", initializer=self.boundary_initializer, autocast=False
        )

    def chain_parameters(self) -> Tuple[Tensor, Tensor, Tensor]:
        """`(transitions, start, end)` as used, forbidden entries at `FORBIDDEN`."""
        transitions = ops.convert_to_tensor(self.transitions)
        start, end = ops.convert_to_tensor(self.start), ops.convert_to_tensor(self.end)
        if self._allowed is None:
            return transitions, start, end
        forbidden = ops.convert_to_tensor(FORBIDDEN, transitions.dtype)
        return tuple(
            ops.where(ops.convert_to_tensor(allowed), weight, forbidden)
            for allowed, weight in zip(self._allowed, (transitions, start, end))
        )

    def _inputs(self, emissions, mask) -> Tuple[Tensor, Optional[Tensor]]:
        """Validated emissions in the recursion dtype, and a bool mask or None."""
        emissions = ops.convert_to_tensor(emissions)
        if not self.built:
            self.build(tuple(emissions.shape))
        self._check_shape(emissions.shape)
        dtype = keras.backend.standardize_dtype(emissions.dtype)
        if "float" not in dtype:
            raise TypeError(f"Layer {self.name!r} expects float emissions, received dtype {dtype}.")
        return ops.cast(emissions, self.variable_dtype), validate_mask(mask, emissions)

    def call(self, emissions, mask=None):
        emissions, mask = self._inputs(emissions, mask)
        parameters = self.chain_parameters()
        tags = maths.viterbi_decode(emissions, mask, *parameters)
        attach_scores(tags, CRFScores(emissions, mask, *parameters))
        return tags

    def decode(self, emissions, mask=None) -> Tensor:
        """Viterbi tags, int32 `[batch, time]`, `PAD_TAG` at masked positions."""
        emissions, mask = self._inputs(emissions, mask)
        return maths.viterbi_decode(emissions, mask, *self.chain_parameters())

    def top_k(self, emissions, mask=None, k: int = 2, log_probabilities: bool = False) -> Tuple[Tensor, Tensor]:
        """The k best paths and their scores, best first (n-best Viterbi).

        Args:
            emissions: Float `[batch, time, num_tags]`.
            mask: Optional bool `[batch, time]`.
            k: How many paths per row (an int >= 1, fixed when traced).
            log_probabilities: Return log p(path | emissions) (score - log
                Z, as `path_log_probability`) instead of the scores.

        Returns:
            `(paths, scores)`: int32 `[batch, k, time]`, `PAD_TAG` at masked
            positions, and `[batch, k]` in non-increasing order. Only
            allowed paths count (see `allowed_transitions`); a row with
            fewer than k paths (a row with no valid position has one, the
            empty path, of score 0) fills the rest with the sentinel:
            score (and log-probability) -inf, `PAD_TAG` at every position.
            Paths of equal score come in an unspecified order. `k=1` gives
            `decode`'s path (ties aside) whenever an allowed path exists.
        """
        if not isinstance(log_probabilities, (bool, np.bool_)):
            raise TypeError(f"`log_probabilities` must be True or False, received {log_probabilities!r}.")
        emissions, mask = self._inputs(emissions, mask)
        parameters = self.chain_parameters()
        paths, scores = decoding.viterbi_top_k(emissions, mask, *parameters, k=k)
        if log_probabilities:
            scores = scores - maths.log_partition(emissions, mask, *parameters)[:, None]
        return paths, scores

    def path_log_probability(self, emissions, tags, mask=None) -> Tensor:
        """log p(tags | emissions) = score(tags) - log Z, `[batch]` (0 for a
        row with no valid position); tags at masked positions are ignored."""
        return -self.negative_log_likelihood(emissions, tags, mask)

    def marginals(self, emissions, mask=None) -> Tensor:
        """p(y_t = k | emissions), `[batch, time, num_tags]`, 0 at masked positions."""
        emissions, mask = self._inputs(emissions, mask)
        return maths.marginals(emissions, mask, *self.chain_parameters())

    def log_partition(self, emissions, mask=None) -> Tensor:
        """log Z, `[batch]` (0 for a row with no valid position)."""
        emissions, mask = self._inputs(emissions, mask)
        return maths.log_partition(emissions, mask, *self.chain_parameters())

    def negative_log_likelihood(self, emissions, tags, mask=None) -> Tensor:
        """-log p(tags | emissions), `[batch]`; tags at masked positions are ignored."""
        emissions, mask = self._inputs(emissions, mask)
        return maths.negative_log_likelihood(emissions, tags, mask, *self.chain_parameters())

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        self._check_shape(input_shape)
        return tuple(input_shape[:2])

    def compute_output_spec(self, emissions, mask=None):
        return keras.KerasTensor(self.compute_output_shape(emissions.shape), dtype="int32")

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(attributes(self, "num_tags", "tags", "allowed_transitions"))
        config.update(initializer_configs(self, "transitions_initializer", "boundary_initializer"))
        return config


# --- the scores, from the layer to the loss ------------------------------------


def attach_scores(tags, scores: CRFScores) -> None:
    """Attaches `scores` to the tensor `tags` for `crf_scores`, the way Keras
    attaches a mask to a layer's output (`tf_internal.set_tensor_attribute`:
    an attribute, or Keras's own store by tensor for JAX's tracers, which
    take none; that store is per thread and emptied by
    `keras.backend.clear_session()`). Each replica of a distributed step
    gets its own tensors, so its own scores. A tensor that takes neither an
    attribute nor a weak reference gets none: decoding still works, and
    `crf_scores` says how to train then."""
    try:
        tf_internal.set_tensor_attribute(tags, SCORES_ATTRIBUTE, scores)
    except TypeError:  # no weak reference: nothing could drop the entry
        pass


def attached_scores(y_pred) -> Optional[CRFScores]:
    """The `CRFScores` attached to `y_pred`, or None."""
    return tf_internal.tensor_attribute(y_pred, SCORES_ATTRIBUTE)


def crf_scores(y_pred) -> CRFScores:
    """The `CRFScores` a `CRF` layer attached to its output tags."""
    scores = attached_scores(y_pred)
    if scores is None:
        raise ValueError(
            "kb.CRFLoss needs the output of a kb.CRF layer as y_pred (make kb.CRF the model's "
            "last layer, and compute the loss on its output as returned); received a tensor "
            f"without the CRF's scores: {y_pred!r}. Outside a model, or where the {backend.NAME} "
            "backend's tensors can carry no scores (neither attributes nor weak references), "
            "train with the layer's crf.negative_log_likelihood(emissions, tags, mask) in a "
            "custom training step."
        )
    return scores
