"""keras_birnn/tagging/metrics.py: `SpanF1` against `span_scores` (itself
tested against seqeval) on 100 random corpora per scheme, ill-formed tags
included, fed batch by batch with padding, eagerly and traced (`tf.function`
with unknown batch and time, `jax.jit`, PyTorch eagerly); inside `fit` and
`evaluate` of small taggers (kb.CRF, masked softmax), whose padding must not
count, against `span_scores` of `model.predict`; its config. Every backend."""

import random

import keras
import numpy as np
import pytest

import keras_birnn as kb
from keras_birnn.tagging.metrics import SpanF1
from keras_birnn.tagging.spans import span_scores
from backend_harness import BACKEND
from all_backends.test_tagging_spans import PREFIXES, TYPES, random_corpus

SCHEMES = ["iob2", "iob1", "bioes"]


def scheme_tags(scheme):
    return ["O"] + [f"{p}-{t}" for p in PREFIXES[scheme] for t in TYPES]


def padded_batches(gold, predicted, tags, rng: random.Random, probabilities: bool):
    """(y_true, y_pred, sample_weight) batches of 1 to 7 sentences, padded on
    the right to the batch's longest plus 0 to 2: half the batches pad
    y_true with -1, half with tag 0 and a 0/1 sample_weight; y_pred holds
    random tags at the padding (ids, or scores whose argmax they are)."""
    i = 0
    while i < len(gold):
        part = range(i, min(len(gold), i + rng.randint(1, 7)))
        width = max(len(gold[j]) for j in part) + rng.randint(0, 2)
        y_true = np.full((len(part), width), -1, "int32")
        y_pred = np.array([[rng.randrange(len(tags)) for _ in range(width)] for _ in part], "int32")
        weight = np.zeros((len(part), width), "float32")
        for row, j in enumerate(part):
            y_true[row, : len(gold[j])] = [tags.index(t) for t in gold[j]]
            y_pred[row, : len(gold[j])] = [tags.index(t) for t in predicted[j]]
            weight[row, : len(gold[j])] = 1.0
        use_weight = rng.random() < 0.5
        if use_weight:
            y_true[weight == 0] = 0
        if probabilities:
            scores = np.random.default_rng(i).random((len(part), width, len(tags)), dtype=np.float32)
            np.put_along_axis(scores, y_pred[..., None], 2.0, axis=-1)
            y_pred = scores
        yield y_true, y_pred, weight if use_weight else None
        i = part.stop


_TRACED = {}


def traced_update(metric, y_true, y_pred, sample_weight):
    """`metric.update_state` traced: a `tf.function` with unknown batch and
    time (TensorFlow), `jax.jit` of the stateless update (JAX), eagerly
    (PyTorch)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        spec = [tf.TensorSpec([None] * a.ndim, tf.as_dtype(a.dtype)) for a in (y_true, y_pred)]
        weight = np.ones(y_true.shape, "float32") if sample_weight is None else sample_weight
        key = (id(metric), y_pred.ndim)  # one graph per metric and kind of y_pred, for every shape
        if key not in _TRACED:
            _TRACED[key] = tf.function(metric.update_state, input_signature=spec + [tf.TensorSpec([None, None])])
        _TRACED[key](y_true, y_pred, weight)
    elif BACKEND == "jax":
        import jax

        key = id(metric)  # one jitted function per metric: it traces once per shape
        if key not in _TRACED:
            _TRACED[key] = jax.jit(metric.stateless_update_state)
        values = _TRACED[key]([v.value for v in metric.variables], y_true, y_pred, sample_weight)
        for variable, value in zip(metric.variables, values):
            variable.assign(value)
    else:
        metric.update_state(y_true, y_pred, sample_weight)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("mode, corpora", [("eager", 10), ("traced", 20), ("eager", 100)])
def test_span_f1_equals_span_scores(mode, corpora, scheme):
    if BACKEND == "jax":
        # JAX compiles each eager op per shape (about 3 s a corpus) and each
        # new metric's jitted update (2-3 s): a few corpora traced cover JAX;
        # the 100 corpora run eagerly on TensorFlow and PyTorch.
        if mode == "eager":
            pytest.skip("JAX: the traced case covers it (eager ops compile per shape)")
        corpora = min(corpora, 4)
    tags, rng = scheme_tags(scheme), random.Random(7)
    for seed in range(corpora):
        gold, predicted = random_corpus(seed, scheme)
        micro, macro = SpanF1(tags, scheme), SpanF1(tags, scheme, average="macro")
        for y_true, y_pred, weight in padded_batches(gold, predicted, tags, rng, probabilities=seed % 3 == 0):
            for metric in (micro, macro):
                if mode == "eager":
                    metric.update_state(y_true, y_pred, sample_weight=weight)
                else:
                    traced_update(metric, y_true, y_pred, weight)
        expected = span_scores(gold, predicted, scheme)
        assert float(micro.result()) == pytest.approx(expected.f1, abs=1e-6), seed
        assert micro.scores() == expected, seed
        assert float(macro.result()) == pytest.approx(expected.macro_f1, abs=1e-6), seed
        micro.reset_state()
        assert float(micro.result()) == 0.0 and micro.scores().gold == 0


def test_hand_computed_and_padding_tag():
    f1 = SpanF1(["", "O", "B-PER", "I-PER", "B-LOC"])  # "" at id 0: a padding tag, read as O
    # gold PER [0, 2), LOC [3, 4); predicted PER [0, 2), PER [3, 4) (I-PER after O); padding ignored.
    f1.update_state([[2, 3, 1, 4, 0, 0]], [[2, 3, 1, 3, 0, 2]], sample_weight=[[1, 1, 1, 1, 1, 0]])
    scores = f1.scores()
    assert (scores.gold, scores.predicted, scores.correct) == (2, 2, 1)
    assert float(f1.result()) == pytest.approx(0.5)
    assert scores.types["PER"].precision == 0.5 and scores.types["LOC"].recall == 0.0
    one = SpanF1(["O", "B-X", "I-X"])
    one.update_state(np.array([[1, 2, 0]]), np.array([[1, 2, 0]]), sample_weight=np.array([1.0]))  # [batch] weight
    assert float(one.result()) == 1.0


def test_config_round_trip():
    metric = SpanF1(["O", "B-X", "E-X", "S-X", "I-X"], scheme="bioes", average="macro", name="f1x")
    config = metric.get_config()
    assert config["tags"] == ["O", "B-X", "E-X", "S-X", "I-X"] and config["scheme"] == "bioes"
    assert config["average"] == "macro" and config["name"] == "f1x"
    for copy in (SpanF1.from_config(config), keras.metrics.deserialize(keras.metrics.serialize(metric))):
        assert type(copy) is SpanF1 and copy.get_config() == config
        copy.update_state([[1, 4, 2, 3]], [[1, 4, 2, 0]])  # gold B I E S, predicted B I E O
        assert float(copy.result()) == pytest.approx(2 / 3)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(tags=["O", "B-X"], scheme="bilou"), ValueError, "`scheme` must be one of .*received 'bilou'"),
    (dict(tags=["O", "B-X"], average="weighted"), ValueError, "`average` must be one of .*received 'weighted'"),
    (dict(tags=["O", "O"]), ValueError, "`tags` has no span tag.*received \\['O', 'O'\\]"),
    (dict(tags=["O", "E-X"]), ValueError, "IOB2 tag .*received 'E-X'"),
    (dict(tags="O B-X"), TypeError, "`tags` must be a sequence of tag names.*received 'O B-X'"),
])
def test_bad_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        SpanF1(**kwargs)


# --- in a model ----------------------------------------------------------------------------------

TAGS = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]  # tag 0 a span's start: padding read as tags would count


def tagging_data(pad_value: int):
    """Token ids (0 = padding) and tags mostly learnable from them (a quarter
    random), 24 sentences of 1 to 7."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 8, size=24)
    x = np.zeros((24, 9), "int32")
    y = np.full((24, 9), pad_value, "int32")
    for i, n in enumerate(lengths):
        x[i, :n] = rng.integers(1, 20, size=n)
        y[i, :n] = np.where(rng.random(n) < 0.25, rng.integers(0, len(TAGS), size=n), (x[i, :n] * 7) % len(TAGS))
    return x, y, lengths


def tagger(head: str):
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 8, mask_zero=True)(tokens)
    x = kb.Bidirectional(kb.GRUCell(8), return_sequences=True)(x)
    if head == "crf":
        outputs, loss = kb.CRF(len(TAGS))(keras.layers.Dense(len(TAGS))(x)), kb.CRFLoss()
    else:
        outputs, loss = keras.layers.Dense(len(TAGS), activation="softmax")(x), "sparse_categorical_crossentropy"
    model = keras.Model(tokens, outputs)
    model.compile(keras.optimizers.Adam(0.05), loss=loss, metrics=[SpanF1(TAGS), SpanF1(TAGS, average="macro",
                                                                                       name="macro_f1")])
    return model


def predicted_scores(model, x, y, lengths):
    ids = keras.ops.convert_to_numpy(model.predict(x, verbose=0))
    ids = ids.argmax(-1) if ids.ndim == 3 else ids
    gold = [[TAGS[t] for t in y[i, :n]] for i, n in enumerate(lengths)]
    return span_scores(gold, [[TAGS[t] for t in ids[i, :n]] for i, n in enumerate(lengths)])


@pytest.mark.slow(reason="trains a tagger")
@pytest.mark.parametrize("head", ["crf", "softmax"])
def test_fit_and_evaluate_count_no_padding(head):
    # On JAX Keras gives a softmax output's mask to no metric in fit: -1 padding there.
    x, y, lengths = tagging_data(-1 if head == "softmax" and BACKEND == "jax" else 0)
    model = tagger(head)
    model.fit(x, y, batch_size=8, epochs=6, verbose=0)
    expected = predicted_scores(model, x, y, lengths)
    assert 0.2 < expected.f1 < 1.0  # learned something, with errors to count
    logs = model.evaluate(x, y, batch_size=5, verbose=0, return_dict=True)  # 5 batches, the last of 4
    assert logs["span_f1"] == pytest.approx(expected.f1, abs=1e-6)
    assert logs["macro_f1"] == pytest.approx(expected.macro_f1, abs=1e-6)
    model.optimizer.learning_rate.assign(0.0)  # fit's metric, on weights that stay as they are
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert history.history["span_f1"][-1] == pytest.approx(expected.f1, abs=1e-6)
