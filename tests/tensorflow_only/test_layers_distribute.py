"""Distributed training: our layers under `tf.distribute` strategies.

The oracle is single-device `model.fit` on the same global batches (same
initial weights, SGD, MSE, no shuffling): data-parallel training must end
with the same weights, to float32 round-off.

- `MirroredStrategy` over two logical CPU devices, with `model.fit`. The
  devices must be configured before TensorFlow initialises, so the test runs
  in a fresh process.
- `MultiWorkerMirroredStrategy` with two worker processes on loopback ports.
  Keras 3 (checked with 3.15) cannot run `model.fit` under this strategy for
  any model (keras-team/keras#20585, tensorflow/tensorflow#72388): fit's
  symbolic build reduces the nested data batch with `strategy.reduce`
  (keras/src/backend/tensorflow/trainer.py, `_maybe_symbolic_build`), which
  `CollectiveAllReduceStrategy` cannot do for a nest, and its logs are
  averaged over axis 0 of scalars (`reduce_per_replica`). The workers
  therefore drive Keras's own `model.train_step` (the compiled loss, its
  per-replica scaling and the optimizer's cross-replica all-reduce: what
  `fit` runs per step) with `strategy.run`.

Masks: the model reads padded rows (right padding, left padding, a hole),
and its output is sentence-level, so the loss carries no Keras mask. (With a
masked per-position loss, Keras normalises each replica's loss by that
replica's valid positions, so data-parallel and single-device training agree
only when every replica holds as many valid positions; that is Keras's loss
reduction, not a property of the layers.)
"""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import REPO, run_python

# The model, the data and the single-device oracle, shared by both tests
# (pasted into the fresh processes as source).
COMMON = """
import numpy as np
import keras
import keras_birnn as kb

GLOBAL_BATCH, STEPS, LR = 8, 3, 0.2


def make_model():
    keras.utils.set_random_seed(11)
    inputs = keras.Input((None, 3))
    h = keras.layers.Masking(0.0)(inputs)
    h = kb.Bidirectional(kb.LSTMCell(4), merge_mode="projection", projection_units=2,
                         initial_state="learned")(h)
    model = keras.Model(inputs, h)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    return model


def make_data():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 6, 3)).astype("float32")
    x[1, 4:] = 0.0          # right padding
    x[5, :2] = 0.0          # left padding
    x[10, 2:4] = 0.0        # a hole
    x[13, 1:] = 0.0         # one valid step
    y = rng.normal(size=(GLOBAL_BATCH * STEPS, 2)).astype("float32")
    return x, y


def single_device(initial_weights, x, y):
    model = make_model()
    model.set_weights(initial_weights)
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


def flat(weights):
    return np.concatenate([np.asarray(w).ravel() for w in weights])
"""


@pytest.fixture(scope="module")
def oracle():
    """Single-device `model.fit` on the same global batches (this process)."""
    namespace = {}
    exec(COMMON, namespace)
    model = namespace["make_model"]()
    initial = model.get_weights()
    x, y = namespace["make_data"]()
    weights, losses = namespace["single_device"](initial, x, y)
    flat = namespace["flat"]
    return {"initial": flat(initial), "weights": flat(weights), "loss": np.asarray(losses)}


MIRRORED = """
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
""" + COMMON + """
x, y = make_data()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    model = make_model()
initial = model.get_weights()
history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
np.savez(OUT, replicas=strategy.num_replicas_in_sync, initial=flat(initial),
         weights=flat(model.get_weights()), loss=history.history["loss"])
"""


@pytest.mark.slow(reason="a MirroredStrategy fit and its oracle, ~16 s")
def test_mirrored_strategy_fit_matches_single_device(tmp_path, oracle):
    """Two replicas on two logical CPUs, `model.fit` for STEPS steps of SGD:
    each replica runs the XLA-compiled loop and the BPTT on half of every
    global batch; the weights and the logged loss match one device's."""
    out = tmp_path / "mirrored.npz"
    run_python(f"OUT = {str(out)!r}\n" + MIRRORED, timeout=240)
    got = np.load(out)
    assert int(got["replicas"]) == 2
    np.testing.assert_array_equal(got["initial"], oracle["initial"])
    assert np.max(np.abs(oracle["weights"] - oracle["initial"])) > 1e-2, "training did not move the weights"
    np.testing.assert_allclose(got["weights"], oracle["weights"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got["loss"], oracle["loss"], atol=1e-5, rtol=1e-5)


WORKER = """
import json, os, sys
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy(
    communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=60))
""" + COMMON + """
x, y = make_data()
with strategy.scope():
    model = make_model()
initial = model.get_weights()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
batches = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))


@tf.function
def train_step(batch):
    logs = strategy.run(model.train_step, args=(batch,))
    return strategy.reduce("MEAN", logs["loss"], axis=None)


for _ in range(STEPS):
    loss = train_step(next(batches))  # Keras's running mean over the epoch, as fit logs it
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
mine, everyone = sys.argv[1], sys.argv[2:]
np.savez(mine + ".partial.npz", replicas=strategy.num_replicas_in_sync, task=task, loss=[float(loss)],
         initial=flat(initial), weights=flat(model.get_weights()))
os.replace(mine + ".partial.npz", mine)
# Wait until every worker has written its results, i.e. is past its last
# collective: a worker that exited first closed its gRPC server while its
# peer was still receiving the last step's data ("Socket closed", seen once).
import time
deadline = time.monotonic() + 60
while not all(os.path.exists(path) for path in everyone) and time.monotonic() < deadline:
    time.sleep(0.05)
# Skip the interpreter's teardown: shutting the collective runtime and its
# gRPC server down took 15-25 s per worker.
sys.stdout.flush()
os._exit(0)
"""


def _free_loopback_ports(count):
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _start_workers(tmp_path):
    """Starts both workers on free loopback ports; returns (processes, log paths, result paths)."""
    ports = _free_loopback_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    env_base = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow",
                    PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    procs, logs = [], []
    results = [tmp_path / f"worker{index}.npz" for index in range(2)]
    for path in results:  # a retry must not see the first try's files
        path.unlink(missing_ok=True)
    for index in range(2):
        env = dict(env_base, TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        logs.append(tmp_path / f"worker{index}.log")
        with open(logs[-1], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", WORKER, str(results[index])] + [str(path) for path in results],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            ))
    return procs, logs, results


def _wait(procs, deadline_s):
    """Waits for both workers. Stops early if one fails (its peer would only
    wait for it until the collective timeout); kills whatever still runs,
    only these processes, by their handles. Returns the exit codes."""
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            codes = [proc.poll() for proc in procs]
            if all(code is not None for code in codes) or any(code not in (None, 0) for code in codes):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [proc.returncode for proc in procs]


@pytest.mark.slow
def test_multi_worker_mirrored_strategy_two_local_workers(tmp_path, oracle):
    """Two worker processes, one replica each, talking over loopback gRPC."""
    for attempt in range(2):  # a second try only if a picked port was taken meanwhile
        started = time.monotonic()
        procs, logs, paths = _start_workers(tmp_path)
        returncodes = _wait(procs, deadline_s=150)
        if returncodes == [0, 0]:
            break
        outputs = [log.read_text() for log in logs]
        port_clash = any("Address already in use" in out or "Could not start gRPC server" in out
                         for out in outputs)
        if not port_clash or attempt == 1:
            pytest.fail(
                f"workers exited with {returncodes} after {time.monotonic() - started:.0f} s:\n"
                + "\n---\n".join(out[-3000:] for out in outputs)
            )
    workers = [np.load(path) for path in paths]
    assert [int(w["task"]) for w in workers] == [0, 1]
    assert all(int(w["replicas"]) == 2 for w in workers)
    # Both workers end with the same weights: the all-reduce hands both the same sums.
    np.testing.assert_array_equal(workers[0]["weights"], workers[1]["weights"])
    np.testing.assert_array_equal(workers[0]["loss"], workers[1]["loss"])
    # ... and they are single-process training's on the same global batches.
    np.testing.assert_array_equal(workers[0]["initial"], oracle["initial"])
    np.testing.assert_allclose(workers[0]["weights"], oracle["weights"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(workers[0]["loss"], oracle["loss"], atol=1e-5, rtol=1e-5)
