"""examples/conll_tagging.py: the conlleval scorer on hand-computed cases (and
against seqeval when installed), the character encoders, word dropout, and
a small run on each shared data set: the loss decreases, the reported F1
equals a count by hand, and the exported SavedModel's tags equal the Keras
model's."""

import contextlib
import io
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import CONLL2000, CONLL2002, EWT, load_example, quietly

TINY = ["--max-train-sentences", "300", "--max-dev-sentences", "60", "--epochs", "5", "--hidden", "16",
        "--word-dim", "16", "--char-dim", "8", "--char-units", "8", "--batch-size", "16",
        "--learning-rate", "1e-2", "--quiet"]


@pytest.fixture(scope="module")
def ct():
    return load_example("conll_tagging")


# --- the scorer ---------------------------------------------------------------------------------


def test_iob_spans_follow_conlleval(ct):
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC", "I-ORG", "O", "I-MISC"]
    # B-LOC after B-LOC starts a new span; I-ORG after I-LOC starts one (a
    # type change); I-MISC after O starts one; the end closes the last.
    assert ct.iob_spans(tags) == [("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 6), ("ORG", 6, 7), ("MISC", 8, 9)]
    assert ct.iob_spans(["I-PER", "I-PER", "B-PER"]) == [("PER", 0, 2), ("PER", 2, 3)]  # I- at the start; IOB1
    assert ct.iob_spans(["O", "O"]) == [] and ct.iob_spans([]) == []
    assert ct.iob_spans(["B-NP", "I-VP", "I-VP", "B-NP", "I-NP"]) == [("NP", 0, 1), ("VP", 1, 3), ("NP", 3, 5)]
    with pytest.raises(ValueError, match="IOB tags"):
        ct.iob_spans(["B-PER", "E-PER"])
    assert ct.is_iob(["O", "B-PER", "I-PER"]) and not ct.is_iob(["NOUN", "VERB"]) and not ct.is_iob(["B-"])


def test_span_scores_hand_computed(ct):
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O", "B-PER"], ["O", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"],  # PER right; LOC missed, ORG wrong type
                 ["B-ORG", "I-ORG", "O", "O", "I-PER"],  # ORG too short (wrong); I-PER starts a right PER
                 ["B-MISC", "O"]]  # a spurious span
    # gold spans 4 (PER, LOC, ORG, PER), predicted 5 (PER, ORG, ORG, PER, MISC), correct 2 (both PER).
    scores = ct.span_scores(gold, predicted)
    assert (scores["gold"], scores["predicted"], scores["correct"]) == (4, 5, 2)
    assert scores["precision"] == pytest.approx(2 / 5) and scores["recall"] == pytest.approx(2 / 4)
    assert scores["f1"] == pytest.approx(2 * 0.4 * 0.5 / 0.9)
    assert scores["types"]["PER"]["f1"] == 1.0 and scores["types"]["LOC"]["recall"] == 0.0
    assert scores["types"]["MISC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "gold": 0, "predicted": 1,
                                       "correct": 0}
    assert ct.span_scores([["O"]], [["O"]])["f1"] == 0.0  # nothing to find, nothing found
    with pytest.raises(ValueError):
        ct.span_scores([["O", "O"]], [["O"]])


def test_span_scores_equal_seqeval_default_mode(ct):
    """seqeval's default mode is conlleval's definition: the same F1, precision
    and recall on random IOB sequences (with I- starts and type changes)."""
    metrics = pytest.importorskip("seqeval.metrics")
    rng = np.random.default_rng(0)
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]
    for _ in range(20):
        lengths = rng.integers(1, 12, size=15)
        gold = [list(rng.choice(names, size=n, p=[0.5, 0.15, 0.1, 0.1, 0.1, 0.05])) for n in lengths]
        predicted = [[t if rng.random() < 0.7 else rng.choice(names) for t in s] for s in gold]
        scores = ct.span_scores(gold, predicted)
        assert scores["f1"] == pytest.approx(metrics.f1_score(gold, predicted))
        assert scores["precision"] == pytest.approx(metrics.precision_score(gold, predicted))
        assert scores["recall"] == pytest.approx(metrics.recall_score(gold, predicted))


def test_to_iob2_keeps_the_spans(ct):
    # IOB1 (an I- starts a span unless the same type precedes), and an I- at an IOB2 sentence start.
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG"]
    assert ct.to_iob2(iob1) == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG"]
    assert ct.iob_spans(ct.to_iob2(iob1)) == ct.iob_spans(iob1)
    assert ct.to_iob2(["B-LOC", "I-LOC", "O"]) == ["B-LOC", "I-LOC", "O"]
    train = [(["San", "Sebasti\u00e1n"], ["I-LOC", "I-LOC"]), (["y"], ["O"])]
    assert ct.training_tags_in_iob2(train) == ([(["San", "Sebasti\u00e1n"], ["B-LOC", "I-LOC"]), (["y"], ["O"])], 1)
    upos = [(["a"], ["DET"])]
    assert ct.training_tags_in_iob2(upos) == (upos, 0)


def spans_by_hand(sentences):
    """Spans as `(sentence, type, start, end)`, found differently from
    `iob_spans`: a non-O tag starts a span unless it is I-X right after B-X
    or I-X; the span runs over the I-X that follow."""
    found = set()
    for s, tags in enumerate(sentences):
        for i, tag in enumerate(tags):
            if tag == "O":
                continue
            kind = tag[2:]
            if tag.startswith("I-") and i > 0 and tags[i - 1] in (f"B-{kind}", f"I-{kind}"):
                continue
            end = i + 1
            while end < len(tags) and tags[end] == f"I-{kind}":
                end += 1
            found.add((s, kind, i, end))
    return found


# --- model pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cnn", "gru", "lstm"])
def test_char_encoder_ignores_padding(ct, kind):
    """A word's vector depends on its characters only: not on the character
    padding width, nor on the other words of the batch; padding words give zeros."""
    layer = ct.CharEncoder(12, kind, char_dim=4, units=3)
    chars = np.array([[[2, 3, 4, 0], [5, 0, 0, 0], [0, 0, 0, 0]], [[6, 7, 8, 9], [0, 0, 0, 0], [0, 0, 0, 0]]], np.int32)
    out = np.asarray(layer(chars))
    assert out.shape == (2, 3, 6)
    wider = np.asarray(layer(np.pad(chars, [(0, 0), (0, 0), (0, 5)])))
    np.testing.assert_allclose(wider, out, atol=1e-6)
    alone = np.asarray(layer(chars[:1, :2, :3]))
    np.testing.assert_allclose(alone, out[:1, :2], atol=1e-6)
    assert not out[0, 2].any() and not out[1, 1:].any()
    np.testing.assert_array_equal(np.asarray(layer.compute_mask(chars)), [[True, True, False], [True, False, False]])


@pytest.mark.parametrize("head", ["softmax", "crf"])
def test_tagger_with_feature_columns_ignores_padding(ct, head):
    """With feature columns the word vectors keep the word mask: a
    sentence's outputs do not depend on the padding after it, and the CRF
    gives 0 there (an unmasked feature part once made padding valid)."""
    keras.utils.set_random_seed(0)
    model = ct.build_tagger(20, 10, ["O", "B-X", "I-X"], head, "lstm", word_dim=4, char_dim=3, char_units=2,
                            hidden=5, feature_count=6, feature_columns=2, feature_dim=3)
    words = np.array([[3, 4, 5, 0, 0, 0, 0, 0]], np.int32)
    chars = np.zeros((1, 8, 4), np.int32)
    chars[0, :3, :2] = 2
    features = np.zeros((1, 8, 2), np.int32)
    features[0, :3] = [[2, 3], [4, 5], [1, 1]]  # 1: a value unseen in training
    np.testing.assert_array_equal(np.asarray(model.get_layer("feature_vectors").compute_mask(features)),
                                  [[True] * 3 + [False] * 5])
    padded = np.asarray(model((words, chars, features)))
    alone = np.asarray(model((words[:, :3], chars[:, :3], features[:, :3])))
    np.testing.assert_allclose(padded[:, :3], alone, atol=1e-6)
    if head == "crf":
        assert not padded[:, 3:].any()


def test_word_dropout_replaces_known_words_only(ct):
    words = np.array([[5, 1, 7, 0], [9, 9, 0, 0]], np.int32)
    batches = [((words, np.zeros((2, 4, 1), np.int32)), np.zeros((2, 4), np.int32))]
    assert ct.drop_words(batches, 0.0, np.random.default_rng(0)) is batches
    (all_dropped, _), _ = ct.drop_words(batches, 1.0 - 1e-9, np.random.default_rng(0))[0]
    np.testing.assert_array_equal(all_dropped, [[1, 1, 1, 0], [1, 1, 0, 0]])  # padding stays 0
    big = [((np.full((100, 100), 7, np.int32), None), None)]
    (some, _), _ = ct.drop_words(big, 0.2, np.random.default_rng(0))[0]
    assert set(np.unique(some)) == {1, 7} and 0.17 < (some == 1).mean() < 0.23
    np.testing.assert_array_equal(words, [[5, 1, 7, 0], [9, 9, 0, 0]])  # the input is not changed


def test_word_keys_lower_case_and_digits(ct):
    keys = ct.word_keys([["Año", "1.500", "EFE"]]).numpy().tolist()
    assert keys == [["año".encode(), b"0.000", b"efe"]]
    assert ct.word_keys(["A1"], digits=True).numpy().tolist() == [b"a1"]
    assert ct.word_keys(["Año", "A1"], case=True).numpy().tolist() == ["Año".encode(), b"A0"]


def test_feature_encoder_ids(ct):
    encoder = ct.FeatureEncoder([[["NN", "B"], ["VB", "I"]], [["NN", "I"]]])
    # 0 padding, 1 unseen, then the sorted keys: 2 "0=NN", 3 "0=VB", 4 "1=B", 5 "1=I".
    assert (encoder.columns, encoder.count) == (2, 6)
    sentence = [["VB", "B"], ["JJ", "I"], ["B", "NN"]]  # "B" in column 0 and "NN" in column 1 are unseen there
    served = encoder(tf.constant([sentence + [["", ""]]])).numpy()[0]
    assert served.tolist() == [[3, 4], [1, 5], [1, 1], [0, 0]]
    short, long_, empty = encoder.ids([[["NN", "I"]], sentence, []], chunk=2)  # chunks padded to their longest
    assert short.tolist() == [[2, 5]] and long_.tolist() == served[:3].tolist() and empty.shape == (0, 2)


def test_feature_columns_are_checked_against_the_file(ct, tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("Confidence NN B-NP\nin IN B-PP\n\nthe DT B-NP\n")
    args = ct.parse_args(["--train", str(path), "--feature-columns", "1"])
    sentences, features = ct.read_sentences(str(path), "columns", args)
    assert features == [[["NN"], ["IN"]], [["DT"]]] and sentences[1] == (["the"], ["B-NP"])
    for columns, message in ((["3"], "has 3 columns"), (["-1"], "is the tag column"), (["2"], "is the tag column"),
                             (["0"], "is the token column")):
        args = ct.parse_args(["--train", str(path), "--feature-columns", *columns])
        with pytest.raises(ValueError, match=f"--feature-columns {columns[0]}.*{message}"):
            ct.read_sentences(str(path), "columns", args)
    with pytest.raises(ValueError, match="one entry per sentence"):
        ct.TaggedSet(sentences, ct.WordEncoder(["the"], ["t"]), ["B-NP"], features[:1], ct.FeatureEncoder(features))


def test_flags(ct, tmp_path):
    for argv in (["--data", "conll2002", "--train", "x"], [], ["--data", "conll2002", "--head", "hmm"],
                 ["--train", "x", "--held-out", "1.0"], ["--data", "ewt", "--char-encoder", "rnn"],
                 ["--data", "ewt", "--layers", "torch"]):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            ct.parse_args(argv)
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        ct.parse_args(["--data", "ewt", "--feature-columns", "1"])
    assert "--feature-columns reads column files" in err.getvalue()
    (tmp_path / "conll2000_chunking").mkdir()
    (tmp_path / "conll2000_chunking" / "train.txt").write_text("")
    args = ct.parse_args(["--data", "conll2000", "--data-dir", str(tmp_path)])
    assert args.heads == ["crf"] and args.char_encoder == "lstm" and args.epochs == 8 and args.name == "conll2000"
    assert args.feature_columns == [1]  # the POS tags, by default for CoNLL-2000
    no_features = ct.parse_args(["--data", "conll2000", "--data-dir", str(tmp_path), "--feature-columns"])
    assert no_features.feature_columns == []
    assert args.layers == "kb"
    assert ct.parse_args(["--data", "conll2000", "--data-dir", str(tmp_path), "--layers", "keras"]).layers == "keras"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b.txt").write_text("")
    args = ct.parse_args(["--train", str(tmp_path / "a" / "b.txt"), "--head", "softmax,crf", "--quick"])
    assert args.heads == ["softmax", "crf"] and args.name == "b" and args.max_train_sentences == 600
    assert args.feature_columns == []


# --- runs on the shared data --------------------------------------------------------------------


def check_run(ct, result, head):
    """Loss decreased; the reported scores equal a count by hand; the
    exported SavedModel's tags equal the Keras model's."""
    (row,) = result["rows"]
    assert row["head"] == head and row["loss_after"] < row["loss_before"], row
    gold = [tags for _, tags in result["dev"]]
    if ct.is_iob(result["tags"]):
        truth, guess = spans_by_hand(gold), spans_by_hand(row["predicted_tags"])
        correct = len(truth & guess)
        assert correct > 0  # a check on something found
        assert (row["gold"], row["predicted"], row["correct"]) == (len(truth), len(guess), correct)
        p, r = correct / max(len(guess), 1), correct / len(truth)
        assert row["f1"] == pytest.approx(2 * p * r / (p + r) if correct else 0.0)
    else:
        hits = sum(a == b for g, y in zip(gold, row["predicted_tags"]) for a, b in zip(g, y))
        assert row["accuracy"] == pytest.approx(hits / sum(map(len, gold)))
    check_export(ct, result, head)


def check_export(ct, result, head):
    """The served tags equal the model's, for dev sentences and OOV words
    (and feature values never seen, with --feature-columns)."""
    sentences = [tokens for tokens, _ in result["dev"][:12]]
    sentences.append(["Zyxwvut", "qwertyuiopasdfghjklzxc", "\u00e9t\u00e9", "2024", "!"])  # OOV words and characters
    served = tf.saved_model.load(result["exports"][head]).signatures["serving_default"]
    padded = ct.pos.pad_tokens(sentences)
    inputs, features, feature_encoder = {"tokens": tf.constant(padded.tolist())}, [], result["feature_encoder"]
    if feature_encoder is not None:
        features = result["dev_features"][:12] + [[["UNSEEN"] * feature_encoder.columns] * 5]
        inputs["features"] = tf.constant([[f[i] if i < len(f) else [""] * feature_encoder.columns
                                           for i in range(padded.shape[1])] for f in features])
    out = served(**inputs)
    tags = [[t.decode() for t in row] for row in out["tags"].numpy()]
    encoded = ct.encode([(s, ["O"] * len(s)) for s in sentences], result["encoder"], result["tags"], features,
                        feature_encoder)
    keras_ids = ct.predict_ids(result["models"][head], encoded)
    for row, tokens in enumerate(sentences):
        n = len(tokens)
        assert tags[row][:n] == [result["tags"][k] for k in keras_ids[row]]
        assert tags[row][n:] == [""] * (padded.shape[1] - n) and (out["tag_ids"].numpy()[row, n:] == -1).all()
    if head == "crf" and ct.is_iob(result["tags"]):  # the "iob2" constraints hold in what is served
        for row in tags:
            row = [t for t in row if t]
            assert all(not t.startswith("I-") or (i and row[i - 1][2:] == t[2:] and row[i - 1] != "O")
                       for i, t in enumerate(row)), row


@pytest.mark.slow(reason="trains a tagger on shared data, ~20-35 s")
@pytest.mark.skipif(not os.path.isdir(CONLL2002), reason="../shared/data/conll2002_spanish absent")
def test_conll2002_crf_head_with_char_cnn(ct, tmp_path):
    result, text = quietly(ct.run, ["--data", "conll2002", "--head", "crf", "--char-encoder", "cnn",
                                    "--out", str(tmp_path), *TINY])
    assert "span F1" in text and "esp.testa" in text
    check_run(ct, result, "crf")


@pytest.mark.slow(reason="trains a tagger on shared data, ~20-35 s")
@pytest.mark.skipif(not os.path.isdir(CONLL2000), reason="../shared/data/conll2000_chunking absent")
def test_conll2000_crf_head_with_char_lstm_and_pos_features_on_the_held_out_split(ct, tmp_path):
    result, text = quietly(ct.run, ["--data", "conll2000", "--head", "crf", "--char-encoder", "lstm",
                                    "--out", str(tmp_path), *TINY])
    assert "held-out 10% of train.txt, split seed 0" in text
    assert result["dev"][0][0][:4] == ["In", "Tokyo", "on", "Monday"]  # the held-out split, not train's head
    assert result["dev_features"][0][:4] == [["IN"], ["NNP"], ["IN"], ["NNP"]]  # its POS column, aligned
    assert [x.name for x in result["models"]["crf"].inputs] == ["words", "chars", "features"]
    check_run(ct, result, "crf")


@pytest.mark.slow(reason="trains a tagger on shared data, ~20-35 s")
@pytest.mark.skipif(not os.path.isdir(EWT), reason="../shared/data/ud_english_ewt absent")
def test_ewt_upos_softmax_head_with_char_gru_keras_twin(ct, tmp_path):
    result, text = quietly(ct.run, ["--data", "ewt", "--head", "softmax", "--char-encoder", "gru",
                                    "--layers", "keras", "--out", str(tmp_path), *TINY])
    assert "accuracy" in text
    layers = {type(layer).__module__.split(".")[0] for layer in result["models"]["softmax"]._flatten_layers()}
    assert "keras_birnn" not in layers  # the twin: Keras's GRU, LSTM and Bidirectional only
    check_run(ct, result, "softmax")
