"""Spans of IOB1, IOB2 and BIOES tags, and their conlleval scores.

Pure Python. The rules are conlleval's (the CoNLL-2000 to 2003 shared
tasks' scorer), which `seqeval`'s default mode follows too; they read any
sequence, including ill-formed ones:

- a span starts at `B-X` or `S-X`; at `I-X` or `E-X` after `O`, after
  `E-*` or `S-*`, or at the sentence start; and at any tag whose type
  differs from the previous tag's;
- it goes on while the tags are `I-X` or `E-X` of its type, and ends
  after `E-X` or `S-X`, before `O`, `B-*`, `S-*`, a tag of another type,
  or the sentence end.

So an `I-X` after `O` starts a span (conlleval counts it; a CRF with the
scheme's constraints never predicts it). The scheme says which prefixes a
tag may have: IOB1 and IOB2 `O`, `B` and `I`; BIOES also `E` and `S`. With
those prefixes IOB1 and IOB2 read the same spans (IOB1 uses `B-X` only
between two spans of type X, IOB2 at every span's start; the rules above
cover both). A tag without a type (`B`, `I`) has type `""`.

`scored_spans` gives a tagged sentence's spans with a confidence each (the
mean of its tokens' confidences); `span_tables` writes the same rules as
tables over tag ids, for reading spans inside a graph
(`keras_birnn.tagging.export`).
"""

import dataclasses
from collections import Counter
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from keras_birnn.crf.schemes import PREFIXES, check_scheme, split_tag

OUTSIDE = "O"
SCHEMES = ("iob2", "bioes")  # tried in this order by `span_scheme`


class Span(NamedTuple):
    """A span of tags: its type, its first position and the position after its last."""

    type: str
    start: int
    end: int


def tag_parts(tag: str, scheme: str = "iob2") -> Tuple[str, str]:
    """(prefix, type) of one tag: `"O"` -> `("O", "")`, `"B-PER"` -> `("B", "PER")`.

    Raises a ValueError for a tag that is not `O`, `<P>` or `<P>-<type>`
    with a prefix `<P>` of the scheme (IOB1/IOB2: B, I; BIOES: B, I, E, S).
    """
    scheme = check_scheme(scheme)
    parts = split_tag(tag, scheme, typed=False)
    if parts is None:
        allowed = ", ".join(f"'{p}-<type>'" for p in PREFIXES[scheme])
        raise ValueError(f"A {scheme.upper()} tag is 'O', {allowed} (the type optional), received {tag!r}.")
    return parts


def _starts(previous: str, previous_kind: str, prefix: str, kind: str) -> bool:
    """Whether a tag `prefix-kind` after `previous-previous_kind` starts a span."""
    if prefix == OUTSIDE:
        return False
    return prefix in ("B", "S") or previous in ("O", "E", "S") or kind != previous_kind


def _ends(prefix: str, kind: str, following: str, following_kind: str) -> bool:
    """Whether the span of a tag `prefix-kind` ends before `following-following_kind`."""
    if prefix == OUTSIDE:
        return False
    return prefix in ("E", "S") or following in ("O", "B", "S") or kind != following_kind


def spans(tags: Sequence[str], scheme: str = "iob2") -> List[Span]:
    """The spans of one sentence's tags, by conlleval's rules (module docstring).

    Args:
        tags: The sentence's tags, e.g. `["B-PER", "I-PER", "O"]`.
        scheme: `"iob1"`, `"iob2"` or `"bioes"`: the prefixes allowed.

    Returns:
        `Span(type, start, end)` tuples (`end` exclusive), in order.

    Example:

    >>> from keras_birnn.tagging.spans import spans
    >>> spans(["B-PER", "I-PER", "O", "I-LOC", "B-LOC"])
    [Span(type='PER', start=0, end=2), Span(type='LOC', start=3, end=4), Span(type='LOC', start=4, end=5)]
    >>> spans(["S-PER", "B-LOC", "E-LOC"], scheme="bioes")
    [Span(type='PER', start=0, end=1), Span(type='LOC', start=1, end=3)]
    """
    parts = [tag_parts(tag, scheme) for tag in tags] + [(OUTSIDE, "")]
    found: List[Span] = []
    (previous, previous_kind), start = (OUTSIDE, ""), 0
    for i, (prefix, kind) in enumerate(parts[:-1]):
        if _starts(previous, previous_kind, prefix, kind):
            start = i
        if _ends(prefix, kind, *parts[i + 1]):
            found.append(Span(kind, start, i + 1))
        previous, previous_kind = prefix, kind
    return found


def span_scheme(tags: Sequence[str]) -> Optional[str]:
    """`"iob2"` when every tag is `O`, `B-X` or `I-X` (IOB1 reads the same
    spans), `"bioes"` when `E-X`/`S-X` also occur, else None (e.g. UPOS)."""
    for scheme in SCHEMES:
        try:
            [tag_parts(tag, scheme) for tag in tags]
        except ValueError:
            continue
        return scheme
    return None


def scored_spans(tags: Sequence[str], confidence: Sequence[float],
                 scheme: str = "iob2") -> List[Tuple[int, int, str, float]]:
    """The spans of one sentence's tags, each with a confidence.

    A span's confidence is the mean of its tokens' `confidence` (a tagger's
    per-token confidence: the CRF's marginal probability of the chosen tag,
    or a softmax's probability of it).

    Args:
        tags: The sentence's tags.
        confidence: One number per tag.
        scheme: `"iob1"`, `"iob2"` or `"bioes"` (`spans`).

    Returns:
        `(start, end, type, confidence)` tuples (`end` exclusive), in order.

    Example:

    >>> from keras_birnn.tagging.spans import scored_spans
    >>> scored_spans(["B-PER", "I-PER", "O"], [0.5, 0.75, 1.0])
    [(0, 2, 'PER', 0.625)]
    """
    if len(tags) != len(confidence):
        raise ValueError(f"Received {len(tags)} tags and {len(confidence)} confidences.")
    return [(start, end, kind, float(sum(confidence[start:end])) / (end - start))
            for kind, start, end in spans(tags, scheme)]


def span_tables(tags: Sequence[str], scheme: str = "iob2") -> Tuple[List[List[bool]], List[List[bool]], List[str]]:
    """`spans`'s rules over tag ids, for reading spans with array ops.

    Id `len(tags)` stands for the sentence's edges (before the first tag,
    after the last, and padding); it reads as `O`. A span starts at
    position t when `starts[id at t-1][id at t]` and ends after t when
    `ends[id at t][id at t+1]`; in any sentence, starts and ends alternate
    (the k-th start pairs with the k-th end).

    Args:
        tags: The tag names; tag id k is `tags[k]`.
        scheme: `"iob1"`, `"iob2"` or `"bioes"`.

    Returns:
        `(starts, ends, types)`: two `[K + 1, K + 1]` nested lists of bools
        and each tag's type (`""` for `O`).
    """
    parts = [tag_parts(tag, scheme) for tag in tags] + [(OUTSIDE, "")]
    starts = [[_starts(*previous, *current) for current in parts] for previous in parts]
    ends = [[_ends(*current, *following) for following in parts] for current in parts]
    return starts, ends, [kind for _, kind in parts[:-1]]


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


@dataclasses.dataclass(frozen=True)
class SpanScores:
    """conlleval's counts and scores, over all types (micro) or of one type.

    `precision = correct / predicted`, `recall = correct / gold`, `f1 = 2PR /
    (P + R)`, each 0.0 where its denominator is 0. `types` maps each type
    found in the gold or predicted spans to its own `SpanScores` (empty in
    those). `macro_f1`: the mean of the types' F1 (seqeval's macro average).
    """

    precision: float
    recall: float
    f1: float
    gold: int
    predicted: int
    correct: int
    types: Dict[str, "SpanScores"] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_counts(cls, gold: int, predicted: int, correct: int, types=None) -> "SpanScores":
        precision, recall = _ratio(correct, predicted), _ratio(correct, gold)
        f1 = _ratio(2 * precision * recall, precision + recall)
        return cls(precision, recall, f1, gold, predicted, correct, dict(types or {}))

    @property
    def macro_f1(self) -> float:
        return _ratio(sum(t.f1 for t in self.types.values()), len(self.types))

    def as_dict(self, types: bool = True) -> dict:
        """Plain dicts: the scores and counts, and with `types` a `"types"`
        dict of each type's (without a `"types"` of their own)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "types"}
        if not types:
            return fields
        return dict(fields, types={kind: scores.as_dict(types=False) for kind, scores in self.types.items()})

    def __repr__(self) -> str:
        head = (f"P={100 * self.precision:.2f} R={100 * self.recall:.2f} F1={100 * self.f1:.2f} "
                f"(gold {self.gold}, predicted {self.predicted}, correct {self.correct})")
        types = "".join(f"\n  {kind or '<no type>'}: {scores!r}" for kind, scores in self.types.items())
        return f"SpanScores({head}){types}"


def span_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]],
                scheme: str = "iob2") -> SpanScores:
    """conlleval's precision, recall and F1 of predicted tags against gold ones.

    A predicted span is correct when a gold span of the same sentence has
    the same start, end and type. Counts add up over all sentences (micro
    average); `types` holds each type's own scores, sorted by type.

    Args:
        gold: Gold tags, one sequence per sentence.
        predicted: Predicted tags, the same number of sentences and lengths.
        scheme: `"iob1"`, `"iob2"` or `"bioes"` (`spans`).

    Example:

    >>> from keras_birnn.tagging.spans import span_scores
    >>> s = span_scores([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "O"]])
    >>> s.precision, s.recall, round(s.f1, 4), s.types["LOC"].recall
    (1.0, 0.5, 0.6667, 0.0)
    """
    scheme = check_scheme(scheme)
    if len(gold) != len(predicted):
        raise ValueError(f"`gold` has {len(gold)} sentences and `predicted` {len(predicted)}.")
    counts: Dict[str, Counter] = {}
    for i, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"Sentence {i} has {len(g)} gold tags and {len(p)} predicted ones.")
        gold_spans, predicted_spans = set(spans(g, scheme)), set(spans(p, scheme))
        found = {"gold": gold_spans, "predicted": predicted_spans, "correct": gold_spans & predicted_spans}
        for name, spans_found in found.items():
            for span in spans_found:
                counts.setdefault(span.type, Counter())[name] += 1
    total = sum(counts.values(), Counter())
    types = {kind: SpanScores.from_counts(c["gold"], c["predicted"], c["correct"]) for kind, c in sorted(counts.items())}
    return SpanScores.from_counts(total["gold"], total["predicted"], total["correct"], types)


def convert_tags(tags: Sequence[str], source: str, target: str) -> List[str]:
    """The same spans (`spans(tags, source)`) written in the `target` scheme.

    IOB2 and BIOES spans start with `B-X` (BIOES: `S-X` for one tag, and
    `E-X` at the end of a longer span); IOB1 writes `B-X` only at a span
    that directly follows a span of type X. Ill-formed input (an `I-X`
    after `O`) comes out well-formed with the same spans.

    Example:

    >>> from keras_birnn.tagging.spans import convert_tags
    >>> convert_tags(["I-PER", "I-PER", "O", "I-LOC"], "iob1", "bioes")
    ['B-PER', 'E-PER', 'O', 'S-LOC']
    """
    target = check_scheme(target, "target")
    out = [OUTSIDE] * len(tags)
    previous = None
    for kind, start, end in spans(tags, check_scheme(source, "source")):
        suffix = f"-{kind}" if kind else ""
        first = "B" if target != "iob1" or (previous is not None and previous == (kind, start)) else "I"
        out[start:end] = [first + suffix] + ["I" + suffix] * (end - start - 1)
        if target == "bioes":
            out[end - 1] = ("S" if end - start == 1 else "E") + suffix
        previous = (kind, end)
    return out
