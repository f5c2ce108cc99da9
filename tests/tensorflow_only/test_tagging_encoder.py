"""keras_birnn/tagging/encoder.py: `TokenEncoder` against a plain-Python oracle
(dict lookups over Python's own string functions), eager and in a
`tf.function` with unknown batch and time, adapt options, `.keras` files."""

import os
import unicodedata
from collections import Counter

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_birnn.tagging.encoder import PAD, TokenEncoder, pad_tokens

SENTENCES = [
    ["The", "Cat", "sat", "in", "2024", "."],
    ["the", "cat", "ran", "1999", "times", "."],
    ["ÉCOLE", "école", "Straße", "naïve", "٣٤", "Überhaupt-wunderbar"],
    ["the", "dog", "sat"],
]


# --- the oracle: Python strings and dicts -------------------------------------------------------


def key(token, lowercase=True, fold_digits=True):
    token = token.lower() if lowercase else token
    if fold_digits:
        token = "".join("0" if unicodedata.category(c) == "Nd" else c for c in token)
    return token


def kept(counts, min_count=1, max_size=None):
    entries = sorted((-n, k) for k, n in counts.items() if n >= min_count)
    return [k for _, k in entries][:max_size]


def oracle_vocabularies(sentences, lowercase=True, fold_digits=True, min_word=1, min_char=1, max_words=None):
    tokens = [t for s in sentences for t in s if t]
    words = kept(Counter(key(t, lowercase, fold_digits) for t in tokens), min_word, max_words)
    chars = kept(Counter(c for t in tokens for c in t), min_char)
    return words, chars


def oracle_ids(batch, words, chars, max_chars, lowercase=True, fold_digits=True):
    word_index = {w: i + 2 for i, w in enumerate(words)}
    char_index = {c: i + 2 for i, c in enumerate(chars)}
    word_ids = np.zeros(batch.shape, np.int32)
    char_ids = np.zeros(batch.shape + (max_chars,), np.int32)
    for (b, t), token in np.ndenumerate(batch):
        if token == PAD:
            continue
        word_ids[b, t] = word_index.get(key(token, lowercase, fold_digits), 1)
        kept_chars = list(token)
        if len(kept_chars) > max_chars:  # first ceil(C / 2), last floor(C / 2)
            head = max_chars - max_chars // 2
            kept_chars = kept_chars[:head] + kept_chars[len(kept_chars) - max_chars // 2 :]
        for k, c in enumerate(kept_chars):
            char_ids[b, t, k] = char_index.get(c, 1)
    return word_ids, char_ids


def in_graph(encoder, tokens):
    """The encoder in a tf.function whose batch and time are unknown."""
    run = tf.function(encoder.__call__, input_signature=[tf.TensorSpec([None, None], tf.string)])
    return [t.numpy() for t in run(tf.constant(tokens))]


QUERY = pad_tokens(SENTENCES + [["unseen", "CAT", "7", "a" * 30, "école"], [], ["Ω"]])


# --- ids --------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_chars", [4, 5, 16])
def test_ids_equal_the_dict_lookup_eager_and_traced(max_chars):
    encoder = TokenEncoder(max_chars=max_chars)
    encoder.adapt(SENTENCES)
    words, chars = oracle_vocabularies(SENTENCES)
    assert encoder.get_word_vocabulary() == ["", "[UNK]"] + words
    assert encoder.get_char_vocabulary() == ["", "[UNK]"] + chars
    expected = oracle_ids(QUERY, words, chars, max_chars)
    eager = [np.asarray(t) for t in encoder(QUERY)]
    for got in (eager, in_graph(encoder, QUERY)):
        assert got[0].dtype == np.int32 and got[1].dtype == np.int32
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])


def test_padding_and_oov():
    encoder = TokenEncoder(max_chars=3, word_vocabulary=["a"], char_vocabulary=["a"])
    word_ids, char_ids = encoder(pad_tokens([["a", "b", "ab"], [], ["[UNK]"]]))
    np.testing.assert_array_equal(word_ids, [[2, 1, 1], [0, 0, 0], [1, 0, 0]])
    np.testing.assert_array_equal(char_ids[0], [[2, 0, 0], [1, 0, 0], [2, 1, 0]])
    np.testing.assert_array_equal(char_ids[1], 0)  # a row of padding: nothing
    assert encoder.word_count == 3 and encoder.char_count == 3


def test_ragged_input_equals_padded():
    encoder = TokenEncoder(max_chars=6)
    encoder.adapt(SENTENCES)
    ragged = tf.ragged.constant(SENTENCES)
    for got, expected in zip(encoder(ragged), encoder(pad_tokens(SENTENCES))):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "options",
    [
        dict(lowercase=False),
        dict(fold_digits=False),
        dict(lowercase=False, fold_digits=False, min_word_count=2),
        dict(min_word_count=2, min_char_count=3),
        dict(max_word_vocabulary=3, max_char_vocabulary=5),
    ],
)
def test_adapt_options(options):
    encoder = TokenEncoder(max_chars=8, **options)
    encoder.adapt(SENTENCES)
    case = dict(lowercase=options.get("lowercase", True), fold_digits=options.get("fold_digits", True))
    words, _ = oracle_vocabularies(SENTENCES, **case, min_word=options.get("min_word_count", 1),
                                   max_words=options.get("max_word_vocabulary"))
    _, chars = oracle_vocabularies(SENTENCES, min_char=options.get("min_char_count", 1))
    chars = chars[: options.get("max_char_vocabulary")]
    assert encoder.get_word_vocabulary()[2:] == words
    assert encoder.get_char_vocabulary()[2:] == chars
    expected = oracle_ids(QUERY, words, chars, 8, **case)
    for got, want in zip(encoder(QUERY), expected):
        np.testing.assert_array_equal(got, want)


def test_adapt_sources_agree():
    # A list of token lists, a padded NumPy array and a tf.data.Dataset of
    # ragged or dense batches give the same vocabularies.
    expected = TokenEncoder()
    expected.adapt(SENTENCES)
    padded = pad_tokens(SENTENCES)
    sources = [
        padded,
        tf.data.Dataset.from_tensor_slices(padded).batch(2),
        tf.data.Dataset.from_tensor_slices(tf.ragged.constant(SENTENCES)).batch(3),
    ]
    for data in sources:
        encoder = TokenEncoder()
        encoder.adapt(data)
        assert encoder.get_word_vocabulary() == expected.get_word_vocabulary()
        assert encoder.get_char_vocabulary() == expected.get_char_vocabulary()
    first = TokenEncoder()
    first.adapt(tf.data.Dataset.from_tensor_slices(padded).batch(1), steps=1)
    assert first.get_word_vocabulary()[2:] == oracle_vocabularies(SENTENCES[:1])[0]


def test_tf_data_map():
    encoder = TokenEncoder(max_chars=5)
    encoder.adapt(SENTENCES)
    data = tf.data.Dataset.from_tensor_slices(QUERY).batch(3).map(encoder)
    words = np.concatenate([w.numpy() for w, _ in data])
    np.testing.assert_array_equal(words, oracle_ids(QUERY, *oracle_vocabularies(SENTENCES), 5)[0])


# --- saving -------------------------------------------------------------------------------------


def test_config_and_keras_file_keep_the_vocabularies(tmp_path):
    encoder = TokenEncoder(max_chars=5, lowercase=False, min_word_count=2, name="enc")
    encoder.adapt(SENTENCES)
    expected = [np.asarray(t) for t in encoder(QUERY)]
    again = TokenEncoder.from_config(encoder.get_config())
    tokens = keras.Input((None,), dtype="string")
    model = keras.Model(tokens, encoder(tokens))
    model.save(os.path.join(tmp_path, "encoder.keras"))
    loaded = keras.saving.load_model(os.path.join(tmp_path, "encoder.keras"), safe_mode=True)
    for got in (again(QUERY), loaded(tf.constant(QUERY))):
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)
    assert loaded.layers[-1].get_word_vocabulary() == encoder.get_word_vocabulary()
    assert loaded.layers[-1].lowercase is False


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(max_chars=0), ValueError, "max_chars"),
        (dict(max_chars=2.5), TypeError, "max_chars"),
        (dict(lowercase="yes"), TypeError, "lowercase"),
        (dict(min_word_count=0), ValueError, "min_word_count"),
        (dict(max_word_vocabulary=-1), ValueError, "max_word_vocabulary"),
        (dict(word_vocabulary=["a", ""], char_vocabulary=["a"]), ValueError, "word_vocabulary"),
        (dict(word_vocabulary=["a"]), ValueError, "char_vocabulary"),
    ],
)
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        TokenEncoder(**kwargs)


def test_bad_calls_and_data():
    encoder = TokenEncoder()
    with pytest.raises(ValueError, match="no vocabularies"):
        encoder(pad_tokens([["a"]]))
    with pytest.raises(TypeError, match="string 'the cat'"):
        encoder.adapt(["the cat", "a dog"])
    with pytest.raises(TypeError, match="`data`"):
        encoder.adapt(42)
    encoder.adapt(SENTENCES)
    with pytest.raises(ValueError, match=r"\[batch, time\]"):
        encoder(np.array(["a", "b"], dtype=object))
