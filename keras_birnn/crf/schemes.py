"""Tagging schemes as CRF transition constraints (`kb.CRF(allowed_transitions=...)`).

Each scheme turns tag names into three boolean NumPy arrays: `allowed`
`[K, K]` (row: previous tag, column: next tag), `start` `[K]` (may begin a
sentence) and `end` `[K]` (may end one). `kb.CRF` sets the scores of what
is not allowed to the finite `kb.crf.FORBIDDEN`.

- `"iob2"`: `O`, `B-X`, `I-X`. `I-X` only right after `B-X` or `I-X`, never
  first. Any tag may end a sentence (a chunk ends wherever `I-X` stops).
- `"iob1"`: `O`, `B-X`, `I-X`. `I-X` begins a chunk after anything that is
  not of type X and continues one after `B-X` or `I-X`; `B-X` marks a new
  chunk right after a chunk of the same type, so it only follows `B-X` or
  `I-X` and never comes first. Any tag may end a sentence.
- `"bioes"`: `O`, `B-X`, `I-X`, `E-X`, `S-X`. Inside a chunk (after `B-X`
  or `I-X`) only `I-X` or `E-X` of the same type; outside one (after `O`,
  `E-*`, `S-*`) only `O`, `B-*` or `S-*`. A sentence starts with `O`, `B-*`
  or `S-*` and ends with `O`, `E-*` or `S-*`.

The type X is everything after the first `-` (`B-GPE-LOC` has type
`GPE-LOC`); it must not be empty.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np

# The one home of the schemes' names and tag prefixes: `kb.CRF`'s
# constraints, `kb.tagging`'s span scoring and metric, and the tagger
# builder all read tags through `split_tag`.
SCHEMES = ("iob2", "iob1", "bioes")
# The prefixes each scheme accepts besides "O".
PREFIXES: Dict[str, Tuple[str, ...]] = {"iob2": ("B", "I"), "iob1": ("B", "I"), "bioes": ("B", "I", "E", "S")}

Allowed = Tuple[np.ndarray, np.ndarray, np.ndarray]


def check_scheme(scheme: str, argument: str = "scheme") -> str:
    """`scheme` lower-cased, or a ValueError naming `argument` and the value."""
    if not isinstance(scheme, str) or scheme.lower() not in SCHEMES:
        raise ValueError(f"`{argument}` must be one of {SCHEMES}, received {scheme!r}.")
    return scheme.lower()


def split_tag(tag: str, scheme: str, typed: bool = True) -> Optional[Tuple[str, str]]:
    """`("O", "")` or `(prefix, type)` of a tag name under `scheme`, or None
    where it does not fit. The type is everything after the first `-`;
    `typed=False` also reads a bare prefix (`"B"`, type `""`).

    >>> from keras_birnn.crf.schemes import split_tag
    >>> split_tag("I-B-X", "iob2"), split_tag("S-PER", "iob2"), split_tag("B", "iob2", typed=False)
    (('I', 'B-X'), None, ('B', ''))
    """
    if tag == "O":
        return "O", ""
    if not isinstance(tag, str):
        return None
    prefix, dash, kind = tag.partition("-")
    if prefix not in PREFIXES[scheme]:
        return None
    if dash:
        return (prefix, kind) if kind else None
    return None if typed else (prefix, "")


def tag_parts(tag: str, scheme: str) -> Tuple[str, str]:
    """`split_tag` for a CRF's tag names, which need a type.

    Raises:
        ValueError: the name does not fit the scheme (the message names it).
    """
    parts = split_tag(tag, scheme)
    if parts is None:
        names = ", ".join(f"'{p}-<type>'" for p in PREFIXES[scheme])
        raise ValueError(f"allowed_transitions={scheme!r} needs tag names 'O', {names}, received {tag!r}.")
    return parts


def _only_after_same_type(parts, prefix: str) -> Allowed:
    """IOB2 (`prefix` "I") and IOB1 (`prefix` "B"): a `prefix`-X tag only
    right after `B-X` or `I-X`, never first; every other move allowed."""
    allowed = np.ones((len(parts), len(parts)), bool)
    for j, (p_j, kind) in enumerate(parts):
        if p_j == prefix:
            allowed[:, j] = [p in ("B", "I") and k == kind for p, k in parts]
    start = np.array([p != prefix for p, _ in parts])
    return allowed, start, np.ones(len(parts), bool)


def _bioes(parts) -> Allowed:
    def may_follow(previous, following) -> bool:
        (p, p_kind), (f, f_kind) = previous, following
        if p in ("B", "I"):  # inside a chunk: continue or close it
            return f in ("I", "E") and f_kind == p_kind
        return f in ("O", "B", "S")

    allowed = np.array([[may_follow(p, f) for f in parts] for p in parts], bool)
    start = np.array([prefix in ("O", "B", "S") for prefix, _ in parts])
    end = np.array([prefix in ("O", "E", "S") for prefix, _ in parts])
    return allowed, start, end


_BUILDERS = {"iob2": lambda parts: _only_after_same_type(parts, "I"),
             "iob1": lambda parts: _only_after_same_type(parts, "B"), "bioes": _bioes}


def scheme_allowed(scheme: str, tags: Sequence[str]) -> Allowed:
    """`(allowed [K, K], start [K], end [K])`, bool, of `scheme` over `tags`.

    Args:
        scheme: One of `SCHEMES` (`"iob2"`, `"iob1"`, `"bioes"`).
        tags: The tag names, in the order of the CRF's tag ids.

    Raises:
        ValueError: an unknown scheme, or a tag name that does not fit it.

    Example:

    >>> from keras_birnn.crf.schemes import scheme_allowed
    >>> allowed, start, end = scheme_allowed("bioes", ["O", "B-X", "I-X", "E-X", "S-X"])
    >>> allowed[1].tolist(), start.tolist(), end.tolist()   # after B-X: I-X or E-X
    ([False, False, True, True, False], [True, True, False, False, True], [True, False, False, True, True])
    """
    if scheme not in _BUILDERS:
        raise ValueError(f"`allowed_transitions` must be one of {SCHEMES}, received {scheme!r}.")
    return _BUILDERS[scheme]([tag_parts(tag, scheme) for tag in tags])


def iob2_allowed(tags: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """IOB2's allowed transitions `[K, K]` (previous, next) and starts `[K]`
    (every end is allowed): `scheme_allowed("iob2", tags)[:2]`."""
    return scheme_allowed("iob2", tags)[:2]

