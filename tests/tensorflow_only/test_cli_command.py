"""The `keras-birnn` command (keras_birnn/cli/main.py), run in-process
through `main([...])`: its output against what the library gives for the
same files (`Tagger.predict`, `Tagger.evaluate`, counts made here), and
every user error as exit code 2 with one line naming the file and line.
"""

import json
import os
import pathlib
import subprocess
import sys

import keras
import pytest

from keras_birnn.cli.main import main
from keras_birnn.tagging import SentenceClassifier, Tagger, convert_tags

REPO = pathlib.Path(__file__).resolve().parents[2]
NAMES = ["Ada", "Alan", "Grace", "Paris", "London", "Rome"]
WORDS = ["met", "saw", "in", "the", "rain", "slept", "near"]


def toy_corpus(count: int, offset: int = 0):
    """`count` sentences with IOB2 tags: names of people (B-PER) and places (B-LOC)."""
    sentences = []
    for i in range(offset, offset + count):
        tokens = [NAMES[i % 6], WORDS[i % 7], WORDS[(i * 3) % 7], NAMES[(i + 2) % 6]]
        tags = ["B-PER" if t in NAMES[:3] else "B-LOC" if t in NAMES else "O" for t in tokens]
        sentences.append((tokens[: 2 + i % 3], tags[: 2 + i % 3]))
    return sentences


def write_conll(path, sentences, extra_column=False):
    lines = []
    for tokens, tags in sentences:
        lines += [f"{t} X {g}" if extra_column else f"{t} {g}" for t, g in zip(tokens, tags)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return str(path)


def run(capsys, *argv):
    """`(exit code, stdout, stderr)` of `keras-birnn argv`."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code, err, *parts):
    assert code == 2, err
    assert "Traceback" not in err
    assert "keras-birnn: error:" in err
    for part in parts:
        assert part in err, err


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny trained Tagger, its `.keras` file and a test file of its data."""
    folder = tmp_path_factory.mktemp("cli")
    keras.utils.set_random_seed(0)
    train = toy_corpus(20)
    tokens, tags = [s[0] for s in train], [s[1] for s in train]
    tagger = Tagger.from_sentences(tokens, tags, embedding_dim=4, hidden=4)
    tagger.compile(keras.optimizers.Adam(0.05))
    tagger.fit(tokens, tags, epochs=2, batch_size=8, seed=0, verbose=0)
    model = str(folder / "ner.keras")
    tagger.save(model)
    test = toy_corpus(6, offset=20) + [(["Zed", "met", "Ada"], ["O", "O", "B-PER"])]  # an unseen word
    return tagger, model, folder, test


def test_data_prints_counts_and_oov_rate(tmp_path, capsys):
    train, dev = toy_corpus(7), toy_corpus(3, offset=5) + [(["Zed", "in", "Oslo"], ["O", "O", "B-LOC"])]
    code, out, err = run(capsys, "data", write_conll(tmp_path / "train.conll", train, extra_column=True),
                         "--dev", write_conll(tmp_path / "dev.conll", dev, extra_column=True), "--scheme", "iob2")
    assert code == 0, err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()}
    assert rows["sentences"] == ["7", "4"]
    assert rows["tokens"] == [str(sum(len(t) for t, _ in train)), str(sum(len(t) for t, _ in dev))]
    vocabulary = {t for tokens, _ in train for t in tokens}
    dev_tokens = [t for tokens, _ in dev for t in tokens]
    rate = sum(t not in vocabulary for t in dev_tokens) / len(dev_tokens)
    assert rate > 0
    assert f"Dev out of train vocabulary: {100 * rate:.2f}% of tokens" in out
    b_per = sum(g == "B-PER" for _, tags in train for g in tags)
    assert rows["B-PER"][0] == str(b_per)
    assert "IOB2 violations: 0" in out


def test_predict_conll_and_jsonl_match_tagger_predict(saved, capsys):
    tagger, model, folder, test = saved
    path = write_conll(folder / "predict.conll", test)
    expected = tagger.predict([tokens for tokens, _ in test])
    code, out, err = run(capsys, "predict", model, path)
    assert code == 0, err
    blocks = [block.splitlines() for block in out.strip("\n").split("\n\n")]
    assert len(blocks) == len(test)
    for block, (tokens, _), found in zip(blocks, test, expected):
        fields = [line.split("\t") for line in block]
        assert [f[0] for f in fields] == tokens
        assert [f[1] for f in fields] == found.tags
        assert [float(f[2]) for f in fields] == pytest.approx(found.confidence, abs=1e-6)
    code, out, err = run(capsys, "predict", model, path, "--output-format", "jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["tokens"] for r in rows] == [tokens for tokens, _ in test]
    assert [r["tags"] for r in rows] == [found.tags for found in expected]
    for row, found in zip(rows, expected):
        assert row["confidence"] == pytest.approx(found.confidence, abs=1e-6)


def test_evaluate_prints_tagger_evaluate_as_json(saved, capsys):
    tagger, model, folder, test = saved
    path = write_conll(folder / "evaluate.conll", test, extra_column=True)
    code, out, err = run(capsys, "evaluate", model, path)
    assert code == 0, err
    metrics = json.loads(out)
    expected = tagger.evaluate([t for t, _ in test], [g for _, g in test])
    assert metrics == json.loads(json.dumps(expected))
    predicted = [p.tags for p in tagger.predict([t for t, _ in test])]
    pairs = [(g, p) for (_, gold), tags in zip(test, predicted) for g, p in zip(gold, tags)]
    assert metrics["accuracy"] == pytest.approx(sum(g == p for g, p in pairs) / len(pairs))
    assert out.index('"accuracy"') < out.index('"f1"')  # sorted keys


def test_evaluate_converts_the_files_scheme_to_the_models(saved, capsys):
    tagger, model, folder, test = saved
    assert tagger.scheme == "iob2"
    iob1 = [(tokens, convert_tags(tags, "iob2", "iob1")) for tokens, tags in test]
    assert any(tag.startswith("I-") for _, tags in iob1 for tag in tags)  # the files differ
    path = write_conll(folder / "iob1.conll", iob1)
    code, out, err = run(capsys, "evaluate", model, path, "--scheme", "iob1")
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(tagger.evaluate([t for t, _ in test], [g for _, g in test])))


def test_export_writes_versions_and_refuses_an_existing_one(saved, tmp_path, capsys):
    _, model, _, _ = saved
    base = tmp_path / "served"
    for version in (1, 2):
        code, out, err = run(capsys, "export", model, base)
        assert code == 0, err
        assert out.strip() == os.path.join(str(base), str(version))
        assert (base / str(version) / "saved_model.pb").is_file()
    code, out, err = run(capsys, "export", model, base, "--version", "1")
    assert_user_error(code, err, os.path.join(str(base), "1"), "exists")
    assert sorted(os.listdir(base)) == ["1", "2"]


def test_classifier_predict_and_evaluate_on_a_tsv_file(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    texts = ["a fine film", "dull and long", "fine acting", "long and dull film", "a fine cast"]
    labels = ["pos", "neg", "pos", "neg", "pos"]
    classifier = SentenceClassifier.from_texts(texts, labels, embedding_dim=4, hidden=4)
    model = tmp_path / "polarity.keras"
    classifier.save(model)
    path = tmp_path / "test.tsv"
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{g}\n" for t, g in zip(texts, labels)), encoding="utf-8")
    code, out, err = run(capsys, "predict", model, path, "--header")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    expected = classifier.predict(texts)
    assert [r["text"] for r in rows] == texts
    assert [r["label"] for r in rows] == [found.label for found in expected]
    assert [r["probability"] for r in rows] == pytest.approx([found.probability for found in expected], abs=1e-6)
    code, out, err = run(capsys, "evaluate", model, path, "--header")
    assert code == 0, err
    assert json.loads(out) == pytest.approx(classifier.evaluate(texts, labels))
    path.write_text("text\tlabel\na fine film\tpos\nfine\tneutral\n", encoding="utf-8")
    assert_user_error(*run(capsys, "evaluate", model, path, "--header")[::2], f"{path}:3:", "'neutral'")


MALFORMED = [  # (file name, contents, the line reported); one test, so the fast subset runs them all
    ("columns.conll", b"Ada B-PER\nmet O\nAlan X B-PER\n", 3),
    ("empty.conll", b"", 1),
    ("latin1.conll", b"Ada B-PER\nCaf\xe9 O\n", 2),
    ("conllu.conllu", b"1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n\n2\tbark\tVERB\n", 3),
]


def test_data_reports_malformed_files_at_their_line(tmp_path, capsys):
    for name, content, line in MALFORMED:
        path = tmp_path / name
        path.write_bytes(content)
        code, out, err = run(capsys, "data", path)
        assert_user_error(code, err, f"{path}:{line}:")
        assert len(err.strip().splitlines()) == 1 and out == ""


def test_evaluate_reports_an_unknown_tag_at_its_line(saved, capsys):
    _, model, folder, _ = saved
    path = folder / "unknown.conll"
    path.write_text("Ada B-PER\nmet O\n\nAlan B-PER\nslept B-VERB\n", encoding="utf-8")
    code, out, err = run(capsys, "evaluate", model, path)
    assert_user_error(code, err, f"{path}:5:", "'B-VERB'")
    assert out == ""


def test_model_files_that_are_no_task_model(saved, tmp_path, capsys):
    _, _, folder, test = saved
    data = write_conll(folder / "any.conll", test)
    missing = tmp_path / "missing.keras"
    assert_user_error(*run(capsys, "predict", missing, data)[::2], str(missing), "no such file")
    plain = tmp_path / "plain.keras"
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).save(plain)
    assert_user_error(*run(capsys, "evaluate", plain, data)[::2], str(plain), "Sequential")
    garbage = tmp_path / "garbage.keras"
    garbage.write_text("not a zip file")
    assert_user_error(*run(capsys, "export", garbage, tmp_path / "out")[::2], str(garbage))
    assert not (tmp_path / "out").exists()


def test_missing_data_file(tmp_path, capsys):
    missing = tmp_path / "nothing.conll"
    assert_user_error(*run(capsys, "data", missing)[::2], str(missing), "no such file")


def test_bad_columns_flag_is_a_usage_error(tmp_path, capsys):
    path = write_conll(tmp_path / "train.conll", toy_corpus(2))
    for columns in ("tokens=x", "tokens", "=1", "tags=-1"):
        code, out, err = run(capsys, "data", path, "--columns", columns)
        assert code == 2 and out == "", columns
        assert "usage: keras-birnn data" in err and "--columns" in err, err
        assert "Traceback" not in err


@pytest.mark.slow(reason="a fresh Python process importing TensorFlow")
def test_python_dash_m_help():
    run_ = subprocess.run([sys.executable, "-m", "keras_birnn.cli", "--help"], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert run_.returncode == 0, run_.stderr[-2000:]
    assert run_.stdout.startswith("usage: keras-birnn")
    for command in ("data", "evaluate", "predict", "export"):
        assert command in run_.stdout
