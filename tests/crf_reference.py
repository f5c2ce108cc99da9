"""A brute-force NumPy linear-chain CRF, the oracle of tests/tensorflow_only/test_crf.py.

Every quantity comes from enumerating every tag sequence over a row's valid
positions (so only for small cases: K ** n paths), in float64. It shares no
code with keras_birnn: a path's score is written out from the definition

    score(y) = start[y_1] + sum_i e[p_i, y_i] + sum_{i>1} A[y_{i-1}, y_i] + end[y_n]

over the valid positions p_1 < ... < p_n of the row (masked positions are
skipped by the chain). A row with no valid position has the empty path
only: log Z = 0, NLL = 0. Decoded tags are 0 at masked positions.

`allowed(path)` optionally restricts the enumeration (to the paths valid
under IOB2, IOB1 or BIOES: `iob2_checker`, `iob1_checker`, `bioes_checker`,
each written from the scheme's definition, on tag names).

`top_k` lists the k best paths by sorting the enumeration; `assert_top_k`
judges an n-best list a decoder returned (ties allowed).
"""

import itertools

import numpy as np


def _logsumexp(values):
    values = np.asarray(values, np.float64)
    top = values.max()
    return top + np.log(np.exp(values - top).sum())


def _score(e_row, positions, path, transitions, start, end):
    if not positions:
        return 0.0
    total = start[path[0]] + end[path[-1]]
    for i, (p, y) in enumerate(zip(positions, path)):
        total += e_row[p, y]
        if i > 0:
            total += transitions[path[i - 1], y]
    return float(total)


def row_paths(e_row, mask_row, transitions, start, end, allowed=None):
    """[(path over valid positions, score)] for every (allowed) path of a row."""
    positions = [int(p) for p in np.flatnonzero(mask_row)]
    num_tags = e_row.shape[-1]
    paths = []
    for path in itertools.product(range(num_tags), repeat=len(positions)):
        if allowed is None or allowed(path):
            paths.append((path, _score(e_row, positions, path, transitions, start, end)))
    return positions, paths


def log_partition(e, mask, transitions, start, end, allowed=None):
    out = np.zeros(e.shape[0])
    for b in range(e.shape[0]):
        _, paths = row_paths(e[b], mask[b], transitions, start, end, allowed)
        out[b] = _logsumexp([s for _, s in paths]) if mask[b].any() else 0.0
    return out


def nll(e, tags, mask, transitions, start, end, allowed=None):
    out = np.zeros(e.shape[0])
    log_z = log_partition(e, mask, transitions, start, end, allowed)
    for b in range(e.shape[0]):
        positions = [int(p) for p in np.flatnonzero(mask[b])]
        gold = [int(tags[b, p]) for p in positions]
        out[b] = log_z[b] - _score(e[b], positions, gold, transitions, start, end)
    return out


def viterbi(e, mask, transitions, start, end, allowed=None):
    out = np.zeros(mask.shape, np.int64)
    for b in range(e.shape[0]):
        positions, paths = row_paths(e[b], mask[b], transitions, start, end, allowed)
        if positions:
            best, _ = max(paths, key=lambda item: item[1])
            out[b, positions] = best
    return out


def marginals(e, mask, transitions, start, end, allowed=None):
    out = np.zeros(e.shape)
    for b in range(e.shape[0]):
        positions, paths = row_paths(e[b], mask[b], transitions, start, end, allowed)
        if not positions:
            continue
        log_z = _logsumexp([s for _, s in paths])
        for path, s in paths:
            for p, y in zip(positions, path):
                out[b, p, y] += np.exp(s - log_z)
    return out


def iob2_checker(names):
    """allowed(path) for IOB2: I-X only right after B-X or I-X, never first."""

    def allowed(path):
        previous = None
        for y in path:
            name = names[y]
            if name.startswith("I-") and previous not in ("B-" + name[2:], name):
                return False
            previous = name
        return True

    return allowed


def _parts(name):
    return ("O", "") if name == "O" else (name[0], name[2:])


def iob1_checker(names):
    """allowed(path) for IOB1: B-X only right after a B-X or I-X token; I-X anywhere."""

    def allowed(path):
        previous = ("O", "")
        for y in path:
            prefix, kind = _parts(names[y])
            if prefix == "B" and (previous[0] == "O" or previous[1] != kind):
                return False
            previous = (prefix, kind)
        return True

    return allowed


def bioes_checker(names):
    """allowed(path) for BIOES, as a chunker reads it: outside a chunk, O
    and S-X stay outside and B-X opens a chunk of type X; inside one, I-X
    continues it and E-X closes it; the sentence must end outside."""

    def allowed(path):
        inside = None  # the open chunk's type
        for y in path:
            prefix, kind = _parts(names[y])
            if inside is None:
                if prefix not in ("O", "S", "B"):
                    return False
                inside = kind if prefix == "B" else None
            else:
                if prefix not in ("I", "E") or kind != inside:
                    return False
                inside = None if prefix == "E" else inside
        return inside is None

    return allowed


def _ranked(e_row, mask_row, transitions, start, end, allowed):
    positions, row = row_paths(e_row, mask_row, transitions, start, end, allowed)
    return positions, sorted(row, key=lambda item: -item[1])


def top_k(e, mask, transitions, start, end, k, allowed=None):
    """The k best paths `[batch, k, time]` (0 at masked positions) and their
    scores `[batch, k]`, best first; past a row's number of paths, score
    -inf and tags 0. A row with no valid position has one path (score 0)."""
    paths = np.zeros((e.shape[0], k) + mask.shape[1:], np.int64)
    scores = np.full((e.shape[0], k), -np.inf)
    for b in range(e.shape[0]):
        positions, ranked = _ranked(e[b], mask[b], transitions, start, end, allowed)
        for rank, (path, score) in enumerate(ranked[:k]):
            paths[b, rank, positions] = path
            scores[b, rank] = score
    return paths, scores


def assert_top_k(paths, scores, e, mask, transitions, start, end, k, allowed=None, atol=1e-4):
    """`(paths, scores)` is a correct n-best list: the oracle's k best scores,
    each listed path distinct and allowed, scoring what is listed, 0 at
    masked positions; sentinels (-inf, tags 0) past a row's paths. Paths
    of (nearly) equal score may come in any order, so the path sets are
    compared only where the oracle's k-th and (k+1)-th scores are apart."""
    paths, scores = np.asarray(paths), np.asarray(scores)
    assert paths.shape == (e.shape[0], k) + mask.shape[1:] and paths.dtype == np.int32, (paths.shape, paths.dtype)
    for b in range(e.shape[0]):
        positions, ranked = _ranked(e[b], mask[b], transitions, start, end, allowed)
        want = [score for _, score in ranked[:k]]
        want += [-np.inf] * (k - len(want))
        np.testing.assert_allclose(scores[b], want, atol=atol, rtol=atol, err_msg=f"row {b}")
        assert np.all(paths[b][:, ~mask[b]] == 0), (b, paths[b])
        listed = [tuple(int(y) for y in paths[b, r, positions]) for r in range(k) if scores[b, r] > -np.inf]
        assert np.all(paths[b, len(listed):] == 0), (b, paths[b])
        assert len(set(listed)) == len(listed), (b, listed)
        for r, path in enumerate(listed):
            assert allowed is None or allowed(path), (b, path)
            got = _score(e[b], positions, list(path), transitions, start, end)
            np.testing.assert_allclose(got, scores[b, r], atol=atol, rtol=atol, err_msg=f"row {b} rank {r}")
        if len(ranked) <= k or ranked[k - 1][1] - ranked[k][1] > 10 * atol:
            assert set(listed) == {path for path, _ in ranked[:k]}, (b, listed)


CHECKERS = {"iob2": iob2_checker, "iob1": iob1_checker, "bioes": bioes_checker}
# Tag names of each scheme with two chunk types, for the tests.
EXAMPLE_TAGS = {
    "iob2": ["O", "B-A", "I-A", "B-B", "I-B"],
    "iob1": ["O", "B-A", "I-A", "B-B", "I-B"],
    "bioes": ["O", "B-A", "I-A", "E-A", "S-A", "B-B", "I-B", "E-B", "S-B"],
}


def central_differences(loss, values, step=1e-5):
    """d loss / d each array of `values` (float64), by central differences."""
    gradients = []
    for index, value in enumerate(values):
        numeric = np.zeros_like(value)
        for pos in np.ndindex(value.shape):
            shifted = [v.copy() for v in values]
            shifted[index][pos] += step
            plus = loss(shifted)
            shifted[index][pos] -= 2 * step
            numeric[pos] = (plus - loss(shifted)) / (2 * step)
        gradients.append(numeric)
    return gradients


def random_iob2_tags(rng, rows, time):
    """`[rows, time]` int32 tags over ("O", "B-X", "I-X") = (0, 1, 2) that
    keep IOB2 (an I-X only after B-X or I-X), drawn from `rng`."""
    tags = np.zeros((rows, time), "int32")
    for b in range(rows):
        for t in range(time):
            previous = tags[b, t - 1] if t else 0
            tags[b, t] = rng.choice([0, 1, 2]) if previous else rng.choice([0, 1])
    return tags
