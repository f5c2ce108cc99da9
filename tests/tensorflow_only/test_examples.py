"""Smoke tests of examples/: each trains on a small slice of the real data
(loss decreases), the POS tagger's SavedModel serves strings to tags in a
fresh process, and the parts with exact answers are checked exactly.

The full runs are not here; their commands and results are in the README.
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import EWT, POLARITY, REPO, load_example, quietly, run_python
from keras_birnn.tagging import TokenEncoder, load_vectors

needs_ewt = pytest.mark.skipif(not os.path.isdir(EWT), reason="../shared/data/ud_english_ewt absent")
needs_polarity = pytest.mark.skipif(not os.path.isdir(POLARITY), reason="../shared/data/sentence_polarity absent")


# --- book_figures --------------------------------------------------------------------------

FIG_17_2 = [  # seed 000's figure 17-2: t, input, fwd[0], fwd[1], bwd[0], bwd[1]
    "  0  +1.0   +0.462  -0.291   -0.165  +0.519",
    "  1  +0.0   +0.154  -0.161   +0.069  -0.130",
    "  2  -1.0   -0.425  +0.217   +0.069  -0.482",
    "  3  +0.5   +0.101  -0.021   -0.289  +0.442",
    "  4  +2.0   +0.777  -0.550   -0.380  +0.834",
]
# Norms quoted in seed 000's text for figure 17-5 (position: |fwd|, |bwd|).
FIG_17_5_BOOK = {0: (0.054, 0.056), 2: (0.089, 0.076), 3: (0.057, 0.004), 7: (0.045, 0.009)}
# Program 095 compiled with gcc -O0 on glibc, printf precision raised to %.6f.
FIG_17_5_GLIBC_NORMS = [
    (0.050084, 0.082574), (0.006297, 0.028774), (0.083710, 0.110973), (0.052278, 0.004918),
    (0.021923, 0.018445), (0.019190, 0.098949), (0.100454, 0.115374), (0.041490, 0.013679),
]


def test_book_figures_print_the_books_tables(tmp_path):
    book = load_example("book_figures")
    png = tmp_path / "figure_17_5.png"
    out, text = quietly(book.run, ["--png", str(png)])
    for line in FIG_17_2:
        assert line in out["17-2"]
        t, x, f0, f1, b0, b1 = line.split()
        assert f"  {t}  {x}   [{f0}, {f1} | {b0}, {b1}]" in out["17-3"]
    predicted = [line.split()[-1] for line in out["17-4"].splitlines()[4:10]]
    assert predicted == ["DET", "VERB", "PREP", "NOUN", "NOUN", "VERB"]
    assert "  The     DET    0.21  0.19  0.21  0.18  0.21   DET" in out["17-4"]
    # The Microsoft C runtime's rand() gives the book's figure 17-5.
    _, forward, backward = out["17-5/msvc"]
    for t, (f, b) in FIG_17_5_BOOK.items():
        assert (round(float(forward[t]), 3), round(float(backward[t]), 3)) == (f, b)
    assert min(forward.min(), backward.min()) == pytest.approx(0.004, abs=5e-4)
    assert max(forward.max(), backward.max()) == pytest.approx(0.107, abs=5e-4)
    assert "factor of 14" in text
    # Seeded NumPy weights: other numbers, still uneven.
    _, forward, backward = out["17-5/numpy"]
    assert np.max(np.maximum(forward, backward) / np.minimum(forward, backward)) > 3
    assert "only the qualitative pattern holds" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert out.get("png") is None
    else:
        assert out["png"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_book_figure_17_5_with_glibc_rand_matches_the_compiled_program():
    book = load_example("book_figures")
    _, forward, backward, _ = book.figure_17_5("glibc")
    np.testing.assert_allclose(np.stack([forward, backward], -1), FIG_17_5_GLIBC_NORMS, atol=2e-6)


# --- pos_tagging ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pos_run(tmp_path_factory):
    pos = load_example("pos_tagging")
    out = tmp_path_factory.mktemp("pos")
    argv = [
        "--train", os.path.join(EWT, "en_ewt-ud-train.conllu"),
        "--dev", os.path.join(EWT, "en_ewt-ud-dev.conllu"),
        "--variants", "gru,bigru", "--epochs", "2", "--max-train-sentences", "200",
        "--max-dev-sentences", "40", "--hidden", "16", "--word-dim", "16", "--char-units", "8",
        "--batch-size", "16", "--out", str(out), "--quiet",
    ]
    result, text = quietly(pos.run, argv)
    return pos, result, text


@pytest.mark.slow(reason="the pos_run fixture trains every tagger variant, ~37 s")
@needs_ewt
def test_pos_tagger_trains_every_variant(pos_run):
    _, result, text = pos_run
    assert [row["variant"] for row in result["rows"]] == ["gru", "bigru"]
    for row in result["rows"]:
        assert row["loss_after"] < row["loss_before"], row
        # One model.fit: a loss, a dev pass and a time per epoch; Keras's masked
        # "upos" metric on dev equals the example's own count over words.
        assert len(row["epoch_losses"]) == len(row["dev_curve"]) == len(row["epoch_seconds"]) == 2
        assert len(row["validation_seconds"]) == 2 and min(row["epoch_seconds"]) > 0
        assert row["dev_curve"][-1] == pytest.approx(row["dev"], abs=1e-6)
    assert "dev UPOS" in text and result["export_path"] in text
    png = os.path.join(os.path.dirname(os.path.dirname(result["export_path"])), "pos_tagging_training.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in text and not os.path.exists(png)
    else:
        assert f"Training curves: {png}" in text
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow(reason="the pos_run fixture trains every tagger variant, ~37 s")
@needs_ewt
def test_pos_tagger_savedmodel_serves_strings_to_tags_in_a_fresh_process(pos_run):
    pos, result, _ = pos_run
    path = result["export_path"]
    assert path.endswith(os.path.join("pos_tagger", "1"))
    from keras_birnn.export.saved_model import saved_model_xla_functions

    assert not saved_model_xla_functions(path)
    sentences = [tokens for tokens, _ in result["dev"][:6]]
    sentences.append(["Zyxwvut", "qwertyuiopasdfghjklzxc", "\u00e9t\u00e9", "!"])  # OOV words and characters
    padded = pos.pad_tokens(sentences).tolist()
    served = json.loads(run_python(f"""
        import json
        import tensorflow as tf
        serve = tf.saved_model.load({path!r}).signatures["serving_default"]
        out = serve(inputs=tf.constant({json.dumps(padded)}))
        print(json.dumps({{"tags": [[t.decode() for t in row] for row in out["tags"].numpy()],
                          "confidence": out["confidence"].numpy().tolist()}}))
    """))
    # The Keras model on the same sentences, encoded by the training pipeline.
    model = result["models"][result["best"]]
    encoded = pos.Encoded([(s, ["X"] * len(s)) for s in sentences], result["encoder"], result["tags"])
    predicted = pos.predict_ids(model, encoded)
    (words, chars), _ = encoded.batch(list(range(len(sentences))))
    keras_probs = np.asarray(model((words, chars), training=False))
    for row, tokens in enumerate(sentences):
        n = len(tokens)
        assert served["tags"][row][:n] == [result["tags"][k] for k in predicted[row]]
        assert served["tags"][row][n:] == [""] * (len(padded[row]) - n)  # padding in, "" out
        # The served confidence: the softmax's probability of the chosen tag.
        np.testing.assert_allclose(np.array(served["confidence"][row])[:n], keras_probs[row, :n].max(-1), atol=1e-5)


@pytest.mark.slow(reason="the pos_run fixture trains every tagger variant, ~37 s")
@needs_ewt
def test_pos_tagger_litert_takes_device_ids_and_equals_keras(pos_run):
    """The .tflite tagger (builtin ops only) on ids computed in plain Python
    from its ids.json: the same ids as the training pipeline's, and the same
    probabilities as the Keras model at every word, right- and left-padded."""
    pytest.importorskip("ai_edge_litert.interpreter")
    pos, result, _ = pos_run
    path = result["litert_path"]
    assert path.endswith(os.path.join("pos_tagger_litert", "pos_tagger.tflite"))
    with open(os.path.join(os.path.dirname(path), "ids.json"), encoding="utf-8") as f:
        ids = json.load(f)
    assert ids["tags"] == list(result["tags"]) and ids["batch_size"] == 1
    sentences = [tokens for tokens, _ in result["dev"][:4]]
    sentences.append(["Zyxwvut", "qwertyuiopasdfghjklzxc", "\u00e9t\u00e9", "!"])  # OOV words and characters
    model = result["models"][result["best"]]
    interpreter = pos.litert_interpreter(path)
    for tokens in sentences:
        words, chars = pos.device_ids([tokens], ids)
        expected_words, expected_chars = result["encoder"](pos.pad_tokens([tokens]))
        np.testing.assert_array_equal(words, expected_words)
        np.testing.assert_array_equal(chars, expected_chars)
        for shift in (0, 3):  # right padding only, then three padding words in front
            w = np.pad(words, [(0, 0), (shift, 1)])
            c = np.pad(chars, [(0, 0), (shift, 1), (0, 0)])
            got = pos.litert_probabilities(interpreter, w, c)
            keras_probs = np.asarray(model((w, c), training=False))
            valid = w != 0
            np.testing.assert_allclose(got[valid], keras_probs[valid], atol=1e-5, rtol=1e-5)


def test_device_ids_equal_the_token_encoders():
    """`device_ids` (plain Python, the LiteRT app's side) gives `TokenEncoder`'s ids: case, digits, long words."""
    pos = load_example("pos_tagging")
    encoder = TokenEncoder(max_chars=6, word_vocabulary=["the", "0000"], char_vocabulary=list("abcdehij0T"))
    ids = {"words": encoder.get_word_vocabulary(), "chars": encoder.get_char_vocabulary(), "max_chars": 6,
           "lowercase": True, "fold_digits": True}
    sentences = [["The", "abcdefghij", "2024", "\u00e9t\u00e9"], ["THE", "x"]]
    words, chars = pos.device_ids(sentences, ids)
    expected_words, expected_chars = encoder(pos.pad_tokens(sentences))
    np.testing.assert_array_equal(words, expected_words)
    np.testing.assert_array_equal(chars, expected_chars)
    assert words.tolist() == [[2, 1, 3, 1], [2, 1, 0, 0]]


def test_token_encoder_keeps_prefix_and_suffix_of_long_words():
    encoder = TokenEncoder(word_vocabulary=["the"], char_vocabulary=list("abcdefghijklmnopqrstuvwxyz"), max_chars=6)
    word_ids, char_ids = encoder([["The", "abcdefghij", ""], ["xyz", "", ""]])
    assert word_ids.numpy().tolist() == [[2, 1, 0], [1, 0, 0]]  # lower-cased; OOV 1; padding 0
    index = {c: i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
    assert char_ids.numpy()[0, 1].tolist() == [index[c] for c in "abchij"]  # first 3 + last 3
    assert char_ids.numpy()[0, 0].tolist() == [1, index["h"], index["e"], 0, 0, 0]  # "T" is OOV
    assert char_ids.numpy()[1, 0].tolist() == [index["x"], index["y"], index["z"], 0, 0, 0]
    assert not char_ids.numpy()[:, 2].any() and not char_ids.numpy()[1, 1:].any()


def test_pos_variants_take_pretrained_vectors(tmp_path):
    """--embeddings' path in pos_tagging: the file's vector is the row of each
    known word in the built model (the "gru" variant rewires build_tagger's
    model, and keeps its embedding), frozen with --freeze-embeddings."""
    pos = load_example("pos_tagging")
    path = tmp_path / "tiny.txt"  # GloVe: no header
    path.write_text("the 0.5 -1.25 2\ncat 1 0 -3.5\n")
    vocabulary = ["", "[UNK]", "the", "cat", "emu"]
    matrix, stats = load_vectors(str(path), vocabulary)
    assert (stats.exact, stats.missing, stats.dim) == (2, 1, 3)
    for variant in ("gru", "bilstm2"):
        model = pos.build_variant(variant, 5, 6, ["A", "B"], char_units=2, hidden=3, embeddings=matrix,
                                  trainable_embeddings=False)
        layer = model.get_layer("word_embedding")
        table = np.asarray(layer.embeddings)
        np.testing.assert_array_equal(table[2:4], [[0.5, -1.25, 2], [1, 0, -3.5]])
        assert not table[0].any() and not layer.trainable
        assert not any(w is layer.embeddings for w in model.trainable_weights)


def test_pos_flags(tmp_path):
    pos = load_example("pos_tagging")
    a, b = tmp_path / "a.conllu", tmp_path / "b.conllu"
    a.write_text(""), b.write_text("")
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        pos.parse_args(["--train", str(a)])  # --dev is required with --train
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        pos.parse_args(["--train", str(a), "--dev", str(b), "--variants", "gru,cnn"])
    args = pos.parse_args(["--train", str(a), "--dev", str(b)])
    assert args.variants == ["gru", "bigru", "bilstm", "bilstm2"] and args.out == "saved_models"
    assert pos.EWT == ("ud_english_ewt", "en_ewt-ud-train.conllu", "en_ewt-ud-dev.conllu")


# --- sentence_classification ----------------------------------------------------------------------


@pytest.mark.slow(reason="trains every head, ~34 s")
@needs_polarity
def test_sentence_classification_trains_each_head():
    sent = load_example("sentence_classification")
    result, text = quietly(sent.run, [
        "--pos", os.path.join(POLARITY, "rt-polarity.pos"), "--neg", os.path.join(POLARITY, "rt-polarity.neg"),
        "--max-sentences", "300", "--epochs", "2", "--embed-dim", "16", "--hidden", "8",
        "--variants", "uni-final,bi-final,bi-mean,bi-max,bi-attention", "--quiet",
    ])
    assert [r["variant"] for r in result["rows"]] == ["uni-final", "bi-final", "bi-mean", "bi-max", "bi-attention"]
    for row in result["rows"]:
        assert row["loss_after"] < row["loss_before"], row
    assert "Held-out accuracy (30 sentences)" in text


@needs_polarity
def test_sentence_classification_finds_its_default_data(monkeypatch, tmp_path):
    """--data-dir (else KERAS_BIRNN_DATA) is a local copy used as it is;
    --pos and --neg go together."""
    sent = load_example("sentence_classification")
    expected = (os.path.join(POLARITY, "rt-polarity.pos"), os.path.join(POLARITY, "rt-polarity.neg"))
    args = sent.parse_args(["--data-dir", os.path.dirname(POLARITY)])
    assert (args.pos, args.neg) == expected
    monkeypatch.setenv("KERAS_BIRNN_DATA", os.path.dirname(POLARITY))
    args = sent.parse_args([])
    assert (args.pos, args.neg) == expected
    there = tmp_path / "there.txt"
    there.write_text("a line\n")
    assert "--pos and --neg go together" in _refused(sent.parse_args, ["--pos", str(there)])


def test_sentence_split_is_fixed_seeded_and_disjoint():
    sent = load_example("sentence_classification")
    train, val, test = sent.split_indices(10_662, seed=0)
    assert len(test) == 1066 and len(val) == 960 and len(train) == 10_662 - 1066 - 960
    assert len(set(train) | set(val) | set(test)) == 10_662
    again = sent.split_indices(10_662, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again))
    assert not np.array_equal(test, sent.split_indices(10_662, seed=1)[2])
    assert sent.tokenize("It's a gem, not a flop!") == ["it's", "a", "gem", ",", "not", "a", "flop", "!"]


def test_sentence_batches_dataset_redraws_each_pass():
    """`Batches.dataset()` gives `model.fit` the batches `Batches[k]` holds,
    padded to each batch's longest sentence; each later pass (epoch) the
    next draw of the same seeded generator, and the unshuffled batches
    every pass."""
    sent = load_example("sentence_classification")
    rng = np.random.default_rng(3)
    ids = [rng.integers(2, 50, size=n).astype(np.int32) for n in rng.integers(1, 9, size=23)]
    labels = rng.integers(0, 2, size=23).astype(np.float32)

    def passes(batches, count):
        data = batches.dataset()
        assert data.options().autotune.enabled is False  # see Batches.dataset
        return [[(x.numpy(), y.numpy()) for x, y in data] for _ in range(count)]

    def draws(count):  # what each epoch's batches should be
        expected = sent.Batches(ids, labels, 5, seed=7)
        out = []
        for _ in range(count):
            out.append([expected[k] for k in range(len(expected))])
            expected.on_epoch_end()
        return out

    got = passes(sent.Batches(ids, labels, 5, seed=7), 3)
    for got_pass, want_pass in zip(got, draws(3)):
        assert len(got_pass) == len(want_pass) == 5
        for (x, y), (wx, wy) in zip(got_pass, want_pass):
            np.testing.assert_array_equal(x, wx)
            np.testing.assert_array_equal(y, wy)
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(got[0], got[1]))  # redrawn
    x, _ = got[0][0]
    assert x.shape[1] == max(int((row != 0).sum()) for row in x)  # padded to the longest row
    fixed = passes(sent.Batches(ids, labels, 5, seed=7, shuffle=False), 2)
    for (x0, y0), (x1, y1) in zip(*fixed):
        np.testing.assert_array_equal(x0, x1)
        np.testing.assert_array_equal(y0, y1)


# --- merge_modes -----------------------------------------------------------------------------------


@pytest.mark.slow(reason="trains models, ~12 s")
def test_merge_modes_sum_cannot_tell_a_sequence_from_its_reverse():
    merge = load_example("merge_modes")
    result, text = quietly(merge.run, ["--sections", "merge,stack", "--samples", "128", "--length", "6",
                                       "--epochs", "3", "--hidden", "4"])
    rows = {(r["merge"], r["weights"]): r for r in result["merge"]["rows"]}
    # Shared weights + sum: x and its reverse get the same vector and opposite
    # labels, so exactly one of each held-out pair is right, whatever the training.
    assert rows[("sum", "shared")]["accuracy"] == 0.5
    for row in rows.values():
        assert row["loss_last"] < row["loss_first"], row
    assert "sum(reversed x)|       = 0.0e+00" in text
    # Seed 000's stacking exercise: 128 wide, 37,248 + 74,112 parameters.
    stack = result["stack"][False]
    assert (stack["first"], stack["second"], stack["width"]) == (37_248, 74_112, 128)


@pytest.mark.slow(reason="trains models, ~44 s")
def test_merge_modes_ensemble_and_cells_train():
    merge = load_example("merge_modes")
    result, _ = quietly(merge.run, ["--sections", "cells,ensemble", "--samples", "96", "--length", "8",
                                    "--epochs", "3", "--hidden", "4"])
    rows = result["cells"]["rows"] + result["ensemble"]["hmm"]["rows"] + result["ensemble"]["runs"]["rows"]
    assert len(rows) == 10  # BiGRU, BiLSTM on two tasks; forward, backward, joint on two tasks
    for row in rows:
        assert row["loss_last"] < row["loss_first"], row
    hmm = result["ensemble"]["hmm"]["accuracy"]
    assert set(hmm) == {"forward GRU", "backward GRU", "BiGRU (joint)", "ensemble, averaged", "ensemble, product"}
    assert 0.5 < result["ensemble"]["hmm"]["optimum"] <= 1.0


def test_pos_datasets_give_the_batches_without_autotuning():
    """`dataset` feeds `model.fit` exactly the batches
    given (or drawn, the same seeded draws each pass), with tf.data's
    autotuning off (`keras_birnn.cli.arguments.without_autotuning`)."""
    pos = load_example("pos_tagging")
    rng = np.random.default_rng(0)
    batches = []
    for n in (3, 2):
        words = rng.integers(1, 9, size=(n, 4)).astype(np.int32)
        chars = rng.integers(1, 9, size=(n, 4, 5)).astype(np.int32)
        batches.append(((words, chars), rng.integers(0, 3, size=(n, 4)).astype(np.int32)))
    data = pos.dataset(batches)
    assert data.options().autotune.enabled is False and int(data.cardinality()) == 2
    given = list(data)
    assert len(given) == len(batches)
    for ((w, c), y), ((ww, wc), wy) in zip(given, batches):
        np.testing.assert_array_equal(w.numpy(), ww)
        np.testing.assert_array_equal(c.numpy(), wc)
        np.testing.assert_array_equal(y.numpy(), wy)

    def draw(rng):
        return [batches[int(k)] for k in rng.integers(0, 2, size=2)]

    # Seed 2 draws [1, 0], then [0, 0]: a pipeline repeating its first
    # pass gives other batches on the second.
    rng = np.random.default_rng(2)
    training = pos.dataset(lambda: draw(rng), batches[0], 2)
    assert training.options().autotune.enabled is False and int(training.cardinality()) == 2
    want = np.random.default_rng(2)
    for _ in range(2):  # each pass the next draw
        expected, drawn = draw(want), list(training)
        assert len(drawn) == len(expected)
        for ((w, _), _), ((ww, _), _) in zip(drawn, expected):
            np.testing.assert_array_equal(w.numpy(), ww)


def test_hmm_posterior_equals_brute_force_enumeration():
    merge = load_example("merge_modes")
    stay, flip = 0.8, 0.3
    observed = np.array([[1, 0, 0, 1, 1], [0, 0, 1, 0, 1]], "float32")[..., None]
    paths = np.array(np.meshgrid(*[[0, 1]] * 5, indexing="ij")).reshape(5, -1).T  # all 32 hidden paths
    for row in range(len(observed)):
        obs = observed[row, :, 0]
        weights = []
        for path in paths:
            p = 0.5
            for t in range(1, 5):
                p *= stay if path[t] == path[t - 1] else 1 - stay
            p *= np.prod(np.where(path == obs, 1 - flip, flip))
            weights.append(p)
        weights = np.array(weights)
        expected = (weights[:, None] * paths).sum(0) / weights.sum()
        np.testing.assert_allclose(merge.hmm_posterior(observed[row : row + 1], stay, flip)[0], expected, atol=1e-12)


def test_merge_modes_combinations():
    merge = load_example("merge_modes")
    p_f = np.array([[[0.5, 0.5], [0.9, 0.1]]])
    p_b = np.array([[[0.5, 0.5], [0.6, 0.4]]])
    np.testing.assert_allclose(merge.combine(p_f, p_b, "average"), [[[0.5, 0.5], [0.75, 0.25]]])
    # Product of experts: 0.9*0.6 against 0.1*0.4, renormalised (the average would give 0.75).
    np.testing.assert_allclose(merge.combine(p_f, p_b, "product"), [[[0.5, 0.5], [0.54 / 0.58, 0.04 / 0.58]]],
                               rtol=1e-6)
    assert merge.gru_params(32, 64, reset_after=False) * 2 == 37_248


# --- missing data: a clear error naming the flag, exit code 2 -------------------------------------


def _refused(parse, argv):
    """The message of `parse(argv)`'s SystemExit, which must be argparse's code 2."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(err):
        parse(argv)
    assert stop.value.code == 2, err.getvalue()
    return err.getvalue()


def test_missing_default_data_names_the_flags(tmp_path, monkeypatch):
    """As in a fresh clone: no ../shared/data beside the repository, no network."""
    absent = tmp_path / "absent"
    sent = load_example("sentence_classification")
    monkeypatch.delenv("KERAS_BIRNN_DATA", raising=False)
    text = _refused(sent.parse_args, ["--data-url", absent.as_uri(), "--cache-dir", str(tmp_path / "cache")])
    assert f"could not download {absent.as_uri()}/sentence_polarity/rt-polarity.pos" in text
    assert "--data-dir DIR" in text and "KERAS_BIRNN_DATA=DIR" in text and "default data" in text
    pos = load_example("pos_tagging")
    text = _refused(pos.parse_args, ["--data-url", absent.as_uri(), "--cache-dir", str(tmp_path / "cache")])
    assert f"could not download {absent.as_uri()}/ud_english_ewt/en_ewt-ud-train.conllu" in text
    assert "--data-dir DIR" in text
    ct = load_example("conll_tagging")
    for data, name in (("conll2002", "conll2002_spanish"), ("conll2000", "conll2000_chunking"),
                       ("ewt", "ud_english_ewt")):
        text = _refused(ct.parse_args, ["--data", data, "--data-url", absent.as_uri(),
                                        "--cache-dir", str(tmp_path / "cache")])
        assert f"the default data, {name}" in text and "--data-dir DIR" in text


def test_missing_data_files_name_their_flag(tmp_path):
    there, absent = tmp_path / "there.txt", str(tmp_path / "absent.txt")
    there.write_text("a line\n")
    sent = load_example("sentence_classification")
    assert "--neg: no file" in _refused(sent.parse_args, ["--pos", str(there), "--neg", absent])
    pos = load_example("pos_tagging")
    assert "--train: no file" in _refused(pos.parse_args, ["--train", absent, "--dev", str(there)])
    assert "--test: no file" in _refused(pos.parse_args, ["--train", str(there), "--dev", str(there), "--test", absent])
    ct = load_example("conll_tagging")
    assert "--dev: no file" in _refused(ct.parse_args, ["--train", str(there), "--dev", absent])


def test_missing_data_exits_2_without_a_traceback():
    """The whole script, in its own process: usage, the message, exit code 2."""
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "sentence_classification.py"),
         "--pos", "absent.pos", "--neg", "absent.neg"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow"),
    )
    assert done.returncode == 2 and "--pos: no file 'absent.pos'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "usage:" in done.stderr
