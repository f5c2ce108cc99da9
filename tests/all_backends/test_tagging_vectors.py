"""keras_birnn/tagging/vectors.py: word2vec text and binary, GloVe and fastText
files (plain and gzip) written here from known vectors, read back into a
matrix aligned with a vocabulary (exact hits, case fallback, missing words,
the padding and OOV rows), the statistics, malformed files, and the matrix
in a frozen or fine-tuned `keras.layers.Embedding` saved in a `.keras`
file. Pure NumPy: the same on every backend."""

import gzip
import json
import zipfile

import keras
import numpy as np
import pytest

from keras_birnn.tagging.vectors import VectorStats, detect_format, load_vectors

WORDS = ["the", "Paris", "paris", "NEW", "é", "x-ray"]
VOCABULARY = ["", "[UNK]", "the", "paris", "Paris", "new", "é", "zebra", "New"]


def known_vectors(dim=4):
    rng = np.random.default_rng(0)
    return {w: rng.normal(size=dim).astype(np.float32) for w in WORDS}


def write(path, fmt, vectors, compress=False):
    """Writes `vectors` in the format: "word2vec", "fasttext" (a trailing
    space on each line, as fastText writes), "glove" or "word2vec-binary"."""
    dim = len(next(iter(vectors.values())))
    if fmt == "word2vec-binary":
        data = f"{len(vectors)} {dim}\n".encode() + b"".join(
            w.encode() + b" " + v.astype("<f4").tobytes() + b"\n" for w, v in vectors.items())
    else:
        header = "" if fmt == "glove" else f"{len(vectors)} {dim}\n"
        tail = " " if fmt == "fasttext" else ""
        data = (header + "".join(f"{w} {' '.join(repr(float(x)) for x in v)}{tail}\n"
                                 for w, v in vectors.items())).encode()
    (gzip.open if compress else open)(path, "wb").write(data)
    return str(path)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("fmt", ["word2vec", "fasttext", "glove", "word2vec-binary"])
def test_every_format_reads_the_vectors(tmp_path, fmt, compress):
    vectors = known_vectors()
    path = write(tmp_path / "v.txt", fmt, vectors, compress)
    assert detect_format(path) == ("word2vec" if fmt == "fasttext" else fmt)
    for given in ("auto", fmt):
        matrix, stats = load_vectors(path, VOCABULARY, format=given)
        assert matrix.shape == (9, 4) and matrix.dtype == np.float32
        np.testing.assert_array_equal(matrix[0], 0.0)  # padding
        for i, source in [(2, "the"), (3, "paris"), (4, "Paris"), (5, "NEW"), (6, "é"), (8, "NEW")]:
            np.testing.assert_array_equal(matrix[i], vectors[source])  # exact: float32 -> text -> float32
        assert (stats.exact, stats.case_fallback, stats.missing) == (4, 2, 1) and stats.missing_words == ("zebra",)
        assert stats.dim == 4 and stats.file_words == 6 and stats.coverage == pytest.approx(6 / 7)


def test_case_fallback_prefers_the_lower_cased_entry(tmp_path):
    vectors = {"PARIS": np.ones(2), "Paris": np.full(2, 2.0), "paris": np.full(2, 3.0), "Rome": np.full(2, 4.0)}
    path = write(tmp_path / "v.txt", "glove", vectors)
    matrix, stats = load_vectors(path, ["pARIS", "ROME", "rome"], padding_token=None, oov_token=None)
    # pARIS: the lower-cased entry "paris"; ROME and rome: the first entry equal but for case.
    np.testing.assert_array_equal(matrix, [[3.0, 3.0], [4.0, 4.0], [4.0, 4.0]])
    assert (stats.exact, stats.case_fallback, stats.missing) == (0, 3, 0)


def test_missing_rows_random_seeded_or_zeros(tmp_path):
    vectors = known_vectors()
    path = write(tmp_path / "v.vec", "word2vec", vectors)
    vocabulary = ["", "[UNK]", "the", "zebra", "yak"]
    a, _ = load_vectors(path, vocabulary, seed=3)
    b, _ = load_vectors(path, vocabulary, seed=3)
    c, _ = load_vectors(path, vocabulary, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a[3], c[3])
    found_std = np.std(vectors["the"])  # the one vector found sets the random rows' scale
    expected = np.random.default_rng(3).normal(0.0, found_std, (3, 4))  # [UNK], zebra, yak in order
    np.testing.assert_allclose(a[[1, 3, 4]], expected, rtol=1e-6)
    zeros, stats = load_vectors(path, vocabulary, missing="zeros")
    np.testing.assert_array_equal(zeros[[0, 1, 3, 4]], 0.0)
    assert stats.missing == 2 and "missing=2 ['zebra', 'yak']" in repr(stats) and "coverage=33.3%" in repr(stats)
    scaled, _ = load_vectors(path, vocabulary, scale=0.5, seed=3, dtype="float64")
    np.testing.assert_allclose(scaled[[1, 3, 4]], np.random.default_rng(3).normal(0.0, 0.5, (3, 4)))


def test_first_entry_of_a_repeated_word_counts(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("a 1 2\na 3 4\n")
    matrix, stats = load_vectors(str(path), ["a"], padding_token=None)
    np.testing.assert_array_equal(matrix, [[1.0, 2.0]])
    assert stats.file_words == 2


@pytest.mark.parametrize("content, message", [
    ("", "empty"),
    ("2 3\nthe 1 2 3\n", "header says 2 vectors of 3 values, the file has 1"),
    ("1 3\nthe 1 2\n", "line 2: expected a word and 3 values, found 2 values"),
    ("the 1 2 3\nof 1 2\n", "line 2: expected a word and 3 values, found 2 values"),  # inconsistent dims
    ("the 1 2 3\nof 1 2 3 4\n", "line 2: expected a word and 3 values, found 4 values"),
    ("the 1 2 3\nzebra 1 x 3\n", "line 2: non-numeric value 'x' for the word 'zebra'"),
    ("1 3\n", "header says 1 vectors of 3 values, the file has 0"),
])
def test_malformed_text_files_are_named(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"{path}.*{message}"):
        load_vectors(str(path), ["the", "zebra"])


def test_malformed_binary_files_are_named(tmp_path):
    good = write(tmp_path / "v.bin", "word2vec-binary", known_vectors())
    data = open(good, "rb").read()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:-10])
    with pytest.raises(ValueError, match=f"{cut}: truncated at vector 6 of 6 .the word 'x-ray'.: 7 of its 16 bytes"):
        load_vectors(str(cut), ["the"], format="word2vec-binary")
    more = tmp_path / "more.bin"
    more.write_bytes(b"7" + data[1:])  # the header announces 7
    with pytest.raises(ValueError, match="truncated at vector 7 of 7"):
        load_vectors(str(more), ["the"], format="word2vec-binary")
    extra = tmp_path / "extra.bin"
    extra.write_bytes(b"5" + data[1:])
    with pytest.raises(ValueError, match="data after the 5 vectors"):
        load_vectors(str(extra), ["the"], format="word2vec-binary")


def test_bad_arguments_are_named(tmp_path):
    path = write(tmp_path / "v.txt", "glove", known_vectors())
    with pytest.raises(ValueError, match="`format` must be one of .*received 'npy'"):
        load_vectors(path, ["the"], format="npy")
    with pytest.raises(ValueError, match="`missing` must be one of .*received 'mean'"):
        load_vectors(path, ["the"], missing="mean")
    with pytest.raises(TypeError, match="`vocabulary` must be a sequence of words.*received 'the'"):
        load_vectors(path, "the")


@pytest.mark.slow(reason="fits and saves two small models")
@pytest.mark.parametrize("trainable", [False, True])
def test_embedding_frozen_or_fine_tuned_saves_exactly(tmp_path, trainable):
    path = write(tmp_path / "v.vec", "fasttext", known_vectors())
    matrix, _ = load_vectors(path, VOCABULARY)
    tokens = keras.Input((None,), dtype="int32")
    embed = keras.layers.Embedding(len(VOCABULARY), 4, mask_zero=True, weights=[matrix], trainable=trainable)
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(embed(tokens))))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(embed.embeddings), matrix)
    model.compile(keras.optimizers.SGD(0.5), "mse")
    model.fit(np.array([[2, 3, 4, 0], [5, 6, 7, 8]]), np.array([[1.0], [-1.0]]), epochs=2, verbose=0)
    after = keras.ops.convert_to_numpy(embed.embeddings)
    assert np.array_equal(after, matrix) != trainable  # frozen: unchanged; fine-tuned: trained
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded.layers[1].embeddings), after)
    assert loaded.layers[1].trainable == trainable
    with zipfile.ZipFile(tmp_path / "m.keras") as saved:
        config = saved.read("config.json")
    assert len(config) < 5000 and "embeddings_initializer" in json.loads(config)["config"]["layers"][1]["config"]
