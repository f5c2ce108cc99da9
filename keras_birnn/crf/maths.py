"""The maths of a masked linear-chain conditional random field (CRF).

Small pure functions of `emissions [batch, time, K]`, a bool `mask [batch,
time]` (or None: every position valid) and the chain's parameters
`transitions [K, K]` (row: previous tag, column: next tag), `start [K]` and
`end [K]`:

    score(y) = start[y_1] + sum_i emissions[p_i, y_i]
               + sum_{i>1} transitions[y_{i-1}, y_i] + end[y_n]

where p_1 < ... < p_n are the row's valid positions. The chain skips masked
positions wherever they are (right padding, left padding, holes): a
transition links consecutive *valid* positions. A row with no valid position
has log Z = 0, NLL = 0, tags 0 and marginals 0. Whatever sits in a masked
emission slot (NaN included) reaches no output and no gradient.

Written in `keras.ops`, so they run on every Keras backend (TensorFlow, JAX,
PyTorch). On TensorFlow three primitives (`scan`, `gather`, `max_and_argmax`) use
TensorFlow's own ops, so that the loops that `fit` and an exported decoder
run keep their ops: the `keras.ops` forms build larger graphs there
(`keras.ops.scan` keeps the carry in a TensorArray and runs one iteration at
a time; `take_along_axis` broadcasts and reshapes; `argmax` adds a
negative-zero fix, and `max` an assertion when eager). On JAX the public
functions run under `jax.jit` (`plain`).

The layer (`keras_birnn.crf.layer.CRF`) and the loss
(`keras_birnn.crf.loss.CRFLoss`) are thin wrappers around these functions;
n-best decoding and path log-probabilities are in `keras_birnn.crf.decoding`.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import keras
from keras import ops

from keras_birnn import backend

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


# --- how each backend runs the maths -----------------------------------------


def plain(function: Callable) -> Callable:
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


def scan(step: Callable, elems, initializer, reverse: bool = False):
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


def gather(params: Tensor, indices: Tensor, batch_dims: int = 0) -> Tensor:
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


def max_and_argmax(x: Tensor, axis: int) -> Tuple[Tensor, Tensor]:
    """The maximum along `axis` and the int32 index of its first occurrence."""
    if backend.IS_TENSORFLOW:  # keras.ops.max also asserts a non-empty tensor when eager
        return tf.reduce_max(x, axis=axis), tf.argmax(x, axis=axis, output_type=tf.int32)
    return ops.max(x, axis=axis), ops.cast(ops.argmax(x, axis=axis), "int32")


# --- the maths ----------------------------------------------------------------


def prepare(emissions, mask) -> Tuple[Tensor, Tensor]:
    """Float emissions with masked slots zeroed, and a bool mask (all True for None)."""
    emissions = ops.convert_to_tensor(emissions)
    if mask is None:
        return emissions, ops.ones(ops.shape(emissions)[:2], "bool")
    mask = ops.cast(mask, "bool")
    return ops.where(mask[..., None], emissions, ops.zeros_like(emissions)), mask


def time_major(x) -> Tensor:
    """Swaps the batch and time axes (either way)."""
    return ops.swapaxes(x, 0, 1)


def last_step(outputs, initial) -> Tensor:
    """The last step of time-major scan outputs, or `initial` when there is no step."""
    return ops.concatenate([initial[None], outputs], axis=0)[-1]


def zero_state(emissions, dtype=None) -> Tensor:
    """Zeros `[batch, K]` (the emissions' dtype unless `dtype`): a scan's first carry."""
    shape = ops.shape(emissions)
    return ops.zeros((shape[0], shape[2]), dtype or emissions.dtype)


def not_started(emissions) -> Tensor:
    """False `[batch]`: no row has met a valid position yet."""
    return ops.zeros(ops.shape(emissions)[:1], "bool")


@plain
def forward_scores(emissions, mask, transitions, start) -> Tuple[Tensor, Tensor]:
    """The forward algorithm in log space.

    Returns:
        `(alphas, last)`: alphas `[batch, time, K]`, at each valid position
        the log-sum of the scores of every path prefix ending there in each
        tag (start and emissions included); at a masked position the value of
        the last valid one before it. `last` `[batch, K]` is the value after
        the last position (zeros for a row with no valid position).
    """
    emissions, mask = prepare(emissions, mask)

    def step(carry, inputs):
        alpha, started = carry
        e_t, valid_t = inputs
        chained = ops.logsumexp(alpha[:, :, None] + transitions, axis=1) + e_t
        new = ops.where(started[:, None], chained, start + e_t)
        return ops.where(valid_t[:, None], new, alpha), ops.logical_or(started, valid_t)

    initial = (zero_state(emissions), not_started(emissions))
    alphas, _ = scan(step, (time_major(emissions), time_major(mask)), initial)
    return time_major(alphas), last_step(alphas, initial[0])


@plain
def backward_scores(emissions, mask, transitions, end) -> Tensor:
    """The backward algorithm in log space.

    Returns:
        betas `[batch, time, K]`: at each valid position, the log-sum of the
        scores of every path suffix after it, given its tag (transitions,
        later emissions and end included; `end` itself at the last valid
        position). Values at masked positions are unspecified.
    """
    emissions, mask = prepare(emissions, mask)

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

    zeros = zero_state(emissions)
    initial = (zeros, zeros, not_started(emissions))
    betas, _, _ = scan(step, (time_major(emissions), time_major(mask)), initial, reverse=True)
    return time_major(betas)


@plain
def log_partition(emissions, mask, transitions, start, end) -> Tensor:
    """log Z `[batch]`: the log-sum of the scores of every path (0 for a row
    with no valid position)."""
    emissions, mask = prepare(emissions, mask)
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
    ordered = gather(tags, ops.cast(ops.argsort(key, axis=1), "int32"), batch_dims=1)
    return ops.concatenate([ordered, ops.zeros((ops.shape(tags)[0], 1), ordered.dtype)], axis=1)


@plain
def path_score(emissions, tags, mask, transitions, start, end) -> Tensor:
    """score(tags) `[batch]` of the given paths; tags at masked positions
    are ignored (any value, also out of range)."""
    emissions, mask = prepare(emissions, mask)
    tags = ops.where(mask, ops.cast(tags, "int32"), ops.zeros_like(mask, "int32"))
    emitted = gather(emissions, tags, batch_dims=2)
    emitted = ops.sum(ops.where(mask, emitted, ops.zeros_like(emitted)), axis=1)
    ordered = _valid_first(tags, mask)
    count = ops.sum(ops.cast(mask, "int32"), axis=1)
    num_tags = ops.shape(transitions)[0]
    links = gather(ops.reshape(transitions, (-1,)), ordered[:, :-2] * num_tags + ordered[:, 1:-1])
    linked = ops.arange(ops.shape(links)[1], dtype="int32")[None, :] < ops.maximum(count - 1, 0)[:, None]
    chained = ops.sum(ops.where(linked, links, ops.zeros_like(links)), axis=1)
    last = gather(ordered, ops.maximum(count - 1, 0), batch_dims=1)
    ends = gather(start, ordered[:, 0]) + gather(end, last)
    return emitted + chained + ops.where(count > 0, ends, ops.zeros_like(ends))


@plain
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
        top, best = max_and_argmax(candidates, axis=1)
        new = ops.where(started[:, None], top + e_t, start + e_t)
        pointers = ops.where(ops.logical_and(valid_t, started)[:, None], best, identity)
        return ops.where(valid_t[:, None], new, score), ops.logical_or(started, valid_t), pointers

    initial = (zero_state(emissions), not_started(emissions), zero_state(emissions, "int32"))
    scores, _, pointers = scan(step, (time_major(emissions), time_major(mask)), initial)
    return last_step(scores, initial[0]), pointers


def backtrack(pointers, last_tag) -> Tensor:
    """Time-major tags `[time, batch]` from back pointers and the last tag."""

    def step(tag, pointers_t):
        return gather(pointers_t, tag, batch_dims=1)

    previous = scan(step, pointers, last_tag, reverse=True)  # [t] = tag at t - 1
    return ops.concatenate([previous[1:], last_tag[None]], axis=0)[: ops.shape(pointers)[0]]


@plain
def viterbi_decode(emissions, mask, transitions, start, end) -> Tensor:
    """The highest-scoring path, int32 `[batch, time]`; `PAD_TAG` (0) at masked positions."""
    emissions, mask = prepare(emissions, mask)
    final, pointers = _viterbi_forward(emissions, mask, transitions, start)
    _, last_tag = max_and_argmax(final + end, axis=-1)
    tags = time_major(backtrack(pointers, last_tag))
    return ops.where(mask, tags, PAD_TAG)


@plain
def marginals(emissions, mask, transitions, start, end) -> Tensor:
    """p(y_t = k | emissions) `[batch, time, K]` by forward-backward; 0 at masked positions."""
    emissions, mask = prepare(emissions, mask)
    alphas, last = forward_scores(emissions, mask, transitions, start)
    betas = backward_scores(emissions, mask, transitions, end)
    log_z = ops.logsumexp(last + end, axis=-1)
    valid = mask[..., None]
    log_p = ops.where(valid, alphas + betas - log_z[:, None, None], ops.zeros_like(alphas))
    return ops.where(valid, ops.exp(log_p), ops.zeros_like(log_p))
