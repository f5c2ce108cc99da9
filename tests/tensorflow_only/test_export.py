"""SavedModel export: served outputs equal the Keras model's, padded rows included.

The serving side runs in a fresh process that never imports keras_birnn, as
TF Serving would; the oracle is the Keras model run on each row unpadded
(and on the zero-padded batch where Keras itself masks token 0).
"""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn.export.saved_model import (
    FORBIDDEN_OPS,
    INPUTS_KEY,
    LENGTHS_KEY,
    SIGNATURE_DEFAULT,
    SIGNATURE_UNPADDED,
    _read_saved_model,
    check_graph_ops,
    next_version,
    saved_model_op_types,
)
from helpers import REPO, run_python

VOCAB, TAGS, FEATURES = 30, 5, 3
# Two batch sizes and time sizes; each has full rows and right-padded rows.
CASES = {"a": (3, 7, [7, 4, 1]), "b": (5, 4, [2, 4, 3, 1, 4])}


def make_tagger():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    embedded = keras.layers.Embedding(VOCAB, 6, mask_zero=True)(tokens)
    tags = kb.Bidirectional(
        kb.GRUCell(8), merge_mode="projection", projection_units=TAGS,
        projection_activation="softmax", return_sequences=True,
    )(embedded)
    return keras.Model(tokens, tags, name="tagger")


def make_classifier():
    features = keras.Input((None, FEATURES), name="features")
    sentence = kb.Bidirectional(kb.LSTMCell(6))(features)
    probs = keras.layers.Dense(2, activation="softmax")(sentence)
    return keras.Model(features, probs, name="classifier")


def case_inputs(kind, batch, time, lengths, rng):
    """Inputs whose padded slots hold garbage, never the padding marker."""
    if kind == "tagger":
        return rng.integers(1, VOCAB, size=(batch, time)).astype("int32")
    return rng.normal(size=(batch, time, FEATURES)).astype("float32")


def keras_oracle(model, x, lengths, kind):
    """The Keras model on each row alone (unpadded), padded back to the batch.

    Padded positions of the tagger's output are zeros (the projection
    zeros masked positions), which is what the Keras model gives on the
    batch padded with token 0; checked below as well.
    """
    rows = []
    for row, length in enumerate(lengths):
        out = np.asarray(model(x[row : row + 1, :length], training=False))[0]
        if kind == "tagger":
            out = np.concatenate([out, np.zeros((x.shape[1] - length, TAGS), out.dtype)])
        rows.append(out)
    return np.stack(rows)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Both models exported, with inputs and Keras oracles saved for the server."""
    root = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    arrays, dirs = {}, {}
    for kind, model in (("tagger", make_tagger()), ("classifier", make_classifier())):
        dirs[kind] = kb.export_saved_model(model, str(root / kind))
        for name, (batch, time, lengths) in CASES.items():
            x = case_inputs(kind, batch, time, lengths, rng)
            lengths = np.asarray(lengths, np.int32)
            padded_oracle = keras_oracle(model, x, lengths, kind)
            if kind == "tagger":
                # Keras itself on the zero-padded batch (mask_zero) agrees.
                zero_padded = np.where(np.arange(time) < lengths[:, None], x, 0)
                np.testing.assert_allclose(
                    np.asarray(model(zero_padded)), padded_oracle, atol=1e-6, rtol=1e-6
                )
            arrays[f"{kind}_{name}_x"] = x
            arrays[f"{kind}_{name}_lengths"] = lengths
            arrays[f"{kind}_{name}_padded"] = padded_oracle
            arrays[f"{kind}_{name}_full"] = np.asarray(model(x, training=False))
    np.savez(root / "cases.npz", **arrays)
    return root, dirs


SERVER = """
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

data = np.load(sys.argv[1])
dirs = json.loads(sys.argv[2])
report = {"max_diff": {}, "ops": {}, "unregistered": {}, "signatures": {}, "xla_compiled": {}}
for kind, path in dirs.items():
    loaded = tf.saved_model.load(path)
    report["signatures"][kind] = {
        name: sorted(fn.structured_input_signature[1]) for name, fn in loaded.signatures.items()
    }
    default = loaded.signatures["serving_default"]
    unpadded = loaded.signatures["serving_unpadded"]
    for case in ("a", "b"):
        x = tf.constant(data[f"{kind}_{case}_x"])
        lengths = tf.constant(data[f"{kind}_{case}_lengths"])
        served = default(inputs=x, lengths=lengths)["outputs"].numpy()
        report["max_diff"][f"{kind}_{case}_padded"] = float(
            np.max(np.abs(served - data[f"{kind}_{case}_padded"])))
        served = unpadded(inputs=x)["outputs"].numpy()
        report["max_diff"][f"{kind}_{case}_full"] = float(
            np.max(np.abs(served - data[f"{kind}_{case}_full"])))
    proto = saved_model_pb2.SavedModel()
    with open(path + "/saved_model.pb", "rb") as f:
        proto.ParseFromString(f.read())
    ops, xla = set(), []
    for graph in proto.meta_graphs:
        ops.update(node.op for node in graph.graph_def.node)
        xla += [n.name for n in graph.graph_def.node if n.attr["_XlaMustCompile"].b]
        for function in graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
            xla += [function.signature.name] if function.attr["_XlaMustCompile"].b else []
            xla += [n.name for n in function.node_def if n.attr["_XlaMustCompile"].b]
    report["ops"][kind] = sorted(ops)
    report["xla_compiled"][kind] = xla
    report["unregistered"][kind] = sorted(op for op in ops if op_def_registry.get(op) is None)
report["keras_birnn_imported"] = any(m.split(".")[0] == "keras_birnn" for m in sys.modules)
print(json.dumps(report))
"""


def _saved_model_cli_cmd(*args):
    exe = shutil.which("saved_model_cli")
    cmd = [exe] if exe else [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli"]
    return cmd + list(args)


@pytest.fixture(scope="module")
def processes(exported, tmp_path_factory):
    """The serving process and the saved_model_cli calls, run side by side.

    Returns {name: stdout}; each must exit 0. Running them at once keeps the
    file fast: each is mostly TensorFlow's import time.
    """
    root, dirs = exported
    data = np.load(root / "cases.npz")
    commands = {
        "show": _saved_model_cli_cmd("show", "--all", "--dir", dirs["tagger"]),
    }
    for kind in ("tagger", "classifier"):
        x, lengths = data[f"{kind}_a_x"], data[f"{kind}_a_lengths"]
        outdir = tmp_path_factory.mktemp(f"cli_{kind}")
        commands[f"run_{kind}"] = _saved_model_cli_cmd(
            "run", "--dir", dirs[kind], "--tag_set", "serve", "--signature_def", "serving_default",
            "--input_exprs", f"inputs={x.tolist()!r};lengths={lengths.tolist()!r}",
            "--outdir", str(outdir),
        )
        commands[f"outdir_{kind}"] = str(outdir)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    running = {
        name: subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, cmd in commands.items() if not name.startswith("outdir_")
    }
    # Meanwhile the server: a fresh process that must never import keras_birnn.
    argv = ["serve", str(root / "cases.npz"), json.dumps(dirs)]
    try:
        results = {"server": run_python(f"import sys; sys.argv = {argv!r}\n" + SERVER)}
        for name, proc in running.items():
            stdout, stderr = proc.communicate(timeout=300)
            assert proc.returncode == 0, (name, stderr[-3000:])
            results[name] = stdout
    finally:
        for proc in running.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    results.update({k: v for k, v in commands.items() if k.startswith("outdir_")})
    return results


@pytest.fixture(scope="module")
def served(processes):
    return json.loads(processes["server"].strip().splitlines()[-1])


@pytest.mark.slow(reason="the served fixture starts a server process, ~27 s")
def test_server_process_never_imports_keras_birnn(served):
    assert served["keras_birnn_imported"] is False


@pytest.mark.slow(reason="the served fixture starts a server process, ~27 s")
@pytest.mark.parametrize("kind", ["tagger", "classifier"])
def test_served_outputs_equal_keras_for_two_batch_and_time_sizes(served, kind):
    diffs = {k: v for k, v in served["max_diff"].items() if k.startswith(kind)}
    assert len(diffs) == 4  # two cases x (padded with lengths, unpadded)
    for key, diff in diffs.items():
        assert diff <= 1e-5, (key, diff)


@pytest.mark.slow(reason="the served fixture starts a server process, ~27 s")
@pytest.mark.parametrize("kind", ["tagger", "classifier"])
def test_signature_names_are_the_documented_ones(served, kind):
    assert served["signatures"][kind] == {
        SIGNATURE_DEFAULT: ["inputs", LENGTHS_KEY],
        SIGNATURE_UNPADDED: ["inputs"],
    }


@pytest.mark.slow(reason="the served fixture starts a server process, ~27 s")
@pytest.mark.parametrize("kind", ["tagger", "classifier"])
def test_graph_has_only_registered_core_ops_and_no_forbidden_ones(served, kind):
    ops = set(served["ops"][kind])
    assert not ops & FORBIDDEN_OPS
    assert {"PyFunc", "EagerPyFunc", "PyFuncStateless", "CudnnRNN", "CudnnRNNV3"} <= FORBIDDEN_OPS
    assert not any(op.startswith("Cudnn") for op in ops)
    assert served["unregistered"][kind] == []
    # Plain graph loops: nothing needs XLA's JIT to serve.
    assert served["xla_compiled"][kind] == []
    # The recurrence is a graph loop, the merge a matmul: the graph is the model.
    assert ops & {"While", "StatelessWhile"}
    assert "MatMul" in ops or "Einsum" in ops


@pytest.mark.slow(reason="the processes fixture starts saved_model_cli and a server, ~15 s and more in children")
def test_saved_model_cli_show_all(processes):
    out = processes["show"]
    for needle in (
        "signature_def['serving_default']", "signature_def['serving_unpadded']",
        "inputs['inputs']", "inputs['lengths']", "outputs['outputs']",
        "shape: (-1, -1)", "shape: (-1, -1, 5)",
    ):
        assert needle in out, needle


@pytest.mark.slow(reason="the processes fixture starts saved_model_cli and a server, ~15 s and more in children")
@pytest.mark.parametrize("kind", ["tagger", "classifier"])
def test_saved_model_cli_run_matches_keras(exported, processes, kind):
    root, _ = exported
    assert "Result for output key outputs" in processes[f"run_{kind}"]
    written = np.load(os.path.join(processes[f"outdir_{kind}"], "outputs.npy"))
    np.testing.assert_allclose(
        written, np.load(root / "cases.npz")[f"{kind}_a_padded"], atol=1e-5, rtol=1e-5
    )


# --- in-process checks of the design ----------------------------------------------


@pytest.mark.slow(reason="exports and serves a model, ~6 s")
def test_masking_layer_input_gets_its_mask_value_in_padded_slots(tmp_path):
    """A model starting with Masking(mask_value=-1) masks via its own marker."""
    model = keras.Sequential(
        [
            keras.Input((None, 2)),
            keras.layers.Masking(mask_value=-1.0),
            kb.Bidirectional(kb.GRUCell(4)),
            keras.layers.Dense(3),
        ]
    )
    path = kb.export_saved_model(model, str(tmp_path / "m"), version=3)
    assert path == str(tmp_path / "m" / "3")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 2)).astype("float32")
    lengths = np.array([6, 2], np.int32)
    served = tf.saved_model.load(path).signatures["serving_default"](
        inputs=tf.constant(x), lengths=tf.constant(lengths)
    )["outputs"].numpy()
    expected = np.concatenate([np.asarray(model(x[i : i + 1, :n])) for i, n in enumerate(lengths)])
    np.testing.assert_allclose(served, expected, atol=1e-5, rtol=1e-5)


def test_model_that_drops_the_mask_is_refused(tmp_path):
    """Conv1D does not carry Keras masks: lengths could not reach the recurrence."""
    features = keras.Input((None, 3))
    hidden = keras.layers.Conv1D(4, 2, padding="same")(features)
    model = keras.Model(features, kb.Bidirectional(kb.GRUCell(4))(hidden))
    with pytest.warns(UserWarning, match="does not support masking"):
        with pytest.raises(ValueError, match="does not reach"):
            kb.export_saved_model(model, str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()
    # Without lengths it exports, and serves the Keras outputs.
    path = kb.export_saved_model(model, str(tmp_path / "bad"), lengths_input=False)
    loaded = tf.saved_model.load(path)
    assert sorted(loaded.signatures) == [SIGNATURE_DEFAULT]
    x = np.random.default_rng(1).normal(size=(2, 5, 3)).astype("float32")
    np.testing.assert_allclose(
        loaded.signatures[SIGNATURE_DEFAULT](inputs=tf.constant(x))["outputs"].numpy(),
        np.asarray(model(x)), atol=1e-5, rtol=1e-5,
    )


@pytest.mark.slow(reason="exports twice, ~4 s")
def test_versions_count_up_and_existing_ones_are_kept(tmp_path):
    base = tmp_path / "clf"
    assert next_version(base) == 1
    for name in ("1", "3", "notes", "10x"):
        (base / name).mkdir(parents=True)
    assert next_version(base) == 4
    model = make_classifier()
    assert kb.export_saved_model(model, str(base)) == str(base / "4")
    assert next_version(base) == 5
    with pytest.raises(FileExistsError):
        kb.export_saved_model(model, str(base), version=3)
    assert sorted(os.listdir(base)) == ["1", "10x", "3", "4", "notes"]  # no staging left


def test_lengths_need_a_sequence_input(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="lengths_input=False"):
        kb.export_saved_model(model, str(tmp_path / "x"))


def test_graph_check_rejects_python_callbacks_and_xla_clusters(tmp_path):
    class PyCallback(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return tf.numpy_function(lambda v: 2 * v, [x], tf.float32)

    class Compiled(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)], jit_compile=True)
        def serve(self, x):
            return 2 * x

    class Plain(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return 2 * x

    for name, module, message in (("py", PyCallback(), "PyFunc"), ("xla", Compiled(), "XLA")):
        tf.saved_model.save(module, str(tmp_path / name), signatures=module.serve)
        with pytest.raises(ValueError, match=message):
            check_graph_ops(str(tmp_path / name))
    module = Plain()
    tf.saved_model.save(module, str(tmp_path / "plain"), signatures=module.serve)
    assert {"Mul", "Placeholder"} <= check_graph_ops(str(tmp_path / "plain"))


def _while_forms(saved_model_dir) -> list:
    """Per `While` loop of a SavedModel (graphs and function libraries): its
    `_lower_using_switch_merge` attribute (True: lowered), None where unset."""
    forms = []
    for meta_graph in _read_saved_model(saved_model_dir).meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        nodes += [n for f in meta_graph.graph_def.library.function for n in f.node_def]
        for node in nodes:
            if node.op in ("While", "StatelessWhile"):
                attr = node.attr.get("_lower_using_switch_merge")
                forms.append(None if attr is None else attr.b)
    return forms


@pytest.mark.parametrize("units, features, functional", [(8, 3, True), (64, 128, False)], ids=["small", "large"])
def test_serving_loops_are_laid_out_as_in_process_inference(tmp_path, units, features, functional):
    """An exported layer has a loop per direction, which TensorFlow's
    executor runs at the same time, each a functional `While` where a
    32-row batch would run one in process (a small step: it took the
    demo's exported model from 0.89x Keras's speed at batch 1 to
    1.70-1.79x, benchmarks/README.md) and lowered for a large step (64 units over 128
    features: 36,864 multiply-adds a row). Both serve the model's numbers
    on each row alone, through both signatures."""
    inputs = keras.Input((None, features), name="features")
    model = keras.Model(inputs, kb.Bidirectional(kb.GRUCell(units), return_sequences=True)(inputs))
    path = kb.export_saved_model(model, str(tmp_path / "model"))
    loaded = tf.saved_model.load(path)
    forms = _while_forms(path)
    assert set(forms) == {not functional} and len(forms) == 2 * len(loaded.signatures), forms
    rng = np.random.default_rng(3)
    x, lengths = rng.normal(size=(3, 6, features)).astype("float32"), np.array([6, 2, 4], np.int32)
    expected = np.stack([
        np.pad(np.asarray(model(x[row : row + 1, :n]))[0], [[0, 6 - n], [0, 0]]) for row, n in enumerate(lengths)
    ])
    served = loaded.signatures[SIGNATURE_DEFAULT](**{INPUTS_KEY: tf.constant(x), LENGTHS_KEY: tf.constant(lengths)})
    np.testing.assert_allclose(next(iter(served.values())).numpy(), expected, atol=1e-5)
    unpadded = loaded.signatures[SIGNATURE_UNPADDED](**{INPUTS_KEY: tf.constant(x[:1])})
    np.testing.assert_allclose(next(iter(unpadded.values())).numpy(), expected[:1], atol=1e-5)


@pytest.mark.slow(reason="exports with and without XLA, ~12 s")
def test_keras_model_export_for_export_has_no_xla_and_serves_the_same(tmp_path, caplog):
    """Keras's own `model.export()` traces the layers as they are: with the
    XLA-compiled loops, which a model server without XLA cannot run (the
    graph check refuses it). Traced under `xla_disabled()` it passes the
    check, but still holds the training path's custom gradient, which a
    reload warns about; under `kb.for_export()` it passes, reloads without
    that warning and serves the model's outputs. Only the serving graph
    swaps batch and time with `Transpose` alone: the training path's loops
    move the bits as float64s (`Bitcast`, which tf2onnx cannot convert and
    TensorFlow cannot differentiate)."""
    model = make_tagger()
    tokens = np.array([[3, 4, 5, 0], [6, 7, 8, 9]], np.int32)
    model.export(str(tmp_path / "as_is"), verbose=False)
    with pytest.raises(ValueError, match="XLA"):
        check_graph_ops(str(tmp_path / "as_is"))
    assert "Bitcast" in saved_model_op_types(str(tmp_path / "as_is"))
    with kb.xla_disabled():
        model.export(str(tmp_path / "plain"), verbose=False)
    with kb.for_export():
        model.export(str(tmp_path / "serving"), verbose=False)
    assert "Bitcast" not in saved_model_op_types(str(tmp_path / "serving"))
    for name, warns in (("plain", True), ("serving", False)):
        check_graph_ops(str(tmp_path / name))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            loaded = tf.saved_model.load(str(tmp_path / name))
        assert any("custom gradients" in r.getMessage() for r in caplog.records) is warns, name
        np.testing.assert_allclose(np.asarray(loaded.serve(tokens)), np.asarray(model(tokens)), atol=1e-6)


# What some TensorFlow builds print when they start, whatever TF_CPP_MIN_LOG_LEVEL
# says: absl's notice that it logs to stderr before it is initialised, and
# INFO lines (oneDNN, the CPU's instructions).
_START_UP_LINES = ("WARNING: All log messages before absl::InitializeLog()", "I0000 ",
                   "To enable the following instructions")


@pytest.mark.slow(reason="a fresh Python process, ~15 s")
def test_loading_an_export_prints_no_warning(tmp_path):
    """A serving graph holds the forward pass only: loading it prints
    nothing (no "unsaved custom gradients" warning for the training path's
    BPTT functions), and a gradient of the reloaded model still works
    (TensorFlow's autodiff through the While loop), equal to Keras's."""
    keras.utils.set_random_seed(0)
    features = keras.Input((None, 3))
    model = keras.Model(features, kb.Bidirectional(kb.LSTMCell(4), return_sequences=True)(features))
    path = kb.export_saved_model(model, tmp_path, version=1)
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32")
    with tf.GradientTape() as tape:
        xt = tf.constant(x)
        tape.watch(xt)
        loss = tf.reduce_sum(model(xt) ** 2)
    expected = tape.gradient(loss, xt).numpy()
    code = f"""
        import json, numpy as np, tensorflow as tf
        loaded = tf.saved_model.load({str(path)!r})  # kept: the signature's variables live in it
        serve = loaded.signatures["serving_unpadded"]
        x = tf.constant(np.asarray({x.tolist()!r}, "float32"))
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(serve(inputs=x)["outputs"] ** 2)
        print(json.dumps(tape.gradient(loss, x).numpy().tolist()))
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith(_START_UP_LINES)]
    flagged = [line for line in warnings if "WARNING" in line or "custom gradient" in line or re.match(r"W\d{4} ", line)]
    assert not flagged, warnings
    np.testing.assert_allclose(np.asarray(json.loads(done.stdout.strip().splitlines()[-1])), expected, atol=1e-5)
