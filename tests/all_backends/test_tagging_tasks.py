"""keras_birnn/tagging/{tagger,classifier,batching}.py on every backend.

A tiny `Tagger` (CRF and softmax heads) and `SentenceClassifier` train a
few steps on a toy corpus; then what their string-level methods give is
checked against independent computations: the network's own output
decoded by hand (argmax, `kb.CRF.decode`), the CRF's marginals and k best
paths by enumerating every path (`crf_reference.py`), seqeval's span
scores, and a saved -> loaded (safe mode) copy.
"""

import numpy as np
import pytest

import crf_reference as ref
import keras
import keras_birnn as kb
from backend_harness import to_numpy
from keras_birnn.tagging.batching import EncodedSentences, bucket_batches, drop_words, pad_batch
from keras_birnn.tagging.encoder import OOV_ID, PAD_ID
from keras_birnn.tagging.tagger import Tagger, span_scheme

SENTENCES = [
    (["Ada", "met", "Alan"], ["B-PER", "O", "B-PER"]),
    (["Ada", "Lovelace", "lived", "in", "London"], ["B-PER", "I-PER", "O", "O", "B-LOC"]),
    (["Alan", "Turing", "slept"], ["B-PER", "I-PER", "O"]),
    (["in", "New", "York"], ["O", "B-LOC", "I-LOC"]),
    (["Grace", "visited", "Paris"], ["B-PER", "O", "B-LOC"]),
    (["London", "rain"], ["B-LOC", "O"]),
]
TOKENS = [tokens for tokens, _ in SENTENCES]
TAGS = [tags for _, tags in SENTENCES]
QUERIES = [["Ada", "met", "Grace"], ["Paris"], ["Unseen", "New", "York", "x"], ["Turing", "in", "London"]]
QUERY_TAGS = [["B-PER", "O", "B-PER"], ["B-LOC"], ["O", "B-LOC", "I-LOC", "O"], ["B-PER", "O", "B-LOC"]]


@pytest.fixture(scope="module", params=["crf", "softmax"])
def tagger(request):
    keras.utils.set_random_seed(1)
    model = Tagger.from_sentences(TOKENS, TAGS, embedding_dim=6, hidden=5, head=request.param,
                                  char_encoder="cnn", char_units=3, encoder=kb.tagging.TokenEncoder(max_chars=5))
    model.compile(keras.optimizers.Adam(0.05))
    model.fit(TOKENS, TAGS, batch_size=3, epochs=3, word_dropout=0.1, seed=0, verbose=0,
              validation_data=(TOKENS[:2], TAGS[:2]))
    return model


def by_hand(model, sentences):
    """(tag ids, probabilities of every tag [B, T, K], valid, emissions or None) from the network itself."""
    words, chars = (to_numpy(x) for x in model.encoder(kb.tagging.pad_tokens(sentences)))
    valid = words != 0
    if model.head == "softmax":
        probabilities = to_numpy(model.network([words, chars], training=False))
        return probabilities.argmax(-1), probabilities, valid, None
    network = model.network
    emissions = to_numpy(keras.Model(network.inputs, network.get_layer("emissions").output)([words, chars]))
    crf = network.get_layer("crf")
    ids = to_numpy(crf.decode(emissions, mask=valid))
    np.testing.assert_array_equal(np.where(valid, to_numpy(network([words, chars])), 0), ids)
    transitions, start, end = (np.asarray(to_numpy(p), "float64") for p in crf.chain_parameters())
    marginals = ref.marginals(emissions.astype("float64"), valid, transitions, start, end)  # every path
    return ids, marginals, valid, (emissions, transitions, start, end)


def test_tag_set_and_scheme(tagger):
    assert tagger.tags == ("B-LOC", "B-PER", "I-LOC", "I-PER", "O")
    assert tagger.scheme == "iob2" and span_scheme(["NOUN", "VERB"]) is None
    assert span_scheme(["O", "S-X", "E-X", "B-X"]) == "bioes"


def test_predict_is_the_network_decoded_by_hand(tagger):
    predicted = tagger.predict(QUERIES, batch_size=2)
    ids, probabilities, valid, _ = by_hand(tagger, QUERIES)
    for row, (tokens, result) in enumerate(zip(QUERIES, predicted)):
        n = len(tokens)
        assert result.tags == [tagger.tags[k] for k in ids[row, :n]]
        expected = np.take_along_axis(probabilities[row, :n], ids[row, :n, None], -1)[:, 0]
        np.testing.assert_allclose(result.confidence, expected, atol=2e-5)
        assert result.paths is None
        # The spans of the tags (conlleval's reader), each with its tokens' mean oracle confidence.
        found = kb.tagging.spans(result.tags, "iob2")
        assert [s[:3] for s in result.spans] == [(s.start, s.end, s.type) for s in found]
        np.testing.assert_allclose([s[3] for s in result.spans], [expected[s.start:s.end].mean() for s in found],
                                   atol=2e-5)


def test_predict_is_compiled_and_its_padding_changes_nothing(tagger):
    # Each sentence alone (padded to 8 tokens) against all in one batch (padded to the longest).
    together = tagger.predict(QUERIES, batch_size=len(QUERIES))
    alone = [tagger.predict([tokens])[0] for tokens in QUERIES]
    for one, many in zip(alone, together):
        assert one.tags == many.tags
        np.testing.assert_allclose(one.confidence, many.confidence, atol=1e-6)
    decoder = tagger._decoder()
    assert decoder.predict_function is not None  # predict went through Keras's predict_on_batch
    if keras.backend.backend() == "jax":  # jax.jit: run eagerly, JAX compiles each op for each batch shape
        assert decoder.jit_compile is True
    if keras.backend.backend() == "tensorflow":
        assert hasattr(decoder.predict_function, "get_concrete_function")  # a tf.function


def test_top_k_paths_are_the_brute_force_best(tagger):
    if tagger.head == "softmax":
        with pytest.raises(ValueError, match="CRF"):
            tagger.predict(QUERIES, top_k=2)
        return
    predicted = tagger.predict(QUERIES, top_k=3)
    _, _, valid, (emissions, transitions, start, end) = by_hand(tagger, QUERIES)
    log_z = ref.log_partition(emissions.astype("float64"), valid, transitions, start, end)
    allowed = ref.iob2_checker(list(tagger.tags))
    paths, scores = ref.top_k(emissions.astype("float64"), valid, transitions, start, end, 3, allowed)
    for row, result in enumerate(predicted):
        n = len(QUERIES[row])
        best = [p for p, s in zip(paths[row], scores[row]) if np.isfinite(s)]
        expected = np.exp(np.asarray(scores[row][:len(best)]) - log_z[row])
        np.testing.assert_allclose([p for _, p in result.paths], expected, rtol=1e-4, atol=1e-7)
        assert result.paths[0][0] == result.tags  # the best path is the Viterbi one
        # Random weights: no two of these paths tie, so the lists match path by path.
        assert [tags for tags, _ in result.paths] == [[tagger.tags[k] for k in path[:n]] for path in best]


def test_evaluate_equals_seqeval(tagger):
    seqeval = pytest.importorskip("seqeval.metrics")
    scores = tagger.evaluate(QUERIES, QUERY_TAGS)
    predicted = [p.tags for p in tagger.predict(QUERIES)]
    assert scores["f1"] == pytest.approx(seqeval.f1_score(QUERY_TAGS, predicted), abs=1e-9)
    assert scores["precision"] == pytest.approx(seqeval.precision_score(QUERY_TAGS, predicted), abs=1e-9)
    assert scores["recall"] == pytest.approx(seqeval.recall_score(QUERY_TAGS, predicted), abs=1e-9)
    report = seqeval.classification_report(QUERY_TAGS, predicted, output_dict=True, zero_division=0)
    for kind in ("PER", "LOC"):
        assert scores["types"][kind]["f1"] == pytest.approx(report[kind]["f1-score"], abs=1e-9)
    pairs = [(g, p) for gs, ps in zip(QUERY_TAGS, predicted) for g, p in zip(gs, ps)]
    assert scores["accuracy"] == pytest.approx(np.mean([g == p for g, p in pairs]))
    with pytest.raises(ValueError, match="B-MISC"):
        tagger.evaluate(QUERIES[:1], [["B-PER", "O", "B-MISC"]])
    with pytest.raises(ValueError, match="B-MISC"):
        tagger.fit(QUERIES[:1], [["B-PER", "O", "B-MISC"]], verbose=0)


def test_save_load_gives_identical_predictions(tagger, tmp_path):
    path = str(tmp_path / "tagger.keras")
    tagger.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded, Tagger) and loaded.tags == tagger.tags and loaded.head == tagger.head
    assert len(tagger.layers) == 2  # the encoder and the network (predict's scorer is not tracked)
    top_k = 2 if tagger.head == "crf" else None
    assert loaded.predict(QUERIES, top_k=top_k) == tagger.predict(QUERIES, top_k=top_k)
    assert loaded.encoder.get_word_vocabulary() == tagger.encoder.get_word_vocabulary()


def test_fit_lowers_the_loss_and_takes_a_dataset(tagger):
    data = tagger.sentence_dataset(TOKENS, TAGS, batch_size=6, shuffle=False)
    before = tagger.evaluate(data, verbose=0, return_dict=True)["loss"]
    tagger.fit(data, epochs=2, verbose=0)
    assert tagger.evaluate(data, verbose=0, return_dict=True)["loss"] < before


def test_fit_on_strings_calls_the_callbacks_once_a_batch(tagger):
    class Count(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches, self.losses = 0, []

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

        def on_epoch_end(self, epoch, logs=None):
            self.losses.append(logs["loss"])

    count = Count()
    history = tagger.fit(TOKENS, TAGS, batch_size=5, epochs=2, verbose=0, callbacks=[count], seed=0)
    assert count.batches == 2 * -(-len(TOKENS) // 5)
    assert count.losses == history.history["loss"]


def test_the_train_step_is_compiled_as_keras_would_compile_the_network(tagger):
    """The encoder (string ops, no XLA) is outside the steps: on JAX they are
    jit-compiled as the network alone would be; Keras's "auto" is False on
    PyTorch and on a CPU-only TensorFlow."""
    tagger.compile()
    network = keras.Model(tagger.network.inputs, tagger.network.outputs)  # the same layers, no encoder
    network.compile("adam", "mse")
    assert tagger.jit_compile == network.jit_compile == (keras.backend.backend() == "jax")


# --- batching ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [None, 0, 1])
def test_buckets_hold_every_sentence_once(seed):
    lengths = np.random.default_rng(5).integers(1, 40, 103)
    rng = None if seed is None else np.random.default_rng(seed)
    groups = bucket_batches(lengths, 8, rng)
    assert sorted(np.concatenate(groups).tolist()) == list(range(103))
    assert all(len(g) == 8 for g in groups[:-1] if seed is None) and max(map(len, groups)) == 8
    if seed is None:  # sorted by length, so each batch's lengths are close
        assert np.all(np.diff(lengths[np.concatenate(groups)]) >= 0)
    else:  # jittered by less than JITTER tokens: a batch spans little more than that
        spans = [np.ptp(lengths[g]) for g in groups]
        assert np.median(spans) <= 6


def test_the_dataset_yields_every_sentence_once(tagger):
    data = tagger.sentence_dataset(TOKENS * 3, TAGS * 3, batch_size=4, seed=3)
    expected = sorted(tuple(w.tolist()) for w in to_numpy(tagger.encoder(kb.tagging.pad_tokens(TOKENS * 3))[0]))
    for _ in range(2):  # two passes: new buckets each time, each sentence once
        rows = []
        for batch in data.as_numpy_iterator():
            words = batch[0][0]
            assert words.shape[1] % 8 == 0 and (words[:, 5:] == 0).all()  # LENGTH_MULTIPLE; the longest has 5
            assert batch[1].shape == words.shape and (batch[1][words == 0] == 0).all()
            rows += [tuple(r.tolist()) + (0,) * (len(expected[0]) - len(r)) for r in words]
        assert sorted(r[:len(expected[0])] for r in rows) == expected
        assert len(rows) == 18


def test_word_dropout_rate():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (400, 60)).astype(np.int32)  # 0: padding, 1: OOV, others known
    dropped = drop_words(ids, 0.3, np.random.default_rng(1))
    known = ids > OOV_ID
    assert (dropped[~known] == ids[~known]).all()  # padding and OOV untouched
    changed = dropped != ids
    assert (dropped[changed] == OOV_ID).all()
    assert abs(changed[known].mean() - 0.3) < 0.01
    assert (drop_words(ids, 0.0, rng) == ids).all() and (drop_words(ids, 0.3, None) == ids).all()
    with pytest.raises(ValueError, match="word_dropout"):
        drop_words(ids, 1.0, rng)


def test_pad_batch_pads_with_zeros():
    encoded = EncodedSentences([np.array([3, 4]), np.array([5])], [np.ones((2, 2), int), np.ones((1, 2), int)], None)
    words, chars = pad_batch(encoded, [1, 0], True)
    assert words.tolist() == [[5, PAD_ID], [3, 4]] and chars[0, 1].tolist() == [0, 0]
    assert pad_batch(encoded, [1], False, multiple=4).tolist() == [[5, 0, 0, 0]]


# --- the sentence classifier ---------------------------------------------------------------------

TEXTS = ["a fine film", "a dull film", "fine acting", "dull plot and dull acting", "truly fine", "so dull"]
LABELS = ["pos", "neg", "pos", "neg", "pos", "neg"]


@pytest.mark.parametrize("pooling", ["max", "attention"])
def test_classifier(pooling, tmp_path):
    keras.utils.set_random_seed(2)
    model = kb.tagging.SentenceClassifier.from_texts(TEXTS, LABELS, embedding_dim=6, hidden=4, pooling=pooling)
    model.compile(keras.optimizers.Adam(0.05))
    history = model.fit(TEXTS, LABELS, batch_size=3, epochs=4, word_dropout=0.1, seed=0, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    queries = ["a fine plot", "dull", "unseen words only", ""]
    predicted = model.predict(queries, batch_size=3)
    words = to_numpy(model.encoder(kb.tagging.pad_tokens([q.split() for q in queries]))[0])
    probabilities = to_numpy(model.network(words))
    for p, row in zip(predicted, probabilities):
        assert p.label == model.labels[row.argmax()] and p.probability == pytest.approx(row.max(), abs=1e-6)
        np.testing.assert_allclose([p.probabilities[k] for k in model.labels], row, atol=1e-6)
    scores = model.evaluate(TEXTS, LABELS)
    assert scores["accuracy"] == pytest.approx(np.mean([p.label == g for p, g in zip(model.predict(TEXTS), LABELS)]))
    with pytest.raises(ValueError, match="meh"):
        model.evaluate(TEXTS[:1], ["meh"])
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.labels == ("neg", "pos") and loaded.predict(queries, batch_size=3) == predicted


def test_from_sentences_checks_its_data():
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    model = Tagger.from_sentences(TOKENS, TAGS, tags=tags, embedding_dim=4, hidden=2, head="softmax")
    assert model.tags == tuple(tags) and model.network.output.shape[-1] == 5 and model.head == "softmax"
    with pytest.raises(ValueError, match="tag 'B-PER', which the model does not know"):
        Tagger.from_sentences(TOKENS, TAGS, tags=["O", "B-MISC"], embedding_dim=4, hidden=2)
    with pytest.raises(ValueError, match="2 tokens and 1 tags"):
        Tagger.from_sentences([["a", "b"]], [["O"]], embedding_dim=4, hidden=2)
    with pytest.raises(ValueError, match="features"):
        Tagger.from_sentences(TOKENS, TAGS, embedding_dim=4, hidden=2, features={"pos": 3})
