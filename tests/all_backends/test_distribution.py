"""`keras.distribution.DataParallel` on JAX gives one device's numbers.

The layers on JAX run the portable engine (a masked `keras.ops.scan`);
under `DataParallel` Keras shards each batch over the device mesh's
`batch` axis and replicates the weights, and XLA's GSPMD partitions the
whole jitted step (the scan, the masked loss, its mean, the gradients).
The oracle is the same model with no distribution (every array on one
device), built from the same seed and trained on the same batches.

- A tagger: `Embedding(mask_zero=True)` -> `kb.Bidirectional(GRUCell,
  return_sequences=True)` -> `kb.Bidirectional(LSTMCell, merge_mode=
  "projection")` -> logits, with a masked per-position
  `SparseCategoricalCrossentropy(from_logits=True)`, right-padded rows of
  varying length (each device's share of a batch holds a different number
  of valid positions: the loss is still normalised over the global batch,
  unlike per-replica reduction under `tf.distribute`, see
  `test_layers_distribute.py`).
- A sentence-level model: `kb.Bidirectional(GRUCell)` (final states) ->
  `Dense`.

`predict` must agree within 1e-5 and the weights after two epochs of `fit`
(SGD, `shuffle=False`, global batch 8 over 4 devices) within 1e-5; `fit`
must have moved the weights. So that the test cannot pass vacuously, it
checks that there were 4 devices, that the data layout is sharded over
`batch` on a mesh of 4, that the weights were replicated on all 4, and,
with `jax.debug.inspect_array_sharding` inside the jitted predict and train
steps, that the embedded batch really was split into 4 shards of 2 rows.

The virtual CPU devices (`--xla_force_host_platform_device_count=4`) must be
set before JAX starts, so the distributed runs are a fresh Python process
with `KERAS_BACKEND=jax` and `JAX_PLATFORMS=cpu`; it runs once, in the
suite's JAX run (`KERAS_BACKEND=jax python -m pytest`), and is skipped in
the TensorFlow and PyTorch runs. It is marked slow (a fresh process and training runs), so the
fast subset (`-m "not slow"`) leaves it out.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO
from backend_harness import BACKEND

DEVICES = 4
ATOL = 1e-5

pytestmark = [
    pytest.mark.skipif(BACKEND != "jax", reason="runs once, in the suite's JAX run (a JAX subprocess)"),
    pytest.mark.slow(reason="a fresh JAX process: two models' predict and fit, on 1 and 4 devices, ~25 s of CPU"),
]

SCRIPT = """
import json

import jax
import keras
import numpy as np

import keras_birnn as kb

assert keras.backend.backend() == "jax", keras.backend.backend()
VOCAB, TAGS, CLASSES, EMBED, T, N, BATCH, EPOCHS = 20, 5, 3, 6, 7, 16, 8, 2

rng = np.random.default_rng(0)
lengths = rng.integers(1, T + 1, size=N)
lengths[0] = T
valid = np.arange(T)[None, :] < lengths[:, None]
tokens = np.where(valid, rng.integers(1, VOCAB, size=(N, T)), 0).astype("int32")
tags = np.where(valid, rng.integers(0, TAGS, size=(N, T)), 0).astype("int32")
classes = rng.integers(0, CLASSES, size=(N,)).astype("int32")

seen = []  # (devices, shard shape) of the embedded batch, per traced step


class Probe(keras.layers.Layer):
    # The identity; records how the array is sharded in the jitted step.
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x):
        shape = tuple(x.shape)
        jax.debug.inspect_array_sharding(
            x, callback=lambda s: seen.append([len(s.device_set), list(s.shard_shape(shape))]))
        return x


def embedded():
    keras.utils.set_random_seed(7)
    x = keras.Input((None,), dtype="int32")
    return x, Probe()(keras.layers.Embedding(VOCAB, EMBED, mask_zero=True)(x))


def tagger():
    x, h = embedded()
    h = kb.Bidirectional(kb.GRUCell(5), return_sequences=True)(h)
    h = kb.Bidirectional(kb.LSTMCell(4), merge_mode="projection", projection_units=6,
                         return_sequences=True)(h)
    return keras.Model(x, keras.layers.Dense(TAGS)(h))


def sentence():
    x, h = embedded()
    h = kb.Bidirectional(kb.GRUCell(5))(h)
    return keras.Model(x, keras.layers.Dense(CLASSES)(h))


def run(make, targets, distribution):
    keras.distribution.set_distribution(distribution)
    try:
        seen.clear()
        model = make()
        model.compile(keras.optimizers.SGD(0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        initial = [np.asarray(w) for w in model.get_weights()]
        predicted = model.predict(tokens, batch_size=BATCH, verbose=0)
        model.fit(tokens, targets, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
        return dict(
            initial=initial,
            predicted=np.asarray(predicted),
            trained=[np.asarray(w) for w in model.get_weights()],
            weight_devices=sorted({len(v.value.sharding.device_set) for v in model.weights}),
            probe=list(seen),
        )
    finally:
        keras.distribution.set_distribution(None)


def max_diff(a, b):
    return float(max(np.max(np.abs(x - y)) for x, y in zip(a, b)))


distribution = keras.distribution.DataParallel(devices=jax.devices())
layout = distribution.get_data_layout((BATCH, T))
report = dict(
    devices=jax.device_count(),
    platform=jax.devices()[0].platform,
    mesh_shape=list(distribution.device_mesh.shape),
    data_axes=list(layout.axes),
    # Valid positions in each device's share (BATCH // devices rows) of each batch.
    valid_per_shard=valid.sum(1).reshape(N // BATCH, jax.device_count(), -1).sum(-1).tolist(),
)
for name, make, targets in (("tagger", tagger, tags), ("sentence", sentence, classes)):
    one, many = run(make, targets, None), run(make, targets, distribution)
    report[name] = dict(
        initial_diff=max_diff(one["initial"], many["initial"]),
        predict_diff=float(np.max(np.abs(one["predicted"] - many["predicted"]))),
        weights_diff=max_diff(one["trained"], many["trained"]),
        weights_moved=max_diff(one["trained"], one["initial"]),
        one_weight_devices=one["weight_devices"],
        many_weight_devices=many["weight_devices"],
        one_probe=one["probe"],
        many_probe=many["probe"],
    )
print("REPORT " + json.dumps(report))
"""


def _run_distributed(timeout: int = 300) -> dict:
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_PLATFORMS="cpu",
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}".strip(),
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads(lines[-1][len("REPORT "):])


@pytest.fixture(scope="module")
def report():
    return _run_distributed()


def test_batch_really_sharded_over_four_devices(report):
    assert report["platform"] == "cpu" and report["devices"] == DEVICES
    assert report["mesh_shape"] == [DEVICES]
    assert report["data_axes"] == ["batch", None]
    # The devices' shares hold different numbers of valid positions, so a
    # per-device loss normalisation would show (see the module's doc).
    assert any(len(set(shares)) > 1 for shares in report["valid_per_shard"])
    for name in ("tagger", "sentence"):
        run = report[name]
        assert run["many_weight_devices"] == [DEVICES], run["many_weight_devices"]
        assert run["one_weight_devices"] == [1], run["one_weight_devices"]
        # One traced predict step and one traced train step, each with the
        # embedded global batch of 8 split into 4 shards of 2 rows.
        assert len(run["many_probe"]) >= 2, run["many_probe"]
        for devices, shard in run["many_probe"]:
            assert devices == DEVICES and shard[0] == 8 // DEVICES, run["many_probe"]
        for devices, shard in run["one_probe"]:
            assert devices == 1 and shard[0] == 8, run["one_probe"]


def test_predict_and_fit_match_one_device(report):
    # Both models in one test: the subprocess runs once, and a parametrized
    # second case would be marked slow (conftest) for no saving.
    for name in ("tagger", "sentence"):
        run = report[name]
        assert run["initial_diff"] == 0.0, (name, run["initial_diff"])
        assert run["predict_diff"] <= ATOL, (name, run["predict_diff"])
        # Training must have moved the weights well beyond the tolerance.
        assert run["weights_moved"] > 1e-2, (name, run["weights_moved"])
        assert run["weights_diff"] <= ATOL, (name, run["weights_diff"])
