"""The examples' `--layers keras` twins are the same models.

For every variant of examples/pos_tagging.py and
examples/conll_tagging.py (each character encoder, both heads; the twin is
`keras_twin`, which converts the kb model's recurrent layers with
`kb.to_keras_bidirectional`) and of examples/sentence_classification.py:
the Keras twin has the same number of trainable parameters, and with the
same (random) weights both give the same probabilities, or Viterbi tags,
to 1e-5 on a small padded batch. Padded positions are not compared for the
taggers (kb's stacked layers write zeros there, Keras's a value). Then one
tiny run of each example with `--layers keras --report-json` (and the
tagger's export of the twin).
"""

import contextlib
import io
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import EWT, POLARITY, load_example, quietly
from keras_birnn.data.readers import read_conllu
from keras_birnn.tagging import TokenEncoder, build_tagger, pad_tokens

SENTENCES = [  # used when ../shared/data is absent
    ["The", "old", "man", "sat", "on", "the", "chair", "."],
    ["They", "lead", "the", "race"],
    ["Colorless", "green", "ideas", "sleep", "furiously", "!"],
    ["Hi"],
    ["I", "do", "n't", "think", "so", ",", "said", "Ms.", "Smith-Jones", "yesterday"],
]
TAGGER_VARIANTS = ["gru", "bigru", "bilstm", "bilstm2"]
CLASSIFIER_VARIANTS = [f"{d}-{h}" for d in ("uni", "bi") for h in ("final", "mean", "max", "attention")]


def trainable_count(model) -> int:
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def library_layers(model) -> list:
    """keras_birnn's layers in `model`, at any depth."""
    return [layer for layer in model._flatten_layers() if type(layer).__module__.split(".")[0] == "keras_birnn"]


def kb_weights_from_twin(variant: str, twin: keras.Model, hidden: int):
    """The twin's weights in the kb classifier's order: both list the layers'
    weights in the same order (kb layers use Keras's weight layout)."""
    return twin.get_weights()


# --- pos_tagging ------------------------------------------------------------------------------


def perturbed(model: keras.Model, seed: int = 1) -> keras.Model:
    """`model` with random weights everywhere (biases and CRF transitions too)."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(scale=0.4, size=w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def tagger_data():
    """(module, word ids [B, T], char ids [B, T, C], vocabulary sizes, tags): a
    small padded batch of EWT dev sentences (or SENTENCES)."""
    pos = load_example("pos_tagging")
    path = os.path.join(EWT, "en_ewt-ud-dev.conllu")
    if os.path.exists(path):
        sentences = [(t, upos) for t, upos, _ in read_conllu(path)[:40]]
        batch = [sentences[i] for i in (0, 3, 7, 12, 20, 31)]
    else:
        sentences = batch = [(s, ["NOUN"] * len(s)) for s in SENTENCES]
    encoder = TokenEncoder(max_chars=8, max_word_vocabulary=60, max_char_vocabulary=30)  # some OOV words and chars
    encoder.adapt([tokens for tokens, _ in sentences])
    word_ids, char_ids = encoder(pad_tokens([tokens for tokens, _ in batch]))
    tags = sorted({t for _, upos in sentences for t in upos} | {"X"})
    return pos, np.asarray(word_ids), np.asarray(char_ids), encoder.word_count, encoder.char_count, tags


SIZES = dict(word_dim=12, char_units=5, hidden=7, dropout=0.3)


@pytest.mark.parametrize("variant", TAGGER_VARIANTS)
def test_tagger_twin_has_the_same_parameters_and_predictions(tagger_data, variant):
    """`keras_twin` (Keras's GRU, LSTM and Bidirectional, the kb model's
    weights) gives the kb tagger's probabilities at every word."""
    pos, word_ids, char_ids, n_words, n_chars, tags = tagger_data
    assert list(pos.VARIANTS) == TAGGER_VARIANTS
    assert (word_ids == 0).any() and (char_ids[word_ids != 0] == 0).any()  # padding in both
    ours = perturbed(pos.build_variant(variant, n_words, n_chars, tags, **SIZES))
    twin = pos.keras_twin(ours, pos.keras_gru)
    assert not library_layers(twin) and library_layers(ours)
    assert not library_layers(pos.build_variant(variant, n_words, n_chars, tags, **SIZES, layers="keras"))
    assert trainable_count(ours) == trainable_count(twin) == ours.count_params() == twin.count_params()
    expected = np.asarray(twin((word_ids, char_ids), training=False))
    actual = np.asarray(ours((word_ids, char_ids), training=False))
    valid = word_ids != 0
    np.testing.assert_allclose(actual[valid], expected[valid], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(expected[valid].sum(-1), 1.0, atol=1e-5)


def test_char_encoder_twin_gives_zeros_for_padding_words(tagger_data):
    pos, word_ids, char_ids, n_words, n_chars, tags = tagger_data
    ours = perturbed(pos.build_variant("bigru", n_words, n_chars, tags, **SIZES))
    twin = pos.keras_twin(ours)
    expected, actual = (np.asarray(keras.Model(m.inputs, m.get_layer("char_encoder").output)((word_ids, char_ids)))
                        for m in (twin, ours))
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)
    empty = (char_ids == 0).all(-1)
    assert empty.any() and not expected[empty].any() and not actual[empty].any()
    assert type(twin.get_layer("char_encoder")).__name__ == "EveryWord"


def test_tagger_layers_flag(tmp_path):
    pos = load_example("pos_tagging")
    (tmp_path / "a").write_text(""), (tmp_path / "b").write_text("")
    files = ["--train", str(tmp_path / "a"), "--dev", str(tmp_path / "b")]
    assert pos.parse_args(files).layers == "kb"
    assert pos.parse_args(files + ["--layers", "keras"]).layers == "keras"
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        pos.parse_args(files + ["--layers", "torch"])
    with pytest.raises(ValueError, match="layers"):
        pos.build_variant("gru", 10, 10, ["A", "B"], layers="torch")


# --- sentence_classification ----------------------------------------------------------------


@pytest.mark.parametrize("variant", CLASSIFIER_VARIANTS)
def test_classifier_twin_has_the_same_parameters_and_predictions(variant):
    sent = load_example("sentence_classification")
    assert list(sent.VARIANTS) == CLASSIFIER_VARIANTS
    ours = sent.build_classifier(variant, 40, 8, 6, 0.5, attention_units=5)
    twin = sent.build_classifier(variant, 40, 8, 6, 0.5, attention_units=5, layers="keras")
    assert trainable_count(ours) == trainable_count(twin) == ours.count_params() == twin.count_params()
    ours.set_weights(kb_weights_from_twin(variant, twin, 6))
    rng = np.random.default_rng(0)
    lengths = [7, 1, 4, 9, 3]
    words = np.zeros((len(lengths), max(lengths)), np.int32)
    for row, n in enumerate(lengths):
        words[row, :n] = rng.integers(1, 40, n)
    expected = np.asarray(twin(words, training=False))
    np.testing.assert_allclose(np.asarray(ours(words, training=False)), expected, atol=1e-5, rtol=1e-5)
    # Padding changes nothing in the twin either (the heads read the mask).
    wider = np.pad(words, ((0, 0), (0, 3)))
    np.testing.assert_allclose(np.asarray(twin(wider, training=False)), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow(reason="exports two small classifiers, ~10 s")
def test_classifier_exports_serve_the_twins_numbers(tmp_path):
    """`export_classifier`: kb's export (word ids and `lengths`, or word ids
    alone) and the Keras twin's (`model.export`), the two models holding the
    same weights, serve the twin's probabilities for right-padded word ids;
    the vocabulary beside each export has a word per id."""
    sent = load_example("sentence_classification")
    vocab = sent.Vocabulary([[f"w{k}" for k in range(38)]], min_count=1)
    ours = sent.build_classifier("bi-attention", len(vocab), 8, 6, 0.5, attention_units=5)
    twin = sent.build_classifier("bi-attention", len(vocab), 8, 6, 0.5, attention_units=5, layers="keras")
    ours.set_weights(kb_weights_from_twin("bi-attention", twin, 6))
    rng = np.random.default_rng(1)
    lengths = [5, 1, 8, 3]
    words = np.zeros((len(lengths), max(lengths)), np.int32)
    for row, n in enumerate(lengths):
        words[row, :n] = rng.integers(1, len(vocab), n)
    paths = {layers: sent.export_classifier(model, layers, str(tmp_path), vocab, words)
             for layers, model in (("kb", ours), ("keras", twin))}
    expected = np.asarray(twin(words, training=False))
    kb_export = tf.saved_model.load(paths["kb"]).signatures
    served = [
        kb_export["serving_default"](inputs=tf.constant(words), lengths=tf.constant(lengths)),
        kb_export["serving_unpadded"](inputs=tf.constant(words)),
        tf.saved_model.load(paths["keras"]).signatures["serving_default"](words=tf.constant(words)),
    ]
    for outputs in served:
        (probs,) = outputs.values()
        np.testing.assert_allclose(probs.numpy(), expected, atol=1e-5, rtol=1e-5)
    for path in paths.values():
        with open(os.path.join(os.path.dirname(path), "vocabulary.txt"), encoding="utf-8") as f:
            assert f.read().split("\n")[:-1] == vocab.words


# --- conll_tagging ---------------------------------------------------------------------------


@pytest.mark.parametrize("head,char_encoder", [("softmax", "gru"), ("softmax", "lstm"), ("crf", "lstm"),
                                               ("crf", "cnn")])
def test_conll_tagger_twin_has_the_same_parameters_and_predictions(tagger_data, head, char_encoder):
    pos, word_ids, char_ids, n_words, n_chars, _ = tagger_data
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    columns = 2 if (head, char_encoder) == ("crf", "lstm") else 0  # one case with feature columns
    depth = 2 if (head, char_encoder) == ("softmax", "lstm") else 1  # one with two stacked BiLSTMs
    features = {f"column_{k}": 6 for k in range(columns)}
    ours = perturbed(build_tagger(n_words, tags, embedding_dim=12, char_encoder=char_encoder, num_chars=n_chars,
                                  char_dim=6, char_units=5, hidden=7, dropout=0.3, features=features or None,
                                  feature_dim=3, depth=depth, head=head))
    twin = pos.keras_twin(ours)
    inputs = (word_ids, char_ids) + tuple(np.random.default_rng(2).integers(0, 6, (columns,) + word_ids.shape))
    # Keras has no CRF and no masked max pooling (the CNN's): those stay kb's.
    kept = {"CRF"} if head == "crf" else set()
    kept |= {"CharCNN", "MaskedMaxPooling"} if char_encoder == "cnn" else set()
    assert {type(layer).__name__ for layer in library_layers(twin)} == kept
    assert trainable_count(ours) == trainable_count(twin) == ours.count_params() == twin.count_params()
    expected = np.asarray(twin(inputs, training=False))
    actual = np.asarray(ours(inputs, training=False))
    valid = word_ids != 0
    if head == "softmax":
        np.testing.assert_allclose(actual[valid], expected[valid], atol=1e-5, rtol=1e-5)
    else:  # Viterbi tags
        np.testing.assert_array_equal(actual[valid], expected[valid])
        assert len(np.unique(expected[valid])) > 1


# --- tiny runs of the keras path ---------------------------------------------------------------


@pytest.mark.slow(reason="trains the classifier twin, ~13 s")
@pytest.mark.skipif(not os.path.isdir(POLARITY), reason="../shared/data/sentence_polarity absent")
def test_classifier_keras_run_writes_its_report(tmp_path):
    sent = load_example("sentence_classification")
    report = tmp_path / "report.json"
    result, text = quietly(sent.run, [
        "--pos", os.path.join(POLARITY, "rt-polarity.pos"), "--neg", os.path.join(POLARITY, "rt-polarity.neg"),
        "--max-sentences", "200", "--epochs", "2", "--patience", "5", "--embed-dim", "8", "--hidden", "4",
        "--variants", "bi-max", "--layers", "keras", "--report-json", str(report), "--quiet",
    ])
    assert "Keras's GRU layers" in text
    out = json.loads(report.read_text())
    assert out["layers"] == "keras" and out["variant"] == "bi-max" and len(out["epoch_seconds"]) == 2
    assert out["fit_seconds"] >= sum(out["epoch_seconds"]) > 0 and out["predict_sentences_per_second"] > 0
    assert out["accuracy"] == result["rows"][0]["accuracy"]
    assert result["rows"][0]["loss_after"] < result["rows"][0]["loss_before"]


@pytest.mark.slow(reason="trains and exports the tagger twin, ~16 s")
@pytest.mark.skipif(not os.path.isdir(EWT), reason="../shared/data/ud_english_ewt absent")
def test_tagger_keras_run_exports_the_twin(tmp_path):
    pos = load_example("pos_tagging")
    report = tmp_path / "report.json"
    result, text = quietly(pos.run, [
        "--train", os.path.join(EWT, "en_ewt-ud-train.conllu"), "--dev", os.path.join(EWT, "en_ewt-ud-dev.conllu"),
        "--variants", "bigru", "--epochs", "1", "--max-train-sentences", "64", "--max-dev-sentences", "16",
        "--hidden", "8", "--word-dim", "8", "--char-units", "4", "--batch-size", "16", "--layers", "keras",
        "--out", str(tmp_path), "--report-json", str(report), "--quiet",
    ])
    assert "Keras's recurrent layers" in text
    out = json.loads(report.read_text())
    assert out["layers"] == "keras" and out["variant"] == "bigru" and len(out["epoch_seconds"]) == 1
    assert out["export_path"] == result["export_path"] and out["accuracy"] == result["rows"][0]["dev"]
    model = result["models"]["bigru"]
    assert not library_layers(model)
    sentences = [tokens for tokens, _ in result["dev"][:5]]
    served = tf.saved_model.load(out["export_path"]).signatures["serving_default"]
    tags = served(inputs=tf.constant(pad_tokens(sentences)))["tags"].numpy()
    unlabelled = [(s, ["X"] * len(s)) for s in sentences]
    predicted = pos.predict_ids(model, pos.Encoded(unlabelled, result["encoder"], result["tags"]))
    for row, tokens in enumerate(sentences):
        assert [t.decode() for t in tags[row][: len(tokens)]] == [result["tags"][k] for k in predicted[row]]
