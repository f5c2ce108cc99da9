"""Sentences of token ids as length-bucketed batches, with word dropout.

Sentences differ in length; a batch padded to its longest sentence wastes
little when its sentences have about the same length. `bucket_batches`
sorts the sentences by length (with a random jitter of a few tokens in
training, so that batches differ from epoch to epoch), cuts the order into
batches and shuffles the batches; in training a batch's time axis is
padded to a multiple of `LENGTH_MULTIPLE`, so that `fit` compiles its step
for few shapes (JAX's `jit`, `tf.function`). `drop_words` is word dropout: in
training, each known word id becomes the OOV id with a given probability,
so that the model learns what to do with unknown words (the characters
still spell them). `sentence_dataset` is both as a `tf.data.Dataset`
whose batches are drawn anew at each pass (each epoch of `fit`).

NumPy does the work; `tf.data` (TensorFlow installed) carries the batches
to `fit` on every Keras backend.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from keras_birnn.tagging.encoder import OOV_ID, PAD_ID, TokenEncoder, pad_tokens

DEFAULT_BATCH_SIZE = 32  # items per batch when `fit` is given none
JITTER = 3.0  # tokens of random jitter on each length before sorting (training)
LENGTH_MULTIPLE = 8  # training batches' time axis: a multiple of this (fewer shapes to compile)
ENCODE_CHUNK = 256  # sentences per call of the encoder


class EncodedSentences(NamedTuple):
    """Sentences as ids, one unpadded array per sentence.

    `words[i]`: int32 `[len_i]`; `chars[i]`: int32 `[len_i, max_chars]`;
    `labels[i]`: int32 `[len_i]` (or `[]` per sentence without labels) or
    one int per sentence (a sentence classifier's label); `features`:
    optional `{name: ids}`, `ids[i]` int32 `[len_i]` (a tagger's feature
    columns, in the network's input order), None without.
    """

    words: List[np.ndarray]
    chars: List[np.ndarray]
    labels: Optional[list]
    features: Optional[Dict[str, List[np.ndarray]]] = None

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(w) for w in self.words], np.int64)


def encode_sentences(encoder: TokenEncoder, sentences: Sequence[Sequence[str]],
                     labels: Optional[list] = None) -> EncodedSentences:
    """Encodes token lists once (word and character ids, unpadded).

    Args:
        encoder: A `TokenEncoder` with vocabularies.
        sentences: Token lists.
        labels: Optional labels, one entry per sentence, kept as given.

    Returns:
        An `EncodedSentences`.

    Example:

    >>> from keras_birnn.tagging.batching import encode_sentences
    >>> encoder = kb.tagging.TokenEncoder(max_chars=4, word_vocabulary=["a"], char_vocabulary=["a"])
    >>> encode_sentences(encoder, [["a", "b"], ["a"]]).words[0].tolist()
    [2, 1]
    """
    if labels is not None and len(labels) != len(sentences):
        raise ValueError(f"Received {len(sentences)} sentences and {len(labels)} labels: one per sentence.")
    words: List[np.ndarray] = []
    chars: List[np.ndarray] = []
    for start in range(0, len(sentences), ENCODE_CHUNK):
        part = [list(s) for s in sentences[start:start + ENCODE_CHUNK]]
        word_ids, char_ids = (np.asarray(_numpy(x)) for x in encoder(pad_tokens(part)))
        words += [word_ids[row, :len(tokens)] for row, tokens in enumerate(part)]
        chars += [char_ids[row, :len(tokens)] for row, tokens in enumerate(part)]
    return EncodedSentences(words, chars, None if labels is None else list(labels))


def _numpy(x) -> np.ndarray:
    """A backend tensor (or a TensorFlow one) as NumPy."""
    return x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else np.asarray(x)


def bucket_batches(lengths: Sequence[int], batch_size: int,
                   rng: Optional[np.random.Generator] = None) -> List[np.ndarray]:
    """Sentence indices grouped into batches of similar length.

    Every index appears in exactly one batch. Without `rng` the batches
    follow the sorted lengths (stable, deterministic); with `rng` each
    length gets a uniform jitter in `[0, JITTER)` before sorting and the
    batches come out shuffled.

    Args:
        lengths: The length of each sentence.
        batch_size: Sentences per batch (the last batch may be smaller).
        rng: Optional NumPy generator: jitter and shuffle (training).

    Returns:
        A list of int arrays of sentence indices.

    Example:

    >>> from keras_birnn.tagging.batching import bucket_batches
    >>> [b.tolist() for b in bucket_batches([5, 1, 4, 2], 2)]
    [[1, 3], [2, 0]]
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int, received {batch_size!r}.")
    keys = np.asarray(lengths, np.float64)
    if rng is not None:
        keys = keys + rng.uniform(0.0, JITTER, len(keys))
    order = np.argsort(keys, kind="stable")
    groups = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    if rng is not None:
        rng.shuffle(groups)
    return groups


def drop_words(word_ids: np.ndarray, rate: float, rng: Optional[np.random.Generator]) -> np.ndarray:
    """Word dropout: each known word id becomes `OOV_ID` with probability `rate`.

    Padding (`PAD_ID`) and OOV ids stay as they are; the input is not
    changed (a new array comes back).

    Args:
        word_ids: Int word ids, any shape.
        rate: Probability in `[0, 1)`.
        rng: NumPy generator; None (or `rate` 0) returns `word_ids`.

    Returns:
        The word ids after dropout, int32.

    Example:

    >>> from keras_birnn.tagging.batching import drop_words
    >>> drop_words(np.array([[5, 6, 0]]), 0.5, np.random.default_rng(0)).tolist()
    [[5, 1, 0]]
    """
    if isinstance(rate, bool) or not 0.0 <= float(rate) < 1.0:
        raise ValueError(f"`word_dropout` must be a float in [0, 1), received {rate!r}.")
    word_ids = np.asarray(word_ids, np.int32)
    if rate == 0 or rng is None:
        return word_ids
    drop = (word_ids > OOV_ID) & (rng.random(word_ids.shape) < rate)
    return np.where(drop, OOV_ID, word_ids).astype(np.int32)


def batch_width(encoded: EncodedSentences, indices: Sequence[int], multiple: int = 1) -> int:
    """The longest of the sentences (at least 1), rounded up to a multiple of `multiple`."""
    longest = max([len(encoded.words[i]) for i in indices] + [1])
    return -(-longest // multiple) * multiple


def pad_batch(encoded: EncodedSentences, indices: Sequence[int], with_chars: bool,
              multiple: int = 1) -> Union[np.ndarray, tuple]:
    """The model inputs of some sentences, right-padded with 0.

    Args:
        encoded: The sentences as ids.
        indices: Which sentences, in batch order.
        with_chars: Also the character ids.
        multiple: Pad the time axis to a multiple of this: fewer distinct
            shapes, so fewer compilations (XLA, `tf.function`) in training.

    Returns:
        `words` int32 `[B, T]`, or `(words, chars [B, T, C])` with
        `with_chars`; with `encoded.features`, a tuple of the words, the
        characters (with `with_chars`) and each feature's ids `[B, T]`, in
        the order of `encoded.features`.
    """
    width = batch_width(encoded, indices, multiple)
    words = np.full((len(indices), width), PAD_ID, np.int32)
    chars = np.zeros((len(indices), width, encoded.chars[0].shape[-1] if encoded.chars else 1), np.int32)
    for row, i in enumerate(indices):
        n = len(encoded.words[i])
        words[row, :n], chars[row, :n] = encoded.words[i], encoded.chars[i]
    if encoded.features is None:
        return (words, chars) if with_chars else words
    columns = []
    for ids in encoded.features.values():
        column = np.full((len(indices), width), PAD_ID, np.int32)
        for row, i in enumerate(indices):
            column[row, :len(ids[i])] = ids[i]
        columns.append(column)
    return tuple([words] + ([chars] if with_chars else []) + columns)


def pad_labels(encoded: EncodedSentences, indices: Sequence[int],
               multiple: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """Per-token labels `[B, T]` (0 at padding) and their weights (1 valid,
    0 padding), padded as `pad_batch` pads the inputs."""
    width = batch_width(encoded, indices, multiple)
    labels = np.zeros((len(indices), width), np.int32)
    weights = np.zeros((len(indices), width), np.float32)
    for row, i in enumerate(indices):
        n = len(encoded.labels[i])
        labels[row, :n], weights[row, :n] = encoded.labels[i], 1.0
    return labels, weights


BatchMaker = Callable[[EncodedSentences, np.ndarray, Optional[np.random.Generator]], tuple]


def sentence_dataset(encoded: EncodedSentences, make_batch: BatchMaker, batch_size: int,
                     seed: Optional[int] = None, shuffle: bool = True):
    """A `tf.data.Dataset` of length-bucketed batches, drawn anew at each pass.

    Args:
        encoded: The sentences as ids (`encode_sentences`).
        make_batch: `(encoded, indices, rng) -> batch` (a tuple of NumPy
            arrays: inputs, labels and optional sample weights); `rng` is
            None when not shuffling (no word dropout then).
        batch_size: Sentences per batch.
        seed: Seed of the jitter, shuffle and dropout draws.
        shuffle: Jitter and shuffle (training); False keeps the sorted order.

    Returns:
        A `tf.data.Dataset` with a known cardinality.
    """
    rng = np.random.default_rng(seed) if shuffle else None
    count = len(bucket_batches(encoded.lengths, batch_size))

    def draw() -> Iterator[tuple]:
        for group in bucket_batches(encoded.lengths, batch_size, rng):
            yield make_batch(encoded, group, rng)

    return batches_dataset(encoded, make_batch, draw, count)


def epoch_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> List[np.ndarray]:
    """The training batches of one epoch, a function of `(seed, epoch)` only.

    `bucket_batches` with a generator seeded by `[seed, epoch]`: a run that
    resumes at epoch e (or at batch b of it) draws the same batches as one
    that never stopped. `batch_rng(seed, epoch, b)` seeds batch b's own
    draws (word dropout) the same way.
    """
    return bucket_batches(lengths, batch_size, np.random.default_rng([seed, epoch]))


def batch_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of batch `index` of `epoch` (see `epoch_batches`)."""
    return np.random.default_rng([seed, epoch, index])


def batches_dataset(encoded: EncodedSentences, make_batch: BatchMaker, draw: Callable[[], Iterator[tuple]],
                    count: int):
    """A `tf.data.Dataset` over what `draw()` yields: `count` batches of
    `make_batch`'s form (the element spec is taken from a one-sentence batch)."""
    import tensorflow as tf  # tf.data carries the batches on every backend

    sample = make_batch(encoded, np.arange(min(len(encoded.words), 1)), None)
    spec = tf.nest.map_structure(lambda a: tf.TensorSpec([None] * a.ndim, tf.as_dtype(a.dtype)), sample)
    data = tf.data.Dataset.from_generator(draw, output_signature=spec)
    return without_autotuning(data.apply(tf.data.experimental.assert_cardinality(count)))


def without_autotuning(data):
    """A `tf.data.Dataset` with tf.data's autotuning off. A pipeline of
    batches made ready in Python has nothing to tune, and with autotuning on
    TensorFlow 2.21 stalled `model.fit` at epoch ends (an iterator's
    teardown waits on the tuning thread; benchmarks/README.md, "Whole
    models against their Keras twins")."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return data.with_options(options)
