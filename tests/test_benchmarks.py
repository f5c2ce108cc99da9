"""benchmarks/bench_examples.py's parts that run in child processes.

Its children are the examples (tested in their own files) and a latency
script given to `python -c`; the script is checked here on the demo's
SavedModels, kb's (`inputs` and `lengths`) and Keras's (`bits`), which it
must serve through the same signature without keras_birnn (that the
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


@pytest.mark.slow(reason="exports two small models and serves each in a child process, ~20 s")
@pytest.mark.parametrize("layers", ["kb", "keras"])
def test_latency_script_serves_the_demo_exports(tmp_path, layers):
    bench = load_bench()
    model = demo.build_bigru(4, layers=layers)
    if layers == "keras":
        path = str(tmp_path / "1")
        model.export(path, verbose=False)
    else:
        import keras_birnn as kb

        path = kb.export_saved_model(model, str(tmp_path), version=1)
    done = subprocess.run([sys.executable, "-c", bench.LATENCY_CHILD, path, "unused", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["sentences"] == 64 and result["batch64_words"] == 64 * 24
    assert result["batch1_ms"] > 0 and result["batch64_ms"] > 0
