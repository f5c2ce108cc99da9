"""Sequence tagging from strings to a served tagger.

- `TokenEncoder`: string tokens to word and character ids, a Keras layer
  whose vocabularies come from `adapt()` and live in the exported graph;
  `pad_tokens` pads token lists with "".
- `load_vectors`: pretrained word vectors (word2vec text or binary, GloVe,
  fastText `.vec`) as an embedding matrix for a vocabulary, with coverage
  statistics (`VectorStats`).
- `build_tagger`: word embeddings (random or pretrained), an optional
  character encoder, optional feature columns, stacked `kb.Bidirectional`
  layers and a CRF or softmax head, as a plain `keras.Model`.
- `SpanF1`: span precision/recall/F1 (conlleval rules; IOB1, IOB2, BIOES)
  as a Keras metric for `compile(metrics=...)`; `spans` and `span_scores`
  score tag strings in plain Python.
- `Tagger` and `SentenceClassifier`: task models in Keras's style, each a
  `keras.Model` holding its encoder, names and network: `fit`, `predict`
  and `evaluate` on strings, one `.keras` file, `export` for TF Serving.
  `keras_birnn.tagging.batching` gives them length-bucketed batches and
  word dropout.
- `export_tagger`: a SavedModel that takes string tokens and returns tags,
  tag ids and a per-token confidence (needs TensorFlow).

Everything but the exports runs on every Keras backend;
`TokenEncoder`, like Keras's `StringLookup`, needs TensorFlow installed and
runs eagerly or in `tf.data` on JAX and PyTorch.
"""

from keras_birnn.tagging.builder import CharCNN, build_tagger
from keras_birnn.tagging.classifier import SentenceClassifier, build_classifier
from keras_birnn.tagging.encoder import TokenEncoder, pad_tokens
from keras_birnn.tagging.export import export_tagger
from keras_birnn.tagging.metrics import SpanF1
from keras_birnn.tagging.spans import Span, SpanScores, convert_tags, span_scores, spans
from keras_birnn.tagging.tagger import Tagger
from keras_birnn.tagging.vectors import VectorStats, load_vectors

__all__ = [
    "CharCNN",
    "SentenceClassifier",
    "Span",
    "SpanF1",
    "SpanScores",
    "Tagger",
    "TokenEncoder",
    "VectorStats",
    "build_classifier",
    "build_tagger",
    "convert_tags",
    "export_tagger",
    "load_vectors",
    "pad_tokens",
    "span_scores",
    "spans",
]
