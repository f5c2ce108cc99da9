"""keras_birnn/tagging/export.py: `export_tagger`'s SavedModel, reloaded with
plain `tf.saved_model.load`, against the Keras model's own predictions and
the CRF's marginals computed eagerly (and the brute-force CRF of
`crf_reference.py`), for batches of several sizes, with padding."""

import numpy as np
import pytest
import tensorflow as tf

import crf_reference as ref
import keras
from keras_birnn.tagging.builder import build_tagger
from keras_birnn.tagging.encoder import TokenEncoder, pad_tokens
from keras_birnn.tagging.export import export_tagger

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TRAIN = [["Ada", "Lovelace", "met", "Babbage", "in", "London"], ["Alan", "Turing", "lived", "in", "Wilmslow"]]
QUERIES = [  # batches of other sizes than each other, with padding and unseen words
    [["Ada", "met", "Alan", "Turing"], ["London"], []],
    [["Grace", "Hopper", "in", "New", "York"], ["in"]],
]


def tagger(head, char_encoder):
    encoder = TokenEncoder(max_chars=6)
    encoder.adapt(TRAIN)
    model = build_tagger(encoder.word_count, TAGS, embedding_dim=6, char_encoder=char_encoder,
                         num_chars=encoder.char_count, char_units=3, hidden=4, head=head)
    rng = np.random.default_rng(0)  # weights that are not the initial zeros of the CRF
    model.set_weights([rng.normal(scale=0.8, size=w.shape).astype("float32") for w in model.get_weights()])
    return model, encoder


def expected(model, encoder, sentences):
    """(tag ids, confidence) from the Keras model eagerly: its predictions,
    and the CRF's marginals at the predicted tags (softmax: the probability)."""
    word_ids, char_ids = encoder(pad_tokens(sentences))
    inputs = [word_ids, char_ids] if len(model.inputs) == 2 else word_ids
    output = np.asarray(model(inputs, training=False))
    valid = np.asarray(word_ids) != 0
    if output.ndim == 3:
        ids = output.argmax(-1)
        probabilities = output
    else:
        ids = output
        emissions = keras.Model(model.inputs, model.get_layer("emissions").output)(inputs)
        crf = model.get_layer("crf")
        probabilities = np.asarray(crf.marginals(emissions, mask=valid))
        transitions, start, end = [np.asarray(p, "float64") for p in crf.chain_parameters()]
        oracle = ref.marginals(np.asarray(emissions, "float64"), valid, transitions, start, end)
        np.testing.assert_allclose(probabilities, oracle, atol=1e-5)
    ids = np.where(valid, ids, 0)
    confidence = np.where(valid, np.take_along_axis(probabilities, ids[..., None], -1)[..., 0], 0.0)
    return ids, confidence, valid


@pytest.mark.parametrize("head, char_encoder", [("softmax", None), ("crf", "lstm"), ("crf", "cnn"), ("softmax", "gru")])
def test_served_tags_equal_the_keras_model(head, char_encoder, tmp_path):
    model, encoder = tagger(head, char_encoder)
    folder = export_tagger(model, encoder, str(tmp_path / "tagger"), TAGS)
    assert folder == str(tmp_path / "tagger" / "1")
    serve = tf.saved_model.load(folder).signatures["serving_default"]
    _, spec = serve.structured_input_signature
    assert spec["inputs"].shape.as_list() == [None, None] and spec["inputs"].dtype == tf.string
    for sentences in QUERIES:
        out = serve(inputs=tf.constant(pad_tokens(sentences)))
        ids, confidence, valid = expected(model, encoder, sentences)
        np.testing.assert_array_equal(out["tag_ids"].numpy(), np.where(valid, ids, -1))
        names = np.where(valid, np.array(TAGS, object)[ids], "")
        np.testing.assert_array_equal(out["tags"].numpy().astype(str), names.astype(str))
        np.testing.assert_allclose(out["confidence"].numpy(), confidence, atol=1e-6, rtol=0)
        assert out["tag_ids"].dtype == tf.int32 and out["confidence"].dtype == tf.float32
        assert np.all(confidence[valid] > 0) and np.all(confidence[valid] <= 1 + 1e-6)


@pytest.mark.slow(reason="an export (about 12 s on 2 cores); test_served_tags_equal_the_keras_model's first case covers the module")
def test_padding_gives_nothing(tmp_path):
    model, encoder = tagger("crf", None)
    serve = tf.saved_model.load(export_tagger(model, encoder, str(tmp_path), TAGS)).signatures["serving_default"]
    out = serve(inputs=tf.constant([["", "", ""], ["Ada", "", ""]]))
    assert out["tags"].numpy().tolist() == [[b"", b"", b""], [out["tags"].numpy()[1, 0], b"", b""]]
    assert out["tags"].numpy()[1, 0] in [t.encode() for t in TAGS]
    np.testing.assert_array_equal(out["tag_ids"].numpy()[:, 1:], -1)
    np.testing.assert_array_equal(out["confidence"].numpy()[0], 0)


def test_bad_arguments(tmp_path):
    model, encoder = tagger("crf", None)
    with pytest.raises(ValueError, match="`tags`"):
        export_tagger(model, encoder, str(tmp_path), TAGS[:3])
    with pytest.raises(TypeError, match="`encoder`"):
        export_tagger(model, {"the": 2}, str(tmp_path), TAGS)
    with_features = build_tagger(encoder.word_count, TAGS, embedding_dim=4, hidden=2, features={"pos": 4})
    with pytest.raises(ValueError, match="pos"):
        export_tagger(with_features, encoder, str(tmp_path), TAGS)
