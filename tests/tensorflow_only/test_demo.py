"""The main job (`python -m keras_birnn.demo`): labels, table, export, the claim."""

import contextlib
import io
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from keras_birnn import demo

# Hand-worked: blocks of 1s at 0-3 (a run), 7 (a lone 1), 10-11 (a run).
#   index   0 1 2 3 4 5 6 7 8 9 10 11
BITS = [1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1]
LABELS = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]
STARTS = {0, 7, 10}
ENDS = {3, 7, 11}
# Block edges, plus the 0s next to a block: 4 (after 0-3), 6 and 8 (around 7), 9 (before 10).
BOUNDARY = {0, 3, 4, 6, 7, 8, 9, 10, 11}

SMALL_RUN = [
    "--seed", "0", "--hidden", "8", "--length", "12", "--train-size", "600",
    "--test-size", "200", "--epochs", "4", "--batch-size", "16", "--quiet",
]


def test_labels_and_boundaries_on_a_hand_worked_example():
    bits = np.array(BITS)
    np.testing.assert_array_equal(demo.run_labels(bits), LABELS)
    assert set(np.flatnonzero(demo.block_starts(bits))) == STARTS
    assert set(np.flatnonzero(demo.block_ends(bits))) == ENDS
    assert set(np.flatnonzero(demo.boundary_positions(bits))) == BOUNDARY
    # Batched: the functions work row by row, rows never leak into each other.
    batch = np.stack([bits, bits[::-1]])
    np.testing.assert_array_equal(demo.run_labels(batch), [LABELS, LABELS[::-1]])
    assert set(np.flatnonzero(demo.boundary_positions(batch)[1])) == {11 - i for i in BOUNDARY}


def test_edge_rows():
    np.testing.assert_array_equal(demo.run_labels([[0, 0, 0], [1, 1, 1], [1, 0, 1]]),
                                  [[0, 0, 0], [1, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(demo.boundary_positions([[0, 0, 0], [1, 1, 1], [0, 1, 0]]),
                                  [[0, 0, 0], [1, 0, 1], [1, 1, 1]])


def _blocks(row):
    """Maximal blocks of 1s as (first, last), by a plain scan."""
    blocks, start = [], None
    for t, b in enumerate(list(row) + [0]):
        if b and start is None:
            start = t
        if not b and start is not None:
            blocks.append((start, t - 1))
            start = None
    return blocks


def _oracle(row):
    """Labels, boundary and block-start positions of one row, from its blocks."""
    labels, boundary, starts = [0] * len(row), set(), set()
    for first, last in _blocks(row):
        if last > first:
            labels[first : last + 1] = [1] * (last - first + 1)
        starts.add(first)
        boundary.update({first, last} | {t for t in (first - 1, last + 1) if 0 <= t < len(row)})
    return labels, boundary, starts


def test_vectorized_functions_match_the_block_scan_on_random_rows():
    rows = np.random.default_rng(3).integers(0, 2, size=(200, 15))
    for row, labels, boundary, starts in zip(
        rows, demo.run_labels(rows), demo.boundary_positions(rows), demo.block_starts(rows)
    ):
        want_labels, want_boundary, want_starts = _oracle(row)
        assert labels.tolist() == want_labels
        assert set(np.flatnonzero(boundary)) == want_boundary
        assert set(np.flatnonzero(starts)) == want_starts


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        result = demo.run(SMALL_RUN + ["--out", str(out)])
    return result, text.getvalue(), out


def _parse_table(text):
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["model", "hidden", "params"])
    table = {}
    for line in lines[header + 1 : header + 3]:
        name, hidden, params, overall, boundary, start = line.split()
        table[name] = {
            "hidden": int(hidden), "params": int(params),
            **{k: float(v.rstrip("%")) for k, v in
               (("overall", overall), ("boundary", boundary), ("block start", start))},
        }
    return table


@pytest.mark.slow(reason="the small_run fixture trains the demo's models, ~12 s")
def test_printed_table_equals_accuracies_recomputed_from_the_models(small_run):
    result, text, _ = small_run
    table = _parse_table(text)
    assert sorted(table) == ["BiGRU", "GRU"]
    bits = result.x_test[..., 0].astype(int)
    oracles = [_oracle(row) for row in bits]
    assert result.y_test.tolist() == [labels for labels, _, _ in oracles]
    for name, model in result.models.items():
        predicted = np.argmax(model.predict(result.x_test, verbose=0), axis=-1)
        hits = {"overall": [], "boundary": [], "block start": []}
        for row, (labels, boundary, starts) in zip(predicted, oracles):
            for t, (p, y) in enumerate(zip(row, labels)):
                hits["overall"].append(p == y)
                if t in boundary:
                    hits["boundary"].append(p == y)
                if t in starts:
                    hits["block start"].append(p == y)
        assert table[name]["hidden"] == 8
        assert table[name]["params"] == model.count_params()
        for key, values in hits.items():
            assert table[name][key] == pytest.approx(100 * np.mean(values), abs=0.005), (name, key)
    # Same hidden size, twice the recurrent weights (two GRUs).
    assert table["BiGRU"]["params"] == 2 * 3 * (8 + 8 * 8 + 2 * 8) + (8 + 8) * 2 + 2
    assert table["GRU"]["params"] == 3 * (8 + 8 * 8 + 2 * 8) + 8 * 2 + 2


@pytest.mark.slow(reason="the small_run fixture trains the demo's models, ~12 s")
def test_bigru_is_near_perfect_at_boundaries_and_the_gru_is_not(small_run):
    table = _parse_table(small_run[1])
    assert table["BiGRU"]["boundary"] >= 97.0
    assert table["BiGRU"]["block start"] >= 95.0
    # A left-to-right model guesses at block starts: about 50% there.
    assert table["GRU"]["block start"] <= 75.0
    assert table["GRU"]["boundary"] <= table["BiGRU"]["boundary"] - 5.0


@pytest.mark.slow(reason="the small_run fixture trains the demo's models, ~12 s")
def test_exported_savedmodel_predicts_what_the_keras_model_predicts(small_run):
    result, text, out = small_run
    assert result.export_path == os.path.join(str(out), "run_of_ones", "1")
    assert {"saved_model.pb", "variables"} <= set(os.listdir(result.export_path))
    keras_probs = result.models["BiGRU"].predict(result.x_test, verbose=0)
    # The demo's own printed prediction came from the reloaded SavedModel.
    np.testing.assert_allclose(result.served_probs, keras_probs[0], atol=1e-5, rtol=1e-5)
    printed = dict(
        re.findall(r"^\s+(input bits|true labels|predicted labels)\s+: ([01 ]+)$", text, re.M)
    )
    assert printed["input bits"].split() == [str(int(b)) for b in result.x_test[0, :, 0]]
    assert printed["true labels"].split() == [str(y) for y in result.y_test[0]]
    assert printed["predicted labels"].split() == [str(p) for p in np.argmax(keras_probs[0], -1)]
    # The whole held-out set through the reloaded graph, padded rows included.
    served = tf.saved_model.load(result.export_path).signatures["serving_default"]
    lengths = np.full(len(result.x_test), result.x_test.shape[1], np.int32)
    lengths[::3] = 7
    probs = served(inputs=tf.constant(result.x_test), lengths=tf.constant(lengths))["outputs"].numpy()
    full = lengths == result.x_test.shape[1]
    np.testing.assert_allclose(probs[full], keras_probs[full], atol=1e-5, rtol=1e-5)
    short = result.models["BiGRU"].predict(result.x_test[::3, :7], verbose=0)
    np.testing.assert_allclose(probs[::3, :7], short, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(probs[::3, 7:], 0.0)


def test_flags_are_checked_and_main_is_the_console_entry():
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()):
        demo.parse_args(["--hidden", "0"])
    assert exit_info.value.code == 2
    args = demo.parse_args([])
    assert (args.seed, args.hidden, args.out, args.quiet) == (0, 8, "saved_models", False)
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")) as f:
        assert 'keras-birnn-demo = "keras_birnn.demo:main"' in f.read()
    assert callable(demo.main)


@pytest.mark.parametrize("name", ["GRU", "BiGRU"])
def test_keras_twin_is_the_same_function(name):
    """`--layers keras`: the same parameters, and with the twin's weights the
    kb model gives the twin's probabilities (kb's projection merge holds
    V_f, V_b, c where the twin's Dense kernel is [V_f; V_b])."""
    build = {"GRU": demo.build_gru, "BiGRU": demo.build_bigru}[name]
    ours, twin = build(5), build(5, layers="keras")
    assert ours.count_params() == twin.count_params()
    modules = lambda model: {type(layer).__module__.split(".")[0] for layer in model._flatten_layers()}  # noqa: E731
    assert "keras_birnn" in modules(ours) and "keras_birnn" not in modules(twin)
    weights = twin.get_weights()
    if name == "BiGRU":
        kernel, bias = weights[-2:]
        weights = weights[:-2] + [kernel[:5], kernel[5:], bias]
    ours.set_weights(weights)
    bits = np.random.default_rng(3).integers(0, 2, size=(4, 9, 1)).astype("float32")
    expected = np.asarray(twin(bits))
    np.testing.assert_allclose(np.asarray(ours(bits)), expected, atol=1e-6, rtol=1e-5)
    assert np.abs(expected - expected[..., ::-1]).max() > 1e-3  # not a constant 0.5
    with pytest.raises(ValueError, match="`layers`.*'torch'"):
        build(5, layers="torch")


@pytest.mark.slow(reason="trains and exports both demo models twice, ~15 s")
@pytest.mark.parametrize("layers", ["kb", "keras"])
def test_report_json_and_the_served_twin(tmp_path, layers):
    report = tmp_path / "report.json"
    text = io.StringIO()
    argv = ["--hidden", "4", "--length", "10", "--train-size", "64", "--test-size", "40", "--epochs", "2",
            "--quiet", "--out", str(tmp_path), "--layers", layers, "--report-json", str(report)]
    with contextlib.redirect_stdout(text):
        result = demo.run(argv)
    folder = "run_of_ones_keras" if layers == "keras" else "run_of_ones"
    assert result.export_path == os.path.join(str(tmp_path), folder, "1")
    np.testing.assert_allclose(result.served_probs, result.models["BiGRU"].predict(result.x_test[:1], verbose=0)[0],
                               atol=1e-6)
    written = json.loads(report.read_text())
    assert (written["example"], written["layers"], written["variant"]) == ("demo", layers, "BiGRU")
    assert [v["variant"] for v in written["variants"]] == ["GRU", "BiGRU"]
    assert len(written["epoch_seconds"]) == 2 and written["fit_seconds"] == pytest.approx(
        sum(written["epoch_seconds"]))
    assert written["predict_sentences_per_second"] > 0 and written["predict_first_seconds"] > 0
    assert written["accuracy"] == pytest.approx(result.rows[1]["overall"])
    assert written["params"] == result.models["BiGRU"].count_params()
