"""benchmarks/bench_examples.py's parts that run in child processes.

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

import pytest

from helpers import REPO
from keras_birnn import demo


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_examples", os.path.join(REPO, "benchmarks", "bench_examples.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_latency_script_compiles_and_commands_name_the_examples():
    bench = load_bench()
    compile(bench.LATENCY_CHILD, "latency_child", "exec")
    args = bench.argparse.Namespace(demo_epochs=3, quick=False)
    command = bench.example_command("demo", "keras", args, "r.json", "out")
    assert command[1:] == ["-m", "keras_birnn.demo", "--out", "out", "--epochs", "3", "--layers", "keras",
                           "--report-json", "r.json", "--quiet"]


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
    assert [e.split("=")[0] for e in entries] == ["kb", "kb_unpadded", "keras"]
    done = subprocess.run([sys.executable, "-c", bench.LATENCY_CHILD, "unused", "1"] + entries,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(results) == ["kb", "kb_unpadded", "keras"]
    for result in results.values():
        assert result["sentences"] == 64 and result["batch64_words"] == 64 * 24
        assert result["batch1_ms"] > 0 and result["batch64_ms"] > 0
