"""keras_birnn/tagging/builder.py on every backend: `build_tagger`'s models
against the same tagger composed by hand from fresh kb and Keras layers with
the same weights (NumPy lookups and products, the brute-force CRF of
`crf_reference.py` for the tags), `fit` lowers the loss, `.keras` round trips,
bad arguments; and what `keras_birnn.tagging` does on this backend
(`TokenEncoder` eagerly and in `tf.data`, `export_tagger`'s refusal)."""

import keras
import numpy as np
import pytest

import crf_reference as ref
import keras_birnn as kb
from helpers import keras_round_trip
from keras_birnn.backend import TensorFlowOnlyError
from keras_birnn.tagging.builder import build_tagger
from backend_harness import BACKEND, to_numpy

TAGS = ["O", "B-PER", "I-PER"]
NUM_WORDS, NUM_CHARS, NUM_POS = 20, 12, 5
SIZES = dict(embedding_dim=6, char_dim=4, char_units=3, hidden=5, feature_dim=2)
LENGTHS = [5, 3, 4, 1]


def batch(seed=0):
    """(inputs by name, labels): word ids with right padding, 1 to 4
    characters per word, POS ids, IOB2-valid gold tags."""
    rng = np.random.default_rng(seed)
    mask = np.arange(max(LENGTHS))[None, :] < np.array(LENGTHS)[:, None]
    words = np.where(mask, rng.integers(1, NUM_WORDS, mask.shape), 0).astype("int32")
    spelled = np.arange(4)[None, None, :] < rng.integers(1, 5, mask.shape)[..., None]
    chars = np.where(mask[..., None] & spelled, rng.integers(1, NUM_CHARS, mask.shape + (4,)), 0).astype("int32")
    pos = np.where(mask, rng.integers(1, NUM_POS, mask.shape), 0).astype("int32")
    labels = np.where(mask, rng.choice([0, 1], mask.shape), 0).astype("int32")  # O or B-PER: always allowed
    return {"words": words, "chars": chars, "pos": pos}, labels


def model_inputs(model, named):
    inputs = [named[t.name] for t in model.inputs]
    return inputs if len(inputs) > 1 else inputs[0]


# --- the same tagger by hand ----------------------------------------------------------------


def lookup(model, name, ids):
    return model.get_layer(name).get_weights()[0][ids]


def char_vectors(model, kind, chars):
    """One vector per word from fresh layers with the model's weights, run on
    every word of the batch reshaped to [B * T, C]; zeros for padding words."""
    layer = model.get_layer("char_encoder")
    embedded = lookup(model, "char_embedding", chars)
    b, t, c, d = embedded.shape
    flat, flat_mask = embedded.reshape(b * t, c, d), (chars != 0).reshape(b * t, c)
    if kind == "cnn":
        conv = keras.layers.Conv1D(layer.filters, layer.width, padding="same", activation="tanh")
        conv.build((None, None, d))
        conv.set_weights(layer.conv.get_weights())
        out = to_numpy(conv(np.where(flat_mask[..., None], flat, 0).astype("float32")))
        out = np.where(flat_mask[..., None], out, -np.inf).max(axis=1)
    else:
        cell = kb.GRUCell(SIZES["char_units"]) if kind == "gru" else kb.LSTMCell(SIZES["char_units"])
        bi = kb.Bidirectional(cell)
        bi.build((None, None, d))
        bi.set_weights(layer.encoder.get_weights())
        out = to_numpy(bi(flat, mask=flat_mask))
    out = np.where(flat_mask.any(axis=1)[:, None], out, 0.0)
    return out.reshape(b, t, -1)


def by_hand(model, named, char_encoder, head, features):
    """The tagger's output composed from fresh layers and NumPy."""
    words = named["words"]
    mask = words != 0
    parts = [lookup(model, "word_embedding", words)]
    if char_encoder:
        parts.append(char_vectors(model, char_encoder, named["chars"]))
    if features:
        parts.append(lookup(model, "pos_embedding", named["pos"]))
    x = np.concatenate(parts, axis=-1).astype("float32")
    for stacked in model.get_layer("encoder").bidirectionals:
        bi = kb.Bidirectional(kb.LSTMCell(SIZES["hidden"]), return_sequences=True)
        bi.build(x.shape)
        bi.set_weights(stacked.get_weights())
        x = to_numpy(bi(x, mask=mask))
    kernel, bias = model.get_layer("tags" if head == "softmax" else "emissions").get_weights()
    scores = x.astype("float64") @ kernel + bias
    if head == "softmax":
        exps = np.exp(scores - scores.max(-1, keepdims=True))
        return exps / exps.sum(-1, keepdims=True)
    transitions, start, end = model.get_layer("crf").get_weights()
    return ref.viterbi(scores, mask, transitions, start, end, allowed=ref.iob2_checker(TAGS))


CASES = [  # (char_encoder, head, depth, features): the cheapest first
    (None, "softmax", 1, None),
    ("gru", "crf", 1, None),
    ("lstm", "crf", 2, {"pos": NUM_POS}),
    ("cnn", "softmax", 1, {"pos": NUM_POS}),
    ("cnn", "crf", 1, None),
]


@pytest.mark.parametrize("char_encoder, head, depth, features", CASES)
def test_predictions_equal_the_tagger_by_hand(char_encoder, head, depth, features):
    model = build_tagger(NUM_WORDS, TAGS, char_encoder=char_encoder, num_chars=NUM_CHARS, features=features,
                         depth=depth, head=head, dropout=0.3, **SIZES)
    # Nonzero CRF parameters (they start at zero), so that they count.
    if head == "crf":
        rng = np.random.default_rng(1)
        model.get_layer("crf").set_weights([rng.normal(size=w.shape) for w in model.get_layer("crf").get_weights()])
    named, _ = batch()
    got = model.predict(model_inputs(model, named), verbose=0)
    expected = by_hand(model, named, char_encoder, head, features)
    mask = named["words"] != 0
    if head == "crf":
        np.testing.assert_array_equal(got, expected)
    else:  # the valid positions: padding is whatever the head computes there
        np.testing.assert_allclose(got[mask], expected[mask], atol=1e-5)


@pytest.mark.slow(reason="fit traces a training step, then a .keras round trip (10-35 s on 2 cores)")
@pytest.mark.parametrize("char_encoder, head", [(None, "softmax"), ("gru", "crf")])
def test_fit_lowers_the_loss_and_keeps_frozen_vectors(char_encoder, head, tmp_path):
    vectors = np.random.default_rng(2).normal(size=(NUM_WORDS, 6)).astype("float32")
    sizes = {k: v for k, v in SIZES.items() if k != "embedding_dim"}
    model = build_tagger(NUM_WORDS, TAGS, embeddings=vectors, trainable_embeddings=False, char_encoder=char_encoder,
                         num_chars=NUM_CHARS, head=head, **sizes)
    loss = kb.CRFLoss() if head == "crf" else "sparse_categorical_crossentropy"
    model.compile(keras.optimizers.Adam(0.05), loss=loss)
    named, labels = batch()
    inputs = model_inputs(model, named)
    history = model.fit(inputs, labels, epochs=6, batch_size=len(LENGTHS), verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    np.testing.assert_array_equal(model.get_layer("word_embedding").get_weights()[0], vectors)
    assert "Constant" not in str(model.get_layer("word_embedding").get_config())  # the matrix is a weight only
    loaded = keras_round_trip(model, str(tmp_path / "tagger.keras"), inputs)
    assert loaded.get_layer("word_embedding").trainable is False


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(), ValueError, "embedding_dim"),
        (dict(embedding_dim=0), ValueError, "embedding_dim"),
        (dict(embeddings=np.zeros((3, 4), "float32")), ValueError, "embeddings"),
        (dict(embedding_dim=5, embeddings=np.zeros((NUM_WORDS, 4), "float32")), ValueError, "embedding_dim"),
        (dict(embedding_dim=4, char_encoder="rnn"), ValueError, "char_encoder"),
        (dict(embedding_dim=4, char_encoder="gru"), TypeError, "num_chars"),
        (dict(embedding_dim=4, head="hmm"), ValueError, "head"),
        (dict(embedding_dim=4, head="softmax", allowed_transitions="iob2"), ValueError, "allowed_transitions"),
        (dict(embedding_dim=4, allowed_transitions="bio"), ValueError, "allowed_transitions"),
        (dict(embedding_dim=4, dropout=1.0), ValueError, "dropout"),
        (dict(embedding_dim=4, depth=0), ValueError, "depth"),
        (dict(embedding_dim=4, cell="rnn"), ValueError, "cell"),
        (dict(embedding_dim=4, features={"words": 3}), ValueError, "features"),
        (dict(embedding_dim=4, features={"pos": 0}), ValueError, "features"),
        (dict(embedding_dim=4, features=["pos"]), TypeError, "features"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, words):
    with pytest.raises(error, match=words):
        build_tagger(NUM_WORDS, TAGS, **kwargs)
    with pytest.raises(ValueError, match="tags"):
        build_tagger(NUM_WORDS, ["O", "O"], embedding_dim=4)


def test_allowed_transitions_auto():
    crf = lambda tags, **kw: build_tagger(NUM_WORDS, tags, embedding_dim=4, hidden=2, **kw).get_layer("crf")
    assert crf(TAGS).allowed_transitions == "iob2"
    assert crf(["NOUN", "VERB"]).allowed_transitions is None
    assert crf(["O", "B-PER", "I-PER", "E-PER", "S-PER"]).allowed_transitions == "bioes"
    assert crf(TAGS, allowed_transitions=None).allowed_transitions is None
    assert crf(TAGS, allowed_transitions="iob1").allowed_transitions == "iob1"


# --- keras_birnn.tagging on this backend ----------------------------------------------------------


def test_encoder_eagerly_and_in_tf_data():
    # Where Keras's StringLookup runs: eagerly (the backend's tensors come
    # back) and in tf.data (TensorFlow's tensors stay), TensorFlow installed.
    tf = pytest.importorskip("tensorflow")
    from keras_birnn.tagging.encoder import TokenEncoder, pad_tokens

    encoder = TokenEncoder(max_chars=3, word_vocabulary=["the", "0"], char_vocabulary=["t", "e"])
    tokens = pad_tokens([["The", "7", "cat"], ["tee"]])
    word_ids, char_ids = encoder(tokens)
    assert keras.ops.is_tensor(word_ids) and not isinstance(word_ids, tf.Tensor) or BACKEND == "tensorflow"
    np.testing.assert_array_equal(to_numpy(word_ids), [[2, 3, 1], [1, 0, 0]])
    np.testing.assert_array_equal(to_numpy(char_ids)[1, 0], [2, 3, 3])
    mapped = tf.data.Dataset.from_tensor_slices(tokens).batch(2).map(encoder)
    (words, chars), = list(mapped)
    np.testing.assert_array_equal(words.numpy(), to_numpy(word_ids))


@pytest.mark.skipif(BACKEND == "tensorflow", reason="exports on TensorFlow: tests/tensorflow_only/test_tagging_export.py")
def test_export_refuses_other_backends(tmp_path):
    from keras_birnn.tagging.export import export_tagger

    model = build_tagger(NUM_WORDS, TAGS, embedding_dim=4, hidden=2)
    with pytest.raises(TensorFlowOnlyError, match=BACKEND):
        export_tagger(model, None, str(tmp_path), TAGS)
