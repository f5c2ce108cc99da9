"""`export_tagger`: a trained tagger and its encoder as one SavedModel, strings in and out.

The SavedModel's `serving_default` signature takes string tokens and
returns tag names, tag ids and a confidence per token; the vocabularies
(`TokenEncoder`), the model and the CRF's decoding all live in the graph,
so a client needs neither Keras nor keras_birnn:

    serving_default(inputs: string [batch, time], "" = padding
                    [, <feature>: string [batch, time] per feature column])
        -> tags: string [batch, time]        ("" at padding)
           tag_ids: int32 [batch, time]       (-1 at padding)
           confidence: float32 [batch, time]  (0 at padding)
          [span_start: int32 [batch, S]       (-1 past the row's spans)
           span_end: int32 [batch, S]         (exclusive; -1 past the spans)
           span_type: string [batch, S]       ("" past the spans)
           span_confidence: float32 [batch, S] (0 past the spans)]

Confidence: with a CRF head, the marginal probability of the chosen tag
at that token, p(y_t = tag | sentence) by forward-backward (`kb.CRF`'s
`marginals`); with a softmax head, the chosen tag's probability.

Feature columns (a model built with `build_tagger(..., features=...)`):
one string input per feature, named as the model's input, its vocabulary
looked up in the graph ("" = padding -> id 0, an unseen value -> id 1,
`vocabulary[k]` -> k + 2: `keras.layers.StringLookup(mask_token="",
num_oov_indices=1)`), so a client sends strings only.

Spans (with a span scheme, `"iob1"`, `"iob2"` or `"bioes"`): the spans of
the chosen tags, read by `keras_birnn.tagging.spans`' rules
(`span_tables`), in order; S is the most spans of any sentence of the
batch (at least 1). A span's confidence is the mean of its tokens'
`confidence`.

The signature takes tokens, not sentences: tokenization is the client's,
and must be the one the model was trained on (splitting on whitespace
leaves punctuation on words, "Paris." for "Paris" "."). A client tags a
sentence with `sentence.split()` (or its tokenizer), padded with "".

Export needs the TensorFlow backend (`export_tagger` raises
`keras_birnn.backend.TensorFlowOnlyError` elsewhere): train on JAX or
PyTorch, save a `.keras` file and export it in a TensorFlow process.
"""

from __future__ import annotations

import os
import warnings
from typing import Dict, List, Mapping, Optional, Sequence

import keras

from keras_birnn import backend
from keras_birnn.crf.layer import CRF
from keras_birnn.tagging.encoder import TokenEncoder
from keras_birnn.tagging.spans import span_scheme, span_tables

if backend.IS_TENSORFLOW:
    import tensorflow as tf

    from keras_birnn import recurrence
    from keras_birnn.export.saved_model import SIGNATURE_DEFAULT, export_saved_model, next_version, write_version

OUTPUT_KEYS = ("tags", "tag_ids", "confidence")
SPAN_KEYS = ("span_start", "span_end", "span_type", "span_confidence")
INPUTS_KEY = "inputs"  # the served tokens' input name
TEXT_INPUTS = ("words", "chars")  # the model inputs the encoder feeds; the others are features
PADDING_ID = -1  # the served `tag_ids` at padding (tag id 0 is a real tag)


def crf_head(model: keras.Model) -> Optional[CRF]:
    """The model's CRF layer when its output is the CRF's tags, else None."""
    last = model.layers[-1] if model.layers else None
    return last if isinstance(last, CRF) else None


def feature_inputs(model: keras.Model) -> List[str]:
    """The names of a `build_tagger` model's feature inputs, in input order."""
    return [t.name for t in model.inputs if t.name not in TEXT_INPUTS]


def check_tagger_model(model, encoder, tags, feature_vocabularies: Optional[Mapping[str, Sequence[str]]] = None) -> None:
    """Raises unless `model` is a `build_tagger` model (inputs `words`,
    optionally `chars`, then features) whose output fits `tags`, `encoder` a
    `TokenEncoder`, and `feature_vocabularies` holds a vocabulary for each
    feature input (as many ids as its embedding) and no other."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras.Model (e.g. from build_tagger), received {model!r}.")
    if not isinstance(encoder, TokenEncoder):
        raise TypeError(f"`encoder` must be a keras_birnn.tagging.encoder.TokenEncoder, received {encoder!r}.")
    names = [t.name for t in model.inputs]
    features = feature_inputs(model)
    if names[:1] != ["words"] or names[1:len(names) - len(features)] not in ([], ["chars"]):
        raise ValueError(f"A tagger's inputs are `words`, optionally `chars`, then its features (build_tagger), "
                         f"received inputs {names}.")
    given = dict(feature_vocabularies or {})
    if sorted(given) != sorted(features):
        raise ValueError(f"The model reads the features {features}; `feature_vocabularies` must hold the "
                         f"vocabulary of each and no other, received it for {sorted(given)}.")
    for name in features:
        check_vocabulary(model, name, given[name])
    crf = crf_head(model)
    width = crf.num_tags if crf is not None else model.outputs[0].shape[-1]
    if isinstance(tags, (str, bytes)) or not all(isinstance(t, str) for t in tags) or len(tags) != width:
        raise ValueError(f"`tags` must be the model's {width} tag names, received {tags!r}.")


def check_vocabulary(model: keras.Model, name: str, vocabulary: Sequence[str]) -> None:
    """Raises unless `vocabulary` holds distinct strings other than "" and, with
    padding and unseen, as many ids as the feature's embedding (when it has one)."""
    if isinstance(vocabulary, (str, bytes)) or not all(isinstance(v, str) and v for v in vocabulary) \
            or len(set(vocabulary)) != len(vocabulary):
        raise ValueError(f"The vocabulary of the feature {name!r} must hold distinct non-empty strings.")
    try:
        width = model.get_layer(f"{name}_embedding").input_dim
    except ValueError:  # not a build_tagger model's embedding: nothing to compare
        return
    if width != len(vocabulary) + 2:
        raise ValueError(f"The feature {name!r} has {width} ids in the model (padding and unseen included); "
                         f"its vocabulary gives {len(vocabulary) + 2}.")


def claim_version(path: str, version: Optional[int], overwrite: bool) -> int:
    """The version folder an export writes: `version`, or the next free integer.

    Args:
        path: The model's base folder.
        version: A positive int, or None for one more than the highest
            existing integer folder (1 in a new folder).
        overwrite: Whether an existing version folder may be replaced; it
            then is, with a warning that says so.

    Returns:
        The version number.

    Raises:
        FileExistsError: `path/<version>/` exists and `overwrite` is False.
    """
    version = next_version(path) if version is None else version
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"`version` must be a positive int, received {version!r}.")
    target = os.path.join(os.fspath(path), str(version))
    if os.path.exists(target):
        if not overwrite:
            raise FileExistsError(
                f"{target} exists and exported versions are never replaced silently: pass "
                "version=None for the next free one, another version, or overwrite=True."
            )
        warnings.warn(f"Overwriting the exported version {target}.", UserWarning, stacklevel=3)
    return version


def served_spans(tag_ids, confidence, tables) -> Dict[str, "tf.Tensor"]:
    """The spans of a batch of tag ids, in TensorFlow ops.

    Args:
        tag_ids: int32 `[B, T]`, -1 at padding.
        confidence: float32 `[B, T]`, each token's confidence.
        tables: `keras_birnn.tagging.spans.span_tables` of the tags.

    Returns:
        `span_start`, `span_end` (exclusive), `span_type` and
        `span_confidence` (the mean of the span's tokens' confidence), each
        `[B, S]` with S the most spans of a row (at least 1), padded with
        -1, -1, "" and 0.
    """
    starts, ends, types = tables
    edge = len(types)  # the id `span_tables` gives to the sentence's edges and padding
    ids = tf.where(tag_ids < 0, edge, tag_ids)
    border = tf.fill([tf.shape(ids)[0], 1], edge)
    previous, following = tf.concat([border, ids[:, :-1]], 1), tf.concat([ids[:, 1:], border], 1)
    opens = tf.gather_nd(tf.constant(starts), tf.stack([previous, ids], -1))
    closes = tf.gather_nd(tf.constant(ends), tf.stack([ids, following], -1))
    # Starts and ends alternate in every row: the k-th start (row-major) pairs with the k-th end.
    first, last = tf.where(opens), tf.where(closes)
    rows, start, end = first[:, 0], first[:, 1], last[:, 1] + 1
    counts = tf.reduce_sum(tf.cast(opens, tf.int64), 1)
    column = tf.range(tf.shape(rows, tf.int64)[0]) - tf.gather(tf.cumsum(counts, exclusive=True), rows)
    time = tf.range(tf.shape(ids, tf.int64)[1])[None, :]
    inside = (time >= start[:, None]) & (time < end[:, None])
    total = tf.reduce_sum(tf.where(inside, tf.gather(confidence, rows), 0.0), 1)
    values = {"span_start": (tf.cast(start, tf.int32), -1), "span_end": (tf.cast(end, tf.int32), -1),
              "span_type": (tf.gather(tf.constant(types, tf.string), tf.gather_nd(ids, first)), ""),
              "span_confidence": (total / tf.cast(end - start, tf.float32), 0.0)}
    width = tf.reduce_max(tf.concat([counts, tf.ones([1], tf.int64)], 0))  # at least 1 column
    shape = tf.stack([tf.shape(ids, tf.int64)[0], width])
    index = tf.stack([rows, column], 1)
    return {key: tf.tensor_scatter_nd_update(tf.fill(shape, filler), index, value)
            for key, (value, filler) in values.items()}


class _Serving(keras.Model):
    """Strings in, tag names, ids, confidences (and spans) out (the exported call)."""

    def __init__(self, model: keras.Model, encoder: TokenEncoder, tags: Sequence[str], scheme: Optional[str],
                 feature_vocabularies: Mapping[str, Sequence[str]], **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.tag_names = encoder, tuple(tags)
        self.crf = crf_head(model)
        self.with_chars = "chars" in [t.name for t in model.inputs]
        self.feature_names = tuple(feature_inputs(model))
        self.lookups = [keras.layers.StringLookup(vocabulary=list(feature_vocabularies[name]), mask_token="",
                                                  num_oov_indices=1, name=f"{name}_lookup")
                        for name in self.feature_names]
        self.tables = span_tables(tags, scheme) if scheme is not None else None
        # One pass gives the model's own output and, for a CRF, its emissions.
        outputs = model.outputs + ([self.crf.input] if self.crf is not None else [])
        self.scorer = keras.Model(model.inputs, outputs, name="scorer")
        self.built = True  # its parts are: a functional model, the encoder and the lookups

    def model_inputs(self, inputs) -> list:
        """The model's inputs (ids) from the served strings."""
        tokens = inputs[INPUTS_KEY] if self.feature_names else inputs
        word_ids, char_ids = self.encoder(tokens)
        ids = [word_ids] + ([char_ids] if self.with_chars else [])
        ids += [tf.cast(lookup(inputs[name]), tf.int32) for name, lookup in zip(self.feature_names, self.lookups)]
        return ids

    def call(self, inputs, training=False):
        ids = self.model_inputs(inputs)
        outputs = keras.tree.flatten(self.scorer(ids if len(ids) > 1 else ids[0], training=False))
        valid = ids[0] != 0
        if self.crf is not None:
            tag_ids, emissions = tf.cast(outputs[0], tf.int32), outputs[1]
            probabilities = self.crf.marginals(emissions, mask=valid)
        else:
            probabilities = outputs[0]
            tag_ids = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        tag_ids = tf.where(valid, tag_ids, 0)  # a real id at padding, for the gathers
        chosen = tf.gather(probabilities, tag_ids, batch_dims=2)
        names = tf.where(valid, tf.gather(tf.constant(self.tag_names), tag_ids), "")
        # -1 at padding: 0 is a real tag's id.
        found = {"tags": names, "tag_ids": tf.where(valid, tag_ids, PADDING_ID),
                 "confidence": tf.where(valid, tf.cast(chosen, tf.float32), 0.0)}
        if self.tables is not None:
            found.update(served_spans(found["tag_ids"], found["confidence"], self.tables))
        return found


def write_with_features(serving: _Serving, path: str, version: Optional[int], overwrite: bool, verbose: bool) -> str:
    """Writes a feature tagger's SavedModel: `serving_default` takes `inputs`
    and one string input per feature (`export_saved_model` serves one input)."""
    version = next_version(path) if version is None else version
    target = os.path.join(os.fspath(path), str(version))
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"{target} exists; TF Serving versions are immutable. Pass another `version`, "
                              "version=None for the next one, or overwrite=True.")
    names = (INPUTS_KEY,) + serving.feature_names
    spec = {name: tf.TensorSpec([None, None], tf.string, name=name) for name in names}
    archive = keras.export.ExportArchive()
    archive.track(serving)
    with recurrence.for_export():  # plain TF loops, no XLA: serving needs no JIT
        archive.add_endpoint(SIGNATURE_DEFAULT, lambda inputs: serving(inputs, training=False), input_signature=[spec])
        write_version(archive, path, version)
    if verbose:
        print(f"Exported SavedModel to {target}: {SIGNATURE_DEFAULT}({', '.join(names)})")
    return target


def export_tagger(
    model: keras.Model,
    encoder: TokenEncoder,
    path: str,
    tags: Sequence[str],
    *,
    version: Optional[int] = None,
    overwrite: bool = False,
    verbose: bool = False,
    scheme: Optional[str] = "auto",
    feature_vocabularies: Optional[Mapping[str, Sequence[str]]] = None,
) -> str:
    """Exports a tagger and its encoder as a SavedModel for TF Serving.

    Writes `path/<version>/` (atomic version folder, the recurrences traced
    without XLA, the graph's ops checked: `kb.export_saved_model`'s
    machinery). Its `serving_default` signature takes string tokens
    `inputs` `[batch, time]` ("" = padding; batch and time any size) and,
    for a model with features, one string input `[batch, time]` per
    feature; it returns `tags` (string), `tag_ids` (int32) and
    `confidence` (float32), each `[batch, time]`, with "", -1 and 0 at
    padding, and with a span scheme the spans `span_start`, `span_end`,
    `span_type` and `span_confidence` (`[batch, S]`; a span's confidence
    is the mean of its tokens' confidence) (module docstring).

    Args:
        model: A tagger from `build_tagger` (inputs `words`, optionally
            `chars`, and features; a CRF or softmax head), trained on
            `encoder`'s ids.
        encoder: The `TokenEncoder` whose ids the model was trained on.
        path: The model's base folder (TF Serving's `--model_base_path`).
        tags: The tag names, tag id k is `tags[k]`.
        version: Positive int; default one more than the highest existing.
        overwrite: Replace an existing version folder.
        verbose: Print where the export went.
        scheme: How the spans are read: `"auto"` (`span_scheme(tags)`),
            `"iob1"`, `"iob2"`, `"bioes"`, or None (no span outputs).
        feature_vocabularies: With features: `{name: vocabulary}`, the
            value `vocabulary[k]` having id k + 2 (0: "", 1: unseen).

    Returns:
        The path of the version folder.

    Raises:
        TensorFlowOnlyError: On the JAX or PyTorch backend.
        ValueError: A model with other inputs, features without their
            vocabularies, or tags that do not fit it.

    Example:

    >>> import tempfile
    >>> from keras_birnn.tagging.encoder import TokenEncoder, pad_tokens
    >>> from keras_birnn.tagging.builder import build_tagger
    >>> from keras_birnn.tagging.export import export_tagger
    >>> encoder = TokenEncoder(max_chars=8)
    >>> encoder.adapt([["Ada", "met", "Alan"]])
    >>> tags = ["O", "B-PER", "I-PER"]
    >>> model = build_tagger(encoder.word_count, tags, embedding_dim=8, hidden=8)
    >>> folder = export_tagger(model, encoder, tempfile.mkdtemp(), tags)
    >>> serve = tf.saved_model.load(folder).signatures["serving_default"]
    >>> out = serve(inputs=tf.constant(pad_tokens([["Ada", "met"], ["Alan"]])))
    >>> sorted(out)
    ['confidence', 'span_confidence', 'span_end', 'span_start', 'span_type', 'tag_ids', 'tags']
    >>> out["tags"].numpy()[1, 1], int(out["tag_ids"][1, 1])
    (b'', -1)
    """
    if not backend.IS_TENSORFLOW:
        raise backend.tensorflow_only_error(
            "keras_birnn.tagging.export.export_tagger", "export the tagger with export_tagger"
        )
    check_tagger_model(model, encoder, tags, feature_vocabularies)
    scheme = span_scheme(tags) if scheme == "auto" else scheme
    serving = _Serving(model, encoder, tags, scheme, feature_vocabularies or {}, name="serving_tagger")
    if serving.feature_names:
        return write_with_features(serving, path, version, overwrite, verbose)
    spec = tf.TensorSpec([None, None], tf.string)
    return export_saved_model(
        serving, path, version=version, lengths_input=False, input_spec=spec, overwrite=overwrite, verbose=verbose
    )
