"""Taggers trained under `tf.distribute.MirroredStrategy`.

`kb.tagging.build_tagger` with a CRF head (`kb.CRFLoss()`) and with a
softmax head (`kb.TokenCrossentropy()`, padding weighed 0), `model.fit` for
a few SGD steps over two logical CPUs: each replica runs the tagger and the
loss on its share of every global batch (the CRF loss reads the scores from
that replica's own decoded tags), and the optimizer all-reduces the
gradients. The oracle is the same model trained by `model.fit` on one
device on the same global batches, from the same initial weights.

The shares hold equal numbers of valid tokens, and unequal ones (about 26
against 7). Both losses divide by the count summed over the replicas
(`keras_birnn.losses.global_mean`), so every case equals one device. Keras's own `"sparse_categorical_crossentropy"`
divides by each replica's own count: the test shows it drifting on the
unequal shares, which is what the oracle must be able to see.

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
STEPS, TIME, LR = 3, 7, 0.2
LOSSES = {"crf": kb.CRFLoss, "softmax": kb.TokenCrossentropy,
          "keras_softmax": lambda: "sparse_categorical_crossentropy"}


def make_model(loss):
    keras.utils.set_random_seed(5)
    model = kb.tagging.build_tagger(30, TAGS, embedding_dim=4, hidden=3, head="crf" if loss == "crf" else "softmax")
    model.compile(keras.optimizers.SGD(LR), loss=LOSSES[loss]())
    return model


def make_data(lengths):
    # One global batch's row lengths, the same in every step; rows 0-3 go to
    # replica 0 and rows 4-7 to replica 1. Padding is id 0: the word mask.
    # (Rows that do not split evenly stop Keras's `fit` under the strategy
    # for any model, a plain Embedding and Dense too: "AddN ... [5,7] !=
    # [4,7]".)
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


def train(model, initial, words, labels, loss):
    model.set_weights(initial)
    weights = None if loss == "crf" else (words != 0).astype("float32")   # the softmax loss skips padding
    history = model.fit(words, labels, sample_weight=weights, batch_size=len(words) // STEPS, epochs=1,
                        shuffle=False, verbose=0)
    return flat(model.get_weights()), np.asarray(history.history["loss"])


strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
results = {"replicas": strategy.num_replicas_in_sync}
cases = {"equal": [7, 5, 3, 2, 2, 3, 5, 7], "unequal": [7, 7, 6, 7, 1, 2, 1, 3]}
for loss in LOSSES:
    with strategy.scope():
        mirrored = make_model(loss)
    single = make_model(loss)
    initial = single.get_weights()
    results[f"{loss}_initial"] = flat(initial)
    for case, lengths in cases.items():
        words, labels = make_data(lengths)
        for name, model in (("single", single), ("mirrored", mirrored)):
            results[f"{loss}_{case}_{name}_weights"], results[f"{loss}_{case}_{name}_loss"] = train(
                model, initial, words, labels, loss)
np.savez(OUT, **results)
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("mirrored") / "taggers.npz"
    run_python(f"OUT = {str(out)!r}\n" + SCRIPT, timeout=400)
    got = np.load(out)
    assert int(got["replicas"]) == 2
    return got


@pytest.mark.slow(reason="a fresh TensorFlow process fitting three taggers on one and two devices, ~40 s")
@pytest.mark.parametrize("loss", ["crf", "softmax"])
@pytest.mark.parametrize("case", ["equal", "unequal"])
def test_mirrored_strategy_fit_of_a_tagger_matches_one_device(trained, loss, case):
    single, mirrored = trained[f"{loss}_{case}_single_weights"], trained[f"{loss}_{case}_mirrored_weights"]
    assert np.max(np.abs(single - trained[f"{loss}_initial"])) > 1e-2, "training did not move the weights"
    np.testing.assert_allclose(mirrored, single, atol=1e-5, rtol=0)
    np.testing.assert_allclose(trained[f"{loss}_{case}_mirrored_loss"], trained[f"{loss}_{case}_single_loss"],
                               rtol=1e-5)


@pytest.mark.slow(reason="shares the fitted taggers' process")
def test_keras_per_replica_mean_drifts_where_token_counts_differ(trained):
    """The oracle sees the flaw `kb.TokenCrossentropy` fixes: Keras's masked
    mean per replica, on shares of about 26 and 7 valid tokens."""
    single = trained["keras_softmax_unequal_single_weights"]
    assert np.max(np.abs(trained["keras_softmax_unequal_mirrored_weights"] - single)) > 1e-3
