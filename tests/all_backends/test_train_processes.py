"""`keras-birnn train` on 2 JAX processes equals 1 process, and survives a kill.

Each run is a job of fresh processes on this machine, on loopback ports,
with Keras's variables (`KERAS_DISTRIBUTION_JOB_ADDRESSES`,
`KERAS_DISTRIBUTION_NUM_PROCESSES`, `KERAS_DISTRIBUTION_PROCESS_ID`). The
oracle is the same config trained by 1 process: the 2-process job ends with
its weights and optimizer state (to 1e-5), its best epoch and dev scores.
The corpus's batches of 8 sentences are split into shards of unequal valid
tokens, and a bucket's last batch of odd rows is padded with an empty row
(`keras_birnn.training.distributed.local_rows`), which the losses skip.

Then process 1 kills itself (SIGKILL) in the middle of an epoch, after a
mid-epoch checkpoint: process 0 must exit non-zero within 60 s naming the
lost process, and `--resume` on both ends with the 1-process weights.

Runs on the JAX backend's suite (the job's processes use JAX whatever the
suite's backend; once is enough).
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from helpers import names_conll

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(keras.backend.backend() != "jax", reason="a JAX job; runs in the JAX suite"),
    pytest.mark.skipif(os.name != "posix", reason="SIGKILL"),
]

CONFIG = """task = "tagger"
seed = 3
[data]
train = "{folder}/train.conll"
dev = "{folder}/dev.conll"
[model]
head = "{head}"
hidden = 8
word_dim = 8
char_dim = 4
char_units = 4
dropout = 0.0
[train]
epochs = 2
batch_size = 8
optimizer = "adam"
learning_rate = 0.05
patience = 0
checkpoint_steps = 5
[export]
enabled = false
"""

# Runs the command; with KILL_AFTER_BATCH=N the process kills itself with
# SIGKILL after its Nth batch (a mid-epoch checkpoint written before it).
WRAPPER = """
import os, signal, sys
from keras_birnn.cli.main import main
from keras_birnn.training import trainer

after = int(os.environ.get("KILL_AFTER_BATCH", 0))
if after:
    batch_end = trainer.Loop.on_train_batch_end
    def on_train_batch_end(self, batch, logs=None):
        batch_end(self, batch, logs)
        if self.run.state["batch"] == after:
            os.kill(os.getpid(), signal.SIGKILL)
    trainer.Loop.on_train_batch_end = on_train_batch_end
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(folder: pathlib.Path, head: str, run: str, index=None, port=None, extra=(), kill_after=0):
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID", "KILL_AFTER_BATCH"):
        env.pop(name, None)
    if index is not None:
        env.update(KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}", KERAS_DISTRIBUTION_NUM_PROCESSES="2",
                   KERAS_DISTRIBUTION_PROCESS_ID=str(index))
    if kill_after:
        env["KILL_AFTER_BATCH"] = str(kill_after)
    config = folder / f"{head}.toml"
    config.write_text(CONFIG.format(folder=folder, head=head), encoding="utf-8")
    command = [sys.executable, "-c", WRAPPER, "train", str(config), "--run", str(folder / run), *extra]
    return subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finished(process, timeout=400):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def job(folder, head, run, extra=(), kill_after=0):
    """Both processes of a 2-process job, process 1 started first."""
    port = free_port()
    second = start(folder, head, run, 1, port, extra, kill_after)
    first = start(folder, head, run, 0, port, extra)
    return first, second


def last_checkpoint(run: pathlib.Path):
    number = json.loads((run / "checkpoint" / "latest.json").read_text())["number"]
    arrays = np.load(run / "checkpoint" / f"state-{number}.npz")
    return [arrays[k] for k in sorted(arrays.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("processes")
    (folder / "train.conll").write_text(names_conll(203, 1) + "\n", encoding="utf-8")
    (folder / "dev.conll").write_text(names_conll(40, 2) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def alone(corpus):
    """The 1-process runs, the oracle: head -> run folder."""
    runs = {}
    for head in ("crf", "softmax"):
        code, out, err = finished(start(corpus, head, f"one_{head}"))
        assert code == 0, err[-3000:]
        runs[head] = corpus / f"one_{head}"
    return runs


def assert_same_run(run, oracle):
    for got, expected in zip(last_checkpoint(run), last_checkpoint(oracle), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    metrics, expected = (json.loads((r / "metrics.json").read_text()) for r in (run, oracle))
    assert metrics["best_epoch"] == expected["best_epoch"] and metrics["processes"] == 2
    assert metrics["dev"]["f1"] == pytest.approx(expected["dev"]["f1"], abs=1e-9)
    assert metrics["dev"]["f1"] > 0.9


@pytest.mark.slow(reason="2 JAX processes and 1, two heads: ~2.5 min")
@pytest.mark.parametrize("head", ["crf", "softmax"])
def test_two_processes_train_as_one(corpus, alone, head):
    first, second = job(corpus, head, f"two_{head}")
    (code0, out0, err0), (code1, out1, err1) = finished(first), finished(second)
    assert code0 == 0 and code1 == 0, err0[-3000:] + err1[-3000:]
    assert_same_run(corpus / f"two_{head}", alone[head])
    # Process 0 prints and writes; process 1 does neither (gloo's own line aside).
    assert "best dev score" in out0
    assert [line for line in out1.splitlines() if not line.startswith("[Gloo]")] == []
    written = sorted(p.name for p in (corpus / f"two_{head}").iterdir())
    assert written == ["best.keras", "checkpoint", "config.toml", "history.csv", "metrics.json", "report.txt"]


@pytest.mark.slow(reason="a killed 2-process JAX job and its resume: ~1.5 min")
def test_a_killed_process_stops_the_job_which_resumes_exactly(corpus, alone):
    first, second = job(corpus, "crf", "killed", kill_after=7)
    code1, _, _ = finished(second)
    killed_at = time.monotonic()
    assert code1 == -9
    code0, _, err0 = finished(first)
    assert time.monotonic() - killed_at < 60
    assert code0 == 1 and "process 1 of 2 was lost; process 0 stops" in err0, err0[-3000:]
    assert "--resume" in err0 and "Traceback" not in err0
    number = json.loads((corpus / "killed" / "checkpoint" / "latest.json").read_text())["number"]
    state = json.loads((corpus / "killed" / "checkpoint" / f"state-{number}.json").read_text())
    assert (state["epoch"], state["batch"]) == (0, 5)  # the mid-epoch checkpoint before the kill
    first, second = job(corpus, "crf", "killed", extra=["--resume"])
    (code0, _, err0), (code1, _, err1) = finished(first), finished(second)
    assert code0 == 0 and code1 == 0, err0[-3000:] + err1[-3000:]
    assert_same_run(corpus / "killed", alone["crf"])
