"""Pretrained word vectors as an embedding matrix aligned with a vocabulary.

Reads word2vec text (a header line "count dim", then "word v1 ... vdim"),
fastText `.vec` files (the same layout), GloVe text (no header) and
word2vec binary (the header, then each word, a space and `dim`
little-endian float32 values, an optional newline after each); any of them
gzip-compressed. Pure Python and NumPy.
"""

import dataclasses
import gzip
import re
from typing import BinaryIO, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

FORMATS = ("auto", "word2vec", "fasttext", "glove", "word2vec-binary")
MISSING = ("random", "zeros")
_HEADER = re.compile(rb"^\s*(\d+)[ \t]+(\d+)\s*$")
_FIELDS = re.compile(r"[ \t]+")


@dataclasses.dataclass(frozen=True)
class VectorStats:
    """How much of a vocabulary a vectors file covers.

    `exact`: words found as they are; `case_fallback`: words found only
    case-insensitively; `missing`: the others (initialised by `missing`);
    the padding and OOV rows are not counted. `coverage`: the share found.
    """

    exact: int
    case_fallback: int
    missing: int
    dim: int
    file_words: int
    missing_words: Tuple[str, ...] = ()

    @property
    def coverage(self) -> float:
        total = self.exact + self.case_fallback + self.missing
        return (self.exact + self.case_fallback) / total if total else 0.0

    def __repr__(self) -> str:
        sample = ", ".join(repr(w) for w in self.missing_words[:5]) + (", ..." if self.missing > 5 else "")
        return (f"VectorStats(coverage={100 * self.coverage:.1f}%, exact={self.exact}, "
                f"case_fallback={self.case_fallback}, missing={self.missing} [{sample}], dim={self.dim}, "
                f"file_words={self.file_words})")


def _open(path: str) -> BinaryIO:
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if compressed else open(path, "rb")


def _header(line: bytes) -> Optional[Tuple[int, int]]:
    found = _HEADER.match(line)
    return (int(found.group(1)), int(found.group(2))) if found else None


def detect_format(path: str) -> str:
    """`"word2vec"` (text with a header), `"glove"` or `"word2vec-binary"`.

    A first line "count dim" is a header when the next line is not text
    of a word and `dim` numbers (then the file is binary) or is one.
    """
    with _open(path) as f:
        first, second = f.readline(), f.readline()
    if not first.strip():
        raise ValueError(f"{path}: the vectors file is empty (no first line).")
    header = _header(first)
    if header is None:
        return "glove"
    try:
        fields = _FIELDS.split(second.decode("utf-8").strip(" \t\r\n"))
        if len(fields) == header[1] + 1:
            [float(v) for v in fields[1:]]
            return "word2vec"
    except (UnicodeDecodeError, ValueError):
        pass
    # Binary, unless the second line is text of the wrong size (then the text reader names the error).
    return "word2vec-binary" if b"\x00" in second or not second.isascii() else "word2vec"


def _text_lines(path: str, encoding_errors: str) -> Iterator[Tuple[int, str]]:
    with _open(path) as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8", errors=encoding_errors).strip(" \t\r\n")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}, line {number}: not UTF-8 ({error}); pass encoding_errors='replace'.")


def _values(path: str, where: str, fields: Sequence[str], dim: int) -> np.ndarray:
    if len(fields) - 1 != dim:
        raise ValueError(f"{path}, {where}: expected a word and {dim} values, found {len(fields) - 1} values.")
    try:
        return np.array(fields[1:], dtype=np.float64)
    except ValueError:
        bad = next(v for v in fields[1:] if not _is_number(v))
        raise ValueError(f"{path}, {where}: non-numeric value {bad!r} for the word {fields[0]!r}.") from None


def _is_number(value: str) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return False


def _read_text(path: str, has_header: bool, wanted, encoding_errors: str) -> Tuple[Dict[str, np.ndarray], int, int]:
    """({word: vector} of the wanted words, dim, words in the file); every
    line's size is checked, the values of the wanted words parsed."""
    found, dim, count, header = {}, None, 0, None
    for number, line in _text_lines(path, encoding_errors):
        if has_header and header is None:
            header = _header(line.encode())
            if header is None:
                raise ValueError(f"{path}, line 1: expected a header 'count dim', found {line[:60]!r}.")
            dim = header[1]
            continue
        if not line:
            continue
        fields = _FIELDS.split(line)
        dim = len(fields) - 1 if dim is None else dim
        if len(fields) - 1 != dim:
            _values(path, f"line {number}", fields, dim)  # raises: the wrong number of values
        if fields[0] not in found and _is_wanted(fields[0], wanted):
            found[fields[0]] = _values(path, f"line {number}", fields, dim)
        count += 1
    _check_count(path, header, count, dim)
    return found, dim, count


def _check_count(path: str, header, count: int, dim: Optional[int]) -> None:
    if dim is None:
        raise ValueError(f"{path}: the vectors file is empty (no vectors).")
    if header is not None and header[0] != count:
        raise ValueError(f"{path}: the header says {header[0]} vectors of {header[1]} values, the file has {count}.")


def _read_binary(path: str, wanted, encoding_errors: str) -> Tuple[Dict[str, np.ndarray], int, int]:
    with _open(path) as f:
        header = _header(f.readline())
        if header is None:
            raise ValueError(f"{path}, line 1: expected a word2vec binary header 'count dim'.")
        count, dim = header
        found, size = {}, 4 * dim
        for index in range(count):
            word = _binary_word(f, path, index, count, encoding_errors)
            data = f.read(size)
            if len(data) != size:
                raise ValueError(f"{path}: truncated at vector {index + 1} of {count} (the word {word!r}): "
                                 f"{len(data)} of its {size} bytes.")
            if word not in found and _is_wanted(word, wanted):
                found[word] = np.frombuffer(data, dtype="<f4").astype(np.float64)
        if f.read(2).strip():  # (a newline may end the last vector)
            raise ValueError(f"{path}: data after the {count} vectors the header announces.")
    return found, dim, count


def _binary_word(f: BinaryIO, path: str, index: int, count: int, encoding_errors: str) -> str:
    chars: List[bytes] = []
    while True:
        c = f.read(1)
        if not c:
            raise ValueError(f"{path}: truncated at vector {index + 1} of {count} (end of file in its word).")
        if c == b" ":
            break
        if c != b"\n" or chars:  # the newline that may follow the previous vector
            chars.append(c)
    try:
        return b"".join(chars).decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}, vector {index + 1}: the word is not UTF-8 ({error}); "
                         "pass encoding_errors='replace'.") from None


def _wanted(vocabulary: Sequence[str]) -> Tuple[set, set]:
    """(the words, their lower-cased forms)."""
    return set(vocabulary), {w.lower() for w in vocabulary}


def _is_wanted(word: str, wanted: Tuple[set, set]) -> bool:
    """Whether the file's `word` is a vocabulary word or equal to one but for case."""
    return word in wanted[0] or word.lower() in wanted[1]


def load_vectors(path: str, vocabulary: Sequence[str], format: str = "auto", missing: str = "random",
                 scale: Optional[float] = None, seed: int = 0, padding_token: Optional[str] = "",
                 oov_token: Optional[str] = "[UNK]", dtype: str = "float32",
                 encoding_errors: str = "strict") -> Tuple[np.ndarray, VectorStats]:
    """An embedding matrix `[len(vocabulary), dim]` from a word vectors file.

    Row i holds the vector of `vocabulary[i]`: the file's entry for the
    word; else (case-insensitive fallback) the entry of its lower-cased
    form, else of the first word in the file equal to it ignoring case;
    else the `missing` initialisation. The first entry of a word repeated in
    the file counts. The padding row (`padding_token`, "" as Keras's
    `StringLookup` and `Embedding(mask_zero=True)` put at id 0) is zeros;
    the OOV row (`oov_token`, "[UNK]" at id 1 there) is initialised like a
    missing word (it trains where the embedding does); neither is looked up
    nor counted in the statistics.

    Every line's number of values is checked; the values are parsed (and
    checked) for the words the vocabulary asks for. Malformed files raise
    ValueErrors naming the file and the line (text) or vector (binary).

    Frozen or fine-tuned: `keras.layers.Embedding(len(vocabulary), dim,
    mask_zero=True, weights=[matrix], trainable=False)` (frozen; `trainable=
    True`: fine-tuned). Keras 3.15 takes `weights=` again (dropped in 3.0):
    the matrix is set once built and saved with the weights, so a `.keras`
    file holds it exactly, once; `embeddings_initializer=Constant(matrix)`
    would also write it, as text, into the model's config.

    Args:
        path: The file (gzip-compressed or not).
        vocabulary: Words, index = id.
        format: `"auto"` (`detect_format`), `"word2vec"`, `"fasttext"`
            (text with a header), `"glove"` (text without) or
            `"word2vec-binary"`.
        missing: `"random"` (normal, seeded) or `"zeros"`, for words not
            in the file and the OOV row.
        scale: Standard deviation of the random rows; None: that of the
            vectors found (0.1 when none is).
        seed: Seed of the random rows.
        padding_token, oov_token: The special rows' words (None: none).
        dtype: The matrix's dtype.
        encoding_errors: How undecodable UTF-8 is treated (`bytes.decode`).

    Returns:
        `(matrix, VectorStats)`.

    Example:

    >>> import os, tempfile
    >>> from keras_birnn.tagging.vectors import load_vectors
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.vec")
    >>> with open(path, "w") as f:
    ...     _ = f.write("2 3\\nparis 1 2 3\\nthe 0.5 0.5 0.5\\n")
    >>> matrix, stats = load_vectors(path, ["", "[UNK]", "the", "Paris", "zebra"])
    >>> matrix[3].tolist(), stats.exact, stats.case_fallback, stats.missing
    ([1.0, 2.0, 3.0], 1, 1, 1)
    >>> embed = keras.layers.Embedding(5, 3, mask_zero=True, weights=[matrix], trainable=False)
    """
    if format not in FORMATS:
        raise ValueError(f"`format` must be one of {FORMATS}, received {format!r}.")
    if missing not in MISSING:
        raise ValueError(f"`missing` must be one of {MISSING}, received {missing!r}.")
    if isinstance(vocabulary, str) or not all(isinstance(w, str) for w in vocabulary):
        raise TypeError(f"`vocabulary` must be a sequence of words (strings), received {vocabulary!r:.80}.")
    special = {padding_token, oov_token} - {None}
    words = [w for w in vocabulary if w not in special]
    format = detect_format(path) if format == "auto" else format
    if format == "word2vec-binary":
        found, dim, count = _read_binary(path, _wanted(words), encoding_errors)
    else:
        found, dim, count = _read_text(path, format != "glove", _wanted(words), encoding_errors)
    return _matrix(vocabulary, found, dim, count, missing, scale, seed, padding_token, oov_token, dtype)


def _matrix(vocabulary, found, dim, count, missing, scale, seed, padding_token, oov_token, dtype):
    lower = _lower_entries(found)
    rows, exact, fallback, absent = [], 0, 0, []
    for word in vocabulary:
        vector = None
        if word not in (padding_token, oov_token):
            vector = found.get(word)
            exact += vector is not None
            if vector is None:
                vector = found.get(word.lower(), lower.get(word.lower()))
                fallback += vector is not None
                if vector is None:
                    absent.append(word)
        rows.append(vector)
    values = np.array([v for v in rows if v is not None]).reshape(-1, dim)
    std = scale if scale is not None else (float(values.std()) if values.size else 0.1)
    rng = np.random.default_rng(seed)
    matrix = np.zeros((len(vocabulary), dim), np.float64)
    for i, (word, vector) in enumerate(zip(vocabulary, rows)):
        if vector is not None:
            matrix[i] = vector
        elif word != padding_token and missing == "random":
            matrix[i] = rng.normal(0.0, std, dim)
    stats = VectorStats(exact, fallback, len(absent), dim, count, tuple(absent))
    return matrix.astype(dtype), stats


def _lower_entries(found: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """{lower-cased word: vector of its first cased form in `found`}."""
    lower: Dict[str, np.ndarray] = {}
    for word, vector in found.items():
        lower.setdefault(word.lower(), vector)
    return lower
