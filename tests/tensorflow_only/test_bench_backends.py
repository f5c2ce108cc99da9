"""benchmarks/bench_backends.py: its --quick run on the TensorFlow backend
(what CI has: the torch and jax backends are run by hand and on the lent
GPU), one quick case on JAX and on PyTorch where installed, with
TensorFlow made unimportable (the GPU machine has none), and its copy of
Keras's GRU weights into torch.nn's layout, checked in NumPy against
torch.nn.GRU's equations (torch is not installed in CI)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO

CASES = [f"{cell}/quick/{masking}/{mode}" for cell in ("bigru", "bilstm")
         for masking in ("unmasked", "masked") for mode in ("train", "infer")]


def load_bench():
    path = os.path.join(REPO, "benchmarks", "bench_backends.py")
    spec = importlib.util.spec_from_file_location("bench_backends", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow(reason="runs the benchmark's --quick mode in a fresh process, ~20 s")
def test_quick_run_on_tensorflow(tmp_path):
    """Every case prints a row for Keras and for kb; both match the NumPy
    oracle to 1e-5 at valid steps with zeros at padded ones, and the mask
    changed Keras's outputs (its masked path ran)."""
    path = tmp_path / "bench.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, os.path.join("benchmarks", "bench_backends.py"), "--quick",
                           "--repeats", "2", "--warmup", "1", "--json", str(path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert "precision: TF32 off" in out and "kb: not on this backend yet" not in out
    for case in CASES:
        for peer in ("keras", "kb"):
            assert any(line.split()[:2] == [case, peer] for line in out.splitlines()), (case, peer, out)
    report = json.loads(path.read_text())
    assert sorted((r["case"], r["peer"]) for r in report["rows"]) == sorted(
        (case, peer) for case in CASES for peer in ("keras", "kb"))
    assert all(r["median_ms"] > 0 and r["first_ms"] > 0 and r["repeats"] >= 1 for r in report["rows"])
    assert len(report["checks"]) == 4
    for check in report["checks"]:
        assert check["keras_vs_oracle"] < 1e-5 and check["kb_vs_oracle"] < 1e-5, check
        assert check["grads_kb_vs_keras_rel"] < 1e-5 and check["kb_engine"] != "none seen", check
        if check["case"].endswith("/masked"):
            assert check["keras_mask_effect"] > 1e-3 and check["engine"].endswith("rnn"), check
    assert report["summary"] and not report["skipped"] and not report["errors"]
    assert all("keras/kb masked" in entry for entry in report["summary"]), report["summary"]


@pytest.mark.slow(reason="runs one quick case of the benchmark in a fresh process per backend, ~15 s each")
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_quick_case_without_tensorflow(backend, tmp_path):
    """On JAX and PyTorch, with `import tensorflow` failing (a sitecustomize
    puts None in sys.modules), keras_birnn imports and kb runs (the scan
    engine on JAX, the vendor engine on PyTorch): a row for Keras, kb (and torch.nn on torch), kb's
    outputs and weight gradients matching the oracle and Keras's; `--threads 1`
    in force."""
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed")
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    path = tmp_path / "bench.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=backend,
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, os.path.join("benchmarks", "bench_backends.py"), "--quick",
                           "--cases", "bilstm/quick/masked/*", "--repeats", "1", "--warmup", "0", "--threads", "1",
                           "--json", str(path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(path.read_text())
    peers = ["keras", "kb"] + (["torch.nn"] if backend == "torch" else [])
    assert report["info"]["backend"] == backend and "tensorflow" not in report["info"]
    assert report["info"]["threads"].startswith("1 ("), report["info"]
    assert sorted((r["case"], r["peer"]) for r in report["rows"]) == sorted(
        (f"bilstm/quick/masked/{mode}", peer) for mode in ("train", "infer") for peer in peers)
    (check,) = report["checks"]
    # On a CPU: JAX's scan engine (no cuDNN), PyTorch's LSTM kernel.
    expected = {"jax": "scan scan per direction (why not vendor: no cuDNN", "torch": "vendor torch.lstm bidirectional"}
    assert check["kb_engine"].startswith(expected[backend]), check
    assert check["kb_vs_oracle"] < 1e-5 and check["grads_kb_vs_keras_rel"] < 1e-5, check
    assert not report["errors"] and not report["skipped"]


def _torch_gru_direction(x, w_ih, w_hh, b_ih, b_hh):
    """torch.nn.GRU's documented equations (gates r, z, n), one direction, NumPy."""
    units = w_hh.shape[1]
    h, outputs = np.zeros((x.shape[0], units)), []
    for t in range(x.shape[1]):
        gi, gh = x[:, t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh
        r = 1 / (1 + np.exp(-(gi[:, :units] + gh[:, :units])))
        z = 1 / (1 + np.exp(-(gi[:, units:2 * units] + gh[:, units:2 * units])))
        n = np.tanh(gi[:, 2 * units:] + r * gh[:, 2 * units:])
        h = (1 - z) * n + z * h
        outputs.append(h)
    return np.stack(outputs, 1)


def test_keras_gru_weights_in_torch_layout():
    """Keras's z, r, h columns and [input; recurrent] biases, moved to
    torch's r, z, n order, give the oracle's forward direction through
    torch's equations; left in Keras's order they do not."""
    bench = load_bench()
    rng = np.random.default_rng(5)
    features, units = 3, 4
    weights = (rng.normal(size=(features, 3 * units)), rng.normal(size=(units, 3 * units)) * 0.5,
               rng.normal(size=(2, 3 * units)) * 0.3)
    x = rng.normal(size=(2, 5, features))
    expected = bench.oracle("bigru", [weights, weights], x, None)[..., :units]
    ours = _torch_gru_direction(x, *bench.torch_layout("bigru", *weights))
    np.testing.assert_allclose(ours, expected, atol=1e-12)
    kernel, recurrent, bias = weights
    unmoved = _torch_gru_direction(x, kernel.T, recurrent.T, bias[0], bias[1])
    assert np.abs(unmoved - expected).max() > 1e-2
