"""A masked linear-chain conditional random field (CRF) head.

The maths are small pure functions of `emissions [batch, time, K]`, a bool
`mask [batch, time]` (or None: every position valid) and the chain's
parameters `transitions [K, K]` (row: previous tag, column: next tag),
`start [K]` and `end [K]`:

    score(y) = start[y_1] + sum_i emissions[p_i, y_i]
               + sum_{i>1} transitions[y_{i-1}, y_i] + end[y_n]

where p_1 < ... < p_n are the row's valid positions. The chain skips masked
positions wherever they are (right padding, left padding, holes): a
transition links consecutive *valid* positions. A row with no valid position
has log Z = 0, NLL = 0, tags 0 and marginals 0. Whatever sits in a masked
emission slot (NaN included) reaches no output and no gradient.

Written in `keras.ops`, so the layer, the loss and the functions run on
every Keras backend (TensorFlow, JAX, PyTorch). On TensorFlow three
primitives (`_scan`, `_gather`, `_best`) use TensorFlow's own ops, so that
the loops that `fit` and an exported decoder run keep their ops: the
`keras.ops` forms build larger graphs there (`keras.ops.scan` keeps the
carry in a TensorArray and runs one iteration at a time; `take_along_axis`
broadcasts and reshapes; `argmax` adds a negative-zero fix, and `max` an
assertion when eager). On JAX the public functions run under `jax.jit`
(`_plain`).

The layer (`CRF`) and the loss (`CRFLoss`) are thin wrappers around these
functions; see the layer's docstring for how they fit Keras's `fit`.
n-best decoding and path log-probabilities are in `keras_birnn.crf.decoding`,
the tagging schemes of `allowed_transitions` in `keras_birnn.crf.schemes`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import initializers, ops

from keras_birnn import backend, tf_internal
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.crf.schemes import SCHEMES, iob2_allowed, scheme_allowed  # noqa: F401 (iob2_allowed: API)
from keras_birnn.masking import validate_mask
from keras_birnn.serialization import attributes, initializer_configs

if backend.IS_TENSORFLOW:
    import tensorflow as tf
elif backend.NAME == "jax":
    import jax

Tensor = Any  # a tensor of the backend

# Score of a forbidden transition: large and finite, so that no -inf - -inf
# ever makes a NaN; exp(FORBIDDEN + anything sensible) is exactly 0.
FORBIDDEN = -1e9
# Decoded tag at masked positions (and everywhere in a row with no valid position).
PAD_TAG = 0
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


# --- how each backend runs the maths -----------------------------------------


def _plain(function: Callable) -> Callable:
    """`function` as each backend runs these pure functions best.

    TensorFlow: kept from AutoGraph, since no Python control flow depends on
    tensors here, and AutoGraph's conversion (which rewrites each
    function's source before tracing it) would only add tracing time in a
    `tf.function` (and in `fit`). JAX: under `jax.jit`, so that an eager
    call compiles once per shape (its scans' steps are new closures on
    every call, which `jax.lax.scan` would trace and compile every time);
    inside a trace it is inlined.
    """
    if backend.IS_TENSORFLOW:
        return tf.autograph.experimental.do_not_convert(function)
    if backend.NAME == "jax":
        return jax.jit(function)
    return function


def _scan(step: Callable, elems, initializer, reverse: bool = False):
    """`tf.scan`'s contract on every backend: `step(carry, elem)` returns
    the next carry, and the result stacks every carry along axis 0 (in the
    elements' order, also when `reverse`)."""
    if backend.IS_TENSORFLOW:
        return tf.scan(step, elems, initializer=initializer, reverse=reverse)
    length = ops.shape(keras.tree.flatten(elems)[0])[0]
    if length == 0:  # PyTorch's scan cannot stack an empty list
        return keras.tree.map_structure(lambda c: ops.zeros((0,) + tuple(c.shape), c.dtype), initializer)

    def carried(carry, elem):
        carry = step(carry, elem)
        return carry, carry

    return ops.scan(carried, initializer, elems, reverse=reverse)[1]


def _gather(params: Tensor, indices: Tensor, batch_dims: int = 0) -> Tensor:
    """`tf.gather(params, indices, batch_dims=batch_dims)` for the cases used
    here: `batch_dims=0` (any indices into axis 0), or `params` of rank
    `batch_dims + 1` read along its last axis, one index per row (`indices`
    of rank `batch_dims`) or several (rank `batch_dims + 1`)."""
    if backend.IS_TENSORFLOW:
        return tf.gather(params, indices, batch_dims=batch_dims)
    if batch_dims == 0:
        return ops.take(params, indices, axis=0)
    if len(indices.shape) == batch_dims:
        return ops.take_along_axis(params, indices[..., None], axis=-1)[..., 0]
    return ops.take_along_axis(params, indices, axis=-1)


def _best(x: Tensor, axis: int) -> Tuple[Tensor, Tensor]:
    """The maximum along `axis` and the int32 index of its first occurrence."""
    if backend.IS_TENSORFLOW:  # keras.ops.max also asserts a non-empty tensor when eager
        return tf.reduce_max(x, axis=axis), tf.argmax(x, axis=axis, output_type=tf.int32)
    return ops.max(x, axis=axis), ops.cast(ops.argmax(x, axis=axis), "int32")


# --- the maths ----------------------------------------------------------------


def _prepare(emissions, mask) -> Tuple[Tensor, Tensor]:
    """Float emissions with masked slots zeroed, and a bool mask (all True for None)."""
    emissions = ops.convert_to_tensor(emissions)
    if mask is None:
        return emissions, ops.ones(ops.shape(emissions)[:2], "bool")
    mask = ops.cast(mask, "bool")
    return ops.where(mask[..., None], emissions, ops.zeros_like(emissions)), mask


def _time_major(x) -> Tensor:
    """Swaps the batch and time axes (either way)."""
    return ops.swapaxes(x, 0, 1)


def _last(outputs, initial) -> Tensor:
    """The last step of time-major scan outputs, or `initial` when there is no step."""
    return ops.concatenate([initial[None], outputs], axis=0)[-1]


def _zero_state(emissions, dtype=None) -> Tensor:
    shape = ops.shape(emissions)
    return ops.zeros((shape[0], shape[2]), dtype or emissions.dtype)


def _not_started(emissions) -> Tensor:
    return ops.zeros(ops.shape(emissions)[:1], "bool")


@_plain
def forward_scores(emissions, mask, transitions, start) -> Tuple[Tensor, Tensor]:
    """The forward algorithm in log space.

    Returns:
        `(alphas, last)`: alphas `[batch, time, K]`, at each valid position
        the log-sum of the scores of every path prefix ending there in each
        tag (start and emissions included); at a masked position the value of
        the last valid one before it. `last` `[batch, K]` is the value after
        the last position (zeros for a row with no valid position).
    """
    emissions, mask = _prepare(emissions, mask)

    def step(carry, inputs):
        alpha, started = carry
        e_t, valid_t = inputs
        chained = ops.logsumexp(alpha[:, :, None] + transitions, axis=1) + e_t
        new = ops.where(started[:, None], chained, start + e_t)
        return ops.where(valid_t[:, None], new, alpha), ops.logical_or(started, valid_t)

    initial = (_zero_state(emissions), _not_started(emissions))
    alphas, _ = _scan(step, (_time_major(emissions), _time_major(mask)), initial)
    return _time_major(alphas), _last(alphas, initial[0])


@_plain
def backward_scores(emissions, mask, transitions, end) -> Tensor:
    """The backward algorithm in log space.

    Returns:
        betas `[batch, time, K]`: at each valid position, the log-sum of the
        scores of every path suffix after it, given its tag (transitions,
        later emissions and end included; `end` itself at the last valid
        position). Values at masked positions are unspecified.
    """
    emissions, mask = _prepare(emissions, mask)

    def step(carry, inputs):
        beta, message, started = carry  # message = emissions + beta of the next valid position
        e_t, valid_t = inputs
        chained = ops.logsumexp(transitions + message[:, None, :], axis=2)
        new = ops.where(started[:, None], chained, end + ops.zeros_like(chained))
        valid = valid_t[:, None]
        return (
            ops.where(valid, new, beta),
            ops.where(valid, e_t + new, message),
            ops.logical_or(started, valid_t),
        )

    zeros = _zero_state(emissions)
    initial = (zeros, zeros, _not_started(emissions))
    betas, _, _ = _scan(step, (_time_major(emissions), _time_major(mask)), initial, reverse=True)
    return _time_major(betas)


@_plain
def log_partition(emissions, mask, transitions, start, end) -> Tensor:
    """log Z `[batch]`: the log-sum of the scores of every path (0 for a row
    with no valid position)."""
    emissions, mask = _prepare(emissions, mask)
    _, last = forward_scores(emissions, mask, transitions, start)
    log_z = ops.logsumexp(last + end, axis=-1)
    return ops.where(ops.any(mask, axis=1), log_z, ops.zeros_like(log_z))


def _valid_first(tags, mask) -> Tensor:
    """Each row's tags at its valid positions, in order, moved to the front;
    `[batch, time + 1]` (one padding column, so that column 0 always exists)."""
    time = ops.shape(mask)[1]
    # Distinct sort keys (valid positions first, each part in time order),
    # so that any sort, stable or not, gives the same order.
    key = ops.arange(time, dtype="int32")[None, :] + ops.cast(ops.logical_not(mask), "int32") * time
    ordered = _gather(tags, ops.cast(ops.argsort(key, axis=1), "int32"), batch_dims=1)
    return ops.concatenate([ordered, ops.zeros((ops.shape(tags)[0], 1), ordered.dtype)], axis=1)


@_plain
def path_score(emissions, tags, mask, transitions, start, end) -> Tensor:
    """score(tags) `[batch]` of the given paths; tags at masked positions
    are ignored (any value, also out of range)."""
    emissions, mask = _prepare(emissions, mask)
    tags = ops.where(mask, ops.cast(tags, "int32"), ops.zeros_like(mask, "int32"))
    emitted = _gather(emissions, tags, batch_dims=2)
    emitted = ops.sum(ops.where(mask, emitted, ops.zeros_like(emitted)), axis=1)
    ordered = _valid_first(tags, mask)
    count = ops.sum(ops.cast(mask, "int32"), axis=1)
    num_tags = ops.shape(transitions)[0]
    links = _gather(ops.reshape(transitions, (-1,)), ordered[:, :-2] * num_tags + ordered[:, 1:-1])
    linked = ops.arange(ops.shape(links)[1], dtype="int32")[None, :] < ops.maximum(count - 1, 0)[:, None]
    chained = ops.sum(ops.where(linked, links, ops.zeros_like(links)), axis=1)
    last = _gather(ordered, ops.maximum(count - 1, 0), batch_dims=1)
    ends = _gather(start, ordered[:, 0]) + _gather(end, last)
    return emitted + chained + ops.where(count > 0, ends, ops.zeros_like(ends))


@_plain
def negative_log_likelihood(emissions, tags, mask, transitions, start, end) -> Tensor:
    """-log p(tags | emissions) = log Z - score(tags), `[batch]` (0 for a row
    with no valid position)."""
    return log_partition(emissions, mask, transitions, start, end) - path_score(
        emissions, tags, mask, transitions, start, end
    )


def _viterbi_forward(emissions, mask, transitions, start):
    """Best prefix scores after the last position `[batch, K]` and the back
    pointers `[time, batch, K]` (identity where no transition enters: masked
    positions and each row's first valid one)."""
    identity = ops.arange(ops.shape(transitions)[0], dtype="int32")

    def step(carry, inputs):
        score, started, _ = carry
        e_t, valid_t = inputs
        candidates = score[:, :, None] + transitions
        top, best = _best(candidates, axis=1)
        new = ops.where(started[:, None], top + e_t, start + e_t)
        pointers = ops.where(ops.logical_and(valid_t, started)[:, None], best, identity)
        return ops.where(valid_t[:, None], new, score), ops.logical_or(started, valid_t), pointers

    initial = (_zero_state(emissions), _not_started(emissions), _zero_state(emissions, "int32"))
    scores, _, pointers = _scan(step, (_time_major(emissions), _time_major(mask)), initial)
    return _last(scores, initial[0]), pointers


def _backtrack(pointers, last_tag) -> Tensor:
    """Time-major tags `[time, batch]` from back pointers and the last tag."""

    def step(tag, pointers_t):
        return _gather(pointers_t, tag, batch_dims=1)

    previous = _scan(step, pointers, last_tag, reverse=True)  # [t] = tag at t - 1
    return ops.concatenate([previous[1:], last_tag[None]], axis=0)[: ops.shape(pointers)[0]]


@_plain
def viterbi_decode(emissions, mask, transitions, start, end) -> Tensor:
    """The highest-scoring path, int32 `[batch, time]`; `PAD_TAG` (0) at masked positions."""
    emissions, mask = _prepare(emissions, mask)
    final, pointers = _viterbi_forward(emissions, mask, transitions, start)
    _, last_tag = _best(final + end, axis=-1)
    tags = _time_major(_backtrack(pointers, last_tag))
    return ops.where(mask, tags, PAD_TAG)


@_plain
def marginals(emissions, mask, transitions, start, end) -> Tensor:
    """p(y_t = k | emissions) `[batch, time, K]` by forward-backward; 0 at masked positions."""
    emissions, mask = _prepare(emissions, mask)
    alphas, last = forward_scores(emissions, mask, transitions, start)
    betas = backward_scores(emissions, mask, transitions, end)
    log_z = ops.logsumexp(last + end, axis=-1)
    valid = mask[..., None]
    log_p = ops.where(valid, alphas + betas - log_z[:, None, None], ops.zeros_like(alphas))
    return ops.where(valid, ops.exp(log_p), ops.zeros_like(log_p))


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
        tags = viterbi_decode(emissions, mask, *parameters)
        _attach_scores(tags, CRFScores(emissions, mask, *parameters))
        return tags

    def decode(self, emissions, mask=None) -> Tensor:
        """Viterbi tags, int32 `[batch, time]`, `PAD_TAG` at masked positions."""
        emissions, mask = self._inputs(emissions, mask)
        return viterbi_decode(emissions, mask, *self.chain_parameters())

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
        from keras_birnn.crf import decoding as crf_decoding  # it builds on this module's maths

        if not isinstance(log_probabilities, (bool, np.bool_)):
            raise TypeError(f"`log_probabilities` must be True or False, received {log_probabilities!r}.")
        emissions, mask = self._inputs(emissions, mask)
        parameters = self.chain_parameters()
        paths, scores = crf_decoding.viterbi_top_k(emissions, mask, *parameters, k=k)
        if log_probabilities:
            scores = scores - log_partition(emissions, mask, *parameters)[:, None]
        return paths, scores

    def path_log_probability(self, emissions, tags, mask=None) -> Tensor:
        """log p(tags | emissions) = score(tags) - log Z, `[batch]` (0 for a
        row with no valid position); tags at masked positions are ignored."""
        return -self.negative_log_likelihood(emissions, tags, mask)

    def marginals(self, emissions, mask=None) -> Tensor:
        """p(y_t = k | emissions), `[batch, time, num_tags]`, 0 at masked positions."""
        emissions, mask = self._inputs(emissions, mask)
        return marginals(emissions, mask, *self.chain_parameters())

    def log_partition(self, emissions, mask=None) -> Tensor:
        """log Z, `[batch]` (0 for a row with no valid position)."""
        emissions, mask = self._inputs(emissions, mask)
        return log_partition(emissions, mask, *self.chain_parameters())

    def negative_log_likelihood(self, emissions, tags, mask=None) -> Tensor:
        """-log p(tags | emissions), `[batch]`; tags at masked positions are ignored."""
        emissions, mask = self._inputs(emissions, mask)
        return negative_log_likelihood(emissions, tags, mask, *self.chain_parameters())

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


# --- the loss -----------------------------------------------------------------


# Scores of tensors that take no attribute (JAX's tracers, inside `jit` and
# `grad`), by the tensor's id, each entry dropped when its tensor is freed:
# Keras keeps `_keras_mask` the same way for such tensors.
_SCORES_BY_ID: Dict[int, CRFScores] = {}


def _attach_scores(tags, scores: CRFScores) -> None:
    """Attaches `scores` to the tensor `tags` for `crf_scores`; a tensor that
    takes neither an attribute nor a weak reference gets none (decoding
    still works; `crf_scores` says how to train then)."""
    try:
        setattr(tags, SCORES_ATTRIBUTE, scores)  # TensorFlow, PyTorch, JAX arrays
        return
    except AttributeError:
        pass
    try:
        weakref.finalize(tags, _SCORES_BY_ID.pop, id(tags), None)
    except TypeError:  # without a weak reference nothing would drop the entry
        return
    _SCORES_BY_ID[id(tags)] = scores


def _attached_scores(y_pred) -> Optional[CRFScores]:
    scores = getattr(y_pred, SCORES_ATTRIBUTE, None)
    return scores if scores is not None else _SCORES_BY_ID.get(id(y_pred))


def crf_scores(y_pred) -> CRFScores:
    """The `CRFScores` a `CRF` layer attached to its output tags."""
    scores = _attached_scores(y_pred)
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
    positions are ignored), then Keras's reduction: by default the mean
    over the batch's rows. `sample_weight` weighs rows (`[batch]`).

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
        if _attached_scores(y_pred) is None and _shapes_only():
            # Keras only reads the shape and dtype: one placeholder NLL per row.
            nll = ops.sum(ops.zeros_like(y_pred, "float32"), axis=-1)
            return super().__call__(nll, nll, sample_weight)
        scores = crf_scores(y_pred)
        tags = _gold_tags(y_true, scores.emissions)
        nll = negative_log_likelihood(
            scores.emissions, tags, scores.mask, scores.transitions, scores.start, scores.end
        )
        # Keras's own __call__ then applies sample weights, the reduction and
        # the distribution scaling to the per-row values (see `call`).
        return super().__call__(nll, nll, sample_weight)

    def call(self, y_true, y_pred):
        """The per-row NLL computed in `__call__`, unchanged."""
        return y_pred
