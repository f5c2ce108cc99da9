"""`Tagger.export` with feature columns and span outputs (keras_birnn/tagging/export.py).

The SavedModel, reloaded with plain `tf.saved_model.load`, answers what
`predict` answers (tags, tag ids, confidence and spans) on padded batches
of unequal lengths with unseen words and an unseen feature value; its
signature takes the tokens and one string input per feature; a words-only
export keeps its inputs and outputs, plus the span outputs only under a
span scheme. `served_spans` (the graph's span reader) is also checked
directly against `scored_spans` on random, ill-formed tag sequences.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras
import keras_birnn as kb
from keras_birnn.tagging.encoder import pad_tokens
from keras_birnn.tagging.export import OUTPUT_KEYS, SPAN_KEYS, served_spans
from keras_birnn.tagging.spans import scored_spans, span_tables
from keras_birnn.tagging.tagger import Tagger

TOKENS = [["He", "saw", "the", "dog"], ["The", "big", "cat", "runs", "home"], ["Dogs", "bark"]]
POS = [["PRP", "VBD", "DT", "NN"], ["DT", "JJ", "NN", "VBZ", "NN"], ["NNS", "VBP"]]
CHUNKS = [["B-NP", "B-VP", "B-NP", "I-NP"], ["B-NP", "I-NP", "I-NP", "B-VP", "B-NP"], ["B-NP", "B-VP"]]
BATCHES = [  # unequal lengths, an unseen word ("Zebra") and an unseen feature value ("XX")
    {"tokens": [["the", "Zebra", "runs"], ["Dogs"], ["He", "saw", "the", "big", "cat", "home"]],
     "pos": [["DT", "XX", "VBZ"], ["NNS"], ["PRP", "VBD", "DT", "JJ", "NN", "NN"]]},
    {"tokens": [["cat"], ["the", "dog", "bark"]], "pos": [["NN"], ["DT", "NN", "VBP"]]},
]


def randomized(tagger):
    """The tagger with random weights (not the CRF's initial zeros): varied tags and spans."""
    rng = np.random.default_rng(0)
    tagger.network.set_weights([rng.normal(scale=0.8, size=w.shape).astype("float32")
                                for w in tagger.network.get_weights()])
    return tagger


def served_rows(out, row):
    """One row's served spans as (start, end, type, confidence), up to the -1 padding."""
    columns = [out[key].numpy()[row] for key in SPAN_KEYS]
    return [(int(s), int(e), t.decode(), float(c)) for s, e, t, c in zip(*columns) if s >= 0]


def assert_serves_predict(serve, tagger, x):
    inputs = {"inputs": tf.constant(pad_tokens(x["tokens"]))}
    inputs.update({name: tf.constant(pad_tokens(x[name])) for name in tagger.feature_names})
    out = serve(**inputs)
    predicted = tagger.predict(x)
    width = max(map(len, x["tokens"]))
    assert out["span_start"].shape[1] == max(max(len(p.spans) for p in predicted), 1)
    for row, result in enumerate(predicted):
        pad = width - len(result.tags)
        assert [t.decode() for t in out["tags"].numpy()[row]] == result.tags + [""] * pad
        assert out["tag_ids"].numpy()[row].tolist() == [tagger.tags.index(t) for t in result.tags] + [-1] * pad
        np.testing.assert_allclose(out["confidence"].numpy()[row], result.confidence + [0.0] * pad, atol=1e-6)
        served = served_rows(out, row)
        assert [s[:3] for s in served] == [s[:3] for s in result.spans]
        np.testing.assert_allclose([s[3] for s in served], [s[3] for s in result.spans], atol=1e-6)
        columns = out["span_start"].shape[1]
        assert out["span_end"].numpy()[row, len(served):].tolist() == [-1] * (columns - len(served))
        assert out["span_type"].numpy()[row, len(served):].tolist() == [b""] * (columns - len(served))
        assert out["span_confidence"].numpy()[row, len(served):].tolist() == [0.0] * (columns - len(served))
    return predicted


@pytest.mark.parametrize("head, char_encoder", [("crf", "cnn"), ("softmax", None)])
def test_the_served_feature_tagger_answers_what_predict_answers(head, char_encoder, tmp_path):
    keras.utils.set_random_seed(5)
    x = {"tokens": TOKENS, "pos": POS}
    tagger = randomized(Tagger.from_sentences(x, CHUNKS, embedding_dim=4, feature_dim=3, hidden=4, head=head,
                                              char_encoder=char_encoder, char_units=2))
    folder = tagger.export(str(tmp_path / "chunker"))
    serve = tf.saved_model.load(folder).signatures["serving_default"]
    _, spec = serve.structured_input_signature
    assert sorted(spec) == ["inputs", "pos"] and all(s.dtype == tf.string for s in spec.values())
    assert sorted(serve.structured_outputs) == sorted(OUTPUT_KEYS + SPAN_KEYS)
    spans = sum(len(p.spans) for batch in BATCHES for p in assert_serves_predict(serve, tagger, batch))
    assert spans >= 3  # the comparison saw spans
    # An unseen value is id 1, as any other unseen value (the graph answered predict on "XX" above).
    other = dict(BATCHES[0], pos=[["DT", "YY", "VBZ"]] + BATCHES[0]["pos"][1:])
    assert tagger.predict(other) == tagger.predict(BATCHES[0])


def test_the_words_only_export_keeps_its_signature(tmp_path):
    keras.utils.set_random_seed(6)
    chunker = randomized(Tagger.from_sentences(TOKENS, CHUNKS, embedding_dim=4, hidden=4))
    serve = tf.saved_model.load(chunker.export(str(tmp_path / "np"))).signatures["serving_default"]
    _, spec = serve.structured_input_signature
    assert sorted(spec) == ["inputs"] and sorted(serve.structured_outputs) == sorted(OUTPUT_KEYS + SPAN_KEYS)
    assert_serves_predict(serve, chunker, {"tokens": BATCHES[0]["tokens"]})

    upos = randomized(Tagger.from_sentences(TOKENS, POS, embedding_dim=4, hidden=4, head="softmax"))
    assert upos.scheme is None
    serve = tf.saved_model.load(upos.export(str(tmp_path / "pos"))).signatures["serving_default"]
    assert sorted(serve.structured_outputs) == sorted(OUTPUT_KEYS)
    out = serve(inputs=tf.constant(pad_tokens(BATCHES[1]["tokens"])))
    assert [[t.decode() for t in row if t] for row in out["tags"].numpy()] == [p.tags for p in upos.predict(BATCHES[1]["tokens"])]
    assert all(p.spans == [] for p in upos.predict(BATCHES[1]["tokens"]))


@pytest.mark.parametrize("scheme, tags", [
    ("iob2", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
    ("iob1", ["O", "B-PER", "I-PER", "I-LOC"]),
    ("bioes", ["O", "B-X", "I-X", "E-X", "S-X", "S-Y", "B"]),
])
def test_served_spans_read_what_scored_spans_reads(scheme, tags):
    rng = np.random.default_rng(7)
    lengths = [9, 0, 1, 4, 9, 6, 2]
    ids = rng.integers(0, len(tags), (len(lengths), 9)).astype(np.int32)  # ill-formed sequences too
    confidence = rng.random(ids.shape).astype(np.float32)
    for row, n in enumerate(lengths):
        ids[row, n:], confidence[row, n:] = -1, 0.0
    tables = span_tables(tags, scheme)
    out = tf.function(lambda i, c: served_spans(i, c, tables),  # unknown batch and time
                      input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.float32)])
    out = out(tf.constant(ids), tf.constant(confidence))
    for row, n in enumerate(lengths):
        expected = scored_spans([tags[k] for k in ids[row, :n]], confidence[row, :n].tolist(), scheme)
        served = served_rows(out, row)
        assert [s[:3] for s in served] == [s[:3] for s in expected]
        np.testing.assert_allclose([s[3] for s in served], [s[3] for s in expected], atol=1e-6)
    empty = served_spans(tf.fill([2, 3], -1), tf.zeros([2, 3]), tables)
    assert empty["span_start"].numpy().tolist() == [[-1], [-1]]
