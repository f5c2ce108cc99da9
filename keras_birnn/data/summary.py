"""A corpus summary before training, in the spirit of `spacy debug data`.

`summarize(train, dev)` reads sentence dicts (`{"tokens": [...], "tags":
[...]}`, as `read_conll`, `read_conllu_column` and `read_tagged_lines`
return) and counts what tends to go wrong silently: tags that break the
tagging scheme, dev labels never seen in training, the share of dev
tokens missing from the training vocabulary, and how long the sentences
are (which sets padding and bucketing). `format_summary` prints it.

Plain Python, on every backend.
"""

import dataclasses
import math
from collections import Counter
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from keras_birnn.crf.schemes import check_scheme, scheme_allowed, split_tag

SentenceDict = Mapping[str, Sequence[str]]
# A tag's row in the scheme's arrays, and `(allowed, start, end)` (crf.schemes).
Checker = Tuple[Dict[str, int], np.ndarray, np.ndarray, np.ndarray]
PERCENTILES = (50, 90, 95, 99)
# Violations kept as examples; `violation_count` counts them all.
MAX_EXAMPLES = 10


@dataclasses.dataclass(frozen=True)
class Violation:
    """A tag that breaks the scheme: where it is and why.

    Attributes:
        split: `"train"` or `"dev"`.
        sentence: The sentence's index in its split (0-based).
        position: The token's index in the sentence (0-based).
        tag: The tag.
        reason: E.g. `"I-LOC cannot follow O"`, `"S-X does not fit IOB2"`.
    """

    split: str
    sentence: int
    position: int
    tag: str
    reason: str


@dataclasses.dataclass(frozen=True)
class CorpusSummary:
    """What `summarize` found. Per-split dicts are keyed `"train"` and, when
    a dev split was given, `"dev"`.

    Attributes:
        sentences: Sentences per split.
        tokens: Tokens per split.
        labels: Per split, each tag's count, most frequent first.
        unseen_labels: Dev tags that train never has, sorted.
        scheme: The scheme checked (lower case), or None.
        violation_count: Tags that break the scheme, both splits.
        violations: The first `MAX_EXAMPLES` of them, train first.
        oov_token_rate: Share of dev tokens absent from train's tokens (None without dev).
        oov_type_rate: Share of distinct dev tokens absent from train's (None without dev).
        lengths: Per split, sentence-length percentiles `"p50"`, `"p90"`,
            `"p95"`, `"p99"` (linear interpolation, NumPy's default) and `"max"`.
    """

    sentences: Dict[str, int]
    tokens: Dict[str, int]
    labels: Dict[str, Dict[str, int]]
    unseen_labels: List[str]
    scheme: Optional[str]
    violation_count: int
    violations: List[Violation]
    oov_token_rate: Optional[float]
    oov_type_rate: Optional[float]
    lengths: Dict[str, Dict[str, float]]


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile of `values` by linear interpolation between
    the closest ranks (NumPy's default method); 0.0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def length_percentiles(sentences: Sequence[SentenceDict]) -> Dict[str, float]:
    """`{"p50": ..., "p90": ..., "p95": ..., "p99": ..., "max": ...}` of the sentences' token counts."""
    lengths = [len(sentence["tokens"]) for sentence in sentences]
    found = {f"p{q}": float(percentile(lengths, q)) for q in PERCENTILES}
    return dict(found, max=float(max(lengths, default=0)))


def oov_rates(train: Sequence[SentenceDict], dev: Sequence[SentenceDict]) -> Tuple[float, float]:
    """`(token rate, type rate)` of dev tokens absent from train's tokens
    (case-sensitive); 0.0 for an empty dev split."""
    vocabulary = {token for sentence in train for token in sentence["tokens"]}
    dev_tokens = [token for sentence in dev for token in sentence["tokens"]]
    dev_types = set(dev_tokens)
    missing_tokens = sum(token not in vocabulary for token in dev_tokens)
    missing_types = len(dev_types - vocabulary)
    return (missing_tokens / len(dev_tokens) if dev_tokens else 0.0,
            missing_types / len(dev_types) if dev_types else 0.0)


def scheme_checker(scheme: str, tags: Sequence[str]) -> Checker:
    """`(index, allowed, start, end)` of `scheme` (`crf.schemes.scheme_allowed`)
    over the tags that fit it; `index` maps each such tag to its row."""
    fitting = []
    for tag in sorted(set(tags)):
        parts = split_tag(tag, scheme, typed=False)
        if parts is not None:
            # A bare prefix ("B") has type "" for span reading; scheme_allowed
            # needs a type, so it gets one that no real tag has.
            fitting.append((tag, tag if parts[1] or tag == "O" else f"{tag}-\x00"))
    allowed, start, end = scheme_allowed(scheme, [typed for _, typed in fitting])
    return {tag: i for i, (tag, _) in enumerate(fitting)}, allowed, start, end


def sentence_violations(tags: Sequence[str], checker: Checker, scheme: str) -> List[Tuple[int, str]]:
    """`(position, reason)` of each tag of one sentence that breaks the scheme."""
    index, allowed, start, end = checker
    found = []
    for position, tag in enumerate(tags):
        if tag not in index:
            found.append((position, f"{tag} does not fit {scheme.upper()}"))
        elif position == 0 and not start[index[tag]]:
            found.append((position, f"{tag} cannot start a sentence"))
        elif position > 0 and tags[position - 1] in index and not allowed[index[tags[position - 1]], index[tag]]:
            found.append((position, f"{tag} cannot follow {tags[position - 1]}"))
        if position == len(tags) - 1 and tag in index and not end[index[tag]]:
            found.append((position, f"{tag} cannot end a sentence"))
    return found


def find_violations(splits: Mapping[str, Sequence[SentenceDict]], scheme: str) -> Tuple[int, List[Violation]]:
    """The count of scheme violations over `splits` and the first `MAX_EXAMPLES`."""
    all_tags = [tag for sentences in splits.values() for sentence in sentences for tag in sentence.get("tags", ())]
    checker = scheme_checker(scheme, all_tags)
    count, examples = 0, []
    for split, sentences in splits.items():
        for i, sentence in enumerate(sentences):
            tags = list(sentence.get("tags", ()))
            for position, reason in sentence_violations(tags, checker, scheme):
                count += 1
                if len(examples) < MAX_EXAMPLES:
                    examples.append(Violation(split, i, position, tags[position], reason))
    return count, examples


def label_counts(sentences: Sequence[SentenceDict]) -> Dict[str, int]:
    """Each tag's count over the sentences' "tags", most frequent first (ties by name)."""
    counts = Counter(tag for sentence in sentences for tag in sentence.get("tags", ()))
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def summarize(train: Sequence[SentenceDict], dev: Optional[Sequence[SentenceDict]] = None,
              scheme: Optional[str] = None) -> CorpusSummary:
    """Counts, label statistics, scheme violations, dev OOV rates and
    sentence-length percentiles of a tagging corpus.

    Args:
        train: Training sentences, each a dict with a "tokens" list and
            (for the label counts and the scheme check) a "tags" list.
        dev: Development sentences, or None (no OOV rates, no unseen labels).
        scheme: `"iob1"`, `"iob2"` or `"bioes"` to check the tags against
            (`crf.schemes`: e.g. an IOB2 `I-X` must continue a span of X), or None.

    Returns:
        A `CorpusSummary`.

    Example:

    >>> from keras_birnn.data.summary import summarize
    >>> train = [{"tokens": ["EU", "rejects", "it"], "tags": ["B-ORG", "O", "O"]},
    ...          {"tokens": ["Peter", "Blackburn"], "tags": ["I-PER", "I-PER"]}]
    >>> dev = [{"tokens": ["EU", "says"], "tags": ["B-ORG", "O"]}]
    >>> s = summarize(train, dev, scheme="iob2")
    >>> s.tokens, s.oov_token_rate, s.violation_count, s.violations[0].reason
    ({'train': 5, 'dev': 2}, 0.5, 1, 'I-PER cannot start a sentence')
    """
    splits = {"train": train} if dev is None else {"train": train, "dev": dev}
    scheme = None if scheme is None else check_scheme(scheme)
    count, examples = find_violations(splits, scheme) if scheme else (0, [])
    labels = {name: label_counts(sentences) for name, sentences in splits.items()}
    oov = oov_rates(train, dev) if dev is not None else (None, None)
    return CorpusSummary(
        sentences={name: len(sentences) for name, sentences in splits.items()},
        tokens={name: sum(len(s["tokens"]) for s in sentences) for name, sentences in splits.items()},
        labels=labels,
        unseen_labels=sorted(set(labels.get("dev", {})) - set(labels["train"])),
        scheme=scheme,
        violation_count=count,
        violations=examples,
        oov_token_rate=oov[0],
        oov_type_rate=oov[1],
        lengths={name: length_percentiles(sentences) for name, sentences in splits.items()},
    )


def table(rows: Sequence[Sequence[str]]) -> List[str]:
    """Rows of cells as lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
            .rstrip() for row in rows]


def format_summary(summary: CorpusSummary) -> str:
    """A readable report of a `CorpusSummary`: one table of the splits'
    counts and lengths, one of the label counts, then OOV and violations.

    Args:
        summary: What `summarize` returned.

    Returns:
        The report, lines joined by "\\n".

    Example:

    >>> from keras_birnn.data.summary import format_summary, summarize
    >>> print(format_summary(summarize([{"tokens": ["a", "b"], "tags": ["B-X", "I-X"]}])))
    Splits      train
    sentences       1
    tokens          2
    length p50    2.0
    ...
    """
    names = list(summary.sentences)
    rows = [["Splits", *names], ["sentences", *(str(summary.sentences[n]) for n in names)],
            ["tokens", *(str(summary.tokens[n]) for n in names)]]
    for key in summary.lengths[names[0]]:
        rows.append([f"length {key}", *(f"{summary.lengths[n][key]:.1f}" for n in names)])
    lines = table(rows) + [""]
    labels = sorted({tag for n in names for tag in summary.labels[n]},
                    key=lambda tag: (-summary.labels[names[0]].get(tag, 0), tag))
    if labels:
        lines += table([["Labels", *names]] + [[t, *(str(summary.labels[n].get(t, 0)) for n in names)] for t in labels])
        lines.append("")
    if summary.unseen_labels:
        lines.append(f"Dev labels never in train: {', '.join(summary.unseen_labels)}")
    if summary.oov_token_rate is not None:
        lines.append(f"Dev out of train vocabulary: {100 * summary.oov_token_rate:.2f}% of tokens, "
                     f"{100 * summary.oov_type_rate:.2f}% of types")
    if summary.scheme is not None:
        lines.append(f"{summary.scheme.upper()} violations: {summary.violation_count}")
        lines += [f"  {v.split} sentence {v.sentence}, position {v.position}: {v.reason}" for v in summary.violations]
    return "\n".join(lines).rstrip("\n")
