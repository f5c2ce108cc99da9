"""`Tagger.export` and `SentenceClassifier.export` (keras_birnn/tagging/{tagger,classifier}.py):
the SavedModel, reloaded with plain `tf.saved_model.load`, answers what
`predict` answers (tags, -1 tag ids and 0 confidence at padding, labels
and probabilities); versions follow the next-free-integer rule and an
existing version is never replaced without `overwrite=True`."""

import os

import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_birnn as kb

TOKENS = [["Ada", "met", "Alan"], ["Ada", "Lovelace", "lived", "in", "London"], ["in", "New", "York"]]
TAGS = [["B-PER", "O", "B-PER"], ["B-PER", "I-PER", "O", "O", "B-LOC"], ["O", "B-LOC", "I-LOC"]]
QUERIES = [["Ada", "met", "Grace", "in", "York"], ["Paris"], ["Unseen", "New", "York"]]


def trained_tagger(head):
    keras.utils.set_random_seed(3)
    tagger = kb.tagging.Tagger.from_sentences(TOKENS, TAGS, embedding_dim=6, hidden=4, head=head,
                                              char_encoder="lstm", char_units=3)
    tagger.fit(TOKENS, TAGS, epochs=2, batch_size=2, verbose=0)
    return tagger


@pytest.mark.parametrize("head", ["crf", "softmax"])
def test_served_tagger_answers_what_predict_answers(head, tmp_path):
    tagger = trained_tagger(head)
    folder = tagger.export(str(tmp_path / "ner"))
    assert folder == str(tmp_path / "ner" / "1")
    serve = tf.saved_model.load(folder).signatures["serving_default"]
    out = serve(inputs=tf.constant(kb.tagging.pad_tokens(QUERIES)))
    predicted = tagger.predict(QUERIES)
    index = {tag: i for i, tag in enumerate(tagger.tags)}
    width = max(map(len, QUERIES))
    for row, result in enumerate(predicted):
        n, pad = len(QUERIES[row]), width - len(QUERIES[row])
        assert [t.decode() for t in out["tags"].numpy()[row]] == result.tags + [""] * pad
        assert out["tag_ids"].numpy()[row].tolist() == [index[t] for t in result.tags] + [-1] * pad
        np.testing.assert_allclose(out["confidence"].numpy()[row], result.confidence + [0.0] * pad, atol=1e-6, rtol=0)
        assert n == len(result.tags)


def test_versions_and_overwrite(tmp_path):
    tagger = trained_tagger("crf")
    base = str(tmp_path / "ner")
    os.makedirs(os.path.join(base, "7"))  # an existing version: the next free one is 8
    assert tagger.export(base) == os.path.join(base, "8")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tagger.export(base, version=8)
    with pytest.raises(FileExistsError):
        tagger.export(base, version=7)
    assert os.listdir(os.path.join(base, "7")) == []  # left as it was
    with pytest.warns(UserWarning, match="Overwriting"):
        assert tagger.export(base, version=7, overwrite=True) == os.path.join(base, "7")
    assert os.path.exists(os.path.join(base, "7", "saved_model.pb"))
    assert sorted(n for n in os.listdir(base) if not n.startswith(".")) == ["7", "8"]
    with pytest.raises(ValueError, match="version"):
        tagger.export(base, version=0)


def test_served_classifier_answers_what_predict_answers(tmp_path):
    keras.utils.set_random_seed(4)
    texts, labels = ["a fine film", "a dull film", "fine acting", "so dull"], ["pos", "neg", "pos", "neg"]
    model = kb.tagging.SentenceClassifier.from_texts(texts, labels, embedding_dim=6, hidden=4, pooling="attention")
    model.fit(texts, labels, epochs=2, batch_size=2, verbose=0)
    folder = model.export(str(tmp_path / "polarity"))
    assert folder == str(tmp_path / "polarity" / "1")
    assert model.export(str(tmp_path / "polarity")) == str(tmp_path / "polarity" / "2")
    serve = tf.saved_model.load(folder).signatures["serving_default"]
    queries = ["a  fine plot", "dull", "unseen words", ""]
    out = serve(inputs=tf.constant(queries))
    predicted = model.predict(queries, batch_size=len(queries))
    assert [k.decode() for k in out["label"].numpy()] == [p.label for p in predicted]
    expected = [[p.probabilities[k] for k in model.labels] for p in predicted]
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, atol=1e-6, rtol=0)
