"""benchmarks/bench_examples.py's parts that run in child processes, the
arithmetic of two other benchmarks (a log parsed, a bound computed),
bench_plain_floor.py's hand-written reference against kb's numbers, and
bench_predict_floor.py's peers on one pass and its hand-written exports.

Its children are the examples (tested in their own files) and a latency
script given to `python -c`; the script is checked here on the demo's
SavedModels, kb's (`inputs` and `lengths`, or `inputs` alone) and Keras's
(`bits`), which it must serve in one process without keras_birnn (that the
exports serve the model's numbers is test_export.py's and the demo's).
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import REPO
from keras_birnn import demo


def load_bench(name="bench_examples"):
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))  # the scripts import each other
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_step_reads_the_training_graph_from_the_log():
    """The size grappler received (after minus change, of the first pass,
    even a pass of 0 ms) and all its passes' time, of the training graph only."""
    log = "\n".join([
        "grappler item: __inference_multi_step_on_iterator_123",
        "  Graph size after: 100 nodes (-20), 7 edges (0), time = 0ms.",
        "  Graph size after: 90 nodes (-10), 5 edges (0), time = 5.5ms.",
        "grappler item: __inference_backward_loop_9",
        "  Graph size after: 10 nodes (0), 1 edges (0), time = 7ms.",
    ])
    assert load_bench("bench_first_step").grappler(log) == {"nodes": 120, "grappler_ms": 5.5}


def test_recurrence_share_bound():
    """keras/kb with each kb epoch shortened by what compiled loops save in
    a later epoch; never below kb's own ratio when compiled loops are slower."""
    share = load_bench("bench_recurrence_share")
    runs = {"kb": [{"epochs": [3.7, 2.4]}], "keras": [{"epochs": [5.0, 2.7]}], "kb_compiled": [{"epochs": [8.8, 1.7]}]}
    assert share._bound("c", runs).endswith("keras/kb_compiled x1.59; all epochs at that speed, "
                                            "compiling free: keras/kb at most x1.64")  # 7.7 / (6.1 - 2 * 0.7)
    runs["kb_compiled"] = [{"epochs": [8.8, 3.0]}]
    assert share._bound("c", runs).endswith("at most x1.26")  # 7.7 / 6.1: no saving


def test_recurrence_share_floor():
    """keras/minimal and minimal/kb, over both epochs and the later ones,
    medians of the rounds' ratios."""
    share = load_bench("bench_recurrence_share")
    runs = {"kb": [{"epochs": [4.0, 2.0]}, {"epochs": [4.0, 2.5]}, {"epochs": [5.0, 2.0]}],
            "keras": [{"epochs": [6.0, 3.0]}] * 3,
            "minimal": [{"epochs": [5.0, 2.0]}, {"epochs": [5.0, 2.0]}, {"epochs": [5.0, 3.0]}]}
    # rounds' all-epoch ratios: keras/minimal 9/7, 9/7, 9/8; minimal/kb 7/6, 7/6.5, 8/7
    assert share._floor("c", runs) == ("c: the leanest plain loop (minimal): all epochs keras/minimal x1.29, "
                                       "minimal/kb x1.14; later epochs keras/minimal x1.50, minimal/kb x1.00")


def test_plain_floor_reference_computes_kb_outputs_and_gradients():
    """bench_plain_floor's hand-written BiGRU, given kb's weights, matches
    kb's outputs and gradients on right-padded batches of three lengths
    (what the script checks before timing), and the check can fail: the
    reference with the two directions' weights swapped differs."""
    import keras_birnn as kb

    floor = load_bench("bench_plain_floor")
    batch, time_size, features, units, _ = floor.SHAPES["quick"]
    layer = kb.Bidirectional(kb.GRUCell(units), return_sequences=True)
    layer.build((None, None, features))
    weights = [v.value for v in layer.trainable_variables]
    data = floor.batches(batch, time_size, features)
    functions = {"kb": floor.layer_functions(layer, features),
                 "minimal": floor.minimal_functions(weights[:3], weights[3:], features)}
    assert floor.largest_difference(functions, data) < 1e-5
    functions["minimal"] = floor.minimal_functions(weights[3:], weights[:3], features)
    assert floor.largest_difference(functions, data) > 1e-3


@pytest.mark.parametrize("graph", [False, True])
def test_minimal_bigru_layer_matches_keras_gru(graph):
    """bench_plain_floor.MinimalBiGRU, the whole-model floor of
    bench_recurrence_share.py --floor, against Keras's Bidirectional(GRU)
    with the same weights (biases included) on right-padded rows, eagerly
    and traced for any batch and length: the outputs at valid steps (zero at
    padded ones), and the gradients of the inputs and of the six weights. Its
    loss also weighs the padded outputs, whose gradients must not leak
    into the states (they are constants)."""
    import keras

    floor = load_bench("bench_plain_floor")
    features, units, lengths = 3, 4, [6, 3, 1]
    rng = np.random.default_rng(7)
    minimal = floor.MinimalBiGRU(units)
    theirs = keras.layers.Bidirectional(keras.layers.GRU(units, return_sequences=True))
    minimal.build((None, None, features))
    theirs.build((None, None, features))
    for mine, their in zip(minimal.trainable_variables, theirs.trainable_variables):
        value = rng.normal(scale=0.5, size=their.shape).astype("float32")
        mine.assign(value)
        their.assign(value)
    x = tf.constant(rng.normal(size=(3, 6, features)).astype("float32"))
    mask = tf.sequence_mask(lengths, 6)
    scale = tf.constant(rng.normal(size=(3, 6, 2 * units)).astype("float32"))

    def run(layer, weigh_padding):
        def outputs_and_gradients(x, mask):
            valid = tf.cast(mask, tf.float32)[..., None]
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, mask=mask)
                loss = tf.reduce_sum(tf.sin(y) * scale * (1.0 if weigh_padding else valid))
            return y * valid, y * (1.0 - valid), tape.gradient(loss, [x] + layer.trainable_variables)

        if graph:
            spec = [tf.TensorSpec([None, None, features]), tf.TensorSpec([None, None], tf.bool)]
            outputs_and_gradients = tf.function(outputs_and_gradients, input_signature=spec)
        return outputs_and_gradients(x, mask)

    y, padded, grads = run(minimal, weigh_padding=True)
    y_ref, _, grads_ref = run(theirs, weigh_padding=False)
    np.testing.assert_allclose(y, y_ref, atol=1e-5)
    assert np.abs(padded).max() == 0.0
    assert len(grads) == len(grads_ref) == 7
    for mine, their in zip(grads, grads_ref):
        np.testing.assert_allclose(mine, their, atol=1e-5)


def test_latency_script_compiles_and_commands_name_the_examples():
    bench = load_bench()
    compile(bench.LATENCY_CHILD, "latency_child", "exec")
    args = bench.argparse.Namespace(demo_epochs=3, quick=False)
    command = bench.example_command("demo", "keras", args, "r.json", "out")
    assert command[1:] == ["-m", "keras_birnn.demo", "--out", "out", "--epochs", "3", "--layers", "keras",
                           "--report-json", "r.json", "--quiet"]
    # The classifier exports (for its latency) unless --no-latency.
    args = bench.argparse.Namespace(classifier_variant="bi-max", epochs=2, max_sentences=None, no_latency=False,
                                    quick=False)
    command = bench.example_command("classifier", "kb", args, "r.json", "out")
    assert command[-9:] == ["--out", "out", "--epochs", "2", "--layers", "kb", "--report-json", "r.json", "--quiet"]
    args.no_latency = True
    assert "--out" not in bench.example_command("classifier", "kb", args, "r.json", "out")


@pytest.mark.slow(reason="exports two small models and serves them in a child process, ~20 s")
def test_latency_script_serves_the_demo_exports(tmp_path):
    """One child serves kb's export through both signatures and Keras's,
    called in turn (`bench_examples.latency_entries` names them)."""
    import keras_birnn as kb

    bench = load_bench()
    keras_path = str(tmp_path / "keras" / "1")
    demo.build_bigru(4, layers="keras").export(keras_path, verbose=False)
    kb_path = kb.export_saved_model(demo.build_bigru(4, layers="kb"), str(tmp_path / "kb"), version=1)
    entries = (bench.latency_entries("demo", "kb", {"export_path": kb_path})
               + bench.latency_entries("demo", "keras", {"export_path": keras_path}))
    for result in served_in_turn(bench, entries).values():
        assert result["batch64_words"] == 64 * 24


def served_in_turn(bench, entries):
    """LATENCY_CHILD's results for kb's export (both signatures) and
    Keras's, each timed at batch 1 over 64 inputs and at batch 64."""
    assert [e.split("=")[0] for e in entries] == ["kb", "kb_unpadded", "keras"]
    done = subprocess.run([sys.executable, "-c", bench.LATENCY_CHILD, "unused", "1"] + entries,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(results) == ["kb", "kb_unpadded", "keras"]
    for result in results.values():
        assert result["sentences"] == 64 and result["batch1_ms"] > 0 and result["batch64_ms"] > 0
    return results


@pytest.mark.slow(reason="exports two small classifiers and serves them in a child process, ~20 s")
def test_latency_script_serves_the_classifier_exports(tmp_path):
    """The classifier's exports (the example's `export_classifier`): kb's
    through both signatures and Keras's, fed rows of word ids from the
    vocabulary written beside each."""
    from helpers import load_example

    sent = load_example("sentence_classification")
    bench = load_bench()
    vocab = sent.Vocabulary([[f"w{k}" for k in range(38)]], min_count=1)
    probe = np.array([[3, 4, 0], [5, 6, 7]], np.int32)
    entries = []
    for layers in ("kb", "keras"):
        model = sent.build_classifier("bi-attention", len(vocab), 8, 6, 0.5, attention_units=5, layers=layers)
        path = sent.export_classifier(model, layers, str(tmp_path), vocab, probe)
        entries += bench.latency_entries("classifier", layers, {"export_path": path})
    words = {r["batch64_words"] for r in served_in_turn(bench, entries).values()}
    assert len(words) == 1 and 64 * 7 <= words.pop() <= 64 * 38  # the same rows for every peer


def test_predict_floor_stand_in_and_interleaving():
    """bench_predict_floor's "none" demo model is what its docstring says,
    Dense(16, tanh) then Dense(2, softmax) at each position, against NumPy;
    every peer's pass predicts the demo's 1,000 x 24 tag probabilities; and
    `timed` warms each peer twice, then calls them in turn, the order
    reversed every other round."""
    floor = load_bench("bench_predict_floor")
    models = floor.demo_models()
    x = floor.demo_bits()[:5]
    (w1, b1), (w2, b2) = [layer.get_weights() for layer in models["none"].layers[1:]]
    logits = np.tanh(x @ w1 + b1) @ w2 + b2
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(models["none"].predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
    shapes = {peer: np.shape(run()) for peer, run in floor.demo_passes().items()}
    assert set(shapes) == set(floor.PEERS) and set(shapes.values()) == {(1000, 24, 2)}, shapes
    calls = []
    medians = floor.timed({peer: (lambda peer=peer: calls.append(peer)) for peer in floor.PEERS}, rounds=2)
    assert calls == ["kb", "kb", "keras", "keras", "none", "none", "kb", "keras", "none", "none", "keras", "kb"]
    assert set(medians) == set(floor.PEERS), medians


def _tanh_direction(bits, weights, reverse, recurrent=True):
    """NumPy: one direction of bench_predict_floor's plain_tanh (or, without
    `recurrent`, no_arithmetic) from a Keras GRU's candidate columns."""
    kernel, recurrent_kernel, bias = weights
    units = recurrent_kernel.shape[0]
    kernel, recurrent_kernel = kernel[:, 2 * units:], recurrent_kernel[:, 2 * units:]
    bias = bias[0, 2 * units:] + bias[1, 2 * units:]
    x = bits[:, ::-1] if reverse else bits
    h, outputs = np.zeros((len(bits), units)), []
    for t in range(bits.shape[1]):
        h = x[:, t] @ kernel + bias + (h @ recurrent_kernel if recurrent else 0)
        h = np.tanh(h) if recurrent else h
        outputs.append(h)
    outputs = np.stack(outputs, 1)
    return outputs[:, ::-1] if reverse else outputs


def test_predict_floor_hand_written_exports(tmp_path):
    """bench_predict_floor's hand-written exports compute what its docstring
    says: plain_gru the Keras twin's numbers (Keras's own layers with the
    same weights), plain_tanh and no_arithmetic their NumPy formulas; the
    entries `write_exports` gives the latency script name every peer, and
    through the SavedModels plain_gru serves the twin's export's numbers."""
    floor = load_bench("bench_predict_floor")
    twin = demo.build_bigru(8, "keras")
    rng = np.random.default_rng(3)  # biases too: Keras initialises them at zero
    twin.set_weights([rng.normal(0.0, 0.5, w.shape).astype("float32") for w in twin.get_weights()])
    bits = floor.demo_bits()[:3]
    modules = floor.plain_modules(twin)
    served = {step: m.serve(bits)["tags"].numpy() for step, m in modules.items()}
    np.testing.assert_allclose(served["plain_gru"], twin.predict(bits, verbose=0), rtol=1e-5, atol=1e-6)
    bigru = twin.get_layer("bigru")
    weights = [layer.get_weights() for layer in (bigru.forward_layer, bigru.backward_layer)]
    tags_kernel, tags_bias = twin.get_layer("tags").get_weights()
    for step, recurrent in (("plain_tanh", True), ("no_arithmetic", False)):
        states = np.concatenate([_tanh_direction(bits, w, r, recurrent) for w, r in zip(weights, (False, True))], -1)
        logits = states @ tags_kernel + tags_bias
        expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        np.testing.assert_allclose(served[step], expected, rtol=1e-5, atol=1e-6, err_msg=step)
    entries = floor.write_exports(str(tmp_path))
    assert [e.split("=")[0] for e in entries] == list(floor.EXPORT_PEERS)
    paths = dict(e.split("=", 1) for e in entries)
    served = {peer: next(iter(tf.saved_model.load(paths[peer].rsplit(":", 1)[0]).signatures["serving_default"](
        bits=tf.constant(bits)).values())).numpy() for peer in ("keras", "plain_gru")}
    np.testing.assert_allclose(served["plain_gru"], served["keras"], rtol=1e-5, atol=1e-6)


def test_layer_benchmark_quick_run(capsys):
    """bench_bidirectional.py's quick run: every peer's row printed, with
    keras_birnn's ratio 1 (a benchmark that calls into the package breaks
    here when an API it uses moves)."""
    bench = load_bench("bench_bidirectional")
    bench.main(["--quick", "--no-first-call", "--no-torch", "--cells", "gru", "--modes", "infer", "train"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("quick gru")]
    assert [r.split()[2] for r in rows] == ["infer", "train"]
    assert all("keras_birnn" in r and "x1.00" in r and "keras_jit" in r for r in rows)
