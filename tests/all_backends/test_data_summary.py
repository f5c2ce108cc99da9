"""keras_birnn.data.summary: counts, labels, scheme violations, OOV rates and
length percentiles of a small corpus, against hand-computed numbers and
NumPy; the printed report. Plain Python (no TensorFlow), on every backend."""

import numpy as np
import pytest

from keras_birnn.data.readers import read_conll
from keras_birnn.data.summary import MAX_EXAMPLES, Violation, format_summary, percentile, summarize


def sentence(words, tags):
    return {"tokens": words.split(), "tags": tags.split()}


TRAIN = [
    sentence("EU rejects German call .", "B-ORG O B-MISC O O"),
    sentence("Peter Blackburn", "I-PER I-PER"),  # IOB2: I-PER starts the sentence
    sentence("The EU said", "O I-ORG O"),  # IOB2: I-ORG after O
    sentence("Rio de Janeiro", "B-LOC I-LOC I-MISC"),  # IOB2: I-MISC after I-LOC
    sentence("a", "O"),
]
DEV = [
    sentence("EU says no", "B-ORG O O"),
    sentence("Peter Pan said EU", "B-PER I-PER O B-ORG"),
    sentence("Dull", "B-EVT"),
]


def test_counts_labels_and_unseen_labels():
    s = summarize(TRAIN, DEV)
    assert s.sentences == {"train": 5, "dev": 3}
    assert s.tokens == {"train": 14, "dev": 8}
    assert s.labels["train"] == {"O": 6, "I-PER": 2, "B-LOC": 1, "B-MISC": 1, "B-ORG": 1, "I-LOC": 1,
                                 "I-MISC": 1, "I-ORG": 1}
    assert list(s.labels["train"])[:2] == ["O", "I-PER"]  # most frequent first
    assert s.labels["dev"] == {"O": 3, "B-ORG": 2, "B-EVT": 1, "B-PER": 1, "I-PER": 1}
    assert s.unseen_labels == ["B-EVT", "B-PER"]
    assert (s.scheme, s.violation_count, s.violations) == (None, 0, [])


def test_oov_rates_by_hand_and_by_sets():
    s = summarize(TRAIN, DEV)
    # Dev tokens EU says no Peter Pan said EU Dull: says, no, Pan, Dull are
    # not in train (4 of 8 tokens); 7 distinct, 4 of them new.
    assert s.oov_token_rate == 0.5
    assert s.oov_type_rate == pytest.approx(4 / 7)
    vocabulary = {t for x in TRAIN for t in x["tokens"]}
    dev_tokens = [t for x in DEV for t in x["tokens"]]
    assert s.oov_token_rate == np.mean([t not in vocabulary for t in dev_tokens])
    assert s.oov_type_rate == pytest.approx(len(set(dev_tokens) - vocabulary) / len(set(dev_tokens)))
    assert summarize(TRAIN, TRAIN).oov_token_rate == 0.0
    none = summarize(TRAIN)
    assert (none.oov_token_rate, none.oov_type_rate, none.unseen_labels) == (None, None, [])
    assert set(none.sentences) == {"train"}


def test_length_percentiles_by_hand_and_numpy():
    lengths = summarize(TRAIN, DEV).lengths
    # Train lengths sorted 1 2 3 3 5: rank q/100 * 4, interpolated.
    assert lengths["train"] == pytest.approx({"p50": 3.0, "p90": 4.2, "p95": 4.6, "p99": 4.92, "max": 5.0})
    assert lengths["dev"] == pytest.approx({"p50": 3.0, "p90": 3.8, "p95": 3.9, "p99": 3.98, "max": 4.0})
    rng = np.random.default_rng(0)
    for size in (1, 2, 7, 100, 1001):
        values = rng.integers(1, 80, size).tolist()
        corpus = [{"tokens": ["w"] * n} for n in values]
        found = summarize(corpus).lengths["train"]
        for q in (50, 90, 95, 99):
            assert found[f"p{q}"] == pytest.approx(np.percentile(values, q), abs=1e-9), (size, q)
            assert percentile(values, q) == pytest.approx(np.percentile(values, q), abs=1e-9)
        assert found["max"] == max(values)
    assert percentile([], 50) == 0.0


def test_iob2_violations():
    s = summarize(TRAIN, DEV, scheme="IOB2")
    assert s.scheme == "iob2" and s.violation_count == 3
    assert s.violations == [
        Violation("train", 1, 0, "I-PER", "I-PER cannot start a sentence"),
        Violation("train", 2, 1, "I-ORG", "I-ORG cannot follow O"),
        Violation("train", 3, 2, "I-MISC", "I-MISC cannot follow I-LOC"),
    ]


def test_iob1_violations():
    # IOB1: B-X only right after a span of X.
    s = summarize(TRAIN, DEV, scheme="iob1")
    assert [(v.split, v.sentence, v.position, v.reason) for v in s.violations] == [
        ("train", 0, 0, "B-ORG cannot start a sentence"),
        ("train", 0, 2, "B-MISC cannot follow O"),
        ("train", 3, 0, "B-LOC cannot start a sentence"),
        ("dev", 0, 0, "B-ORG cannot start a sentence"),
        ("dev", 1, 0, "B-PER cannot start a sentence"),
        ("dev", 1, 3, "B-ORG cannot follow O"),
        ("dev", 2, 0, "B-EVT cannot start a sentence"),
    ]
    assert s.violation_count == 7


@pytest.mark.parametrize("tags, expected", [
    ("S-X", []),
    ("B-X E-X O", []),
    ("B-X O", [(1, "O cannot follow B-X")]),
    ("I-X", [(0, "I-X cannot start a sentence"), (0, "I-X cannot end a sentence")]),
    ("B-X E-Y", [(1, "E-Y cannot follow B-X")]),
    ("O B-X", [(1, "B-X cannot end a sentence")]),
    ("O Z-X O", [(1, "Z-X does not fit BIOES")]),
])
def test_bioes_violations(tags, expected):
    s = summarize([sentence(" ".join(["w"] * len(tags.split())), tags)], scheme="bioes")
    assert [(v.position, v.reason) for v in s.violations] == expected
    assert s.violation_count == len(expected)


def test_tags_outside_the_scheme_and_bare_prefixes():
    corpus = [sentence("a b c", "O S-X I-X"), sentence("a b", "B I"), sentence("a b", "O I")]
    s = summarize(corpus, scheme="iob2")
    # S-X is no IOB2 tag; the I-X after it is not judged against it.
    assert [(v.sentence, v.position, v.reason) for v in s.violations] == [
        (0, 1, "S-X does not fit IOB2"), (2, 1, "I cannot follow O")]


def test_examples_are_capped_but_all_are_counted():
    corpus = [sentence("a", "I-X")] * (MAX_EXAMPLES + 5)
    s = summarize(corpus, scheme="iob2")
    assert s.violation_count == MAX_EXAMPLES + 5
    assert [v.sentence for v in s.violations] == list(range(MAX_EXAMPLES))
    untagged = summarize([{"tokens": ["a", "b"]}], [{"tokens": ["c"]}], scheme="iob2")
    assert (untagged.labels, untagged.violation_count, untagged.oov_token_rate) == ({"train": {}, "dev": {}}, 0, 1.0)


def test_summary_of_read_files(tmp_path):
    (tmp_path / "train.conll").write_text("EU I-ORG\nsaid O\n\nPeter I-PER\n", encoding="utf-8")
    (tmp_path / "dev.conll").write_text("EU I-ORG\nslept O\n", encoding="utf-8")
    train = read_conll(tmp_path / "train.conll", scheme="iob1", to_scheme="iob2")
    dev = read_conll(tmp_path / "dev.conll", scheme="iob1", to_scheme="iob2")
    s = summarize(train, dev, scheme="iob2")
    assert (s.violation_count, s.oov_token_rate, s.labels["train"]) == (0, 0.5, {"B-ORG": 1, "B-PER": 1, "O": 1})
    # The same files unconverted break IOB2 twice.
    raw = summarize(read_conll(tmp_path / "train.conll"), scheme="iob2")
    assert [(v.sentence, v.position) for v in raw.violations] == [(0, 0), (1, 0)]


def test_format_summary():
    text = format_summary(summarize(TRAIN, DEV, scheme="iob2"))
    lines = text.splitlines()
    assert lines[:8] == [
        "Splits      train  dev",
        "sentences       5    3",
        "tokens         14    8",
        "length p50    3.0  3.0",
        "length p90    4.2  3.8",
        "length p95    4.6  3.9",
        "length p99    4.9  4.0",
        "length max    5.0  4.0",
    ]
    assert lines[9:12] == ["Labels  train  dev", "O           6    3", "I-PER       2    1"]
    assert "B-EVT       0    1" in lines
    assert "Dev labels never in train: B-EVT, B-PER" in lines
    assert "Dev out of train vocabulary: 50.00% of tokens, 57.14% of types" in lines
    assert lines[-4:] == [
        "IOB2 violations: 3",
        "  train sentence 1, position 0: I-PER cannot start a sentence",
        "  train sentence 2, position 1: I-ORG cannot follow O",
        "  train sentence 3, position 2: I-MISC cannot follow I-LOC",
    ]
    plain = format_summary(summarize([{"tokens": ["a"]}]))
    assert plain.splitlines()[0] == "Splits      train" and "Labels" not in plain and "vocabulary" not in plain
