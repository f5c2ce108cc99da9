"""`Tagger`: a sequence tagger as one Keras model, strings in and out.

A `keras.Model` that holds its `TokenEncoder`, its tag names and the
network `build_tagger` builds (CRF or softmax head), in the style of
keras-hub's task models:

    tagger = kb.tagging.Tagger.from_sentences(tokens, tags, embedding_dim=50, hidden=64)
    tagger.fit(tokens, tags, epochs=5, word_dropout=0.05)
    tagger.predict([["Ada", "met", "Alan"]])[0].tags      # ['B-PER', 'O', 'B-PER']
    tagger.evaluate(dev_tokens, dev_tags)["f1"]
    tagger.save("ner.keras")                                 # one file: vocabularies, tags, weights
    tagger.export("saved_models/ner")                        # TF Serving, strings in and out

`fit`, `predict` and `evaluate` take lists of token lists (and tag lists)
and do the rest: ids, length-bucketed batches (`keras_birnn.tagging.batching`),
word dropout, the masked loss. Given anything else (a `tf.data.Dataset` of
model inputs, id arrays) they are Keras's own. The model's inputs are word
ids `[batch, time]` and, with a character encoder, character ids `[batch,
time, chars]`; its output is the network's (CRF tag ids or softmax
probabilities). Runs on every Keras backend (the encoder needs TensorFlow
installed); `export` needs the TensorFlow backend.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from keras_birnn import backend
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.crf import CRFLoss
from keras_birnn.tagging.batching import (DEFAULT_BATCH_SIZE, LENGTH_MULTIPLE, EncodedSentences, bucket_batches,
                                          drop_words, encode_sentences, pad_batch, pad_labels)
from keras_birnn.tagging.builder import build_tagger
from keras_birnn.tagging.encoder import PAD_ID, TokenEncoder
from keras_birnn.tagging.export import check_tagger_model, claim_version, crf_head, export_tagger
from keras_birnn.tagging.spans import span_scores, tag_parts
from keras_birnn.tagging.task import StringTaskModel

SCHEMES = ("iob2", "bioes")  # tried in this order by `span_scheme`


class TaggedSentence(NamedTuple):
    """One sentence's prediction.

    `tags`: a tag name per token. `confidence`: per token, the CRF's
    marginal probability of the chosen tag (softmax head: its probability).
    `paths`: with `predict(..., top_k=k)` on a CRF tagger, the k best tag
    sequences and their probabilities, best first (else None).
    """

    tags: List[str]
    confidence: List[float]
    paths: Optional[List[Tuple[List[str], float]]] = None


class Untracked:
    """Holds a model out of Keras's tracking (a plain object: Keras tracks
    layers, variables, lists and dicts set on a layer, not this)."""

    def __init__(self):
        self.model: Optional[keras.Model] = None


def span_scheme(tags: Sequence[str]) -> Optional[str]:
    """`"iob2"` when every tag is `O`, `B-X` or `I-X` (IOB1 reads the same
    spans), `"bioes"` when `E-X`/`S-X` also occur, else None (e.g. UPOS)."""
    for scheme in SCHEMES:
        try:
            [tag_parts(tag, scheme) for tag in tags]
        except ValueError:
            continue
        return scheme
    return None


def is_token_lists(x) -> bool:
    """Whether `x` is a list (or tuple) of token lists: the strings path."""
    if not isinstance(x, (list, tuple)) or not x:
        return False
    first = x[0]
    return isinstance(first, (list, tuple)) and all(isinstance(t, str) for t in first)


def tag_ids(sentence_tags: Sequence[Sequence[str]], tags: Sequence[str]) -> List[np.ndarray]:
    """Tag names to ids; raises ValueError naming a tag not in `tags`."""
    index = {tag: i for i, tag in enumerate(tags)}
    out = []
    for row, names in enumerate(sentence_tags):
        unknown = [t for t in names if t not in index]
        if unknown:
            raise ValueError(f"Sentence {row} has the tag {unknown[0]!r}, which the model does not know; "
                             f"its tags are {list(tags)}.")
        out.append(np.array([index[t] for t in names], np.int32))
    return out


def score_tags(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]],
               scheme: Optional[str]) -> Dict[str, Any]:
    """Token accuracy, and with a span `scheme` conlleval's span scores
    (`precision`, `recall`, `f1`, counts and `types`: per type)."""
    pairs = [(g, p) for gs, ps in zip(gold, predicted) for g, p in zip(gs, ps)]
    scores: Dict[str, Any] = {"accuracy": sum(g == p for g, p in pairs) / max(len(pairs), 1)}
    if scheme is not None:
        scores.update(span_scores(gold, predicted, scheme).as_dict())
    return scores


def has_vocabularies(encoder: TokenEncoder) -> bool:
    """Whether a `TokenEncoder` has its vocabularies (adapted or given)."""
    try:
        encoder.word_count
    except ValueError:
        return False
    return True


def check_lengths(sentences: Sequence[Sequence[str]], sentence_tags: Sequence[Sequence[str]]) -> None:
    """Raises unless there is one tag list per sentence, one tag per token."""
    if len(sentences) != len(sentence_tags):
        raise ValueError(f"Received {len(sentences)} sentences and {len(sentence_tags)} tag lists.")
    for row, (tokens, names) in enumerate(zip(sentences, sentence_tags)):
        if len(tokens) != len(names):
            raise ValueError(f"Sentence {row} has {len(tokens)} tokens and {len(names)} tags.")


@keras_birnn_export("keras_birnn.tagging.Tagger")
class Tagger(StringTaskModel):
    """A sequence tagger: a `TokenEncoder`, tag names and a `build_tagger` network.

    Args:
        encoder: The `TokenEncoder` whose ids the network reads (with
            vocabularies).
        network: A `build_tagger` model: inputs `words` and optionally
            `chars` (no `features`), a CRF or softmax head.
        tags: The tag names; tag id k is `tags[k]`.
        scheme: How `evaluate` reads spans: `"auto"` (`span_scheme`:
            `"iob2"`, `"bioes"` or None), `"iob1"`, `"iob2"`, `"bioes"`, or
            None (token accuracy only).
        **kwargs: `keras.Model` arguments (`name`).

    Example:

    >>> from keras_birnn.tagging.tagger import Tagger
    >>> tokens = [["Ada", "met", "Alan"], ["Alan", "slept"]]
    >>> tags = [["B-PER", "O", "B-PER"], ["B-PER", "O"]]
    >>> tagger = Tagger.from_sentences(tokens, tags, embedding_dim=8, hidden=8)
    >>> tagger.tags
    ('B-PER', 'O')
    >>> history = tagger.fit(tokens, tags, epochs=1, verbose=0)
    >>> len(tagger.predict([["Ada", "slept"]])[0].tags)
    2
    """

    def __init__(self, encoder: TokenEncoder, network: keras.Model, tags: Sequence[str],
                 scheme: Optional[str] = "auto", **kwargs):
        super().__init__(**kwargs)
        check_tagger_model(network, encoder, tags)
        if not has_vocabularies(encoder):
            raise ValueError("The tagger's encoder has no vocabularies: adapt it first (or use Tagger.from_sentences).")
        if scheme not in ("auto", None, "iob1") + SCHEMES:
            raise ValueError(f"`scheme` must be 'auto', None, 'iob1', 'iob2' or 'bioes', received {scheme!r}.")
        self.encoder, self.network = encoder, network
        self._tags = tuple(tags)
        self._scheme_argument = scheme
        self.scheme = span_scheme(self._tags) if scheme == "auto" else scheme
        self.with_chars = len(network.inputs) == 2
        self._scorers = Untracked()  # built on first use; shares the network's weights, so not saved again
        self.built = True

    @property
    def tags(self) -> Tuple[str, ...]:
        """The tag names; tag id k is `tags[k]`."""
        return self._tags

    @property
    def head(self) -> str:
        """`"crf"` or `"softmax"`."""
        return "crf" if crf_head(self.network) is not None else "softmax"

    @classmethod
    def from_sentences(cls, sentences: Sequence[Sequence[str]], sentence_tags: Sequence[Sequence[str]], *,
                       tags: Optional[Sequence[str]] = None, encoder: Optional[TokenEncoder] = None,
                       scheme: Optional[str] = "auto", name: str = "tagger", **build_kwargs) -> "Tagger":
        """A new, untrained tagger for this data.

        Args:
            sentences: The training token lists (the encoder adapts on them).
            sentence_tags: Their tags, one list per sentence.
            tags: The tag names in id order; default the sorted tags of
                `sentence_tags`.
            encoder: A `TokenEncoder`: used as it is when it has
                vocabularies, else adapted on `sentences`; default
                `TokenEncoder()`.
            scheme: As in `Tagger`.
            name: The model's name.
            **build_kwargs: `build_tagger`'s keyword arguments
                (`embedding_dim` defaults to 100 without `embeddings`;
                `num_chars` comes from the encoder).

        Returns:
            A `Tagger` (compile it, or let `fit` compile it with Adam).
        """
        check_lengths(sentences, sentence_tags)
        tags = sorted({t for names in sentence_tags for t in names}) if tags is None else list(tags)
        tag_ids(sentence_tags, tags)  # every tag of the data must be known
        if encoder is None:
            encoder = TokenEncoder()
        if not has_vocabularies(encoder):
            encoder.adapt([list(s) for s in sentences])
        if "features" in build_kwargs:
            raise ValueError("Tagger takes words and characters only: build it without `features`.")
        if build_kwargs.get("embeddings") is None:
            build_kwargs.setdefault("embedding_dim", 100)
        if build_kwargs.get("char_encoder") is not None:
            build_kwargs.setdefault("num_chars", encoder.char_count)
        network = build_tagger(encoder.word_count, tags, **build_kwargs)
        return cls(encoder, network, tags, scheme=scheme, name=name)

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    def compile(self, optimizer="adam", loss="auto", metrics=None, **kwargs) -> None:
        """Keras's `compile`; `loss="auto"`: `kb.CRFLoss()` for a CRF head, the
        sparse cross-entropy for a softmax head (both skip padding)."""
        if loss == "auto":
            loss = CRFLoss() if self.head == "crf" else "sparse_categorical_crossentropy"
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def compile_from_config(self, config: dict) -> None:
        """Compiles a loaded tagger as it was saved (`compile` is overridden)."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if getattr(self, "optimizer", None) is not None:
            self.optimizer.build(self.trainable_variables)  # so its saved state loads

    # --- strings to batches --------------------------------------------------

    def encode(self, x, y=None) -> EncodedSentences:
        """Token lists (and their tags, as ids) encoded once."""
        if y is None:
            return encode_sentences(self.encoder, x)
        check_lengths(x, y)
        return encode_sentences(self.encoder, x, tag_ids(y, self.tags))

    def training_batch(self, encoded: EncodedSentences, indices, rng, word_dropout: float = 0.0) -> tuple:
        """(inputs, tag ids[, weights]) of some sentences; word dropout with `rng`."""
        inputs = pad_batch(encoded, indices, self.with_chars, LENGTH_MULTIPLE)
        if self.with_chars:
            inputs = (drop_words(inputs[0], word_dropout, rng), inputs[1])
        else:
            inputs = drop_words(inputs, word_dropout, rng)
        labels, weights = pad_labels(encoded, indices, LENGTH_MULTIPLE)
        # The CRF's loss reads the mask; the cross-entropy also gets it as
        # weights (Keras's JAX backend hands a softmax output's mask to no loss).
        return (inputs, labels) if self.head == "crf" else (inputs, labels, weights)

    def sentence_dataset(self, sentences: Sequence[Sequence[str]], sentence_tags: Sequence[Sequence[str]],
                         batch_size: int = DEFAULT_BATCH_SIZE, word_dropout: float = 0.0,
                         shuffle: bool = True, seed: Optional[int] = None):
        """Token and tag lists as a `tf.data.Dataset` in model-input form:
        `strings_dataset`, whose batches are `(inputs, tag ids)` (CRF) or
        `(inputs, tag ids, weights)` (softmax), 0 at padding."""
        return self.strings_dataset(sentences, sentence_tags, batch_size, word_dropout, shuffle=shuffle, seed=seed)

    def takes_strings(self, x) -> bool:
        return is_token_lists(x)

    # --- predictions ---------------------------------------------------------

    def _scorer(self) -> keras.Model:
        """The network with its CRF's emissions as a second output (CRF head)."""
        if self._scorers.model is None:
            crf = crf_head(self.network)
            outputs = list(self.network.outputs) + ([crf.input] if crf is not None else [])
            self._scorers.model = keras.Model(self.network.input, outputs, name="scorer")
        return self._scorers.model

    def decode(self, inputs, top_k: Optional[int] = None) -> dict:
        """Tag ids, confidence (and top-k paths) of a batch of model inputs.

        Args:
            inputs: Word ids `[B, T]` (0 = padding), or `(words, chars)`.
            top_k: With a CRF head, also the k best paths.

        Returns:
            NumPy arrays: `tag_ids` int32 `[B, T]` (-1 at padding),
            `confidence` float32 `[B, T]` (0 at padding); with `top_k`,
            `paths` int32 `[B, k, T]` and `probabilities` `[B, k]`.
        """
        words = inputs[0] if self.with_chars else inputs
        valid = ops.not_equal(ops.convert_to_tensor(words), PAD_ID)
        # The CRF's input is [emissions, mask]: flattened, the emissions come second.
        outputs = keras.tree.flatten(self._scorer()(inputs, training=False))
        crf = crf_head(self.network)
        if crf is not None:
            ids, emissions = outputs[0], outputs[1]
            probabilities = crf.marginals(emissions, mask=valid)
        else:
            probabilities = outputs[0]
            ids = ops.argmax(probabilities, axis=-1)
        ids = ops.where(valid, ops.cast(ids, "int32"), 0)
        chosen = ops.take_along_axis(probabilities, ops.expand_dims(ids, -1), axis=-1)[..., 0]
        found = {"tag_ids": ops.where(valid, ids, -1), "confidence": ops.where(valid, chosen, 0.0)}
        if top_k is not None:
            if crf is None:
                raise ValueError("`top_k` needs a CRF head (the tagger's head is 'softmax').")
            paths, log_p = crf.top_k(emissions, mask=valid, k=top_k, log_probabilities=True)
            found.update(paths=paths, probabilities=ops.exp(log_p))
        return {key: ops.convert_to_numpy(value) for key, value in found.items()}

    def predict(self, x, batch_size: Optional[int] = None, verbose="auto", steps=None, callbacks=None, *,
                top_k: Optional[int] = None):
        """Tags token lists (or, given anything else, Keras's `predict`).

        Args:
            x: A list of token lists; or Keras's inputs (then the network's
                raw output comes back).
            batch_size: Sentences per batch (default 32).
            verbose, steps, callbacks: Keras's, for Keras's inputs.
            top_k: With a CRF head, also the `top_k` best paths.

        Returns:
            With token lists, a `TaggedSentence` per sentence, in order.
        """
        if not is_token_lists(x):
            if isinstance(x, (list, tuple)) and not x:
                return []
            return super().predict(x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks)
        encoded = encode_sentences(self.encoder, x)
        results: List[Optional[TaggedSentence]] = [None] * len(x)
        for group in bucket_batches(encoded.lengths, batch_size or DEFAULT_BATCH_SIZE):
            found = self.decode(pad_batch(encoded, group, self.with_chars), top_k)
            for row, i in enumerate(group):
                results[i] = self._sentence(found, row, len(encoded.words[i]))
        return results

    def _sentence(self, found: dict, row: int, length: int) -> TaggedSentence:
        names = [self.tags[k] for k in found["tag_ids"][row, :length]]
        confidence = [float(c) for c in found["confidence"][row, :length]]
        paths = None
        if "paths" in found:
            paths = [([self.tags[k] for k in path[:length]], float(p))
                     for path, p in zip(found["paths"][row], found["probabilities"][row]) if p > 0]
        return TaggedSentence(names, confidence, paths)

    def evaluate(self, x=None, y=None, batch_size: Optional[int] = None, verbose="auto", **kwargs):
        """Scores token lists against gold tags (or, given anything else, Keras's `evaluate`).

        Args:
            x: A list of token lists; or Keras's inputs.
            y: With token lists, the gold tags (each one of `self.tags`,
                else ValueError).
            batch_size: Sentences per batch.
            verbose, **kwargs: Keras's, for Keras's inputs.

        Returns:
            With token lists, a dict: `accuracy` (per token) and, when
            `self.scheme` is a span scheme, conlleval's `precision`,
            `recall`, `f1`, `gold`, `predicted`, `correct` and `types` (the
            same per type).
        """
        if not is_token_lists(x):
            return super().evaluate(x, y, batch_size=batch_size, verbose=verbose, **kwargs)
        check_lengths(x, y)
        tag_ids(y, self.tags)
        predicted = [p.tags for p in self.predict(x, batch_size=batch_size)]
        return score_tags(y, predicted, self.scheme)

    # --- files ----------------------------------------------------------------

    def export(self, path: str, version: Optional[int] = None, overwrite: bool = False,
               verbose: bool = False) -> str:
        """Exports a SavedModel for TF Serving: `path/<version>/`, strings in and out.

        Signature `serving_default(inputs: string [batch, time], "" =
        padding)` -> `tags` (string, "" at padding), `tag_ids` (int32, -1
        at padding), `confidence` (float32, 0 at padding), the values
        `predict` gives (`keras_birnn.tagging.export`).

        Args:
            path: The model's base folder.
            version: Positive int; default the next free integer.
            overwrite: Replace an existing version (with a warning);
                otherwise an existing one raises FileExistsError.
            verbose: Print where the export went.

        Returns:
            The version folder.
        """
        if not backend.IS_TENSORFLOW:
            raise backend.tensorflow_only_error("keras_birnn.tagging.Tagger.export", "export the tagger")
        version = claim_version(path, version, overwrite)
        return export_tagger(self.network, self.encoder, path, self.tags, version=version, overwrite=overwrite,
                             verbose=verbose)

    def names_config(self) -> dict:
        return {"tags": list(self.tags), "scheme": self._scheme_argument}
