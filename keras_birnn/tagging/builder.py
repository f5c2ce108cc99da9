"""`build_tagger`: the BiLSTM-CRF sequence tagger as a plain `keras.Model`.

The architecture of Lample et al. 2016 ("Neural Architectures for Named
Entity Recognition"), with the character CNN of Ma and Hovy 2016
("End-to-end Sequence Labeling via Bi-directional LSTM-CNNs-CRF") as an
option:

    words    [B, T] ids -> Embedding(mask_zero=True)   (trained, or pretrained vectors)
    chars    [B, T, C] ids -> Embedding -> "gru"/"lstm": kb.NestedEncoder(
             kb.Bidirectional(cell)) final states per word; "cnn": CharCNN
    features [B, T] ids each -> Embedding(mask_zero=True)
    then     concatenation -> Dropout -> kb.StackedBidirectional(depth
             layers of `hidden` units per direction, dropout between) ->
             Dropout -> Dense(len(tags)) -> kb.CRF ("crf": Viterbi tags) or
             a softmax ("softmax": probabilities)

Id 0 is padding in every input (`keras_birnn.tagging.encoder.TokenEncoder`
gives such ids): the word mask (word id != 0) reaches the recurrence, the
CRF and the loss. Written in `keras.ops`: the model runs, trains and saves
on TensorFlow, JAX and PyTorch.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.layers.bidirectional import Bidirectional
from keras_birnn.cells import GRUCell, LSTMCell
from keras_birnn.crf.layer import CRF, ALLOWED_TRANSITIONS
from keras_birnn.crf.schemes import split_tag
from keras_birnn.layers.nested import NestedEncoder
from keras_birnn.layers.pooling import MaskedMaxPooling
from keras_birnn.layers.stacking import stacked_bidirectional

HEADS = ("crf", "softmax")
CHAR_ENCODERS = (None, "gru", "lstm", "cnn")
CELLS = {"gru": GRUCell, "lstm": LSTMCell}
RESERVED_INPUTS = ("words", "chars")


@keras_birnn_export("keras_birnn.tagging.CharCNN")
class CharCNN(keras.layers.Layer):
    """Each word's embedded characters to one vector: a convolution, then the maximum.

    `Conv1D(filters, width, padding="same", activation="tanh")` over each
    word's characters, then the maximum over its valid characters
    (`kb.MaskedMaxPooling`): Ma and Hovy 2016's character CNN. Masked
    characters are zeroed first, as the convolution's own padding, so a
    word's vector does not depend on how far it is padded; a word with no
    valid character gives zeros. The output mask marks the words with at
    least one valid character.

    Args:
        filters: Output width (convolution filters).
        width: The convolution's window, in characters.
        **kwargs: Base layer arguments.

    Call arguments:
        inputs: Float `[batch, words, chars, dim]`.
        mask: Optional bool `[batch, words, chars]` (from an
            `Embedding(mask_zero=True)` on character ids).

    Example:

    >>> from keras_birnn.tagging.builder import CharCNN
    >>> chars = np.array([[[3, 4, 0], [5, 0, 0]]])              # [batch, words, chars]
    >>> embedded = keras.layers.Embedding(8, 4, mask_zero=True)(chars)
    >>> tuple(CharCNN(6)(embedded).shape)
    (1, 2, 6)
    """

    def __init__(self, filters: int, width: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.filters = _positive("filters", filters)
        self.width = _positive("width", width)
        self.conv = keras.layers.Conv1D(self.filters, self.width, padding="same", activation="tanh", name="conv")
        self.pool = MaskedMaxPooling(name="max")
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                f"Layer {self.name!r} expects inputs [batch, words, chars, dim] with a known dim, "
                f"received shape {tuple(input_shape)}."
            )
        self.conv.build((None, None, input_shape[-1]))

    def call(self, inputs, mask=None):
        shape = ops.shape(inputs)
        flat = ops.reshape(inputs, (-1, shape[2], inputs.shape[-1]))  # one row per word
        flat_mask = ops.ones(ops.shape(flat)[:2], "bool") if mask is None else ops.reshape(mask, (-1, shape[2]))
        flat = ops.where(flat_mask[..., None], flat, ops.zeros_like(flat))
        pooled = self.pool(self.conv(flat), mask=flat_mask)
        return ops.reshape(pooled, (shape[0], shape[1], self.filters))

    def compute_mask(self, inputs, mask=None):
        return None if mask is None else ops.any(mask, axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:2]) + (self.filters,)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(filters=self.filters, width=self.width)
        return config


# --- argument checks ---------------------------------------------------------


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be a positive int, received {value!r}.")
    if value < 1:
        raise ValueError(f"`{name}` must be a positive int, received {value!r}.")
    return int(value)


def _choice(name: str, value, choices: Sequence) -> Any:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {tuple(choices)}, received {value!r}.")
    return value


def _check_tags(tags) -> List[str]:
    if isinstance(tags, (str, bytes)) or not all(isinstance(t, str) for t in tags):
        raise TypeError(f"`tags` must be a list of tag names (strings), received {tags!r}.")
    tags = list(tags)
    if len(tags) < 2 or len(set(tags)) != len(tags):
        raise ValueError(f"`tags` must hold at least 2 distinct names, received {tags!r}.")
    return tags


def _check_embeddings(num_words: int, embedding_dim, embeddings) -> Tuple[int, Optional[np.ndarray]]:
    """(the word vectors' size, the pretrained matrix or None)."""
    if embeddings is None:
        if embedding_dim is None:
            raise ValueError("Pass `embedding_dim` (trained word vectors) or `embeddings` (a matrix), received neither.")
        return _positive("embedding_dim", embedding_dim), None
    matrix = np.asarray(embeddings)
    if matrix.ndim != 2 or matrix.shape[0] != num_words or not np.issubdtype(matrix.dtype, np.floating):
        raise ValueError(
            f"`embeddings` must be a float matrix [num_words={num_words}, dim], received "
            f"shape {matrix.shape} and dtype {matrix.dtype}."
        )
    if embedding_dim is not None and embedding_dim != matrix.shape[1]:
        raise ValueError(f"`embedding_dim`={embedding_dim!r} differs from the width of `embeddings`, {matrix.shape[1]}.")
    return int(matrix.shape[1]), matrix


def _check_features(features) -> Dict[str, int]:
    if features is None:
        return {}
    if not isinstance(features, Mapping):
        raise TypeError(f"`features` must map input names to id counts, e.g. {{'pos': 20}}, received {features!r}.")
    for name in features:
        if not isinstance(name, str) or not name or name in RESERVED_INPUTS:
            raise ValueError(f"`features` names must be strings other than {RESERVED_INPUTS}, received {name!r}.")
    return {name: _positive(f"features[{name!r}]", count) for name, count in features.items()}


def _rate(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ValueError(f"`{name}` must be a float in [0, 1), received {value!r}.")
    return float(value)


def is_iob2(tags: Sequence[str]) -> bool:
    """Whether every tag is `O`, `B-<type>` or `I-<type>` (what "iob2" constrains)."""
    return all(split_tag(t, "iob2") for t in tags)


def _auto_scheme(tags: Sequence[str]) -> Optional[str]:
    """`"bioes"` for tag names with E- or S- tags, `"iob2"` for O/B-/I- names,
    else None. Tag names cannot tell IOB1 from IOB2: IOB1 data (a chunk may
    start with I-X) must say so."""
    if is_iob2(tags):
        return "iob2"
    return "bioes" if all(split_tag(t, "bioes") for t in tags) else None


def _transitions(head: str, allowed_transitions, tags: List[str]) -> Optional[str]:
    """kb.CRF's `allowed_transitions` from `"auto"`, None or a scheme."""
    _choice("allowed_transitions", allowed_transitions, ("auto",) + ALLOWED_TRANSITIONS)
    if head == "softmax":
        if allowed_transitions not in ("auto", None):
            raise ValueError(
                f"allowed_transitions={allowed_transitions!r} constrains a CRF; head='softmax' has none "
                "(pass head='crf', or allowed_transitions=None)."
            )
        return None
    if allowed_transitions == "auto":
        return _auto_scheme(tags)
    return allowed_transitions


# --- the model ---------------------------------------------------------------


def _word_vectors(num_words: int, dim: int, matrix, trainable: bool):
    """The `words` input and its embedded vectors (masked: id 0 is padding)."""
    words = keras.Input((None,), dtype="int32", name="words")
    layer = keras.layers.Embedding(num_words, dim, mask_zero=True, trainable=trainable, name="word_embedding")
    vectors = layer(words)
    if matrix is not None:  # assigned, not an initializer: a config never holds the matrix
        layer.embeddings.assign(matrix.astype(layer.embeddings.dtype))
    return words, vectors


def _char_vectors(kind: str, num_chars: int, char_dim: int, char_units: int, char_width: int):
    """The `chars` input and one vector per word (`2 * char_units` wide)."""
    chars = keras.Input((None, None), dtype="int32", name="chars")
    embedded = keras.layers.Embedding(num_chars, char_dim, mask_zero=True, name="char_embedding")(chars)
    if kind == "cnn":
        encoder = CharCNN(2 * char_units, char_width, name="char_encoder")
    else:
        encoder = NestedEncoder(Bidirectional(CELLS[kind](char_units), name=f"char_bi{kind}"), name="char_encoder")
    return chars, encoder(embedded)


def _head(x, tags: List[str], head: str, transitions: Optional[str]):
    if head == "softmax":
        return keras.layers.Dense(len(tags), activation="softmax", name="tags")(x)
    emissions = keras.layers.Dense(len(tags), name="emissions")(x)
    return CRF(len(tags), tags=tags, allowed_transitions=transitions, name="crf")(emissions)


def build_tagger(
    num_words: int,
    tags: Sequence[str],
    *,
    embedding_dim: Optional[int] = None,
    embeddings: Optional[np.ndarray] = None,
    trainable_embeddings: bool = True,
    char_encoder: Optional[str] = None,
    num_chars: Optional[int] = None,
    char_dim: int = 32,
    char_units: int = 32,
    char_width: int = 3,
    features: Optional[Mapping[str, int]] = None,
    feature_dim: int = 16,
    hidden: int = 128,
    depth: int = 1,
    cell: str = "lstm",
    dropout: float = 0.0,
    head: str = "crf",
    allowed_transitions: Optional[str] = "auto",
    name: str = "tagger",
) -> keras.Model:
    """Builds a BiLSTM-CRF (or softmax) sequence tagger, a plain `keras.Model`.

    Inputs, by name and in this order (id 0 = padding in each): `words`
    int32 `[batch, time]`; `chars` int32 `[batch, time, chars]` with a
    `char_encoder`; then one int32 `[batch, time]` input per `features`
    entry. Output: with `head="crf"`, the Viterbi tag ids, int32 `[batch,
    time]` (0 at padding; `kb.CRF`); with `head="softmax"`, tag
    probabilities `[batch, time, len(tags)]`. Tag id k is `tags[k]`.

    To train (labels: int tag ids `[batch, time]`, anything at padding):

        model.compile("adam", loss=kb.CRFLoss())                        # head="crf"
        model.compile("adam", loss="sparse_categorical_crossentropy")   # head="softmax"

    Both losses read the word mask, so padding costs nothing.

    Args:
        num_words: Word ids (padding and OOV included), e.g.
            `TokenEncoder.word_count`.
        tags: The tag names, at least 2 distinct strings.
        embedding_dim: Size of trained word vectors; not needed with
            `embeddings`.
        embeddings: Optional pretrained word vectors, a float matrix
            `[num_words, dim]` (row k: word id k), assigned to the
            embedding (not kept in the config; saved with the weights).
        trainable_embeddings: Whether the word vectors train.
        char_encoder: None (no `chars` input), `"gru"` or `"lstm"` (a
            `kb.Bidirectional` over each word's characters run by
            `kb.NestedEncoder`, final states concatenated) or `"cnn"`
            (`CharCNN` with `2 * char_units` filters).
        num_chars: Character ids (padding and OOV included), e.g.
            `TokenEncoder.char_count`; needed with `char_encoder`.
        char_dim: Character embedding size.
        char_units: Character encoder units per direction.
        char_width: The CNN's window, in characters.
        features: Optional `{input name: id count}`: extra categorical
            inputs (POS tags, gazetteer flags...), each embedded in
            `feature_dim` and concatenated to the word vector.
        feature_dim: Embedding size of each feature.
        hidden: Units per direction of each sentence-level layer.
        depth: Number of stacked bidirectional layers (`kb.stacked_bidirectional`).
        cell: `"lstm"` or `"gru"`, the sentence-level cell.
        dropout: Rate on the word vectors, between stacked layers and on
            the top layer's outputs (0.3 to 0.5 is usual for taggers).
        head: `"crf"` or `"softmax"`.
        allowed_transitions: For the CRF: None, `"iob2"`, `"iob1"`,
            `"bioes"` (`kb.CRF`'s schemes), or `"auto"`: `"bioes"` when the
            tags use `E-X`/`S-X`, `"iob2"` when every tag is `O`, `B-X` or
            `I-X`, else None. Tag names cannot tell IOB1 from IOB2: for IOB1
            data (a chunk may start with `I-X`) pass `"iob1"`, or convert the
            tags with `kb.tagging.convert_tags` first.
        name: The model's name.

    Returns:
        The uncompiled `keras.Model`.

    Example:

    >>> from keras_birnn.tagging.builder import build_tagger
    >>> model = build_tagger(50, ["O", "B-PER", "I-PER"], embedding_dim=16,
    ...                      char_encoder="lstm", num_chars=30, char_units=8, hidden=16)
    >>> model.compile("adam", loss=kb.CRFLoss())
    >>> words = np.array([[5, 9, 2, 0], [7, 3, 0, 0]])             # 0: padding
    >>> chars = np.where(words[..., None] > 0, np.array([4, 6, 0]), 0)
    >>> labels = np.array([[1, 2, 0, 0], [0, 1, 0, 0]])
    >>> history = model.fit([words, chars], labels, epochs=2, verbose=0)
    >>> model.predict([words, chars], verbose=0).shape
    (2, 4)
    """
    tags = _check_tags(tags)
    _positive("num_words", num_words)
    dim, matrix = _check_embeddings(num_words, embedding_dim, embeddings)
    _choice("char_encoder", char_encoder, CHAR_ENCODERS)
    _choice("cell", cell, tuple(CELLS))
    _choice("head", head, HEADS)
    if char_encoder is not None:
        _positive("num_chars", num_chars)
        _positive("char_dim", char_dim), _positive("char_units", char_units), _positive("char_width", char_width)
    features, dropout = _check_features(features), _rate("dropout", dropout)
    _positive("feature_dim", feature_dim), _positive("hidden", hidden), _positive("depth", depth)
    transitions = _transitions(head, allowed_transitions, tags)

    words, vectors = _word_vectors(num_words, dim, matrix, bool(trainable_embeddings))
    inputs, parts = [words], [vectors]
    if char_encoder is not None:
        chars, spelled = _char_vectors(char_encoder, num_chars, char_dim, char_units, char_width)
        inputs.append(chars), parts.append(spelled)
    for key, count in features.items():
        inputs.append(keras.Input((None,), dtype="int32", name=key))
        parts.append(keras.layers.Embedding(count, feature_dim, mask_zero=True, name=f"{key}_embedding")(inputs[-1]))
    # Every part is masked (Concatenate's mask is any part's: an unmasked
    # part would mark the padding valid).
    x = keras.layers.Concatenate(name="word_features")(parts) if len(parts) > 1 else parts[0]
    x = keras.layers.Dropout(dropout, name="input_dropout")(x)
    x = stacked_bidirectional(cell, units=(hidden,) * depth, dropout=dropout, name="encoder")(x)
    x = keras.layers.Dropout(dropout, name="output_dropout")(x)
    return keras.Model(inputs if len(inputs) > 1 else words, _head(x, tags, head, transitions), name=name)
