"""examples/conll_tagging.py, rebuilt on keras_birnn.tagging: its IOB2
repair of training tags, feature columns and word dropout, pretrained
vectors in the built model (--embeddings), and a small run on each shared
data set: the loss decreases, the reported F1 equals a count by hand, and
the exported SavedModel's tags equal the Keras model's. (The scorer, the
encoder and the builder are tested with the library: tests/test_portable_tagging_*.py.)"""

import contextlib
import io
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import CONLL2000, CONLL2002, EWT, SHARED_DATA, load_example, quietly
from keras_birnn.tagging import build_tagger, convert_tags, pad_tokens, spans

TINY = ["--max-train-sentences", "300", "--max-dev-sentences", "60", "--epochs", "5", "--hidden", "16",
        "--word-dim", "16", "--char-dim", "8", "--char-units", "8", "--batch-size", "16",
        "--learning-rate", "1e-2", "--quiet"]


@pytest.fixture(scope="module")
def ct():
    return load_example("conll_tagging")


def test_training_tags_in_iob2_keep_the_spans(ct):
    train = [(["San", "Sebasti\u00e1n", "y", "EFE"], ["I-LOC", "I-LOC", "O", "I-ORG"]), (["y"], ["O"])]
    fixed, changed = ct.training_tags_in_iob2(train)
    assert fixed == [(["San", "Sebasti\u00e1n", "y", "EFE"], ["B-LOC", "I-LOC", "O", "B-ORG"]), (["y"], ["O"])]
    assert changed == 2 and spans(fixed[0][1]) == spans(train[0][1]) == [("LOC", 0, 2), ("ORG", 3, 4)]
    assert fixed[0][1] == convert_tags(train[0][1], "iob1", "iob2")  # IOB1 reads the same spans here
    upos = [(["a"], ["DET"])]
    assert ct.training_tags_in_iob2(upos) == (upos, 0)


# --- model pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ["softmax", "crf"])
def test_tagger_with_feature_columns_ignores_padding(ct, head):
    """With feature columns (`build_tagger(features=...)`, as the example
    builds it) a sentence's outputs do not depend on the padding after it,
    and the CRF gives 0 there."""
    keras.utils.set_random_seed(0)
    model = build_tagger(20, ["O", "B-X", "I-X"], embedding_dim=4, char_encoder="lstm", num_chars=10, char_dim=3,
                         char_units=2, hidden=5, head=head, features={"column_1": 6, "column_2": 6}, feature_dim=3)
    words = np.array([[3, 4, 5, 0, 0, 0, 0, 0]], np.int32)
    chars = np.zeros((1, 8, 4), np.int32)
    chars[0, :3, :2] = 2
    features = np.zeros((2, 1, 8), np.int32)
    features[:, 0, :3] = [[2, 4, 1], [3, 5, 1]]  # 1: a value unseen in training
    padded = np.asarray(model((words, chars, *features)))
    alone = np.asarray(model((words[:, :3], chars[:, :3], *features[:, :, :3])))
    np.testing.assert_allclose(padded[:, :3], alone, atol=1e-6)
    if head == "crf":
        assert not padded[:, 3:].any()


def test_word_dropout_replaces_known_words_only(ct):
    words = np.array([[5, 1, 7, 0], [9, 9, 0, 0]], np.int32)
    batch = ((words, np.zeros((2, 4, 1), np.int32)), np.zeros((2, 4), np.int32))
    assert ct.pos.drop_words(batch, 0.0, np.random.default_rng(0)) is batch
    (all_dropped, _), _ = ct.pos.drop_words(batch, 1.0 - 1e-9, np.random.default_rng(0))
    np.testing.assert_array_equal(all_dropped, [[1, 1, 1, 0], [1, 1, 0, 0]])  # padding stays 0
    (some, _), _ = ct.pos.drop_words(((np.full((100, 100), 7, np.int32), None), None), 0.2, np.random.default_rng(0))
    assert set(np.unique(some)) == {1, 7} and 0.17 < (some == 1).mean() < 0.23
    np.testing.assert_array_equal(words, [[5, 1, 7, 0], [9, 9, 0, 0]])  # the input is not changed


def test_feature_columns_are_read_checked_and_encoded(ct, tmp_path):
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
    # Ids per column: 0 padding, 1 unseen, then the sorted training values.
    train = [[["NN", "B"], ["VB", "I"]], [["NN", "I"]]]
    lookups = ct.feature_lookups(train)
    encoder = ct.TokenEncoder()
    encoder.adapt([["a", "b"], ["c"]])
    dev = [(["a", "b", "z"], ["O", "O", "O"]), (["c"], ["O"])]
    encoded = ct.pos.Encoded(dev, encoder, ["O"], [[["VB", "B"], ["JJ", "I"], ["B", "NN"]], [["NN", "I"]]], lookups)
    assert encoded.features[0].tolist() == [[3, 2], [1, 3], [1, 1]] and encoded.features[1].tolist() == [[2, 3]]
    (words, _, first, second), _ = encoded.batch([1, 0])
    assert first.tolist() == [[2, 0, 0], [3, 1, 1]] and second.tolist() == [[3, 0, 0], [2, 3, 1]]
    assert words[0, 1:].tolist() == [0, 0]
    with pytest.raises(ValueError, match="one entry per sentence"):
        ct.pos.Encoded(dev, encoder, ["O"], train[:1], lookups)


def test_flags(ct, tmp_path):
    (tmp_path / "a").mkdir()
    train = tmp_path / "a" / "b.txt"
    train.write_text("")
    for argv in (["--data", "conll2002", "--train", str(train)], [], ["--train", str(train), "--head", "hmm"],
                 ["--train", str(train), "--held-out", "1.0"], ["--train", str(train), "--char-encoder", "rnn"],
                 ["--train", str(train), "--layers", "torch"], ["--train", str(train), "--embeddings", "absent.vec"]):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            ct.parse_args(argv)
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        ct.parse_args(["--train", str(tmp_path / "x.conllu"), "--feature-columns", "1"])
    assert "--feature-columns reads column files" in err.getvalue()
    args = ct.parse_args(["--train", str(train), "--head", "softmax,crf", "--quick"])
    assert args.heads == ["softmax", "crf"] and args.name == "b" and args.max_train_sentences == 600
    assert args.feature_columns == [] and args.layers == "kb" and args.epochs == 3 and args.format == "columns"
    assert ct.parse_args(["--train", str(train), "--layers", "keras"]).layers == "keras"


@pytest.mark.skipif(not os.path.isdir(CONLL2000), reason="../shared/data/conll2000_chunking absent")
def test_registered_data_defaults(ct):
    args = ct.parse_args(["--data", "conll2000", "--data-dir", SHARED_DATA])
    assert args.heads == ["crf"] and args.char_encoder == "lstm" and args.epochs == 8 and args.name == "conll2000"
    assert args.feature_columns == [1]  # the POS tags, by default for CoNLL-2000
    assert args.train == os.path.join(CONLL2000, "train.txt") and args.dev is None
    assert ct.parse_args(["--data", "conll2000", "--data-dir", SHARED_DATA, "--feature-columns"]).feature_columns == []


def write_vectors(path, vectors: dict) -> None:
    """A word2vec text file (a header, then a word and its values per line)."""
    dim = len(next(iter(vectors.values())))
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{len(vectors)} {dim}\n")
        for word, values in vectors.items():
            f.write(word + " " + " ".join(f"{v:.6f}" for v in values) + "\n")


@pytest.mark.slow(reason="trains a tiny tagger with pretrained vectors, ~15-35 s")
def test_embeddings_flag_puts_the_files_vectors_in_the_model(ct, tmp_path):
    """--embeddings: each known word's row of the built model's embedding is
    the file's vector (the word keys are lower-cased: "The" -> "the"), and
    with --freeze-embeddings it is still that after training."""
    rng = np.random.default_rng(0)
    lines = [("The", "O"), ("cat", "B-X"), ("Madrid", "B-LOC"), ("sat", "O")]
    text = "\n".join(" ".join(p) for p in lines) + "\n\n"
    (tmp_path / "train.txt").write_text(text * 12)
    vectors = {w: rng.normal(size=5).round(4) for w in ("the", "cat", "madrid", "dog")}
    write_vectors(tmp_path / "tiny.vec", vectors)
    result, out = quietly(ct.run, ["--train", str(tmp_path / "train.txt"), "--embeddings", str(tmp_path / "tiny.vec"),
                                   "--freeze-embeddings", "--epochs", "2", "--hidden", "4", "--char-dim", "3",
                                   "--char-units", "2", "--min-word-count", "1", "--no-export", "--quiet"])
    assert "Word vectors from" in out and "coverage=75.0%, exact=3, case_fallback=0, missing=1 ['sat']" in out
    model, vocabulary = result["models"]["crf"], result["encoder"].get_word_vocabulary()
    table = np.asarray(model.get_layer("word_embedding").embeddings)
    assert table.shape == (len(vocabulary), 5)
    for word in ("the", "cat", "madrid"):
        np.testing.assert_allclose(table[vocabulary.index(word)], vectors[word], atol=1e-6)
    assert not table[0].any()  # padding


# --- runs on the shared data --------------------------------------------------------------------


def check_run(ct, result, head):
    """Loss decreased; the reported scores equal a count by hand; the
    exported SavedModel's tags equal the Keras model's."""
    (row,) = result["rows"]
    assert row["head"] == head and row["loss_after"] < row["loss_before"], row
    gold = [tags for _, tags in result["dev"]]
    if ct.is_iob2(result["tags"]):
        truth, guess = spans_by_hand(gold), spans_by_hand(row["predicted_tags"])
        correct = len(truth & guess)
        assert correct > 0  # a check on something found
        assert (row["gold"], row["predicted"], row["correct"]) == (len(truth), len(guess), correct)
        p, r = correct / max(len(guess), 1), correct / len(truth)
        assert row["f1"] == pytest.approx(2 * p * r / (p + r) if correct else 0.0)
        assert len(row["train_span_f1"]) == 5 and row["train_span_f1"][-1] > 0  # SpanF1 in fit's logs
    else:
        hits = sum(a == b for g, y in zip(gold, row["predicted_tags"]) for a, b in zip(g, y))
        assert row["accuracy"] == pytest.approx(hits / sum(map(len, gold)))
    if head in result["exports"]:
        check_export(ct, result, head)


def check_export(ct, result, head):
    """The served tags (`export_tagger`) equal the model's, for dev sentences and OOV words."""
    sentences = [tokens for tokens, _ in result["dev"][:12]]
    sentences.append(["Zyxwvut", "qwertyuiopasdfghjklzxc", "\u00e9t\u00e9", "2024", "!"])  # OOV words and characters
    served = tf.saved_model.load(result["exports"][head]).signatures["serving_default"]
    padded = pad_tokens(sentences)
    out = served(inputs=tf.constant(padded))
    tags = [[t.decode() for t in row] for row in out["tags"].numpy()]
    encoded = ct.pos.Encoded([(s, ["O"] * len(s)) for s in sentences], result["encoder"], result["tags"])
    keras_ids = ct.pos.predict_ids(result["models"][head], encoded)
    for row, tokens in enumerate(sentences):
        n = len(tokens)
        assert tags[row][:n] == [result["tags"][k] for k in keras_ids[row]]
        assert tags[row][n:] == [""] * (padded.shape[1] - n) and (out["tag_ids"].numpy()[row, n:] == -1).all()
    if head == "crf" and ct.is_iob2(result["tags"]):  # the "iob2" constraints hold in what is served
        for row in tags:
            row = [t for t in row if t]
            assert all(not t.startswith("I-") or (i and row[i - 1][2:] == t[2:] and row[i - 1] != "O")
                       for i, t in enumerate(row)), row


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


@pytest.mark.slow(reason="trains a tagger on shared data, ~20-35 s")
@pytest.mark.skipif(not os.path.isdir(CONLL2002), reason="../shared/data/conll2002_spanish absent")
def test_conll2002_crf_head_with_char_cnn(ct, tmp_path):
    result, text = quietly(ct.run, ["--data", "conll2002", "--data-dir", SHARED_DATA, "--head", "crf",
                                    "--char-encoder", "cnn", "--out", str(tmp_path), *TINY])
    assert "span F1" in text and "esp.testa" in text
    check_run(ct, result, "crf")


@pytest.mark.slow(reason="trains a tagger on shared data, ~20-35 s")
@pytest.mark.skipif(not os.path.isdir(CONLL2000), reason="../shared/data/conll2000_chunking absent")
def test_conll2000_crf_head_with_char_lstm_and_pos_features_on_the_held_out_split(ct, tmp_path):
    result, text = quietly(ct.run, ["--data", "conll2000", "--data-dir", SHARED_DATA, "--head", "crf",
                                    "--char-encoder", "lstm", "--out", str(tmp_path), *TINY])
    assert "held-out 10% of train.txt, split seed 0" in text
    assert result["dev"][0][0][:4] == ["In", "Tokyo", "on", "Monday"]  # the held-out split, not train's head
    assert result["dev_features"][0][:4] == [["IN"], ["NNP"], ["IN"], ["NNP"]]  # its POS column, aligned
    assert [x.name for x in result["models"]["crf"].inputs] == ["words", "chars", "column_1"]
    assert not result["exports"] and "not exported" in text  # export_tagger takes tokens only
    check_run(ct, result, "crf")


@pytest.mark.slow(reason="trains a tagger on shared data, ~20-35 s")
@pytest.mark.skipif(not os.path.isdir(EWT), reason="../shared/data/ud_english_ewt absent")
def test_ewt_upos_softmax_head_with_char_gru_keras_twin(ct, tmp_path):
    result, text = quietly(ct.run, ["--data", "ewt", "--data-dir", SHARED_DATA, "--head", "softmax",
                                    "--char-encoder", "gru", "--layers", "keras", "--out", str(tmp_path), *TINY])
    assert "accuracy" in text
    layers = {type(layer).__module__.split(".")[0] for layer in result["models"]["softmax"]._flatten_layers()}
    assert "keras_birnn" not in layers  # the twin: Keras's GRU, LSTM and Bidirectional only
    check_run(ct, result, "softmax")
