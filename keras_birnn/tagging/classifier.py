"""`SentenceClassifier`: a sentence classifier as one Keras model, strings in and out.

A `keras.Model` that holds a `TokenEncoder` (its word ids), its label
names and a network:

    words [B, T] ids -> Embedding(mask_zero=True) -> kb.Bidirectional(cell,
    return_sequences=True) -> kb.MaskedMaxPooling / kb.AttentionPooling /
    kb.MaskedMeanPooling -> Dropout -> Dense(len(labels), softmax)

    classifier = kb.tagging.SentenceClassifier.from_texts(texts, labels, pooling="attention")
    classifier.fit(texts, labels, epochs=5)
    classifier.predict(["a gripping film"])[0].label
    classifier.save("polarity.keras"); classifier.export("saved_models/polarity")

Texts are split on whitespace by `tf.strings.split` (the same op in
`predict` and in the exported graph); a text may also be given as a token
list. Runs on every Keras backend (TensorFlow installed for the strings);
`export` needs the TensorFlow backend.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence, Union

import keras
import numpy as np

from keras_birnn import backend
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.config import for_export
from keras_birnn.cells import GRUCell, LSTMCell
from keras_birnn.layers.bidirectional import Bidirectional
from keras_birnn.layers.pooling import AttentionPooling, MaskedMaxPooling, MaskedMeanPooling
from keras_birnn.tagging.batching import (
    DEFAULT_BATCH_SIZE,
    LENGTH_MULTIPLE,
    EncodedSentences,
    bucket_batches,
    drop_words,
    encode_sentences,
    pad_batch,
)
from keras_birnn.tagging.encoder import TokenEncoder
from keras_birnn.tagging.export import claim_version
from keras_birnn.tagging.task import StringTaskModel

POOLINGS = {"max": MaskedMaxPooling, "mean": MaskedMeanPooling, "attention": AttentionPooling}
CELLS = {"lstm": LSTMCell, "gru": GRUCell}
Text = Union[str, Sequence[str]]


class Classified(NamedTuple):
    """One text's prediction: the label, its probability, and every label's."""

    label: str
    probability: float
    probabilities: Dict[str, float]


def tokenize(texts: Sequence[Text]) -> List[List[str]]:
    """Texts split on whitespace by `tf.strings.split` (token lists kept).

    Example:

    >>> from keras_birnn.tagging.classifier import tokenize
    >>> tokenize(["a  good film", ["as", "is"]])
    [['a', 'good', 'film'], ['as', 'is']]
    """
    import tensorflow as tf  # the exported graph splits with the same op

    if isinstance(texts, str):
        raise TypeError("Expected a list of texts, received one string: wrap it in a list.")
    strings = [i for i, t in enumerate(texts) if isinstance(t, str)]
    split = tf.strings.split(tf.constant([texts[i] for i in strings], tf.string)).to_list() if strings else []
    out = [list(t) if not isinstance(t, str) else None for t in texts]
    for i, tokens in zip(strings, split):
        out[i] = [token.decode("utf-8") for token in tokens]
    return out


def build_classifier(num_words: int, num_labels: int, *, embedding_dim: int = 64, hidden: int = 64,
                     cell: str = "lstm", pooling: str = "max", attention_units: int = 32,
                     dropout: float = 0.0, name: str = "classifier") -> keras.Model:
    """Word ids `[batch, time]` (0 = padding) to label probabilities `[batch, num_labels]`.

    Args:
        num_words: Word ids (padding and OOV included).
        num_labels: Number of labels (>= 2).
        embedding_dim: Word vector size.
        hidden: Units per direction of the `kb.Bidirectional` layer.
        cell: `"lstm"` or `"gru"`.
        pooling: `"max"` (`kb.MaskedMaxPooling`), `"mean"` or `"attention"`
            (`kb.AttentionPooling(attention_units)`).
        attention_units: The attention's hidden width.
        dropout: Dropout on the pooled vector.
        name: The model's name.

    Returns:
        A functional `keras.Model` with input `words`.
    """
    if pooling not in POOLINGS or cell not in CELLS:
        raise ValueError(f"`pooling` must be one of {tuple(POOLINGS)} and `cell` one of {tuple(CELLS)}, "
                         f"received {pooling!r} and {cell!r}.")
    if num_labels < 2:
        raise ValueError(f"A classifier needs at least 2 labels, received {num_labels}.")
    words = keras.Input((None,), dtype="int32", name="words")
    x = keras.layers.Embedding(num_words, embedding_dim, mask_zero=True, name="word_embedding")(words)
    x = Bidirectional(CELLS[cell](hidden), return_sequences=True, name="encoder")(x)
    x = (AttentionPooling(attention_units, name="pooling") if pooling == "attention"
         else POOLINGS[pooling](name="pooling"))(x)
    x = keras.layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(words, keras.layers.Dense(num_labels, activation="softmax", name="labels")(x), name=name)


@keras_birnn_export("keras_birnn.tagging.SentenceClassifier")
class SentenceClassifier(StringTaskModel):
    """A sentence classifier: a `TokenEncoder`, label names and a network.

    Args:
        encoder: The `TokenEncoder` whose word ids the network reads.
        network: A model from word ids `[batch, time]` to label
            probabilities `[batch, len(labels)]` (`build_classifier`).
        labels: The label names; label id k is `labels[k]`.
        **kwargs: `keras.Model` arguments (`name`).

    Example:

    >>> from keras_birnn.tagging.classifier import SentenceClassifier
    >>> texts, labels = ["a fine film", "a dull film"], ["pos", "neg"]
    >>> model = SentenceClassifier.from_texts(texts, labels, embedding_dim=8, hidden=4)
    >>> history = model.fit(texts, labels, epochs=1, verbose=0)
    >>> model.predict(["fine"])[0].label in ("pos", "neg")
    True
    """

    def __init__(self, encoder: TokenEncoder, network: keras.Model, labels: Sequence[str], **kwargs):
        super().__init__(**kwargs)
        labels = list(labels)
        if not all(isinstance(k, str) for k in labels) or len(set(labels)) != len(labels):
            raise ValueError(f"`labels` must be distinct strings, received {labels!r}.")
        if network.outputs[0].shape[-1] != len(labels):
            raise ValueError(f"The network gives {network.outputs[0].shape[-1]} probabilities for "
                             f"{len(labels)} labels.")
        self.encoder, self.network = encoder, network
        self._labels = tuple(labels)
        self.built = True

    @property
    def labels(self) -> tuple:
        """The label names; label id k is `labels[k]`."""
        return self._labels

    @classmethod
    def from_texts(cls, texts: Sequence[Text], labels: Sequence[str], *,
                   label_names: Optional[Sequence[str]] = None, encoder: Optional[TokenEncoder] = None,
                   name: str = "sentence_classifier", **build_kwargs) -> "SentenceClassifier":
        """A new, untrained classifier for this data.

        Args:
            texts: The training texts (or token lists); the encoder adapts on them.
            labels: Their labels.
            label_names: The labels in id order; default the sorted labels.
            encoder: A `TokenEncoder`, adapted on `texts` unless it has
                vocabularies; default `TokenEncoder(max_chars=1)` (words only).
            name: The model's name.
            **build_kwargs: `build_classifier`'s keyword arguments.

        Returns:
            A `SentenceClassifier`.
        """
        names = sorted(set(labels)) if label_names is None else list(label_names)
        label_ids(labels, names)
        encoder = TokenEncoder(max_chars=1) if encoder is None else encoder
        try:
            encoder.word_count
        except ValueError:
            encoder.adapt(tokenize(texts))
        network = build_classifier(encoder.word_count, len(names), **build_kwargs)
        return cls(encoder, network, names, name=name)

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    def compile(self, optimizer="adam", loss="sparse_categorical_crossentropy", metrics="auto", **kwargs) -> None:
        """Keras's `compile`, with the sparse cross-entropy and accuracy by default."""
        metrics = ["sparse_categorical_accuracy"] if metrics == "auto" else metrics
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def encode(self, x, y=None) -> EncodedSentences:
        """Texts (and their labels, as ids) encoded once."""
        return encode_sentences(self.encoder, tokenize(x), None if y is None else label_ids(y, self.labels))

    def training_batch(self, encoded: EncodedSentences, indices, rng, word_dropout: float = 0.0) -> tuple:
        """(word ids, label ids) of some texts; word dropout with `rng`."""
        words = drop_words(pad_batch(encoded, indices, False, LENGTH_MULTIPLE), word_dropout, rng)
        return words, np.array([encoded.labels[i] for i in indices], np.int32)

    def text_dataset(self, texts: Sequence[Text], labels: Sequence[str], batch_size: int = DEFAULT_BATCH_SIZE,
                     word_dropout: float = 0.0, shuffle: bool = True, seed: Optional[int] = None):
        """Texts and labels as a `tf.data.Dataset` of `(word ids, label ids)`
        (`strings_dataset`): length-bucketed, with word dropout when shuffling."""
        return self.strings_dataset(texts, labels, batch_size, word_dropout, shuffle=shuffle, seed=seed)

    def takes_strings(self, x) -> bool:
        return is_texts(x)

    def probabilities(self, texts: Sequence[Text], batch_size: Optional[int] = None) -> np.ndarray:
        """Label probabilities `[len(texts), len(labels)]`, in order."""
        encoded = encode_sentences(self.encoder, tokenize(texts))
        out = np.zeros((len(texts), len(self.labels)), np.float32)
        for group in bucket_batches(encoded.lengths, batch_size or DEFAULT_BATCH_SIZE):
            # Compiled (jax.jit, tf.function), for few shapes: run eagerly, JAX compiles each op per batch shape.
            out[group] = self.network.predict_on_batch(pad_batch(encoded, group, False, LENGTH_MULTIPLE))
        return out

    def predict(self, x, batch_size: Optional[int] = None, verbose="auto", steps=None, callbacks=None):
        """Classifies texts (or, given anything else, Keras's `predict`).

        Returns:
            With texts, a `Classified(label, probability, probabilities)` per text.
        """
        if not is_texts(x):
            return super().predict(x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks)
        found = self.probabilities(x, batch_size)
        return [Classified(self.labels[int(np.argmax(p))], float(np.max(p)),
                           dict(zip(self.labels, map(float, p)))) for p in found]

    def evaluate(self, x=None, y=None, batch_size: Optional[int] = None, verbose="auto", **kwargs):
        """With texts and labels, `{"accuracy": ...}`; else Keras's `evaluate`."""
        if not is_texts(x):
            return super().evaluate(x, y, batch_size=batch_size, verbose=verbose, **kwargs)
        gold = label_ids(y, self.labels)
        if len(gold) != len(x):
            raise ValueError(f"Received {len(x)} texts and {len(gold)} labels.")
        predicted = self.probabilities(x, batch_size).argmax(-1)
        return {"accuracy": float(np.mean(predicted == np.asarray(gold))) if gold else 0.0}

    def export(self, path: str, version: Optional[int] = None, overwrite: bool = False,
               verbose: bool = False) -> str:
        """Exports a SavedModel for TF Serving: `path/<version>/`, strings in and out.

        Signature `serving_default(inputs: string [batch])` (whole texts,
        split on whitespace in the graph) -> `label` (string `[batch]`) and
        `probabilities` (float32 `[batch, len(labels)]`), what `predict` gives.

        Arguments and the folder returned: as `Tagger.export` (the next free
        version unless `version` is given; an existing one is replaced only
        with `overwrite=True`).
        """
        if not backend.IS_TENSORFLOW:
            raise backend.tensorflow_only_error("keras_birnn.tagging.SentenceClassifier.export", "export it")
        import tensorflow as tf

        from keras_birnn.export.saved_model import SIGNATURE_DEFAULT, write_version

        version = claim_version(path, version, overwrite)
        serving = ClassifierServing(self.network, self.encoder, self.labels, name="serving_classifier")
        archive = keras.export.ExportArchive()
        archive.track(serving)
        # The recurrence traces as a plain While loop, forward only: serving needs no XLA.
        with for_export():
            archive.add_endpoint(SIGNATURE_DEFAULT, lambda inputs: serving(inputs, training=False),
                                 input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
            folder = write_version(archive, path, version)  # staged, its ops checked, then renamed
        if verbose:
            print(f"Exported SavedModel to {folder}: {SIGNATURE_DEFAULT}(inputs: string [batch])")
        return folder

    def names_config(self) -> dict:
        return {"labels": list(self.labels)}


class ClassifierServing(keras.Model):
    """Texts `[batch]` in, `label` and `probabilities` out (the exported call; TensorFlow)."""

    def __init__(self, network: keras.Model, encoder: TokenEncoder, labels: Sequence[str], **kwargs):
        super().__init__(**kwargs)
        self.network, self.encoder, self.label_names = network, encoder, tuple(labels)
        self.built = True

    def call(self, texts, training=False):
        import tensorflow as tf

        tokens = tf.strings.split(texts).to_tensor(default_value="")
        tokens = tf.pad(tokens, [[0, 0], [0, 1]])  # at least one column (an empty text is all padding)
        word_ids, _ = self.encoder(tokens)
        probabilities = tf.cast(self.network(word_ids, training=False), tf.float32)
        label = tf.gather(tf.constant(self.label_names), tf.argmax(probabilities, axis=-1))
        return {"label": label, "probabilities": probabilities}


def is_texts(x) -> bool:
    """Whether `x` is a list of texts (strings) or of token lists."""
    if not isinstance(x, (list, tuple)) or not x:
        return False
    first = x[0]
    return isinstance(first, str) or (isinstance(first, (list, tuple)) and all(isinstance(t, str) for t in first))


def label_ids(labels: Sequence[str], names: Sequence[str]) -> List[int]:
    """Label names to ids; raises ValueError naming a label not in `names`."""
    index = {name: i for i, name in enumerate(names)}
    unknown = [k for k in labels if k not in index]
    if unknown:
        raise ValueError(f"The label {unknown[0]!r} is not one the model knows; its labels are {list(names)}.")
    return [index[k] for k in labels]
