"""`export_tagger`: a trained tagger and its encoder as one SavedModel, strings in and out.

The SavedModel's `serving_default` signature takes string tokens and
returns tag names, tag ids and a confidence per token; the vocabularies
(`TokenEncoder`), the model and the CRF's decoding all live in the graph,
so a client needs neither Keras nor keras_birnn:

    serving_default(inputs: string [batch, time], "" = padding)
        -> tags: string [batch, time]        ("" at padding)
           tag_ids: int32 [batch, time]       (-1 at padding)
           confidence: float32 [batch, time]  (0 at padding)

Confidence: with a CRF head, the marginal probability of the chosen tag
at that token, p(y_t = tag | sentence) by forward-backward (`kb.CRF`'s
`marginals`); with a softmax head, the chosen tag's probability.

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
from typing import Optional, Sequence

import keras

from keras_birnn import backend
from keras_birnn.crf.layer import CRF
from keras_birnn.tagging.encoder import TokenEncoder

if backend.IS_TENSORFLOW:
    import tensorflow as tf

    from keras_birnn.export.saved_model import export_saved_model, next_version

OUTPUT_KEYS = ("tags", "tag_ids", "confidence")
PADDING_ID = -1  # the served `tag_ids` at padding (tag id 0 is a real tag)


def crf_head(model: keras.Model) -> Optional[CRF]:
    """The model's CRF layer when its output is the CRF's tags, else None."""
    last = model.layers[-1] if model.layers else None
    return last if isinstance(last, CRF) else None


def check_tagger_model(model, encoder, tags) -> None:
    """Raises unless `model` is a `build_tagger` model (inputs `words` and
    optionally `chars`) whose output fits `tags`, and `encoder` a `TokenEncoder`."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"`model` must be a keras.Model (e.g. from build_tagger), received {model!r}.")
    if not isinstance(encoder, TokenEncoder):
        raise TypeError(f"`encoder` must be a keras_birnn.tagging.encoder.TokenEncoder, received {encoder!r}.")
    names = [t.name for t in model.inputs]
    if names not in (["words"], ["words", "chars"]):
        raise ValueError(
            "export_tagger serves models whose inputs are `words` and optionally `chars` (build_tagger "
            f"without `features`), received inputs {names}; export a model with more inputs with "
            "keras.export.ExportArchive."
        )
    crf = crf_head(model)
    width = crf.num_tags if crf is not None else model.outputs[0].shape[-1]
    if isinstance(tags, (str, bytes)) or not all(isinstance(t, str) for t in tags) or len(tags) != width:
        raise ValueError(f"`tags` must be the model's {width} tag names, received {tags!r}.")


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


class _Serving(keras.Model):
    """Strings in, tag names, ids and confidences out (the exported call)."""

    def __init__(self, model: keras.Model, encoder: TokenEncoder, tags: Sequence[str], **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.tag_names = encoder, tuple(tags)
        self.crf = crf_head(model)
        self.with_chars = len(model.inputs) == 2
        # One pass gives the model's own output and, for a CRF, its emissions.
        outputs = model.outputs + ([self.crf.input] if self.crf is not None else [])
        self.scorer = keras.Model(model.inputs, outputs, name="scorer")
        self.built = True  # its parts are: a functional model and the encoder

    def call(self, tokens, training=False):
        word_ids, char_ids = self.encoder(tokens)
        outputs = keras.tree.flatten(self.scorer([word_ids, char_ids] if self.with_chars else word_ids, training=False))
        valid = word_ids != 0
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
        return {"tags": names, "tag_ids": tf.where(valid, tag_ids, PADDING_ID),
                "confidence": tf.where(valid, tf.cast(chosen, tf.float32), 0.0)}


def export_tagger(
    model: keras.Model,
    encoder: TokenEncoder,
    path: str,
    tags: Sequence[str],
    *,
    version: Optional[int] = None,
    overwrite: bool = False,
    verbose: bool = False,
) -> str:
    """Exports a tagger and its encoder as a SavedModel for TF Serving.

    Writes `path/<version>/` through `kb.export_saved_model` (atomic
    version folder, the recurrences traced without XLA, the graph's ops
    checked). Its `serving_default` signature takes string tokens
    `inputs` `[batch, time]` ("" = padding; batch and time any size) and
    returns `tags` (string), `tag_ids` (int32) and `confidence` (float32),
    each `[batch, time]`, with "", -1 and 0 at padding (module docstring).

    Args:
        model: A tagger from `build_tagger` (inputs `words` and optionally
            `chars`; a CRF or softmax head), trained on `encoder`'s ids.
        encoder: The `TokenEncoder` whose ids the model was trained on.
        path: The model's base folder (TF Serving's `--model_base_path`).
        tags: The tag names, tag id k is `tags[k]`.
        version: Positive int; default one more than the highest existing.
        overwrite: Replace an existing version folder.
        verbose: Print where the export went.

    Returns:
        The path of the version folder.

    Raises:
        TensorFlowOnlyError: On the JAX or PyTorch backend.
        ValueError: A model with other inputs, or tags that do not fit it.

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
    >>> sorted(out), out["tags"].numpy()[1, 1], int(out["tag_ids"][1, 1])
    (['confidence', 'tag_ids', 'tags'], b'', -1)
    """
    if not backend.IS_TENSORFLOW:
        raise backend.tensorflow_only_error(
            "keras_birnn.tagging.export.export_tagger", "export the tagger with export_tagger"
        )
    check_tagger_model(model, encoder, tags)
    serving = _Serving(model, encoder, tags, name="serving_tagger")
    spec = tf.TensorSpec([None, None], tf.string)
    return export_saved_model(
        serving, path, version=version, lengths_input=False, input_spec=spec, overwrite=overwrite, verbose=verbose
    )
