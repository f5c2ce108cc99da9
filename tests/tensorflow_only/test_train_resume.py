"""`keras-birnn train --resume` after SIGKILL: the resumed run equals one
that never stopped (every variable bit for bit, the dev score, the history).

Each killed run is a subprocess whose trainer is patched (by the wrapper
below, not in the library) to kill itself with SIGKILL at one point: in
the middle of an epoch (after a batch, with a mid-epoch checkpoint behind
it), at an epoch end (dev scored, the epoch's checkpoint not yet written),
and inside a checkpoint write (half the temporary file written, nothing
renamed). Then `train --resume` runs in a fresh process.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from helpers import names_conll

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL")

# Kills this process at the chosen point: "batch N" (after the Nth batch of
# the run), "epoch N" (at the Nth epoch end, before its checkpoint), "write N"
# (in the Nth atomic write, the temporary file half written).
WRAPPER = """
import os, signal, sys
from keras_birnn.cli.main import main
from keras_birnn.training import checkpoint, trainer

point, n = sys.argv[1], int(sys.argv[2])
count = [0]

def due():
    count[0] += 1
    return count[0] == n

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "batch":
    after = trainer.Loop.on_train_batch_end
    def on_train_batch_end(self, batch, logs=None):
        after(self, batch, logs)
        if due():
            die()
    trainer.Loop.on_train_batch_end = on_train_batch_end
elif point == "epoch":
    end = trainer.Run.end_epoch
    def end_epoch(self, *args):
        if due():
            die()
        end(self, *args)
    trainer.Run.end_epoch = end_epoch
else:
    def atomic_write(path, data):
        if due():
            with open(f"{path}.tmp-{os.getpid()}", "wb") as handle:
                handle.write(data[: len(data) // 2])
                handle.flush()
            die()
        write(path, data)
    write = checkpoint.atomic_write
    checkpoint.atomic_write = atomic_write
sys.exit(main(sys.argv[3:]))
"""

CONFIG = """
seed = 3
[data]
train = "train.conll"
dev = "dev.conll"
[model]
hidden = 8
word_dim = 8
char_dim = 4
char_units = 4
dropout = 0.3
[train]
epochs = 3
batch_size = 8
patience = 0
checkpoint_steps = 4
learning_rate = 0.01
[export]
enabled = false
"""


def write_corpus(folder: pathlib.Path) -> None:
    """A small IOB2 corpus (the word decides the tag) and the run's config."""
    (folder / "train.conll").write_text(names_conll(60, 0), encoding="utf-8")
    (folder / "dev.conll").write_text(names_conll(20, 1), encoding="utf-8")
    (folder / "run.toml").write_text(CONFIG, encoding="utf-8")


def train(folder: pathlib.Path, run: str, *extra: str, kill=None) -> subprocess.CompletedProcess:
    """`keras-birnn train run.toml --run RUN extra` in a subprocess, through the
    kill wrapper when `kill` is `(point, n)`."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    argv = ["train", "run.toml", "--run", run, *extra]
    code = ["-c", WRAPPER, *map(str, kill), *argv] if kill else ["-m", "keras_birnn.cli", *argv]
    return subprocess.run([sys.executable, *code], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)


def final_state(run: pathlib.Path):
    """The last checkpoint's variables and the run's metrics and history."""
    pointer = json.loads((run / "checkpoint" / "latest.json").read_text())
    with np.load(run / "checkpoint" / f"state-{pointer['number']}.npz") as stored:
        values = [stored[k] for k in sorted(stored.files, key=lambda k: int(k.split("_")[1]))]
    metrics = json.loads((run / "metrics.json").read_text())
    return values, metrics, (run / "history.csv").read_text()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    write_corpus(folder)
    done = train(folder, "whole")
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, final_state(folder / "whole")


@pytest.mark.parametrize("point", [("batch", 11), ("epoch", 2), ("write", 5)], ids=["mid-epoch", "epoch-end",
                                                                                      "checkpoint-write"])
def test_a_killed_run_resumes_to_the_same_weights_and_dev_score(uninterrupted, point):
    folder, (weights, metrics, history) = uninterrupted
    run = f"killed_{point[0]}"
    killed = train(folder, run, kill=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (folder / run / "metrics.json").exists()  # it did stop before the end
    resumed = train(folder, run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got_weights, got_metrics, got_history = final_state(folder / run)
    assert len(got_weights) == len(weights)
    for got, want in zip(got_weights, weights):
        np.testing.assert_array_equal(got, want)
    assert got_metrics["dev"] == metrics["dev"]
    assert got_metrics["best_epoch"] == metrics["best_epoch"]
    drop_seconds = lambda text: [line.split(",")[:-2] for line in text.splitlines()]  # noqa: E731
    assert drop_seconds(got_history)[0] == drop_seconds(history)[0]
    np.testing.assert_allclose(np.array(drop_seconds(got_history)[1:], float),
                               np.array(drop_seconds(history)[1:], float), rtol=1e-6)
    assert not [p for p in (folder / run / "checkpoint").iterdir() if ".tmp-" in p.name]
