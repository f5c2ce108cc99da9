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
ids `[batch, time]`, with a character encoder character ids `[batch,
time, chars]`, and one id input `[batch, time]` per feature column; its
output is the network's (CRF tag ids or softmax probabilities). Runs on
every Keras backend (the encoder needs TensorFlow installed); `export`
needs the TensorFlow backend.

Feature columns (a chunker that reads POS tags beside the words): the
strings are then a dict, the token lists under `"tokens"` and one list of
strings per token under each feature's name:

    x = {"tokens": [["He", "runs"]], "pos": [["PRP", "VBZ"]]}
    chunker = kb.tagging.Tagger.from_sentences(x, [["B-NP", "B-VP"]], embedding_dim=50)

`from_sentences` learns each feature's vocabulary (its sorted training
values; id 0 = "" = padding, id 1 = an unseen value, as
`keras.layers.StringLookup(mask_token="", num_oov_indices=1)`), which the
tagger keeps in its config, and its export encodes in the graph.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from keras_birnn import backend
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.crf import CRFLoss
from keras_birnn.losses import TokenCrossentropy
from keras_birnn.tagging.batching import (DEFAULT_BATCH_SIZE, LENGTH_MULTIPLE, EncodedSentences, bucket_batches,
                                          drop_words, encode_sentences, pad_batch, pad_labels)
from keras_birnn.tagging.builder import build_tagger
from keras_birnn.tagging.decoding import Decoder, valid_positions
from keras_birnn.tagging.encoder import OOV_ID, PAD_ID, TokenEncoder
from keras_birnn.tagging.export import (INPUTS_KEY, check_tagger_model, claim_version, crf_head, export_tagger,
                                        feature_inputs)
from keras_birnn.tagging.spans import SCHEMES, scored_spans, span_scheme, span_scores
from keras_birnn.tagging.task import StringTaskModel

TOKENS_KEY = "tokens"  # the token lists' key in the dict form of the strings


class TaggedSentence(NamedTuple):
    """One sentence's prediction.

    `tags`: a tag name per token. `confidence`: per token, the CRF's
    marginal probability of the chosen tag (softmax head: its probability).
    `paths`: with `predict(..., top_k=k)` on a CRF tagger, the k best tag
    sequences and their probabilities, best first (else None). `spans`:
    with a span scheme, the spans of `tags` read in the tagger's scheme,
    `(start, end, type, confidence)` (`end` exclusive; confidence: the mean
    of the span's tokens' `confidence`); `predict` gives `[]` without a
    span scheme, and a `TaggedSentence` built without spans has `()`.
    """

    tags: List[str]
    confidence: List[float]
    paths: Optional[List[Tuple[List[str], float]]] = None
    spans: Sequence[Tuple[int, int, str, float]] = ()


class Untracked:
    """Holds models out of Keras's tracking (a plain object: Keras tracks
    layers, variables, lists and dicts set on a layer, not this)."""

    def __init__(self):
        self.model: Optional[keras.Model] = None
        self.decoder: Optional[keras.Model] = None


def is_token_lists(x) -> bool:
    """Whether `x` is a list (or tuple) of token lists: the strings path."""
    if not isinstance(x, (list, tuple)) or not x:
        return False
    first = x[0]
    return isinstance(first, (list, tuple)) and all(isinstance(t, str) for t in first)


def is_string_input(x) -> bool:
    """Whether `x` is a tagger's strings: token lists, or the dict form
    (token lists under `"tokens"`, feature columns beside them)."""
    return is_token_lists(x) or (isinstance(x, Mapping) and TOKENS_KEY in x)


def split_columns(x, names: Sequence[str]) -> Tuple[list, Dict[str, list]]:
    """The token lists of `x` and its feature columns, checked against `names`.

    Args:
        x: Token lists, or `{"tokens": token lists, name: per-token string
            lists, ...}`.
        names: The features the tagger reads.

    Returns:
        `(token lists, {name: string lists})`, the features in `names`' order.

    Raises:
        ValueError: A feature of `names` is missing, one is not in `names`,
            or a feature's strings do not match the tokens in number.
    """
    if isinstance(x, Mapping):
        if TOKENS_KEY not in x:
            raise ValueError(f"The dict form of the strings holds the token lists under {TOKENS_KEY!r}, "
                             f"received the keys {sorted(x)}.")
        tokens, columns = list(x[TOKENS_KEY]), {k: list(v) for k, v in x.items() if k != TOKENS_KEY}
    else:
        tokens, columns = list(x), {}
    missing, extra = [n for n in names if n not in columns], [n for n in columns if n not in names]
    if missing:
        raise ValueError(f"The tagger reads the features {missing} beside the tokens: pass "
                         f"{{{TOKENS_KEY!r}: token lists, {missing[0]!r}: one string per token, ...}}.")
    if extra:
        known = f"the features {list(names)}" if names else "no features"
        raise ValueError(f"The tagger reads {known}, received the features {extra}.")
    for name in names:
        check_column(tokens, columns[name], name)
    return tokens, {name: columns[name] for name in names}


def check_column(tokens: Sequence[Sequence[str]], values: Sequence[Sequence[str]], name: str) -> None:
    """Raises unless `values` holds one string per token of each sentence."""
    if len(values) != len(tokens):
        raise ValueError(f"The feature {name!r} has {len(values)} sentences and the tokens {len(tokens)}.")
    for row, (words, column) in enumerate(zip(tokens, values)):
        if isinstance(column, (str, bytes)) or len(column) != len(words):
            size = "a string" if isinstance(column, (str, bytes)) else f"{len(column)} values"
            raise ValueError(f"The feature {name!r} of sentence {row} has {size} for {len(words)} tokens: "
                             "one string per token.")
        if not all(isinstance(v, str) for v in column):
            raise ValueError(f"The feature {name!r} of sentence {row} holds a value that is not a string.")


def learn_vocabularies(columns: Mapping[str, Sequence[Sequence[str]]]) -> Dict[str, List[str]]:
    """Each feature's vocabulary: its values, sorted, without "" (padding)."""
    return {name: sorted({v for values in column for v in values} - {""}) for name, column in columns.items()}


def feature_ids(column: Sequence[Sequence[str]], vocabulary: Sequence[str]) -> List[np.ndarray]:
    """A feature's strings as ids: "" -> 0, unseen -> 1, `vocabulary[k]` -> k + 2
    (`keras.layers.StringLookup(mask_token="", num_oov_indices=1)`'s ids)."""
    index = {value: k + 2 for k, value in enumerate(vocabulary)}
    index[""] = PAD_ID
    return [np.array([index.get(v, OOV_ID) for v in values], np.int32) for values in column]


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
        network: A `build_tagger` model: inputs `words`, optionally
            `chars`, and its `features`; a CRF or softmax head.
        tags: The tag names; tag id k is `tags[k]`.
        scheme: How `evaluate`, `predict`'s spans and the export read
            spans: `"auto"` (`span_scheme`: `"iob2"`, `"bioes"` or None),
            `"iob1"`, `"iob2"`, `"bioes"`, or None (token accuracy only, no
            spans).
        feature_vocabularies: With a network that has `features`: each
            feature's vocabulary, `{name: values}` (value k has id k + 2;
            0 is "", 1 unseen); None without.
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
                 scheme: Optional[str] = "auto", feature_vocabularies: Optional[Mapping[str, Sequence[str]]] = None,
                 **kwargs):
        super().__init__(**kwargs)
        check_tagger_model(network, encoder, tags, feature_vocabularies)
        if not has_vocabularies(encoder):
            raise ValueError("The tagger's encoder has no vocabularies: adapt it first (or use Tagger.from_sentences).")
        if scheme not in ("auto", None, "iob1") + SCHEMES:
            raise ValueError(f"`scheme` must be 'auto', None, 'iob1', 'iob2' or 'bioes', received {scheme!r}.")
        self.encoder, self.network = encoder, network
        self._tags = tuple(tags)
        self._scheme_argument = scheme
        self.scheme = span_scheme(self._tags) if scheme == "auto" else scheme
        self.with_chars = "chars" in [t.name for t in network.inputs]
        # Pairs of tuples: Keras tracks (and wraps) the lists and dicts set on a layer, not tuples.
        self._features = tuple((name, tuple(feature_vocabularies[name])) for name in feature_inputs(network))
        self._scorers = Untracked()  # built on first use; shares the network's weights, so not saved again
        self.built = True

    @property
    def tags(self) -> Tuple[str, ...]:
        """The tag names; tag id k is `tags[k]`."""
        return self._tags

    @property
    def feature_vocabularies(self) -> Dict[str, List[str]]:
        """Each feature column's vocabulary, in the network's input order (`{}` without)."""
        return {name: list(vocabulary) for name, vocabulary in self._features}

    @property
    def feature_names(self) -> List[str]:
        """The feature columns the tagger reads beside the tokens, in input order."""
        return [name for name, _ in self._features]

    @property
    def head(self) -> str:
        """`"crf"` or `"softmax"`."""
        return "crf" if crf_head(self.network) is not None else "softmax"

    @classmethod
    def from_sentences(cls, sentences, sentence_tags: Sequence[Sequence[str]], *,
                       tags: Optional[Sequence[str]] = None, encoder: Optional[TokenEncoder] = None,
                       scheme: Optional[str] = "auto", name: str = "tagger", **build_kwargs) -> "Tagger":
        """A new, untrained tagger for this data.

        Args:
            sentences: The training token lists (the encoder adapts on
                them); or the dict form `{"tokens": token lists, name:
                per-token strings, ...}`: the tagger then reads those
                features (sorted by name), each with the vocabulary of its
                training values.
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
                `num_chars` comes from the encoder, `features` from the
                dict form).

        Returns:
            A `Tagger` (compile it, or let `fit` compile it with Adam).
        """
        if "features" in build_kwargs:
            raise ValueError("Tagger learns its `features` from the data: pass the feature columns in "
                             f"`sentences`, {{{TOKENS_KEY!r}: token lists, 'pos': per-token strings}}.")
        names = sorted(k for k in sentences if k != TOKENS_KEY) if isinstance(sentences, Mapping) else []
        bad = [n for n in names if not isinstance(n, str) or n in (INPUTS_KEY, "words", "chars")]
        if bad:
            raise ValueError(f"A feature may not be named {bad[0]!r} ({INPUTS_KEY!r}, 'words' and 'chars' are taken).")
        sentences, columns = split_columns(sentences, names)
        check_lengths(sentences, sentence_tags)
        tags = sorted({t for names in sentence_tags for t in names}) if tags is None else list(tags)
        tag_ids(sentence_tags, tags)  # every tag of the data must be known
        if encoder is None:
            encoder = TokenEncoder()
        if not has_vocabularies(encoder):
            encoder.adapt([list(s) for s in sentences])
        if build_kwargs.get("embeddings") is None:
            build_kwargs.setdefault("embedding_dim", 100)
        if build_kwargs.get("char_encoder") is not None:
            build_kwargs.setdefault("num_chars", encoder.char_count)
        vocabularies = learn_vocabularies(columns)
        features = {n: len(v) + 2 for n, v in vocabularies.items()} or None  # + padding and unseen
        network = build_tagger(encoder.word_count, tags, features=features, **build_kwargs)
        return cls(encoder, network, tags, scheme=scheme, feature_vocabularies=vocabularies or None, name=name)

    def call(self, inputs, training=None):
        return self.network(inputs, training=training)

    def compile(self, optimizer="adam", loss="auto", metrics=None, **kwargs) -> None:
        """Keras's `compile`; `loss="auto"`: `kb.CRFLoss()` for a CRF head,
        `kb.TokenCrossentropy()` for a softmax head (both skip padding and
        average over the global batch, across a strategy's replicas too)."""
        if loss == "auto":
            loss = CRFLoss() if self.head == "crf" else TokenCrossentropy()
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    # --- strings to batches --------------------------------------------------

    def encode(self, x, y=None) -> EncodedSentences:
        """Strings (token lists, or the dict form with the tagger's
        features) and their tags, as ids, encoded once."""
        tokens, columns = split_columns(x, self.feature_names)
        if y is None:
            encoded = encode_sentences(self.encoder, tokens)
        else:
            check_lengths(tokens, y)
            encoded = encode_sentences(self.encoder, tokens, tag_ids(y, self.tags))
        if not columns:
            return encoded
        vocabularies = self.feature_vocabularies
        ids = {n: feature_ids(column, vocabularies[n]) for n, column in columns.items()}
        return encoded._replace(features=ids)

    def training_batch(self, encoded: EncodedSentences, indices, rng, word_dropout: float = 0.0) -> tuple:
        """(inputs, tag ids[, weights]) of some sentences; word dropout with `rng`."""
        inputs = pad_batch(encoded, indices, self.with_chars, LENGTH_MULTIPLE)
        if isinstance(inputs, tuple):  # the words come first, the characters and features after
            inputs = (drop_words(inputs[0], word_dropout, rng),) + inputs[1:]
        else:
            inputs = drop_words(inputs, word_dropout, rng)
        labels, weights = pad_labels(encoded, indices, LENGTH_MULTIPLE)
        # The CRF's loss reads the mask; the cross-entropy also gets it as
        # weights (Keras's JAX backend hands a softmax output's mask to no loss).
        return (inputs, labels) if self.head == "crf" else (inputs, labels, weights)

    def sentence_dataset(self, sentences, sentence_tags: Sequence[Sequence[str]],
                         batch_size: int = DEFAULT_BATCH_SIZE, word_dropout: float = 0.0,
                         shuffle: bool = True, seed: Optional[int] = None):
        """Token lists (or the dict form) and tag lists as a `tf.data.Dataset` in model-input form:
        `strings_dataset`, whose batches are `(inputs, tag ids)` (CRF) or
        `(inputs, tag ids, weights)` (softmax), 0 at padding."""
        return self.strings_dataset(sentences, sentence_tags, batch_size, word_dropout, shuffle=shuffle, seed=seed)

    def takes_strings(self, x) -> bool:
        return is_string_input(x)

    # --- predictions ---------------------------------------------------------

    def _scorer(self) -> keras.Model:
        """The network with its CRF's emissions as a second output (CRF head)."""
        if self._scorers.model is None:
            crf = crf_head(self.network)
            outputs = list(self.network.outputs) + ([crf.input] if crf is not None else [])
            self._scorers.model = keras.Model(self.network.input, outputs, name="scorer")
        return self._scorers.model

    def _decoder(self) -> Decoder:
        """The compiled tag ids and confidence (`keras_birnn.tagging.decoding`)."""
        if self._scorers.decoder is None:
            self._scorers.decoder = Decoder(self._scorer(), crf_head(self.network), name="decoder")
        return self._scorers.decoder

    def decode(self, inputs, top_k: Optional[int] = None) -> dict:
        """Tag ids, confidence (and top-k paths) of a batch of model inputs.

        Args:
            inputs: Word ids `[B, T]` (0 = padding), or a tuple of the
                network's inputs, words first.
            top_k: With a CRF head, also the k best paths.

        Returns:
            NumPy arrays: `tag_ids` int32 `[B, T]` (-1 at padding),
            `confidence` float32 `[B, T]` (0 at padding); with `top_k`,
            `paths` int32 `[B, k, T]` and `probabilities` `[B, k]`.
        """
        crf = crf_head(self.network)
        if top_k is not None and crf is None:
            raise ValueError("`top_k` needs a CRF head (the tagger's head is 'softmax').")
        found = dict(self._decoder().predict_on_batch(inputs))
        if top_k is not None:  # eager: k is the caller's
            emissions = keras.tree.flatten(self._scorer()(inputs, training=False))[1]
            paths, log_p = crf.top_k(emissions, mask=valid_positions(inputs), k=top_k, log_probabilities=True)
            found.update(paths=ops.convert_to_numpy(paths), probabilities=ops.convert_to_numpy(ops.exp(log_p)))
        return found

    def predict(self, x, batch_size: Optional[int] = None, verbose="auto", steps=None, callbacks=None, *,
                top_k: Optional[int] = None):
        """Tags token lists (or, given anything else, Keras's `predict`).

        Args:
            x: A list of token lists, or the dict form (`{"tokens": token
                lists, <feature>: per-token strings}`) for a tagger with
                features; or Keras's inputs (then the network's raw output
                comes back).
            batch_size: Sentences per batch (default 32).
            verbose, steps, callbacks: Keras's, for Keras's inputs.
            top_k: With a CRF head, also the `top_k` best paths.

        Returns:
            With strings, a `TaggedSentence` per sentence, in order; its
            `spans` are those of its tags read in `self.scheme`, each with
            the mean of its tokens' confidence (`[]` without a span scheme).
        """
        if not is_string_input(x):
            if isinstance(x, (list, tuple)) and not x:
                split_columns(x, self.feature_names)  # a feature tagger wants the dict form
                return []
            return super().predict(x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks)
        encoded = self.encode(x)
        results: List[Optional[TaggedSentence]] = [None] * len(encoded.words)
        for group in bucket_batches(encoded.lengths, batch_size or DEFAULT_BATCH_SIZE):
            found = self.decode(pad_batch(encoded, group, self.with_chars, LENGTH_MULTIPLE), top_k)
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
        spans = scored_spans(names, confidence, self.scheme) if self.scheme is not None else []
        return TaggedSentence(names, confidence, paths, spans)

    def evaluate(self, x=None, y=None, batch_size: Optional[int] = None, verbose="auto", **kwargs):
        """Scores token lists against gold tags (or, given anything else, Keras's `evaluate`).

        Args:
            x: A list of token lists (or the dict form, as in `predict`);
                or Keras's inputs.
            y: With strings, the gold tags (each one of `self.tags`,
                else ValueError).
            batch_size: Sentences per batch.
            verbose, **kwargs: Keras's, for Keras's inputs.

        Returns:
            With token lists, a dict: `accuracy` (per token) and, when
            `self.scheme` is a span scheme, conlleval's `precision`,
            `recall`, `f1`, `gold`, `predicted`, `correct` and `types` (the
            same per type).
        """
        if not is_string_input(x):
            return super().evaluate(x, y, batch_size=batch_size, verbose=verbose, **kwargs)
        check_lengths(split_columns(x, self.feature_names)[0], y)
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
        `predict` gives (`keras_birnn.tagging.export`). With features, the
        signature also takes one string `[batch, time]` input per feature
        name (its vocabulary is in the graph). With a span scheme, it also
        returns `predict`'s spans: `span_start`, `span_end` (int32,
        exclusive), `span_type` (string) and `span_confidence` (float32,
        the mean of the span's tokens' confidence), each `[batch, S]`,
        padded with -1, -1, "" and 0.

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
                             verbose=verbose, scheme=self.scheme, feature_vocabularies=self.feature_vocabularies)

    def names_config(self) -> dict:
        config = {"tags": list(self.tags), "scheme": self._scheme_argument}
        if self._features:  # a tagger without features saves the config it always had
            config["feature_vocabularies"] = self.feature_vocabularies
        return config
