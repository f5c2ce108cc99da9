"""`keras-birnn train` (keras_birnn/training/), run in-process through
`main([...])`: the run folder against what the library gives for the same
model and files (`Tagger.evaluate` of best.keras, its `predict`, the
SavedModel's answers, Keras's cosine schedule written out by hand), early
stopping, `--set`, and the catalogue of bad configs and files (exit code
2, one line naming the file and line).
"""

import csv
import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import names_conll
from keras_birnn.cli.main import main
from keras_birnn.tagging.encoder import pad_tokens
from keras_birnn.training.config import DEFAULTS, SOURCES, dump, resolve

TINY = """
seed = 1
[data]
train = "train.conll"
dev = "dev.conll"
[model]
hidden = 8
word_dim = 8
char_dim = 4
char_units = 4
dropout = 0.1
[train]
epochs = 3
batch_size = 8
learning_rate = 0.02
"""


def conll_text(count: int, seed: int) -> str:
    """`count` sentences of people, places and other words, IOB2 tags."""
    return names_conll(count, seed)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train")
    (folder / "train.conll").write_text(conll_text(80, 0), encoding="utf-8")
    (folder / "dev.conll").write_text(conll_text(24, 1), encoding="utf-8")
    (folder / "tiny.toml").write_text(TINY, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def trained(workdir):
    """One run of the tiny config: (folder, run folder, stdout)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.chdir(workdir), contextlib.redirect_stdout(out):
        assert main(["train", "tiny.toml", "--run", "run"]) == 0
    return workdir, workdir / "run", out.getvalue()


def dev_sentences(folder):
    blocks = [b for b in (folder / "dev.conll").read_text().split("\n\n") if b.strip()]
    pairs = [[line.split() for line in b.splitlines()] for b in blocks]
    return [[p[0] for p in s] for s in pairs], [[p[1] for p in s] for s in pairs]


def test_the_run_folder_holds_what_the_best_model_gives(trained):
    folder, run_dir, out = trained
    assert sorted(p.name for p in run_dir.iterdir()) == ["best.keras", "checkpoint", "config.toml", "export",
                                                         "history.csv", "metrics.json", "report.txt"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    best = keras.saving.load_model(run_dir / "best.keras", safe_mode=True)
    tokens, tags = dev_sentences(folder)
    assert best.evaluate(tokens, tags) == {k: v for k, v in metrics["dev"].items() if k != "score"}
    history = list(csv.DictReader((run_dir / "history.csv").open()))
    assert [int(r["epoch"]) for r in history] == [1, 2, 3]
    scores = [float(r["dev_score"]) for r in history]
    assert metrics["best_epoch"] == 1 + int(np.argmax(scores)) and metrics["dev"]["f1"] == max(scores)
    assert metrics["epochs"] == 3 and not metrics["stopped_early"]
    assert float(history[-1]["loss"]) < float(history[0]["loss"])
    report = (run_dir / "report.txt").read_text()
    for kind, s in metrics["dev"]["types"].items():
        assert f"{100 * s['f1']:.2f}" in [line.split()[3] for line in report.splitlines() if line.startswith(kind)]
    epoch_lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 3 and all(" loss " in line and " dev " in line and " ETA " in line
                                         for line in epoch_lines)


def test_the_export_answers_as_the_best_model_predicts(trained):
    folder, run_dir, _ = trained
    best = keras.saving.load_model(run_dir / "best.keras", safe_mode=True)
    tokens, _ = dev_sentences(folder)
    serve = tf.saved_model.load(str(run_dir / "export" / "1")).signatures["serving_default"]
    out = serve(inputs=tf.constant(pad_tokens(tokens)))
    for row, found in enumerate(best.predict(tokens)):
        n = len(found.tags)
        assert [t.decode() for t in out["tags"].numpy()[row, :n]] == found.tags
        np.testing.assert_allclose(out["confidence"].numpy()[row, :n], found.confidence, rtol=1e-5, atol=1e-6)


def test_the_learning_rate_follows_the_cosine_schedule_and_gradients_are_clipped(trained):
    _, run_dir, _ = trained
    settings = resolve(str(run_dir / "config.toml"))
    t = settings["train"]
    history = list(csv.DictReader((run_dir / "history.csv").open()))
    best = keras.saving.load_model(run_dir / "best.keras", safe_mode=True)
    steps = int(best.optimizer.iterations.numpy()) // int(history[metrics_epoch(run_dir) - 1]["epoch"])
    total = t["epochs"] * steps
    for row in history:
        step = int(row["epoch"]) * steps
        cosine = 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
        expected = t["learning_rate"] * ((1 - t["min_learning_rate"]) * cosine + t["min_learning_rate"])
        assert float(row["learning_rate"]) == pytest.approx(expected, rel=1e-5)
    assert best.optimizer.clipnorm == t["clipnorm"] == 1.0
    assert type(best.optimizer).__name__ == "Nadam"


def metrics_epoch(run_dir) -> int:
    return json.loads((run_dir / "metrics.json").read_text())["best_epoch"]


def test_the_saved_config_is_the_resolved_one(trained):
    folder, run_dir, _ = trained
    assert resolve(str(run_dir / "config.toml")) == resolve(str(folder / "tiny.toml"))
    assert resolve(None, ["data.train=x"])["model"] == DEFAULTS["model"]
    assert all(key.split(".")[1] in DEFAULTS[key.split(".")[0]] for key in SOURCES)


def test_set_overrides_a_setting_and_dump_reads_back(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TINY)
    settings = resolve(str(path), ["train.epochs=7", "model.head=softmax", "data.columns={tokens = 0, tags = 1}",
                                   "data.train=other.conll"])
    assert settings["train"]["epochs"] == 7 and settings["model"]["head"] == "softmax"
    assert settings["data"]["columns"] == {"tokens": 0, "tags": 1} and settings["data"]["train"] == "other.conll"
    (tmp_path / "d.toml").write_text(dump(settings))
    assert resolve(str(tmp_path / "d.toml")) == settings


def test_early_stopping_after_patience_epochs_without_a_better_dev_score(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    code, out, err = run(capsys, "train", "tiny.toml", "--run", "stopped", "--set", "train.epochs=10",
                         "--set", "train.patience=2", "--set", "train.learning_rate=1e-9",
                         "--set", "train.schedule=\"constant\"", "--set", "export.enabled=false")
    assert code == 0, err
    metrics = json.loads((workdir / "stopped" / "metrics.json").read_text())
    # A rate of 1e-9 leaves the dev predictions as they are: epoch 1 stays the best.
    assert (metrics["epochs"], metrics["best_epoch"], metrics["stopped_early"]) == (3, 1, True)
    assert len([line for line in out.splitlines() if line.startswith("epoch ")]) == 3


def test_evaluate_predict_and_export_take_the_run_folder(trained, capsys, tmp_path):
    folder, run_dir, _ = trained
    metrics = json.loads((run_dir / "metrics.json").read_text())
    code, out, err = run(capsys, "evaluate", run_dir, folder / "dev.conll")
    assert code == 0, err
    assert json.loads(out)["f1"] == metrics["dev"]["f1"]
    code, out, err = run(capsys, "predict", run_dir, folder / "dev.conll", "--output-format", "jsonl")
    best = keras.saving.load_model(run_dir / "best.keras", safe_mode=True)
    tokens, _ = dev_sentences(folder)
    assert [json.loads(line)["tags"] for line in out.splitlines()] == [p.tags for p in best.predict(tokens)]
    for version in ("1", "2"):
        code, out, err = run(capsys, "export", run_dir, tmp_path / "served")
        assert code == 0 and out.strip().endswith(version), err


def test_a_run_folder_is_not_reused_without_resume_nor_resumed_with_other_settings(trained, capsys, monkeypatch):
    folder, _, _ = trained
    monkeypatch.chdir(folder)
    code, _, err = run(capsys, "train", "tiny.toml", "--run", "run")
    assert code == 2 and "run: the folder holds files; pass --resume" in err
    code, _, err = run(capsys, "train", "tiny.toml", "--run", "run", "--resume", "--set", "train.epochs=4")
    assert code == 2 and "run/config.toml: the run was started with other settings (train.epochs)" in err
    code, out, err = run(capsys, "train", "tiny.toml", "--run", "fresh_folder", "--resume")
    assert code == 2 and "no run to resume" in err
    before = (folder / "run" / "metrics.json").read_text()
    code, out, err = run(capsys, "train", "tiny.toml", "--run", "run", "--resume")
    assert code == 0 and "the run is complete" in out and not [line for line in out.splitlines()
                                                                  if line.startswith("epoch ")]
    assert (folder / "run" / "metrics.json").read_text() == before
    assert sorted(p.name for p in (folder / "run" / "export").iterdir()) == ["1"]


# --- bad input: exit code 2, one line naming the file and line ---------------------------------------

GOOD = "[data]\ntrain = \"train.conll\"\ndev = \"dev.conll\"\n[train]\nepochs = 1\n"
CATALOGUE = {  # name: (config text, {file: text}, --set items, expected in the message)
    "toml syntax": ("[data\ntrain = 1\n", {}, [], "c.toml:1: not valid TOML"),
    "unknown key": (GOOD + "[model]\nhiden = 8\n", {}, [], "c.toml:7: unknown setting `model.hiden`"),
    "unknown section": (GOOD + "[modle]\nhidden = 8\n", {}, [], "c.toml:6: unknown setting `modle`"),
    "wrong type": (GOOD + "[model]\nhidden = \"big\"\n", {}, [], "c.toml:7: `model.hidden` must be an integer"),
    "bad choice": (GOOD + "[model]\nhead = \"crf2\"\n", {}, [], "c.toml:7: `model.head` must be one of crf, softmax"),
    "zero batch": (GOOD.replace("epochs = 1", "batch_size = 0"), {}, [],
                   "c.toml:5: `train.batch_size` must be at least 1"),
    "rate out of range": (GOOD + "[model]\ndropout = 1.5\n", {}, [], "c.toml:7: `model.dropout` must be in"),
    "columns without tags": (GOOD.replace("[train]", "columns = {tokens = 0}\n[train]"), {}, [],
                             "c.toml:4: `data.columns` of a tagger must name tokens and tags"),
    "no train file set": ("[train]\nepochs = 1\n", {}, [], "c.toml:1: `data.train` is not set"),
    "unknown --set": (GOOD, {}, ["model.hiden=3"], "--set model.hiden=3: unknown setting"),
    "--set without =": (GOOD, {}, ["train.epochs"], "--set 'train.epochs': expected section.key=value"),
    "config not utf-8": (None, {}, [], "c.toml:6: not UTF-8"),
    "wrong column count": (GOOD, {"train.conll": "Ada B-PER\nmet O extra\n\n"}, [], "train.conll:2:"),
    "empty train file": (GOOD, {"train.conll": ""}, [], "train.conll"),
    "train not utf-8": (GOOD, {"train.conll": b"Ada B-PER\nm\xe9t O\n\n"}, [], "train.conll:2:"),
    "tag outside the scheme": (GOOD.replace("[train]", "scheme = \"iob2\"\n[train]"),
                               {"train.conll": "Ada X-PER\nmet O\n\n"}, [], "train.conll:1:"),
    "dev file missing": (GOOD.replace("dev.conll", "nowhere.conll"), {}, [], "data.dev = 'nowhere.conll': no such"),
}


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_bad_configs_and_files_exit_2_naming_file_and_line(name, tmp_path, capsys, monkeypatch):
    text, files, items, expected = CATALOGUE[name]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.conll").write_text(conll_text(6, 0))
    (tmp_path / "dev.conll").write_text(conll_text(3, 1))
    for file, content in files.items():
        (tmp_path / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp_path / "c.toml").write_bytes(GOOD.encode() + b"# caf\xe9\n" if text is None else text.encode())
    argv = ["train", "c.toml", "--run", "r"] + [a for item in items for a in ("--set", item)]
    code, out, err = run(capsys, *argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keras-birnn: error: ") and "Traceback" not in err
    assert expected in lines[0], lines[0]


def chunk_text(count: int, seed: int) -> str:
    """Three columns, word POS chunk: the POS tag decides the chunk tag (the words are random)."""
    rng = np.random.default_rng(seed)
    chunk = {"DT": "B-NP", "NN": "I-NP", "VB": "B-VP", "IN": "B-PP"}
    lines = []
    for _ in range(count):
        for pos in ["DT", "NN", "VB", "IN", "DT", "NN"][: rng.integers(3, 7)]:
            lines.append(f"w{rng.integers(40)} {pos} {chunk[pos]}")
        lines.append("")
    return "\n".join(lines)


def test_a_feature_tagger_trains_evaluates_predicts_and_serves_with_its_run_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.txt").write_text(chunk_text(60, 0))
    (tmp_path / "test.txt").write_text(chunk_text(15, 1))
    (tmp_path / "c.toml").write_text(TINY.replace('dev = "dev.conll"', "columns = {tokens = 0, pos = 1, tags = 2}")
                                     .replace('train = "train.conll"', 'train = "train.txt"\nheld_out = 0.2'))
    code, out, err = run(capsys, "train", "c.toml", "--run", "chunks")
    assert code == 0, err
    best = keras.saving.load_model(tmp_path / "chunks" / "best.keras", safe_mode=True)
    assert best.feature_names == ["pos"]
    rows = [[line.split() for line in b.splitlines()] for b in (tmp_path / "test.txt").read_text().split("\n\n")
            if b.strip()]
    x = {"tokens": [[r[0] for r in s] for s in rows], "pos": [[r[1] for r in s] for s in rows]}
    gold = [[r[2] for r in s] for s in rows]
    code, out, err = run(capsys, "evaluate", "chunks", "test.txt")  # read with the run's columns
    assert code == 0, err
    assert json.loads(out)["f1"] == best.evaluate(x, gold)["f1"]
    code, out, err = run(capsys, "predict", "chunks", "test.txt")
    predicted = [[line.split("\t")[1] for line in b.splitlines()] for b in out.split("\n\n") if b.strip()]
    assert predicted == [p.tags for p in best.predict(x)]
    serve = tf.saved_model.load(str(tmp_path / "chunks" / "export" / "1")).signatures["serving_default"]
    served = serve(inputs=tf.constant(pad_tokens(x["tokens"])), pos=tf.constant(pad_tokens(x["pos"])))
    assert [[t.decode() for t in row if t] for row in served["tags"].numpy()] == predicted
    code, out, err = run(capsys, "evaluate", "chunks", "test.txt", "--columns", "tokens=0,tags=2")
    assert code == 2 and "the model reads the feature column(s) pos" in err
