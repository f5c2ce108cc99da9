"""keras_birnn/tagging/spans.py: conlleval's spans and scores of IOB1, IOB2
and BIOES tags, on hand-computed cases, against seqeval's default mode (the
conlleval rules) on 100 random corpora per scheme with ill-formed sequences,
and on IOB2 against examples/conll_tagging.py's scorer (TensorFlow run: the
example imports TensorFlow). Pure Python: the same on every backend."""

import random
import warnings
from typing import List

import pytest

from keras_birnn.tagging.spans import SpanScores, convert_tags, span_scores, spans, tag_parts

TYPES = ("PER", "LOC", "ORG")
PREFIXES = {"iob1": "BI", "iob2": "BI", "bioes": "BIES"}


def random_tags(rng: random.Random, scheme: str, length: int) -> List[str]:
    """Half well-formed sentences (random spans written in the scheme), half
    tag soup: `I-X` after `O`, type changes inside spans, `E-X` alone ..."""
    if rng.random() < 0.5:
        return [rng.choice(["O", "O"] + [f"{p}-{t}" for p in PREFIXES[scheme] for t in TYPES]) for _ in range(length)]
    tags, i = ["O"] * length, 0
    while i < length:
        size = rng.choice([0, 0, 1, 1, 2, 3])
        if size:
            tags[i:i + size] = [f"I-{rng.choice(TYPES)}"] * min(size, length - i)
            tags[i] = tags[i].replace("I-", "B-")
        i += max(size, 1) + rng.choice([0, 1])
    return convert_tags(tags, "iob2", scheme)


def random_corpus(seed: int, scheme: str):
    """(gold, predicted): predicted is the gold with a quarter of its tags redrawn."""
    rng = random.Random(seed)
    gold = [random_tags(rng, scheme, rng.randint(0, 12)) for _ in range(rng.randint(1, 20))]
    predicted = [[t if rng.random() < 0.75 else rng.choice(random_tags(rng, scheme, 3)) for t in s] for s in gold]
    return gold, predicted


def seqeval_report(gold, predicted, scheme: str) -> dict:
    from seqeval.metrics import classification_report
    from seqeval.scheme import IOB1, IOB2, IOBES

    # The default mode (no mode="strict") scores by conlleval's rules and
    # ignores `scheme`; passed all the same, as a caller would.
    scheme_class = {"iob1": IOB1, "iob2": IOB2, "bioes": IOBES}[scheme]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return classification_report(gold, predicted, output_dict=True, scheme=scheme_class, zero_division=0)


# --- hand-computed cases -------------------------------------------------------------------------


def test_spans_follow_conlleval_on_iob():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "I-ORG", "O", "I-MISC"]
    # B-LOC after B-LOC starts a span; I-ORG after I-LOC starts one (a type
    # change); I-MISC after O starts one; the sentence end closes the last.
    expected = [("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 6), ("ORG", 6, 7), ("MISC", 8, 9)]
    for scheme in ("iob1", "iob2"):
        assert spans(tags, scheme) == expected
    assert spans(["I-PER", "I-PER", "B-PER"], "iob1") == [("PER", 0, 2), ("PER", 2, 3)]
    assert spans(["O", "O"]) == [] and spans([]) == []
    assert spans(["B", "I", "O", "I"]) == [("", 0, 2), ("", 3, 4)]  # tags without a type


def test_spans_follow_conlleval_on_bioes():
    tags = ["S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC", "O", "I-ORG", "B-ORG", "E-PER", "S-ORG", "I-ORG"]
    # E-LOC after E-LOC: a span of one; I-ORG after O starts one, ended by B-ORG;
    # E-PER after B-ORG: a type change; I-ORG after S-ORG starts one.
    expected = [("PER", 0, 1), ("LOC", 1, 4), ("LOC", 4, 5), ("ORG", 6, 7), ("ORG", 7, 8), ("PER", 8, 9),
                ("ORG", 9, 10), ("ORG", 10, 11)]
    assert spans(tags, "bioes") == expected


@pytest.mark.parametrize("tag, scheme", [("E-PER", "iob2"), ("S-PER", "iob1"), ("X-PER", "bioes"), ("O-PER", "iob2"),
                                         ("B-", "iob2"), ("", "iob2"), (None, "iob2"), ("NOUN", "bioes")])
def test_bad_tags_are_named(tag, scheme):
    with pytest.raises(ValueError, match=f"{scheme.upper()} tag .*received {tag!r}"):
        spans(["O", tag], scheme)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="`scheme` must be one of .*received 'bilou'"):
        spans(["O"], "bilou")
    with pytest.raises(ValueError, match="`gold` has 2 sentences and `predicted` 1"):
        span_scores([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="Sentence 0 has 2 gold tags and 1 predicted"):
        span_scores([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="`target` must be one of"):
        convert_tags(["O"], "iob2", "bilou")


def test_span_scores_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O", "B-PER"], ["O", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"],  # PER right; LOC missed, ORG of the wrong type
                 ["B-ORG", "I-ORG", "O", "O", "I-PER"],  # ORG too short; I-PER starts a right PER
                 ["B-MISC", "O"]]  # a spurious span
    scores = span_scores(gold, predicted)
    assert (scores.gold, scores.predicted, scores.correct) == (4, 5, 2)
    assert scores.precision == pytest.approx(2 / 5) and scores.recall == pytest.approx(2 / 4)
    assert scores.f1 == pytest.approx(2 * 0.4 * 0.5 / 0.9)
    assert list(scores.types) == ["LOC", "MISC", "ORG", "PER"] and scores.types["PER"].f1 == 1.0
    assert scores.types["MISC"] == SpanScores(0.0, 0.0, 0.0, 0, 1, 0)
    assert scores.macro_f1 == pytest.approx(1 / 4)  # PER 1, the others 0
    assert span_scores([["O"]], [["O"]]).f1 == 0.0  # nothing to find, nothing found
    assert "F1=44.44 (gold 4, predicted 5, correct 2)" in repr(scores) and "\n  PER: " in repr(scores)


def test_tag_parts():
    assert tag_parts("O") == ("O", "") and tag_parts("B-PER") == ("B", "PER")
    assert tag_parts("I-B-X", "iob1") == ("I", "B-X") and tag_parts("S", "bioes") == ("S", "")


@pytest.mark.parametrize("target", ["iob2", "iob1", "bioes"])
def test_convert_tags_keeps_the_spans(target):
    for seed in range(50):
        for tags in random_corpus(seed, "bioes")[0]:
            converted = convert_tags(tags, "bioes", target)
            assert spans(converted, target) == spans(tags, "bioes")
            assert convert_tags(converted, target, target) == converted  # well-formed: unchanged
    assert convert_tags(["B-X", "I-X", "B-X", "O", "I-Y"], "iob2", "iob1") == ["I-X", "I-X", "B-X", "O", "I-Y"]


# --- against seqeval and the example -------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["iob2", "iob1", "bioes"])
def test_span_scores_equal_seqeval(scheme):
    pytest.importorskip("seqeval")
    for seed in range(100):
        gold, predicted = random_corpus(seed, scheme)
        ours, theirs = span_scores(gold, predicted, scheme), seqeval_report(gold, predicted, scheme)
        micro = theirs["micro avg"]
        assert (ours.precision, ours.recall, ours.f1, ours.gold) == pytest.approx(
            (micro["precision"], micro["recall"], micro["f1-score"], micro["support"]), abs=1e-12), seed
        per_type = {k: v for k, v in theirs.items() if not k.endswith(" avg")}
        assert sorted(per_type) == list(ours.types), seed
        for kind, v in per_type.items():
            s = ours.types[kind]
            assert (s.precision, s.recall, s.f1, s.gold) == pytest.approx(
                (v["precision"], v["recall"], v["f1-score"], v["support"]), abs=1e-12), (seed, kind)
        if per_type:
            assert ours.macro_f1 == pytest.approx(theirs["macro avg"]["f1-score"], abs=1e-12), seed


