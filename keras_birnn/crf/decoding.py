"""n-best Viterbi decoding and path probabilities of a linear-chain CRF.

Pure functions of the same arguments as `keras_birnn.crf.maths`
(`emissions [batch, time, K]`, a bool `mask [batch, time]` or None, the
chain's `transitions [K, K]`, `start [K]`, `end [K]`), with the same mask
rules: the chain links consecutive valid positions, wherever they are.

n-best Viterbi keeps, for each tag at each position, the k best prefixes
ending there (`[batch, K, k]`): the k best paths ending in tag j at a
position extend some of the k best prefixes of each previous tag, so a
`top_k` over the `K * k` candidates of each tag is exact. Back pointers
name a (previous tag, rank) slot as `tag * k + rank`.

What counts as a path: a path that uses a forbidden transition, start or
end (a score `<= kb.crf.FORBIDDEN`, as `kb.CRF(allowed_transitions=...)`
sets them) is none, so constrained n-best lists hold allowed paths only;
so are paths through an emission of -inf. A row with no valid position
has exactly one path, the empty one, of score 0 (as log Z = 0 there).
A row with fewer than k paths fills the rest of its list with the
sentinel: score -inf and `PAD_TAG` at every position.

Ties: paths of equal score come in an unspecified order (it differs
between backends' `top_k`); the list as a whole holds k distinct paths.

Written in `keras.ops` on the primitives of `keras_birnn.crf.maths`, so it runs on
TensorFlow (also in a `tf.function` of unknown batch and time, and in an
exported SavedModel), JAX (under `jax.jit`, `k` static) and PyTorch.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np
from keras import ops

from keras_birnn import backend
from keras_birnn.crf import maths

if backend.NAME == "jax":
    import jax

Tensor = Any  # a tensor of the backend

# Scores below this are no path. Absent paths score -inf here, but LiteRT's
# XNNPACK delegate clamps float outputs to float32's range, so an exported
# model meets -3.4e38 (+ finite scores) instead: no real path scores that low.
NO_PATH_BELOW = -1e38


def _plain_with_k(function: Callable) -> Callable:
    """`maths.plain`, with `k` a static argument under `jax.jit` (it sets shapes)."""
    if backend.NAME == "jax":
        return jax.jit(function, static_argnames=("k",))
    return maths.plain(function)


def check_k(k) -> int:
    """`k` as a Python int >= 1, or a ValueError naming it."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"`k` must be an integer >= 1, received {k!r}.")
    return int(k)


def _without_forbidden(x: Tensor) -> Tensor:
    """`x` with forbidden scores (<= FORBIDDEN) at -inf: no path then uses them."""
    return ops.where(x <= maths.FORBIDDEN, ops.full_like(x, -np.inf), x)


def _first_ranks(k: int, dtype) -> Tensor:
    """`[k]`: 0 for rank 0, -inf for the others (a single path so far)."""
    return ops.convert_to_tensor(np.array([0.0] + [-np.inf] * (k - 1)), dtype)


def _top_k(x: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    values, indices = ops.top_k(x, k, sorted=True)
    return values, ops.cast(indices, "int32")


def _n_best_forward(emissions, mask, transitions, start, k: int):
    """The k best prefix scores of each tag after the last position `[batch,
    K, k]` and back pointers `[time, batch, K * k]` (slot `tag * k + rank`
    of the previous valid position; identity where no transition enters)."""
    num_tags = transitions.shape[0]
    firsts = _first_ranks(k, emissions.dtype)
    identity = ops.reshape(ops.arange(num_tags * k, dtype="int32"), (num_tags, k))

    def step(carry, inputs):
        score, started, _ = carry
        e_t, valid_t = inputs
        candidates = score[:, :, :, None] + transitions[None, :, None, :]  # [B, prev, rank, next]
        candidates = ops.transpose(ops.reshape(candidates, (-1, num_tags * k, num_tags)), (0, 2, 1))
        top, best = _top_k(candidates, k)  # [B, next, k]
        new = ops.where(started[:, None, None], top + e_t[:, :, None], (start + e_t)[:, :, None] + firsts)
        entered = ops.logical_and(valid_t, started)[:, None, None]
        pointers = ops.reshape(ops.where(entered, best, identity), (-1, num_tags * k))
        return ops.where(valid_t[:, None, None], new, score), ops.logical_or(started, valid_t), pointers

    zeros = maths.zero_state(emissions)
    initial = (
        zeros[:, :, None] + firsts,
        maths.not_started(emissions),
        ops.zeros((ops.shape(emissions)[0], num_tags * k), "int32"),
    )
    scores, _, pointers = maths.scan(
        step, (maths.time_major(emissions), maths.time_major(mask)), initial
    )
    return maths.last_step(scores, initial[0]), pointers


@_plain_with_k
def _viterbi_top_k(emissions, mask, transitions, start, end, k: int) -> Tuple[Tensor, Tensor]:
    emissions, mask = maths.prepare(emissions, mask)
    transitions, start, end = (_without_forbidden(x) for x in (transitions, start, end))
    num_tags = transitions.shape[0]
    final, pointers = _n_best_forward(emissions, mask, transitions, start, k)
    scores, slots = _top_k(ops.reshape(final + end[:, None], (-1, num_tags * k)), k)
    tags = ops.transpose(maths.backtrack(pointers, slots) // k, (1, 2, 0))  # [B, k, time]
    # A row with no valid position: its one (empty) path scores 0.
    any_valid = ops.any(mask, axis=1)[:, None]
    scores = ops.where(any_valid, scores, _first_ranks(k, scores.dtype)[None, :])
    listed = scores > NO_PATH_BELOW
    keep = ops.logical_and(mask[:, None, :], listed[:, :, None])
    return ops.where(keep, tags, maths.PAD_TAG), ops.where(listed, scores, ops.full_like(scores, -np.inf))


def viterbi_top_k(emissions: Tensor, mask: Optional[Tensor], transitions: Tensor, start: Tensor, end: Tensor,
                  k: int = 2) -> Tuple[Tensor, Tensor]:
    """The k highest-scoring paths and their scores, best first.

    Args:
        emissions: Float `[batch, time, K]`.
        mask: Bool `[batch, time]`, or None (every position valid).
        transitions: `[K, K]` (static K), `start` and `end` `[K]`: the chain's
            parameters; entries `<= kb.crf.FORBIDDEN` are forbidden.
        k: How many paths (a Python int >= 1).

    Returns:
        `(paths, scores)`: paths int32 `[batch, k, time]` (`PAD_TAG` at masked
        positions), scores `[batch, k]` (the emissions' dtype), in
        non-increasing order. Entries past a row's number of paths hold the
        sentinel: score -inf, `PAD_TAG` everywhere. Paths of equal score
        come in an unspecified order.
    """
    return _viterbi_top_k(emissions, mask, transitions, start, end, k=check_k(k))


def path_log_probability(emissions: Tensor, tags: Tensor, mask: Optional[Tensor], transitions: Tensor,
                         start: Tensor, end: Tensor) -> Tensor:
    """log p(tags | emissions) = score(tags) - log Z, `[batch]` (0 for a row
    with no valid position); tags at masked positions are ignored."""
    return -maths.negative_log_likelihood(emissions, tags, mask, transitions, start, end)
