"""`kb.TokenCrossentropy` against NumPy: the masked mean of per-position
cross-entropies, weighed by `sample_weight` or the prediction's mask, from
probabilities or logits, eager and traced, on every backend; its config
round trip. (Its mean over the replicas of a strategy:
tests/tensorflow_only/test_tagger_distribute.py.)"""

import keras
import numpy as np
import pytest

import keras_birnn as kb
from backend_harness import BACKEND, to_numpy

RNG = np.random.default_rng(3)
LOGITS = RNG.normal(size=(3, 5, 4)).astype("float32")
TAGS = RNG.integers(0, 4, (3, 5)).astype("int32")
WEIGHTS = (np.arange(5)[None] < np.array([[5], [2], [0]])).astype("float32")  # lengths 5, 2 and 0
WEIGHTS[0, 1] = 0.5  # a weight other than 0 and 1


def oracle(logits, tags, weights):
    """sum(w * -log p(tag)) / sum(w), in float64."""
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, tags[..., None], -1)[..., 0]
    return float((-picked * weights).sum() / weights.sum())


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype("float32")


def jitted(fn, tags_rank: int):
    """The loss traced as the backend traces a train step (TensorFlow: batch
    and time unknown)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        spec = [tf.TensorSpec([None] * 2 + [1] * (tags_rank - 2), "int32"), tf.TensorSpec([None, None, 4]),
                tf.TensorSpec([None, None])]
        return tf.function(fn, input_signature=spec)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    return fn


@pytest.mark.parametrize("from_logits", [False, True])
def test_token_crossentropy_is_the_weighted_mean_over_valid_positions(from_logits):
    loss = kb.TokenCrossentropy(from_logits=from_logits)
    predictions = LOGITS if from_logits else softmax(LOGITS)
    expected = oracle(LOGITS.astype("float64"), TAGS, WEIGHTS)
    for tags in (TAGS, TAGS[..., None]):  # also with a trailing axis of 1, as Keras's sparse losses take them
        for call in (loss, jitted(loss, tags.ndim)):
            np.testing.assert_allclose(to_numpy(call(tags, predictions, WEIGHTS)), expected, rtol=1e-5)
    # Without weights every position counts: the plain mean.
    np.testing.assert_allclose(to_numpy(loss(TAGS, predictions)), oracle(LOGITS.astype("float64"), TAGS,
                                                                          np.ones_like(WEIGHTS)), rtol=1e-5)


def test_token_crossentropy_reads_the_prediction_mask():
    """A masked softmax output's Keras mask weighs the positions."""
    words = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 4, mask_zero=True)(words)
    model = keras.Model(words, keras.layers.Dense(3, activation="softmax")(x))
    ids = np.array([[1, 2, 3, 0], [4, 0, 0, 0]], "int32")
    tags = np.array([[0, 1, 2, 0], [2, 0, 0, 0]], "int32")
    if BACKEND == "tensorflow":  # the eager output carries its mask on TensorFlow
        probabilities = model(ids)
        got = to_numpy(kb.TokenCrossentropy()(tags, probabilities))
        p = to_numpy(probabilities)
        picked = -np.log(np.take_along_axis(p, tags[..., None], -1)[..., 0])
        np.testing.assert_allclose(got, picked[ids != 0].mean(), rtol=1e-5)
    # Compiled in a model, with the mask as weights: every backend.
    model.compile(keras.optimizers.SGD(0.0), loss=kb.TokenCrossentropy())
    evaluated = model.evaluate(ids, tags, sample_weight=(ids != 0).astype("float32"), verbose=0)
    p = to_numpy(model(ids))
    picked = -np.log(np.take_along_axis(p, tags[..., None], -1)[..., 0])
    np.testing.assert_allclose(evaluated, picked[ids != 0].mean(), rtol=1e-5)


def test_token_crossentropy_config_round_trip():
    loss = kb.TokenCrossentropy(from_logits=True, name="tags")
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(again, kb.TokenCrossentropy) and again.from_logits and again.name == "tags"
    np.testing.assert_allclose(to_numpy(again(TAGS, LOGITS, WEIGHTS)), to_numpy(loss(TAGS, LOGITS, WEIGHTS)))
