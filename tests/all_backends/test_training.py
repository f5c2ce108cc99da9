"""`keras_birnn.training.train` on every backend: a tagger and a sentence
classifier trained from a config on small generated files learn them (the
words decide the answers), and the run's metrics are what the saved best
model gives on dev (`Tagger.evaluate`, `SentenceClassifier.evaluate`)."""

import json

import keras
import numpy as np
import pytest

from helpers import NAMES, names_conll
from keras_birnn.training import resolve, train

OTHER = NAMES["O"]
SIZES = ["model.hidden=8", "model.word_dim=8", "model.char_dim=4", "model.char_units=4", "model.dropout=0.0",
         "train.batch_size=8", "train.learning_rate=0.03", "train.schedule=\"constant\"", "export.enabled=false"]


def write_tagged(path, count: int, seed: int) -> None:
    path.write_text(names_conll(count, seed, separator="\t", longest=5), encoding="utf-8")


def write_texts(path, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    good, bad = ["fine", "great", "warm"], ["dull", "poor", "cold"]
    rows = []
    for _ in range(count):
        label = ["pos", "neg"][rng.integers(2)]
        words = list(rng.choice(OTHER, 3)) + [rng.choice(good if label == "pos" else bad)]
        rows.append(f"{' '.join(rng.permutation(words))}\t{label}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.mark.parametrize("head", ["crf", "softmax"])
def test_a_tagger_trains_from_a_config_and_keeps_its_best_dev_model(tmp_path, head):
    write_tagged(tmp_path / "train.conll", 60, 0)
    write_tagged(tmp_path / "dev.conll", 20, 1)
    settings = resolve(None, [f"data.train={tmp_path / 'train.conll'}", f"data.dev={tmp_path / 'dev.conll'}",
                              f"model.head={head}", "train.epochs=6", *SIZES])
    metrics = train(settings, str(tmp_path / "run"), log=lambda line: None)
    best = keras.saving.load_model(tmp_path / "run" / "best.keras", safe_mode=True)
    sentences = [b.splitlines() for b in (tmp_path / "dev.conll").read_text().split("\n\n") if b.strip()]
    tokens = [[line.split("\t")[0] for line in s] for s in sentences]
    tags = [[line.split("\t")[1] for line in s] for s in sentences]
    assert best.evaluate(tokens, tags)["f1"] == metrics["dev"]["f1"] == metrics["dev"]["score"]
    assert metrics["dev"]["f1"] > 0.9, metrics["dev"]
    assert metrics["backend"] == keras.backend.backend()
    history = (tmp_path / "run" / "history.csv").read_text().splitlines()
    assert len(history) == 1 + metrics["epochs"]


def test_a_sentence_classifier_trains_from_a_config(tmp_path):
    write_texts(tmp_path / "train.tsv", 80, 0)
    write_texts(tmp_path / "dev.tsv", 30, 1)
    settings = resolve(None, ["task=classifier", f"data.train={tmp_path / 'train.tsv'}",
                              f"data.dev={tmp_path / 'dev.tsv'}", "train.epochs=6", *SIZES])
    metrics = train(settings, str(tmp_path / "run"), log=lambda line: None)
    best = keras.saving.load_model(tmp_path / "run" / "best.keras", safe_mode=True)
    rows = [line.split("\t") for line in (tmp_path / "dev.tsv").read_text().splitlines()]
    assert best.evaluate([r[0] for r in rows], [r[1] for r in rows])["accuracy"] == metrics["dev"]["accuracy"]
    assert metrics["dev"]["accuracy"] > 0.9, metrics["dev"]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["best_epoch"] == metrics["best_epoch"]


def test_every_backend_ends_with_the_export_tensorflow_writes(tmp_path):
    # On JAX and PyTorch the run exports from a TensorFlow child process.
    import tensorflow as tf

    write_tagged(tmp_path / "train.conll", 40, 0)
    write_tagged(tmp_path / "dev.conll", 12, 1)
    sizes = [s for s in SIZES if not s.startswith("export.")]
    settings = resolve(None, [f"data.train={tmp_path / 'train.conll'}", f"data.dev={tmp_path / 'dev.conll'}",
                              "train.epochs=2", *sizes])
    lines = []
    metrics = train(settings, str(tmp_path / "run"), log=lines.append)
    assert metrics["export"] == str(tmp_path / "run" / "export" / "1")
    assert f"exported {metrics['export']}" in lines
    best = keras.saving.load_model(tmp_path / "run" / "best.keras", safe_mode=True)
    sentences = [b.splitlines() for b in (tmp_path / "dev.conll").read_text().split("\n\n") if b.strip()]
    tokens = [[line.split("\t")[0] for line in s] for s in sentences]
    width = max(map(len, tokens))
    serve = tf.saved_model.load(metrics["export"]).signatures["serving_default"]
    out = serve(inputs=tf.constant([t + [""] * (width - len(t)) for t in tokens]))
    for row, predicted in enumerate(best.predict(tokens)):
        n = len(predicted.tags)
        assert [t.decode() for t in out["tags"].numpy()[row, :n]] == predicted.tags
        np.testing.assert_allclose(out["confidence"].numpy()[row, :n], predicted.confidence, atol=1e-5)
