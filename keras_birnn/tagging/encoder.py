"""String tokens to word and character ids, as a Keras preprocessing layer.

`TokenEncoder` turns string tokens `[batch, time]` ("" = padding) into word
ids `[batch, time]` and character ids `[batch, time, max_chars]`, int32,
0 = padding and 1 = out of vocabulary (OOV). Its vocabularies come from
`adapt()` (or are given), and it is built on `keras.layers.StringLookup`
and `tf.strings`, so the same lookups run in training, in `tf.data`
pipelines and inside an exported SavedModel (`keras_birnn.tagging.export`).

Like Keras's own `StringLookup`, it needs TensorFlow installed whatever the
Keras backend, and it runs where `StringLookup` runs:

- TensorFlow backend: everywhere (eager, `tf.function` with unknown batch
  and time, `tf.data`, functional models with a string `keras.Input`, the
  exported graph).
- JAX and PyTorch backends: eagerly, on NumPy string arrays or lists
  (the ids come back as the backend's tensors: `jax.Array`,
  `torch.Tensor`), and inside `tf.data` pipelines (`dataset.map(encoder)`:
  TensorFlow tensors stay TensorFlow tensors). Not inside `jax.jit` nor in
  a model that JAX or PyTorch trace, since they have no string tensors:
  encode the strings before the model, and feed it the ids.
"""

from __future__ import annotations

import numbers
from collections import Counter
from typing import Iterator, List, Optional, Sequence, Tuple

import keras
import numpy as np

from keras_birnn import backend
from keras_birnn.api_export import keras_birnn_export

PAD = ""  # the padding token, id 0
OOV = "[UNK]"  # what StringLookup names the OOV id, 1
PAD_ID, OOV_ID = 0, 1
_CHUNK = 1 << 16  # tokens per TensorFlow call while adapting


def _tf():
    """TensorFlow, which the string ops need on every Keras backend."""
    try:
        import tensorflow as tf
    except ImportError as error:  # pragma: no cover - the test machines have it
        raise ImportError(
            "keras_birnn.tagging.encoder needs TensorFlow installed (string ops), whatever the "
            f"Keras backend ({backend.NAME!r}); `pip install tensorflow`."
        ) from error
    return tf


def pad_tokens(sentences: Sequence[Sequence[str]]) -> np.ndarray:
    """Token lists right-padded with "" into a string array `[batch, time]`.

    Example:

    >>> from keras_birnn.tagging.encoder import pad_tokens
    >>> pad_tokens([["Hello", "world"], ["Hi"]]).tolist()
    [['Hello', 'world'], ['Hi', '']]
    """
    sentences = [_check_sentence(s) for s in sentences]
    width = max((len(s) for s in sentences), default=0)
    out = np.full((len(sentences), max(width, 1)), PAD, dtype=object)
    for row, tokens in enumerate(sentences):
        out[row, : len(tokens)] = tokens
    return out


def _check_sentence(tokens) -> list:
    if isinstance(tokens, (str, bytes)):
        raise TypeError(
            f"Expected a list of token lists, received a string {tokens!r} as a sentence: split "
            "each sentence into tokens first (e.g. sentence.split())."
        )
    return list(tokens)


def word_keys(tokens, lowercase: bool = True, fold_digits: bool = True):
    """The word vocabulary's key of each token (TensorFlow strings).

    UTF-8 lower case (`tf.strings.lower`) with `lowercase`, and every
    Unicode decimal digit (category Nd) replaced by "0" with `fold_digits`.
    """
    tf = _tf()
    keys = tf.convert_to_tensor(tokens, tf.string)
    if lowercase:
        keys = tf.strings.lower(keys, encoding="utf-8")
    if fold_digits:
        keys = tf.strings.regex_replace(keys, r"\p{Nd}", "0")
    return keys


def char_windows(tokens, max_chars: int):
    """Each token's characters, string `[..., max_chars]`, "" past its end.

    A token longer than `max_chars` keeps its first `ceil(max_chars / 2)`
    and last `floor(max_chars / 2)` characters: prefixes and suffixes carry
    the morphology. Characters are Unicode code points of the UTF-8 text
    (invalid bytes become U+FFFD).
    """
    tf = _tf()
    tokens = tf.convert_to_tensor(tokens, tf.string)
    flat = tf.reshape(tokens, [-1])
    chars = tf.strings.unicode_split(flat, "UTF-8")  # ragged [N, (L)]
    lengths = tf.cast(chars.row_lengths(), tf.int32)[:, None]
    # Padded to at least `max_chars` columns, so every index below exists.
    filler = tf.fill([tf.shape(flat)[0], max_chars], PAD)
    padded = tf.concat([chars.to_tensor(default_value=PAD), filler], axis=1)
    j = tf.range(max_chars)[None, :]
    head = max_chars - max_chars // 2
    source = tf.where((lengths > max_chars) & (j >= head), lengths - max_chars + j, j)
    picked = tf.where(j < lengths, tf.gather(padded, source, batch_dims=1), PAD)
    return tf.reshape(picked, tf.concat([tf.shape(tokens), [max_chars]], axis=0))


def _token_chunks(data, steps: Optional[int]) -> Iterator:
    """The non-padding tokens of `data` as 1-D TensorFlow string tensors."""
    tf = _tf()
    if isinstance(data, tf.data.Dataset):
        for tokens in data.take(-1 if steps is None else steps):
            if backend.is_ragged(tokens):
                tokens = tokens.flat_values
            flat = tf.reshape(tf.convert_to_tensor(tokens, tf.string), [-1])
            yield tf.boolean_mask(flat, flat != PAD)
        return
    if steps is not None:
        raise ValueError(f"`steps` applies to a tf.data.Dataset only, received steps={steps!r}.")
    if isinstance(data, np.ndarray):
        data = [data.reshape(-1).tolist()]
    elif isinstance(data, (str, bytes)) or not isinstance(data, Sequence):
        raise TypeError(
            "`data` must be a tf.data.Dataset of string tensors, a list of token lists or a "
            f"NumPy string array, received {type(data).__name__}: {str(data)[:80]!r}."
        )
    buffer: List[str] = []
    for sentence in data:
        buffer.extend(t for t in _check_sentence(sentence) if t != PAD)
        if len(buffer) >= _CHUNK:
            yield tf.constant(buffer, tf.string)
            buffer = []
    if buffer:
        yield tf.constant(buffer, tf.string)


def _kept(counts: Counter, min_count: int, max_size: Optional[int]) -> List[str]:
    """Entries seen at least `min_count` times, most frequent first (ties in
    code point order), at most `max_size`; never padding nor OOV."""
    entries = [(n, k.decode("utf-8")) for k, n in counts.items() if n >= min_count]
    entries = sorted((-n, k) for n, k in entries if k not in (PAD, OOV))
    return [k for _, k in entries[:max_size]]


def _positive_int(name: str, value, optional: bool = False) -> Optional[int]:
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be a positive int{' or None' if optional else ''}, received {value!r}.")
    if value < 1:
        raise ValueError(f"`{name}` must be a positive int{' or None' if optional else ''}, received {value!r}.")
    return int(value)


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be True or False, received {value!r}.")
    return bool(value)


def _vocabulary(name: str, value) -> Optional[List[str]]:
    """A given vocabulary: distinct strings, without padding nor OOV."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"`{name}` must be a list of strings, received {str(value)[:80]!r}.")
    value = list(value)
    bad = [v for v in value if v in (PAD, OOV)]
    if bad or len(set(value)) != len(value):
        raise ValueError(
            f"`{name}` must hold distinct strings other than {PAD!r} (padding, id 0) and {OOV!r} "
            f"(OOV, id 1), received {str(bad or value)[:80]}."
        )
    return value


@keras_birnn_export("keras_birnn.tagging.TokenEncoder")
class TokenEncoder(keras.layers.Layer):
    """String tokens to word ids and character ids, vocabularies in the graph.

    Word ids: each token's key (`word_keys`: lower case with `lowercase`,
    Unicode digits -> "0" with `fold_digits`) looked up in the word
    vocabulary. Character ids: each token's characters as written
    (`char_windows`: at most `max_chars` per token, a long token keeps its
    first and last characters) looked up in the character vocabulary. In
    both, id 0 is padding ("" tokens, and characters past a token's end)
    and id 1 is out of vocabulary; the vocabularies' entries follow from 2.
    So `word_count` and `char_count` (the vocabulary sizes, padding and
    OOV included) are the sizes `build_tagger` takes.

    The vocabularies come from `adapt(data)`, or are given (`word_vocabulary`,
    `char_vocabulary`, e.g. the words of pretrained vectors, in the order of
    the matrix's rows from 2), or set with `set_vocabularies`. They are
    saved in the config, so `.keras` files and `from_config` keep them.

    Runs on TensorFlow everywhere; on JAX and PyTorch eagerly and in
    `tf.data` (see the module docstring); it needs TensorFlow installed.

    Args:
        max_chars: Characters kept per token, the character ids' last axis.
        lowercase: Whether word keys are lower-cased (characters keep case).
        fold_digits: Whether every decimal digit of a word key becomes "0".
        min_word_count: `adapt` keeps word keys seen at least this often;
            the rarer ones are OOV (so the OOV vector trains).
        min_char_count: The same for characters.
        max_word_vocabulary: Optional cap on the word entries `adapt` keeps
            (the most frequent; padding and OOV not counted).
        max_char_vocabulary: The same for characters.
        word_vocabulary: Optional word keys, ids 2, 3, ... in this order.
        char_vocabulary: Optional characters, ids 2, 3, ... in this order.
        **kwargs: Base layer arguments (`name`, ...).

    Call arguments:
        tokens: String `[batch, time]` ("" = padding): a NumPy array, a
            `tf.Tensor`, or a `tf.RaggedTensor` `[batch, (time)]` (padded
            with ""). `pad_tokens` pads lists of token lists.

    Returns:
        `(word_ids, char_ids)`: int32 `[batch, time]` and
        `[batch, time, max_chars]`.

    Example:

    >>> from keras_birnn.tagging.encoder import TokenEncoder, pad_tokens
    >>> encoder = TokenEncoder(max_chars=4)
    >>> encoder.adapt([["The", "cat", "sat"], ["the", "dog", "ran", "in", "2024"]])
    >>> encoder.get_word_vocabulary()[:4]
    ['', '[UNK]', 'the', '0000']
    >>> word_ids, char_ids = encoder(pad_tokens([["The", "emu"], ["1999"]]))
    >>> np.asarray(word_ids).tolist()
    [[2, 1], [3, 0]]
    >>> np.asarray(char_ids)[0, 0].tolist()   # "The": T, h, e, then padding
    [10, 6, 5, 0]
    """

    def __init__(
        self,
        max_chars: int = 16,
        lowercase: bool = True,
        fold_digits: bool = True,
        min_word_count: int = 1,
        min_char_count: int = 1,
        max_word_vocabulary: Optional[int] = None,
        max_char_vocabulary: Optional[int] = None,
        word_vocabulary: Optional[Sequence[str]] = None,
        char_vocabulary: Optional[Sequence[str]] = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.max_chars = _positive_int("max_chars", max_chars)
        self.lowercase, self.fold_digits = _flag("lowercase", lowercase), _flag("fold_digits", fold_digits)
        self.min_word_count = _positive_int("min_word_count", min_word_count)
        self.min_char_count = _positive_int("min_char_count", min_char_count)
        self.max_word_vocabulary = _positive_int("max_word_vocabulary", max_word_vocabulary, optional=True)
        self.max_char_vocabulary = _positive_int("max_char_vocabulary", max_char_vocabulary, optional=True)
        lookup = dict(mask_token=PAD, oov_token=OOV, num_oov_indices=1)
        self.word_lookup = keras.layers.StringLookup(name="word_lookup", **lookup)
        self.char_lookup = keras.layers.StringLookup(name="char_lookup", **lookup)
        self._vocabularies: Optional[Tuple[List[str], List[str]]] = None
        words, chars = _vocabulary("word_vocabulary", word_vocabulary), _vocabulary("char_vocabulary", char_vocabulary)
        if (words is None) != (chars is None):
            raise ValueError(
                "Pass both `word_vocabulary` and `char_vocabulary` or neither, received "
                f"word_vocabulary={str(words)[:40]}, char_vocabulary={str(chars)[:40]}."
            )
        if words is not None:
            self.set_vocabularies(words, chars)
        # Strings reach `call` as they are (Keras's StringLookup does the same).
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.supports_jit = False
        self.built = True

    def adapt(self, data, steps: Optional[int] = None) -> None:
        """Sets both vocabularies from the tokens of `data`.

        Args:
            data: A list of token lists, a NumPy string array ("" ignored),
                or a `tf.data.Dataset` of string tensors (any shape, dense
                or ragged; "" ignored).
            steps: With a dataset, how many of its elements to read (default
                all).
        """
        tf = _tf()
        words, chars = Counter(), Counter()
        for tokens in _token_chunks(data, steps):
            words.update(word_keys(tokens, self.lowercase, self.fold_digits).numpy().tolist())
            chars.update(tf.strings.unicode_split(tokens, "UTF-8").flat_values.numpy().tolist())
        self.set_vocabularies(
            _kept(words, self.min_word_count, self.max_word_vocabulary),
            _kept(chars, self.min_char_count, self.max_char_vocabulary),
        )

    def set_vocabularies(self, words: Sequence[str], chars: Sequence[str]) -> None:
        """Sets the word keys (ids 2, 3, ...) and the characters (the same)."""
        words, chars = _vocabulary("words", words), _vocabulary("chars", chars)
        # StringLookup refuses an empty vocabulary; an empty one is all OOV.
        self.word_lookup.set_vocabulary(words or [OOV + "word"])
        self.char_lookup.set_vocabulary(chars or [OOV + "char"])
        self._vocabularies = (words, chars)

    @property
    def word_count(self) -> int:
        """Word ids in use (padding and OOV included): `build_tagger`'s `num_words`."""
        return 2 + len(self._require_vocabularies()[0])

    @property
    def char_count(self) -> int:
        """Character ids in use (padding and OOV included): `num_chars`."""
        return 2 + len(self._require_vocabularies()[1])

    def get_word_vocabulary(self) -> List[str]:
        """The word key of each id: `["", "[UNK]", ...]`."""
        return [PAD, OOV] + list(self._require_vocabularies()[0])

    def get_char_vocabulary(self) -> List[str]:
        """The character of each id: `["", "[UNK]", ...]`."""
        return [PAD, OOV] + list(self._require_vocabularies()[1])

    def _require_vocabularies(self) -> Tuple[List[str], List[str]]:
        if self._vocabularies is None:
            raise ValueError(
                f"TokenEncoder {self.name!r} has no vocabularies yet: call adapt(data), or pass "
                "word_vocabulary and char_vocabulary, or call set_vocabularies."
            )
        return self._vocabularies

    def call(self, tokens):
        tf = _tf()
        self._require_vocabularies()
        was_tf = isinstance(tokens, (tf.Tensor, tf.RaggedTensor))
        tokens = _token_matrix(tokens)
        keys = word_keys(tokens, self.lowercase, self.fold_digits)
        word_ids = tf.cast(self.word_lookup(keys), tf.int32)
        char_ids = tf.cast(self.char_lookup(char_windows(tokens, self.max_chars)), tf.int32)
        if backend.IS_TENSORFLOW or was_tf or not tf.executing_eagerly():
            return word_ids, char_ids  # TensorFlow's own tensors (tf.data, graphs)
        return keras.ops.convert_to_tensor(word_ids.numpy()), keras.ops.convert_to_tensor(char_ids.numpy())

    def compute_output_spec(self, tokens):
        shape = tuple(tokens.shape)
        if len(shape) != 2:
            raise ValueError(f"TokenEncoder {self.name!r} takes string tokens [batch, time], received shape {shape}.")
        return (keras.KerasTensor(shape, dtype="int32"), keras.KerasTensor(shape + (self.max_chars,), dtype="int32"))

    def get_config(self) -> dict:
        config = super().get_config()
        words, chars = self._vocabularies or (None, None)
        config.update(
            max_chars=self.max_chars, lowercase=self.lowercase, fold_digits=self.fold_digits,
            min_word_count=self.min_word_count, min_char_count=self.min_char_count,
            max_word_vocabulary=self.max_word_vocabulary, max_char_vocabulary=self.max_char_vocabulary,
            word_vocabulary=None if words is None else list(words),
            char_vocabulary=None if chars is None else list(chars),
        )
        return config


def _token_matrix(tokens):
    """`tokens` as a TensorFlow string tensor `[batch, time]`."""
    tf = _tf()
    if backend.is_ragged(tokens):
        tokens = tokens.to_tensor(default_value=PAD)
    elif not isinstance(tokens, tf.Tensor):
        tokens = np.asarray(tokens, dtype=object) if not isinstance(tokens, np.ndarray) else tokens
    tokens = tf.convert_to_tensor(tokens, tf.string) if not isinstance(tokens, tf.Tensor) else tokens
    if tokens.dtype != tf.string or tokens.shape.rank != 2:
        raise ValueError(
            f"TokenEncoder takes string tokens [batch, time], received dtype {tokens.dtype.name} and "
            f"shape {tokens.shape}."
        )
    return tokens
