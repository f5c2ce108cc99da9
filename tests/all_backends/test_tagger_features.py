"""keras_birnn/tagging/tagger.py's feature columns and spans, on every backend.

A chunker whose tags follow from a POS-like feature alone (the words are
drawn at random) must learn them, where a words-only tagger cannot; the
feature ids are checked against the vocabulary rule written out here
(StringLookup's: 0 = "", 1 = unseen, sorted values from 2); `predict`'s
tags, confidences and spans against the network run by hand on those ids
and the CRF's marginals by enumerating every tag path (`crf_reference.py`),
the spans read by a reader written here; a saved -> loaded (safe mode) copy
predicts the same.
"""

import numpy as np
import pytest

import crf_reference as ref
import keras
import keras_birnn as kb
from backend_harness import to_numpy
from keras_birnn.tagging.batching import EncodedSentences, pad_batch
from keras_birnn.tagging.tagger import TaggedSentence, Tagger

WORDS = [f"w{i}" for i in range(12)]
CHUNKS = {"DT": "B-NP", "NN": "I-NP", "VB": "O"}  # the feature decides the tag


def corpus(count, seed):
    """`count` sentences: random words, POS drawn as chunks (DT NN*, or VB), their chunk tags."""
    rng = np.random.default_rng(seed)
    tokens, pos, tags = [], [], []
    for _ in range(count):
        column, length = [], int(rng.integers(3, 8))
        while len(column) < length:
            column += ["VB"] if rng.random() < 0.4 else ["DT"] + ["NN"] * int(rng.integers(0, 3))
        tokens.append([str(w) for w in rng.choice(WORDS, len(column))])
        pos.append(column)
        tags.append([CHUNKS[p] for p in column])
    return {"tokens": tokens, "pos": pos}, tags


TRAIN, TRAIN_TAGS = corpus(80, 0)
TEST, TEST_TAGS = corpus(30, 1)
QUERIES = {"tokens": [["w1", "Zebra", "w2"], ["w3"], ["w4", "w5", "w6", "w7", "w8"], ["w9", "w0"]],
           "pos": [["DT", "XX", "VB"], ["NN"], ["VB", "DT", "NN", "NN", "VB"], ["DT", "NN"]]}


def trained(x, y):
    keras.utils.set_random_seed(0)
    model = Tagger.from_sentences(x, y, embedding_dim=4, feature_dim=4, hidden=8)
    model.compile(keras.optimizers.Adam(0.05))
    model.fit(x, y, batch_size=16, epochs=8, seed=0, verbose=0)
    return model


@pytest.fixture(scope="module")
def chunker():
    return trained(TRAIN, TRAIN_TAGS)


def best_accuracy_without_the_feature(tags):
    """The accuracy of the best tagger that knows each token's position and
    its sentence's length only (the words are random): per (length,
    position), the most frequent tag of these very sentences."""
    groups = {}
    for names in tags:
        for i, name in enumerate(names):
            groups.setdefault((len(names), i), []).append(name)
    best = sum(max(group.count(t) for t in set(group)) for group in groups.values())
    return best / sum(map(len, tags))


def test_the_feature_decides_the_tag(chunker):
    assert chunker.feature_vocabularies == {"pos": ["DT", "NN", "VB"]} and chunker.scheme == "iob2"
    scores = chunker.evaluate(TEST, TEST_TAGS)
    assert best_accuracy_without_the_feature(TEST_TAGS) < 0.8  # so the threshold below needs the feature
    assert scores["accuracy"] >= 0.97 and scores["f1"] >= 0.95


@pytest.mark.slow(reason="trains a second tagger (about 40 to 70 s on JAX and PyTorch on 2 cores)")
def test_a_words_only_tagger_cannot(chunker):
    words_only = trained(TRAIN["tokens"], TRAIN_TAGS)  # the same tagger without the feature
    assert words_only.evaluate(TEST["tokens"], TEST_TAGS)["accuracy"] < 0.8


def test_encode_and_training_batch_carry_the_feature_ids(chunker):
    encoded = chunker.encode(QUERIES)
    # Sorted vocabulary DT, NN, VB -> 2, 3, 4; "XX" was never seen -> 1.
    assert [ids.tolist() for ids in encoded.features["pos"]] == [[2, 1, 4], [3], [4, 2, 3, 3, 4], [2, 3]]
    assert EncodedSentences([], [], None).features is None
    words, pos = pad_batch(encoded, [1, 3], with_chars=False)
    assert pos.tolist() == [[3, 0], [2, 3]] and words[0, 1] == 0
    tagged = chunker.encode(TRAIN, TRAIN_TAGS)
    (words, pos), labels = chunker.training_batch(tagged, np.array([0, 1]), np.random.default_rng(0), 0.5)
    assert words.shape == pos.shape == labels.shape and words.shape[1] % 8 == 0
    assert pos[0, :len(TRAIN["pos"][0])].tolist() == [2 + ["DT", "NN", "VB"].index(p) for p in TRAIN["pos"][0]]
    assert (pos[words == 0] == 0).all()


def test_the_wrong_form_of_strings_is_refused(chunker):
    with pytest.raises(ValueError, match=r"features \['pos'\]"):
        chunker.predict(QUERIES["tokens"])
    with pytest.raises(ValueError, match=r"features \['pos'\]"):
        chunker.evaluate(TEST["tokens"], TEST_TAGS)
    with pytest.raises(ValueError, match="'pos' of sentence 1 has 2 values for 1 tokens"):
        chunker.predict({"tokens": [["w1"], ["w2"]], "pos": [["DT"], ["DT", "NN"]]})
    with pytest.raises(ValueError, match="'chunk'"):
        chunker.predict(dict(QUERIES, chunk=QUERIES["pos"]))
    words_only = Tagger.from_sentences(TRAIN["tokens"][:3], TRAIN_TAGS[:3], embedding_dim=2, hidden=2)
    with pytest.raises(ValueError, match=r"no features, received the features \['pos'\]"):
        words_only.predict(QUERIES)
    assert len(words_only.predict({"tokens": QUERIES["tokens"]})) == 4  # the dict form without features
    with pytest.raises(ValueError, match="'pos' of sentence 0"):
        Tagger.from_sentences({"tokens": [["a", "b"]], "pos": [["DT"]]}, [["O", "O"]], embedding_dim=2, hidden=2)


def test_save_load_gives_identical_predictions(chunker, tmp_path):
    path = str(tmp_path / "chunker.keras")
    chunker.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.feature_vocabularies == chunker.feature_vocabularies and loaded.feature_names == ["pos"]
    assert loaded.predict(QUERIES, top_k=2) == chunker.predict(QUERIES, top_k=2)
    assert loaded.evaluate(TEST, TEST_TAGS) == chunker.evaluate(TEST, TEST_TAGS)


# --- spans and confidence against brute force --------------------------------------------------

SCHEME_TAGS = {"iob2": ["B-NP", "I-NP", "O"], "bioes": ["B-NP", "E-NP", "O", "S-NP"]}


def spans_by_hand(tags):
    """(start, end, type) of well-formed IOB2 or BIOES tags: a span opens at B- or
    S-, takes the I- and E- after it, and closes after E- or S- or before anything else."""
    found, start = [], None
    for i, tag in enumerate(tags + ["O"]):
        prefix = tag[0]
        if start is not None and prefix not in ("I", "E"):
            found.append((start, i, tags[start][2:]))
            start = None
        if prefix in ("B", "S"):
            start = i
        if prefix in ("E", "S"):
            found.append((start, i + 1, tags[start][2:]))
            start = None
    return found


@pytest.mark.parametrize("scheme", ["iob2", "bioes"])
def test_spans_and_confidence_are_the_brute_force_ones(scheme):
    keras.utils.set_random_seed(4)
    tags = SCHEME_TAGS[scheme]
    train_tags = [[tags[i % len(tags)] for i in range(len(s))] for s in TRAIN["tokens"]]  # any: not trained
    model = Tagger.from_sentences(TRAIN, train_tags, tags=tags, embedding_dim=3, feature_dim=2, hidden=3,
                                  allowed_transitions=scheme)
    rng = np.random.default_rng(1)  # weights that are not the CRF's initial zeros
    model.network.set_weights([rng.normal(scale=0.9, size=w.shape).astype("float32")
                               for w in model.network.get_weights()])
    predicted = model.predict(QUERIES, batch_size=3)

    words = to_numpy(model.encoder(kb.tagging.pad_tokens(QUERIES["tokens"]))[0])
    pos = np.zeros_like(words)
    for row, column in enumerate([[2, 1, 4], [3], [4, 2, 3, 3, 4], [2, 3]]):  # the vocabulary rule, by hand
        pos[row, :len(column)] = column
    network = model.network
    emissions = to_numpy(keras.Model(network.inputs, network.get_layer("emissions").output)([words, pos]))
    transitions, start, end = (np.asarray(to_numpy(p), "float64") for p in network.get_layer("crf").chain_parameters())
    valid = words != 0
    allowed = (ref.iob2_checker if scheme == "iob2" else ref.bioes_checker)(tags)  # every well-formed path
    marginals = ref.marginals(emissions.astype("float64"), valid, transitions, start, end, allowed)
    best = ref.viterbi(emissions.astype("float64"), valid, transitions, start, end, allowed)
    found_spans = 0
    for row, result in enumerate(predicted):
        n = len(QUERIES["tokens"][row])
        assert result.tags == [tags[k] for k in best[row, :n]]
        confidence = marginals[row, np.arange(n), best[row, :n]]
        np.testing.assert_allclose(result.confidence, confidence, atol=2e-5)
        expected = spans_by_hand(result.tags)
        assert [s[:3] for s in result.spans] == expected
        np.testing.assert_allclose([s[3] for s in result.spans],
                                   [confidence[a:b].mean() for a, b, _ in expected], atol=2e-5)
        found_spans += len(expected)
    assert found_spans >= 2  # the comparison saw spans


def test_a_tagger_without_a_span_scheme_gives_no_spans():
    tokens = [["the", "dog", "runs"], ["dogs", "run"]]
    model = Tagger.from_sentences(tokens, [["DET", "NOUN", "VERB"], ["NOUN", "VERB"]], embedding_dim=2, hidden=2,
                                  head="softmax")
    assert model.scheme is None and [p.spans for p in model.predict(tokens)] == [[], []]
    assert TaggedSentence(["O"], [1.0]).spans == ()  # built without spans
