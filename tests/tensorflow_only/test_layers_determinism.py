"""Determinism and resumable training (issue 7).

Everything runs in fresh processes (`tf.config.experimental.
enable_op_determinism()` is process-global), started together by one
module fixture; the tests compare what they saved, bitwise. The oracle is
always a clean run: the same script, uninterrupted.

What these tests establish (README.md, "Reproducible and resumable
training"):

- Seeded runs are bitwise identical, within a process and across processes,
  dropout and shuffling included. Keras's `jit_compile="auto"` turns XLA off
  for the train step under op determinism; keras_birnn's loop stays
  XLA-compiled and is deterministic.
- `keras.callbacks.BackupAndRestore(save_freq="epoch")` resumes a run
  interrupted mid-epoch exactly (weights and optimizer state, SGD and
  Adam). With `save_freq=<batches>` Keras 3 saves mid-epoch but restores
  only the epoch counter, so the interrupted epoch restarts from its first
  batch on top of the mid-epoch weights.
- Keras writes the checkpoint in place and in two files: a SIGKILL while the
  weights file is written leaves it truncated (resuming then fails, unless
  `double_checkpoint=True`, which falls back to the previous checkpoint and
  resumes exactly); a SIGKILL between the weights and the metadata leaves
  new weights with the old epoch counter, and the resumed run silently
  trains that epoch twice. keras_birnn owns no checkpoint writer to guard.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from helpers import REPO

pytestmark = pytest.mark.slow

CHILD = r'''
import json, os, shutil, signal, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
started = time.time()
import h5py, numpy as np, tensorflow as tf, keras
import keras_birnn as kb
from keras_birnn import recurrence

role, out = sys.argv[1], sys.argv[2]
tf.config.experimental.enable_op_determinism()
F, T, N, BATCH, EPOCHS = 3, 6, 32, 8, 2  # 4 batches per epoch
data = np.random.default_rng(0)
X = data.normal(size=(N, T, F)).astype("float32")
Y = data.normal(size=(N, 1)).astype("float32")


def model(seed=1, dropout=0.0, optimizer="adam"):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None, F))
    h = kb.Bidirectional(kb.GRUCell(8, dropout=dropout, recurrent_dropout=dropout))(inputs)
    m = keras.Model(inputs, keras.layers.Dense(1)(h))
    opt = keras.optimizers.Adam(0.01) if optimizer == "adam" else keras.optimizers.SGD(0.05)
    m.compile(optimizer=opt, loss="mse")
    return m


def fit(m, epochs=EPOCHS, callbacks=(), shuffle=True, x=X, y=Y):
    m.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=shuffle, verbose=0, callbacks=list(callbacks))


def state(m):
    """Weights, then the optimizer's variables (iterations, Adam's moments)."""
    if not m.optimizer.built:
        m.optimizer.build(m.trainable_variables)
    return [np.asarray(v) for v in m.weights] + [np.asarray(v) for v in m.optimizer.variables]


def save(name, arrays):
    np.savez(os.path.join(out, name + ".npz"), *arrays)


class Interrupt(keras.callbacks.Callback):
    """Raises after batch `batch` of epoch `epoch` (a crash mid-epoch)."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise RuntimeError("interrupted")


class Snapshots(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        save(f"clean_epoch{epoch}", state(self.model))


def interrupted(optimizer, backup, save_freq, shuffle, dropout=0.0):
    m = model(optimizer=optimizer, dropout=dropout)
    try:
        fit(m, callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=save_freq), Interrupt(1, 2)],
            shuffle=shuffle)
    except RuntimeError:
        return state(m)
    raise AssertionError("the run was not interrupted")


def resumed(optimizer, backup, shuffle, dropout=0.0, **backup_kwargs):
    m = model(optimizer=optimizer, dropout=dropout)  # the restarted script: same seed, fresh model
    fit(m, callbacks=[keras.callbacks.BackupAndRestore(backup, **backup_kwargs)], shuffle=shuffle)
    return state(m)


report = {}
if role == "determinism":
    # Each run's loops start plain and run XLA-compiled from a shape's third
    # call on (kb.compilation): both paths, switched at the same step.
    with kb.compilation(compile_after=3):
        for name, seed in (("run1", 1), ("run2", 1), ("other_seed", 2)):
            m = model(seed=seed, dropout=0.2)
            if name == "run1":
                save("initial", state(m))
            fit(m, shuffle=True)
            save(name, state(m))
    shapes = m.layers[1].loop_report()["shapes"]
    report = {"keras_jit_compile": m.jit_compile, "loop_xla": kb.loop_config().xla,
              "compiled_loops": sum(s["compiled"] for s in shapes)}

elif role == "resume":
    for optimizer in ("sgd", "adam"):
        m = model(optimizer=optimizer)
        fit(m)
        save(f"clean_{optimizer}", state(m))
        backup = os.path.join(out, f"backup_{optimizer}")
        save(f"interrupted_{optimizer}", interrupted(optimizer, backup, "epoch", shuffle=True))
        save(f"resumed_{optimizer}", resumed(optimizer, backup, shuffle=True))
    # With dropout (the determinism child's run1 is the clean run).
    backup = os.path.join(out, "backup_dropout")
    interrupted("adam", backup, "epoch", shuffle=True, dropout=0.2)
    with h5py.File(os.path.join(backup, "latest.weights.h5"), "r") as f:
        stored = []
        f.visititems(lambda name, item: stored.append(name) if isinstance(item, h5py.Dataset) else None)
    m = model(dropout=0.2)
    report["checkpoint_arrays"] = len(stored)
    report["state_arrays"] = len(state(m))
    report["seed_generator_states"] = sum("seed_generator" in v.path for v in m.variables)
    save("resumed_dropout", resumed("adam", backup, shuffle=True, dropout=0.2))
    # Checkpoints every 2 batches; interrupted after batch 2 of epoch 1, so the
    # last checkpoint holds epoch 0 and batches 0-1 of epoch 1.
    backup = os.path.join(out, "backup_mid")
    interrupted("adam", backup, 2, shuffle=False)
    with open(os.path.join(backup, "training_metadata.json")) as f:
        report["mid_epoch_metadata"] = json.load(f)
    save("resumed_mid", resumed("adam", backup, shuffle=False, save_freq=2))
    m = model()  # what Keras does: epoch 0, batches 0-1 of epoch 1, then epoch 1 in full
    fit(m, epochs=1, shuffle=False)
    fit(m, epochs=1, shuffle=False, x=X[:2 * BATCH], y=Y[:2 * BATCH])
    fit(m, epochs=EPOCHS - 1, shuffle=False)
    save("mid_epoch_replayed", state(m))

elif role == "kill":
    # Trains with epoch checkpoints and SIGKILLs itself during the second
    # save (end of epoch 1): in the middle of the weights file, or after it
    # and before the metadata file.
    backup, moment, double = sys.argv[3], sys.argv[4], sys.argv[5] == "1"
    from keras.src.saving import saving_lib
    from keras.src.utils import file_utils
    saves, made = [0], [0]
    save_weights_only, make, file = saving_lib.save_weights_only, saving_lib.H5IOStore.make, file_utils.File

    def counting_save(*args, **kwargs):
        saves[0] += 1
        made[0] = 0
        return save_weights_only(*args, **kwargs)

    def killing_make(self, *args, **kwargs):
        made[0] += 1
        if moment == "weights" and saves[0] == 2 and made[0] > 3:
            os.kill(os.getpid(), signal.SIGKILL)  # some variables written, the file still open
        return make(self, *args, **kwargs)

    def killing_file(path, mode="r", *args, **kwargs):
        if moment == "metadata" and saves[0] == 2 and str(path).endswith("training_metadata.json") and "w" in mode:
            os.kill(os.getpid(), signal.SIGKILL)  # new weights written, metadata not yet
        return file(path, mode, *args, **kwargs)

    saving_lib.save_weights_only, saving_lib.H5IOStore.make, file_utils.File = counting_save, killing_make, killing_file
    m = model()
    fit(m, callbacks=[keras.callbacks.BackupAndRestore(backup, double_checkpoint=double)], shuffle=False)
    raise AssertionError("not killed")

elif role == "after_kill":
    with kb.compilation(compile_after=3):  # the determinism child's first run, in another process
        m = model(dropout=0.2)
        fit(m, shuffle=True)
    save("run1_elsewhere", state(m))
    m = model()
    fit(m, callbacks=[Snapshots()], shuffle=False)
    save("clean", state(m))
    m = model()
    fit(m, epochs=EPOCHS + 1, shuffle=False)
    save("clean_one_more_epoch", state(m))
    # The previous checkpoint that double_checkpoint=True keeps, as a model state.
    previous = model()
    shutil.copy(os.path.join(out, "killed_in_weights_double", "latest.weights.h5.bkp"),
                os.path.join(out, "previous.weights.h5"))
    previous.optimizer.build(previous.trainable_variables)
    previous.load_weights(os.path.join(out, "previous.weights.h5"))
    save("previous_checkpoint", state(previous))
    for name in sys.argv[3:]:
        backup = os.path.join(out, name)
        try:
            save(f"resumed_{name}", resumed("adam", backup, shuffle=False, double_checkpoint=name.endswith("_double")))
        except Exception as e:
            report[name] = f"{type(e).__name__}: {e}"

report["seconds"] = round(time.time() - started, 1)
with open(os.path.join(out, role + ".json"), "w") as f:
    json.dump(report, f)
'''

KILLS = {  # backup dir name -> (moment of the SIGKILL, double_checkpoint)
    "killed_in_weights": ("weights", False),
    "killed_in_weights_double": ("weights", True),
    "killed_before_metadata": ("metadata", False),
}


def _start(role, out, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    return subprocess.Popen([sys.executable, "-c", CHILD, role, str(out), *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process, expected_rc=0, timeout=600):
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == expected_rc, stderr[-4000:]
    return stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs the children (in parallel where independent); returns a
    loader of their saved states and their reports."""
    out = tmp_path_factory.mktemp("determinism")
    first = {role: _start(role, out) for role in ("determinism", "resume")}
    kills = {name: _start("kill", out, out / name, moment, int(double))
             for name, (moment, double) in KILLS.items()}
    for name, process in kills.items():
        _finish(process, expected_rc=-signal.SIGKILL)
        shutil.copytree(out / name, out / "as_left" / name)  # resuming deletes the backup dir
    after = _start("after_kill", out, *KILLS)
    for process in list(first.values()) + [after]:
        _finish(process)

    class Runs:
        path = out

        @staticmethod
        def state(name):
            with np.load(out / f"{name}.npz") as saved:
                return [saved[f"arr_{i}"] for i in range(len(saved.files))]

        @staticmethod
        def report(role):
            return json.loads((out / f"{role}.json").read_text())

    return Runs


def assert_identical(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_array_equal(a, e)


def differs(a, b):
    return len(a) != len(b) or any(not np.array_equal(x, y) for x, y in zip(a, b))


def test_seeded_runs_are_bitwise_identical(runs):
    """set_random_seed + enable_op_determinism: two runs in one process and a
    run in another process give the same weights and optimizer state, bit
    for bit (dropout, recurrent dropout and shuffling on). Another seed
    gives other weights, and training moved them."""
    run1, run2 = runs.state("run1"), runs.state("run2")
    assert_identical(run2, run1)
    assert_identical(runs.state("run1_elsewhere"), run1)
    assert differs(runs.state("other_seed"), run1)
    assert differs(runs.state("initial")[:4], run1[:4])
    report = runs.report("determinism")
    # Keras turned XLA off for its train step; our loop still ran compiled
    # (from the third call at a shape on).
    assert (report["keras_jit_compile"], report["loop_xla"]) == (False, True)
    assert report["compiled_loops"] >= 1


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_after_an_interruption_mid_epoch(runs, optimizer):
    """Interrupted after batch 2 of epoch 1 and resumed from the epoch-end
    checkpoint by a restarted script: the same weights and optimizer state
    (SGD's iteration count; Adam's, and its moments) as the clean run."""
    clean = runs.state(f"clean_{optimizer}")
    assert differs(runs.state(f"interrupted_{optimizer}"), clean)
    assert_identical(runs.state(f"resumed_{optimizer}"), clean)


def test_dropout_stream_is_not_in_the_checkpoint(runs):
    """The checkpoint holds the weights and the optimizer's variables, not
    the cells' SeedGenerator states (no Keras layer's is saved), so a
    resumed run with dropout draws other masks than the clean run (the
    determinism child's first run) and ends elsewhere."""
    report = runs.report("resume")
    assert report["seed_generator_states"] == 2  # one per direction's cell
    assert report["checkpoint_arrays"] == report["state_arrays"]
    assert differs(runs.state("resumed_dropout"), runs.state("run1"))


def test_mid_epoch_checkpoints_restart_the_epoch(runs):
    """save_freq=2: Keras 3 writes the batch into the metadata but restores
    only the epoch, so the resumed run replays the interrupted epoch from its
    first batch on top of the mid-epoch weights: exactly the replayed
    schedule, not the clean run."""
    assert runs.report("resume")["mid_epoch_metadata"] == {"epoch": 1, "batch": 1}
    resumed = runs.state("resumed_mid")
    assert_identical(resumed, runs.state("mid_epoch_replayed"))
    assert differs(resumed, runs.state("clean"))


def test_sigkill_while_the_weights_file_is_written(runs):
    """The weights file is rewritten in place: a SIGKILL in the middle
    leaves it truncated, and resuming fails. With double_checkpoint=True the
    previous checkpoint (the clean run's state after epoch 0) is still there,
    the resumed run falls back to it and ends exactly as the clean run."""
    for name in ("killed_in_weights", "killed_in_weights_double"):
        left = runs.path / "as_left" / name
        with pytest.raises(OSError):
            h5py.File(left / "latest.weights.h5", "r").close()
        metadata = json.loads((left / "training_metadata.json").read_text())
        assert metadata == {"epoch": 1, "batch": 0}  # from the first, complete save
    report = runs.report("after_kill")
    assert report["killed_in_weights"].startswith("OSError")
    assert "killed_in_weights_double" not in report
    assert_identical(runs.state("previous_checkpoint"), runs.state("clean_epoch0"))
    assert_identical(runs.state("resumed_killed_in_weights_double"), runs.state("clean"))


def test_sigkill_between_the_weights_and_the_metadata(runs):
    """Weights and epoch counter are two writes: killed between them (at the
    end of epoch 1, the last), the checkpoint holds the weights after epoch
    1 and the counter after epoch 0, and the resumed run silently trains
    epoch 1 twice: it ends exactly as a clean run of one more epoch, not as
    the clean run."""
    left = runs.path / "as_left" / "killed_before_metadata"
    metadata = json.loads((left / "training_metadata.json").read_text())
    assert metadata == {"epoch": 1, "batch": 0}
    resumed = runs.state("resumed_killed_before_metadata")
    assert_identical(resumed, runs.state("clean_one_more_epoch"))
    assert differs(resumed, runs.state("clean"))
