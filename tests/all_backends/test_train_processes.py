"""`keras-birnn train` on 2 processes equals 1 process, and survives a kill.

Each run is a job of fresh processes on this machine, on loopback ports:
JAX processes with Keras's variables (`KERAS_DISTRIBUTION_JOB_ADDRESSES`,
`KERAS_DISTRIBUTION_NUM_PROCESSES`, `KERAS_DISTRIBUTION_PROCESS_ID`) in the
JAX suite, TensorFlow workers with `TF_CONFIG` in TensorFlow's. The oracle
is the same config trained by 1 process: the 2-process job ends with its
weights and optimizer state (to 1e-5), its best epoch and dev scores, and
both processes hold the same values to the bit. The corpus's batches of 8 sentences are split into shards of unequal valid
tokens, and a bucket's last batch of odd rows is padded with an empty row
(`keras_birnn.training.distributed.local_rows`), which the losses skip.

Then process 1 kills itself (SIGKILL) in the middle of an epoch, after a
mid-epoch checkpoint: process 0 must exit non-zero within 60 s with one
line (naming the lost process on JAX; on TensorFlow when its heartbeat
check has run), and `--resume` on both ends with the 1-process weights.

The refused settings run on every backend.
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

from keras_birnn.cli.main import main
from keras_birnn.training import distributed

REPO = pathlib.Path(__file__).resolve().parents[2]
BACKEND = keras.backend.backend()
# The jobs: JAX processes in the JAX suite, TensorFlow workers in TensorFlow's.
JOB = pytest.mark.skipif(BACKEND not in ("jax", "tensorflow") or os.name != "posix",
                         reason="a job of JAX processes or TensorFlow workers on POSIX (SIGKILL)")

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
# SIGKILL after its Nth batch (a mid-epoch checkpoint written before it);
# with DUMP_WEIGHTS=PREFIX every process saves its variables at the end
# (PREFIX-<process>.npz), which the run folder holds for process 0 alone.
WRAPPER = """
import os, signal, sys
import numpy as np
from keras import ops
from keras_birnn.cli.main import main
from keras_birnn.training import checkpoint, trainer

prefix = os.environ.get("DUMP_WEIGHTS")
if prefix:
    finish = trainer.Run.finish
    def dumped(self):
        values = [ops.convert_to_numpy(v) for v in checkpoint.all_variables(self.model)]
        np.savez(f"{prefix}-{self.processes.index}.npz", *values)
        return finish(self)
    trainer.Run.finish = dumped

after = int(os.environ.get("KILL_AFTER_BATCH", 0))
if after:
    after_batch = trainer.Run.after_batch
    def counted(self, sync=None):
        after_batch(self, sync)
        if self.state["batch"] == after:
            os.kill(os.getpid(), signal.SIGKILL)
    trainer.Run.after_batch = counted
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_variables(backend: str, index: int, ports) -> dict:
    """Process `index` of 2: Keras's variables (JAX) or TF_CONFIG (TensorFlow)."""
    if backend == "jax":
        return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": f"127.0.0.1:{ports[0]}",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": str(index)}
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}


def start(folder: pathlib.Path, head: str, run: str, index=None, ports=None, extra=(), kill_after=0, dump=None):
    backend = BACKEND
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    for name in ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID", "KILL_AFTER_BATCH", "TF_CONFIG"):
        env.pop(name, None)
    if index is not None:
        env.update(job_variables(backend, index, ports))
    if kill_after:
        env["KILL_AFTER_BATCH"] = str(kill_after)
    if dump:
        env["DUMP_WEIGHTS"] = str(dump)
    config = folder / f"{head}.toml"
    config.write_text(CONFIG.format(folder=folder, head=head), encoding="utf-8")
    command = [sys.executable, "-c", WRAPPER, "train", str(config), "--run", str(folder / run), *extra]
    return subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finished(process, timeout=400):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def job(folder, head, run, extra=(), kill_after=0, dump=None):
    """Both processes of a 2-process job, process 1 started first."""
    ports = (free_port(), free_port())
    second = start(folder, head, run, 1, ports, extra, kill_after, dump)
    first = start(folder, head, run, 0, ports, extra, dump=dump)
    return first, second


# What process 0 says: JAX's coordinator names the lost process; TensorFlow's
# error names it when its heartbeat check has seen it (else the failed step).
LOST = "process 1 of 2 was lost; process 0 stops" if BACKEND == "jax" else "; process 0 stops ("


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


@JOB
@pytest.mark.slow(reason="2 processes and 1, two heads: ~2.5 min")
@pytest.mark.parametrize("head", ["crf", "softmax"])
def test_two_processes_train_as_one(corpus, alone, head):
    first, second = job(corpus, head, f"two_{head}", dump=corpus / f"weights_{head}")
    (code0, out0, err0), (code1, out1, err1) = finished(first), finished(second)
    assert code0 == 0 and code1 == 0, err0[-3000:] + err1[-3000:]
    assert_same_run(corpus / f"two_{head}", alone[head])
    # Both processes end with the same weights and optimizer state, to the bit.
    ends = [np.load(corpus / f"weights_{head}-{index}.npz") for index in (0, 1)]
    assert len(ends[0].files) == len(last_checkpoint(alone[head]))
    for name in ends[0].files:
        np.testing.assert_array_equal(ends[0][name], ends[1][name])
    # Process 0 prints and writes; process 1 does neither (gloo's own line aside).
    assert "best dev score" in out0
    assert [line for line in out1.splitlines() if not line.startswith("[Gloo]")] == []
    written = sorted(p.name for p in (corpus / f"two_{head}").iterdir())
    assert written == ["best.keras", "checkpoint", "config.toml", "history.csv", "metrics.json", "report.txt"]


@JOB
@pytest.mark.slow(reason="a killed 2-process job and its resume: ~1.5 min")
def test_a_killed_process_stops_the_job_which_resumes_exactly(corpus, alone):
    first, second = job(corpus, "crf", "killed", kill_after=7)
    code1, _, _ = finished(second)
    killed_at = time.monotonic()
    assert code1 == -9
    code0, _, err0 = finished(first)
    assert time.monotonic() - killed_at < 60
    assert code0 == 1 and LOST in err0, err0[-3000:]
    assert "--resume" in err0 and "Traceback" not in err0
    number = json.loads((corpus / "killed" / "checkpoint" / "latest.json").read_text())["number"]
    state = json.loads((corpus / "killed" / "checkpoint" / f"state-{number}.json").read_text())
    assert (state["epoch"], state["batch"]) == (0, 5)  # the mid-epoch checkpoint before the kill
    first, second = job(corpus, "crf", "killed", extra=["--resume"])
    (code0, _, err0), (code1, _, err1) = finished(first), finished(second)
    assert code0 == 0 and code1 == 0, err0[-3000:] + err1[-3000:]
    assert_same_run(corpus / "killed", alone["crf"])


ON_JAX = BACKEND == "jax"
BAD_JOBS = [
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2"},
     "without KERAS_DISTRIBUTION_JOB_ADDRESSES, KERAS_DISTRIBUTION_PROCESS_ID" if ON_JAX else "needs KERAS_BACKEND=jax"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1", "KERAS_DISTRIBUTION_NUM_PROCESSES": "two",
      "KERAS_DISTRIBUTION_PROCESS_ID": "0"},
     "KERAS_DISTRIBUTION_NUM_PROCESSES must be an integer, received 'two'" if ON_JAX else "needs KERAS_BACKEND=jax"),
    ({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
      "KERAS_DISTRIBUTION_PROCESS_ID": "2"},
     "KERAS_DISTRIBUTION_PROCESS_ID=2 is not a process of KERAS_DISTRIBUTION_NUM_PROCESSES=2" if ON_JAX
     else "needs KERAS_BACKEND=jax"),
    pytest.param({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                           "task": {"type": "worker", "index": 0}})},
                 "TF_CONFIG names 2 workers: TensorFlow's multi-worker strategy needs KERAS_BACKEND=tensorflow",
                 marks=pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow joins the workers")),
    ({"TF_CONFIG": "{cluster"}, "TF_CONFIG is not a JSON object"),
]


@pytest.mark.parametrize("env, message", BAD_JOBS)
def test_job_settings_it_cannot_join_are_refused(monkeypatch, tmp_path, capsys, env, message):
    for name in distributed.JAX_VARIABLES + ("TF_CONFIG",):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(distributed.ClusterError, match=message.replace("(", r"\(")):
        distributed.join()
    # The command: exit 2, one line, no run folder written.
    (tmp_path / "train.conll").write_text(names_conll(20, 1) + "\n", encoding="utf-8")
    (tmp_path / "c.toml").write_text(f'[data]\ntrain = "{tmp_path}/train.conll"\n', encoding="utf-8")
    assert main(["train", str(tmp_path / "c.toml"), "--run", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "run").exists()


def test_rows_of_a_batch_split_evenly_with_empty_rows():
    words = np.arange(1, 16).reshape(5, 3)
    batch = ((words, words[..., None] * 10), words % 4, np.ones((5, 3)))
    shards = [distributed.local_rows(batch, distributed.Processes(i, 2)) for i in range(2)]
    joined = [np.concatenate([keras.tree.flatten(s)[k] for s in shards]) for k in range(4)]
    for got, expected in zip(joined, keras.tree.flatten(batch)):
        np.testing.assert_array_equal(got[:5], expected)
        np.testing.assert_array_equal(got[5:], 0)  # the empty row: padding, tag 0, weight 0
    assert distributed.local_rows(batch, distributed.Processes()) is batch


def test_tensorflow_errors_name_the_unhealthy_tasks(monkeypatch):
    message = ("Collective ops is aborted by: Error reported from /job:worker/task:2: The following tasks are "
               "unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1\n/job:chief/replica:0/task:0\n"
               "The tasks have crashed.")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["c:1"], "worker": ["a:1", "b:1"]}}))
    assert distributed.unhealthy_tasks(message) == [0, 2]  # the chief is process 0, worker 1 process 2
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1", "c:1"]}}))
    assert distributed.unhealthy_tasks(message.replace("/job:chief/replica:0/task:0\n", "")) == [1]
    assert distributed.unhealthy_tasks("Socket closed") == []


def test_a_child_process_environment_joins_no_job():
    job = {"KERAS_DISTRIBUTION_JOB_ADDRESSES": "127.0.0.1:1", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
           "KERAS_DISTRIBUTION_PROCESS_ID": "1", "TF_CONFIG": "{}", "KERAS_BACKEND": "jax", "PATH": "/bin"}
    assert distributed.single_process_environment(job) == {"KERAS_BACKEND": "jax", "PATH": "/bin"}
