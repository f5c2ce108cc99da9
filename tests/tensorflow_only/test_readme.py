"""README.md's front page holds: its two opening commands are the ones CI
runs, and its tagger and classifier recipes run as printed and give what
the text says.

The recipes are taken from README.md itself (the ```python block under
their heading) and run unchanged in a temporary working folder; then their
results are checked against oracles: seqeval's span F1, the brute-force
CRF of tests/crf_reference.py (the served confidence is the marginal
probability of the served tag), the Keras model's own predictions (the
served tags), the labels, and each sentence run alone (padding changes
nothing).
"""

import pathlib

import numpy as np
import pytest

import crf_reference
from tensorflow_only.test_docs_code import code_blocks

REPO = pathlib.Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def _section_python(heading: str) -> str:
    """The one ```python block of README.md's section `## <heading>`."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else len(text)]
    blocks = [code for language, _, code, _ in code_blocks(section) if language == "python"]
    assert len(blocks) == 1, f"README.md, {heading!r}: expected one python block, found {len(blocks)}"
    return blocks[0]


def _run(code: str, folder: pathlib.Path, monkeypatch) -> dict:
    monkeypatch.chdir(folder)
    namespace = {"__name__": "__main__"}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


def test_readme_opens_with_the_commands_ci_runs():
    lines = README.read_text(encoding="utf-8").splitlines()
    fence = lines.index("```bash")
    opening = lines[fence + 1:lines.index("```", fence + 1)]
    assert lines[0].startswith("# ") and all(not line.strip() for line in lines[1:fence])
    assert opening[0] == 'pip install -e ".[cpu]" && python -m keras_birnn.demo'
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert len(opening) == 2 and opening[1] in ci, "README's test command is not the one .ci/run runs"
    assert "pip install keras-birnn" not in README.read_text(encoding="utf-8")  # not on an index


@pytest.mark.slow(reason="the classifier recipe trains 10 epochs: about 8 s")
def test_classifier_recipe(tmp_path, monkeypatch):
    ns = _run(_section_python("A sentence classifier"), tmp_path, monkeypatch)
    classifier, ids, labels, vectorize = ns["classifier"], ns["ids"], ns["labels"], ns["vectorize"]
    batch = classifier.predict(ids, verbose=0)[:, 0]
    np.testing.assert_array_equal(batch > 0.5, labels == 1)  # it learned its training set
    # Oracle: each sentence alone, unpadded; padding must change nothing.
    for row, p in zip(ids[:6], batch[:6]):
        alone = classifier.predict(row[row != 0][None], verbose=0)[0, 0]
        np.testing.assert_allclose(alone, p, rtol=1e-5, atol=1e-6)
    p = ns["p"].ravel()  # "a funny and beautiful story", "slow , dull mess"
    assert p.shape == (2,) and 0 < p[1] < 0.5 < p[0] < 1
    assert vectorize.vocabulary_size() == len(set(" ".join(ns["texts"]).split())) + 2  # pad and OOV


@pytest.mark.slow(reason="the tagger recipe trains 15 epochs and exports a SavedModel: about 30 s")
def test_tagger_recipe(tmp_path, monkeypatch):
    from seqeval.metrics import f1_score

    import keras
    import keras_birnn as kb

    ns = _run(_section_python("A tagger, from strings to a served model"), tmp_path, monkeypatch)
    model, encoder, tags, out = ns["model"], ns["encoder"], ns["tags"], ns["out"]
    word_ids, char_ids, labels, train = ns["word_ids"], ns["char_ids"], ns["labels"], ns["train"]

    # The metric compiled in the recipe against seqeval, on the model's predictions.
    predicted = model.predict([word_ids, char_ids], verbose=0)
    lengths = [len(y) for _, y in train]
    as_names = [[tags[k] for k in row[:n]] for row, n in zip(predicted, lengths)]
    assert as_names == [y for _, y in train]  # the toy set is learned
    metric = kb.tagging.SpanF1(tags)
    metric.update_state(labels, predicted)
    assert float(metric.result()) == pytest.approx(f1_score([y for _, y in train], as_names), abs=1e-6)
    assert ns["history"].history["span_f1"][-1] == pytest.approx(1.0, abs=0.1)

    # The served tags are the Keras model's on the same tokens.
    sentence = "Grace Hopper was born in London".split()
    words, chars = encoder(kb.tagging.pad_tokens([sentence]))
    expected = model.predict([words, chars], verbose=0)[0]
    np.testing.assert_array_equal(out["tag_ids"].numpy()[0], expected)
    assert [t.decode() for t in out["tags"].numpy()[0]] == [tags[k] for k in expected]

    # The served confidence is the CRF's marginal of the served tag (brute force).
    emissions = keras.Model(model.inputs, model.get_layer("emissions").output)([words, chars])
    crf = model.get_layer("crf")
    weights = [np.asarray(w, np.float64) for w in (crf.transitions, crf.start, crf.end)]
    mask = np.ones((1, len(sentence)), bool)
    marginals = crf_reference.marginals(np.asarray(emissions, np.float64), mask, *weights,
                                        allowed=crf_reference.iob2_checker(tags))
    confidence = out["confidence"].numpy()[0]
    np.testing.assert_allclose(confidence, marginals[0, np.arange(len(sentence)), expected], atol=1e-4)
    assert np.all((confidence > 0) & (confidence <= 1))


def _section_bash(heading: str) -> str:
    """The one ```bash block of README.md's section `## <heading>`."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    section = text[start:text.find("\n## ", start + 1)]
    blocks = [code for language, _, code, _ in code_blocks(section) if language == "bash"]
    assert len(blocks) == 1, f"README.md, {heading!r}: expected one bash block, found {len(blocks)}"
    return blocks[0]


def _conll(count: int, seed: int) -> str:
    """Two-column CoNLL text of people (B-PER I-PER) and places (B-LOC) among other words."""
    rng = np.random.default_rng(seed)
    people, places, other = ["Ada", "Alan", "Grace"], ["Paris", "Rome"], ["met", "in", "the", "saw", "near"]
    lines = []
    for _ in range(count):
        for _ in range(rng.integers(3, 8)):
            kind = rng.integers(4)
            if kind == 2:
                lines += [f"{rng.choice(people)} B-PER", "Lovelace I-PER"]
            else:
                lines.append(f"{rng.choice(places)} B-LOC" if kind == 3 else f"{rng.choice(other)} O")
        lines.append("")
    return "\n".join(lines)


@pytest.mark.slow(reason="trains the shipped NER config on a small file (the config's epochs) and exports: about 60 s")
def test_train_on_your_own_file_runs_as_printed(tmp_path):
    import json
    import os
    import shutil
    import subprocess
    import sys

    import keras

    import keras_birnn  # noqa: F401  (registers Tagger for load_model)
    from keras_birnn.training import resolve

    for name, count, seed in (("my.train", 60, 0), ("my.dev", 20, 1), ("my.test", 20, 2)):
        (tmp_path / name).write_text(_conll(count, seed), encoding="utf-8")
    shutil.copytree(REPO / "examples" / "configs", tmp_path / "examples" / "configs")
    env = dict(os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    done = subprocess.run(["bash", "-e", "-c", _section_bash("Train on your own file")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    best = keras.saving.load_model(tmp_path / "runs" / "my_ner" / "best.keras", safe_mode=True)
    blocks = [b.splitlines() for b in (tmp_path / "my.test").read_text().split("\n\n") if b.strip()]
    tokens = [[line.split()[0] for line in b] for b in blocks]
    tags = [[line.split()[1] for line in b] for b in blocks]
    scores = best.evaluate(tokens, tags)
    printed = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert json.loads(printed[-1])["f1"] == scores["f1"] and set(json.loads(printed[-1])["types"]) == {"LOC", "PER"}
    tagged = [b.splitlines() for b in (tmp_path / "my.test.tagged").read_text().split("\n\n") if b.strip()]
    assert [[line.split("\t")[1] for line in b] for b in tagged] == [p.tags for p in best.predict(tokens)]
    assert "Result for output key tags" in done.stdout
    epochs = resolve(str(REPO / "examples" / "configs" / "conll2002_ner.toml"))["train"]["epochs"]
    assert f"epoch {'1'.rjust(len(str(epochs)))}/{epochs}" in done.stdout and "sentences" in done.stdout
