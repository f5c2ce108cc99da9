"""A brute-force NumPy linear-chain CRF, the oracle of tests/test_crf.py.

Every quantity comes from enumerating every tag sequence over a row's valid
positions (so only for small cases: K ** n paths), in float64. It shares no
code with keras_birnn: a path's score is written out from the definition

    score(y) = start[y_1] + sum_i e[p_i, y_i] + sum_{i>1} A[y_{i-1}, y_i] + end[y_n]

over the valid positions p_1 < ... < p_n of the row (masked positions are
skipped by the chain). A row with no valid position has the empty path
only: log Z = 0, NLL = 0. Decoded tags are 0 at masked positions.

`allowed(path)` optionally restricts the enumeration (e.g. to IOB2-valid
paths).
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
