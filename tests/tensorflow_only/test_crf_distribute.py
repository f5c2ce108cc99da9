"""A CRF tagger trained under `tf.distribute.MirroredStrategy`.

`kb.tagging.build_tagger(..., head="crf")` compiled with `kb.CRFLoss()`,
`model.fit` for a few SGD steps over two logical CPUs: each replica runs the
tagger and the loss on half of every global batch (the loss reads the CRF's
scores from that replica's own decoded tags), and the optimizer all-reduces
the gradients. The oracle is the same model trained by `model.fit` on one
device on the same global batches, from the same initial weights.

The batches' halves hold equal numbers of valid tokens, and also unequal
ones: `kb.CRFLoss` gives one value per row and Keras averages over rows, so
with as many rows per replica the per-replica averaging equals the global
one whatever the token counts (a per-token loss would differ there).

The logical devices must be configured before TensorFlow initialises, so
the whole run happens in a fresh process.
"""

import numpy as np
import pytest

from helpers import run_python

SCRIPT = r"""
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras
import numpy as np
import keras_birnn as kb

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
GLOBAL_BATCH, STEPS, TIME, LR = 8, 3, 7, 0.2


def make_model():
    keras.utils.set_random_seed(5)
    model = kb.tagging.build_tagger(30, TAGS, embedding_dim=4, hidden=3, head="crf")
    model.compile(keras.optimizers.SGD(LR), loss=kb.CRFLoss())
    return model


def make_data(lengths):
    # One global batch's row lengths, the same in every step; rows 0-3 go to
    # replica 0 and rows 4-7 to replica 1. Padding is id 0: the word mask.
    rng = np.random.default_rng(7)
    lengths = np.tile(np.asarray(lengths), STEPS)
    words = rng.integers(1, 30, (len(lengths), TIME)).astype("int32")
    words[np.arange(TIME)[None] >= lengths[:, None]] = 0
    words[[2, 6], 0] = 0                 # left padding, one row per replica
    words[[9, 13], 1] = 0                # a hole, one row per replica
    labels = np.zeros_like(words)
    for row, column in zip(*np.nonzero(words)):     # gold paths that iob2 allows
        after = labels[row, :column][words[row, :column] > 0][-1:]
        labels[row, column] = rng.choice([0, 1, 2, 3] if after.size and after[0] in (1, 2) else [0, 1, 3])
    return words, labels


def flat(weights):
    return np.concatenate([np.asarray(w).ravel() for w in weights])


def train(model, initial, words, labels):
    model.set_weights(initial)
    history = model.fit(words, labels, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    return flat(model.get_weights()), np.asarray(history.history["loss"])


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    mirrored = make_model()
single = make_model()
initial = single.get_weights()
results = {"replicas": strategy.num_replicas_in_sync, "initial": flat(initial)}
cases = {"equal": [7, 5, 3, 2, 2, 3, 5, 7], "unequal": [7, 7, 6, 7, 1, 2, 1, 3]}
for case, lengths in cases.items():
    words, labels = make_data(lengths)
    for name, model in (("single", single), ("mirrored", mirrored)):
        results[f"{case}_{name}_weights"], results[f"{case}_{name}_loss"] = train(model, initial, words, labels)
np.savez(OUT, **results)
"""


@pytest.mark.slow(reason="a fresh TensorFlow process fitting a CRF tagger on one and two devices, ~25 s")
def test_mirrored_strategy_fit_of_a_crf_tagger_matches_one_device(tmp_path):
    out = tmp_path / "crf_mirrored.npz"
    run_python(f"OUT = {str(out)!r}\n" + SCRIPT, timeout=300)
    got = np.load(out)
    assert int(got["replicas"]) == 2
    for case in ("equal", "unequal"):
        single, mirrored = got[f"{case}_single_weights"], got[f"{case}_mirrored_weights"]
        assert np.max(np.abs(single - got["initial"])) > 1e-2, f"{case}: training did not move the weights"
        np.testing.assert_allclose(mirrored, single, atol=1e-5, rtol=0, err_msg=case)
        np.testing.assert_allclose(got[f"{case}_mirrored_loss"], got[f"{case}_single_loss"], rtol=1e-5,
                                   err_msg=case)
