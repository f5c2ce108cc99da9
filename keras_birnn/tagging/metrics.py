"""`SpanF1`: conlleval's span F1 as a Keras metric, counted in the graph.

The spans of gold and predicted tag ids are found with `keras.ops` by the
rules of `keras_birnn.tagging.spans` (conlleval's): each position is
marked where a span starts and where one ends. A gold span is correct when
the predicted tags start a span of its type at its start and, over the
whole span, start and end spans exactly where the gold tags do; so each
gold span's start is paired with its end (the k-th start with the k-th
end, found by an argsort that puts the starts first) and the mismatches
between them counted with a cumulative sum. No loop over time: it runs in
`fit` on TensorFlow (also with unknown batch and time), under `jax.jit`
and on PyTorch.
"""

from typing import Any, List, Optional, Sequence, Tuple

import keras
import numpy as np
from keras import ops

from keras_birnn import tf_internal
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.crf.schemes import check_scheme
from keras_birnn.tagging.spans import SpanScores, tag_parts

Tensor = Any  # a tensor of the backend

# Prefix codes in the graph; 0 (outside) also at padding and for the padding tag "".
CODES = {"O": 0, "B": 1, "I": 2, "E": 3, "S": 4}
PADDING_TAG = ""
AVERAGES = ("micro", "macro")
# Subtracted from a position's sort key to put span starts (ends) first in an
# argsort; larger than any sequence length, small enough for int32.
_FIRST = 2**30


def tag_tables(tags: Sequence[str], scheme: str) -> Tuple[List[int], List[int], Tuple[str, ...]]:
    """(prefix code per tag id, type id per tag id, type names): type id
    `k >= 1` names `types[k - 1]` (sorted); 0 is no type (`O`, padding)."""
    parts = [("O", None) if tag == PADDING_TAG else tag_parts(tag, scheme) for tag in tags]
    types = tuple(sorted({kind for prefix, kind in parts if prefix != "O"}))
    codes = [CODES[prefix] for prefix, _ in parts]
    type_ids = [0 if prefix == "O" else types.index(kind) + 1 for prefix, kind in parts]
    return codes, type_ids, types


def _is(codes, *names):
    """Whether each code is one of the prefixes `names`."""
    found = ops.equal(codes, CODES[names[0]])
    for name in names[1:]:
        found = ops.logical_or(found, ops.equal(codes, CODES[name]))
    return found


def _shifted(x, later: bool):
    """`x [batch, time]` moved one step (the next tag when `later`, else the
    previous one), outside (0) coming in at the edge."""
    edge = ops.zeros_like(x[:, :1])
    return ops.concatenate([x[:, 1:], edge], axis=1) if later else ops.concatenate([edge, x[:, :-1]], axis=1)


def span_boundaries(codes: Tensor, types: Tensor) -> Tuple[Tensor, Tensor]:
    """(starts, ends), bool `[batch, time]`: where conlleval's spans begin
    and where they end (inclusive), for prefix codes and type ids."""
    inside = ops.not_equal(codes, CODES["O"])
    previous, previous_type = _shifted(codes, False), _shifted(types, False)
    following, following_type = _shifted(codes, True), _shifted(types, True)
    starts = ops.logical_or(ops.logical_or(_is(codes, "B", "S"), _is(previous, "O", "E", "S")),
                            ops.not_equal(types, previous_type))
    ends = ops.logical_or(ops.logical_or(_is(codes, "E", "S"), _is(following, "O", "B", "S")),
                          ops.not_equal(types, following_type))
    return ops.logical_and(inside, starts), ops.logical_and(inside, ends)


def _in_order(flags, positions):
    """Positions `[batch, time]` with the flagged ones first, in order (slot
    k of a row: its k-th flagged position, for k below the row's count)."""
    return ops.argsort(ops.where(flags, positions - _FIRST, positions), axis=1)


def correct_spans(gold: Tensor, predicted: Tensor, gold_types: Tensor,
                  predicted_types: Tensor) -> Tuple[Tensor, Tensor]:
    """(correct flags, their type ids), `[batch, time]`: slot k of a row
    flags whether the row's k-th gold span is predicted exactly."""
    (gold_starts, gold_ends), (starts, ends) = gold, predicted
    differ = ops.logical_or(ops.not_equal(gold_starts, starts), ops.not_equal(gold_ends, ends))
    differ = ops.cast(ops.logical_or(differ, ops.logical_and(gold_starts, ops.not_equal(gold_types, predicted_types))),
                      "int32")
    through = ops.cumsum(differ, axis=1)  # mismatches up to and including each position
    positions = ops.cumsum(ops.ones_like(differ), axis=1) - 1
    first, last = _in_order(gold_starts, positions), _in_order(gold_ends, positions)
    before_start = ops.take_along_axis(through - differ, first, axis=1)
    clean = ops.equal(ops.take_along_axis(through, last, axis=1), before_start)
    count = ops.sum(ops.cast(gold_starts, "int32"), axis=1, keepdims=True)
    return ops.logical_and(clean, ops.less(positions, count)), ops.take_along_axis(gold_types, first, axis=1)


@keras_birnn_export("keras_birnn.tagging.SpanF1")
class SpanF1(keras.metrics.Metric):
    """conlleval's span F1 of a tagger, as a Keras metric.

    The scores of `keras_birnn.tagging.spans.span_scores` (conlleval's
    rules, also for ill-formed predictions), counted batch by batch in the
    graph: the metric keeps the numbers of correct, predicted and gold spans
    of each type (float32 variables, exact up to 2**24 spans) and its
    result is their F1.

    Which positions count: padding never does. A position is left out (it
    reads as `O`, so spans end at it) where the Keras mask of `y_pred` is
    False (Keras attaches the output's mask to `y_pred`: `kb.CRF`'s tags and
    a masked softmax both carry it on TensorFlow and PyTorch, `kb.CRF`'s
    also on JAX), where `sample_weight` is 0, or where `y_true` is not a tag
    id (below 0 or at least `len(tags)`, e.g. -1 padding). On JAX Keras
    hands a softmax output's mask to no metric in `fit` (Keras 3.15.1), so
    pad `y_true` with -1 there. The padding tag `""` reads as `O`.

    Args:
        tags: Tag names, index = tag id, e.g. `["O", "B-PER", "I-PER"]`;
            `""` may name a padding tag.
        scheme: `"iob1"`, `"iob2"` or `"bioes"` (the prefixes allowed).
        average: `"micro"` (F1 of all spans) or `"macro"` (mean F1 of the
            types found in the gold or predicted spans, as seqeval).
        name: The metric's name.
        dtype: The result's dtype.

    Update arguments: `y_true` int tag ids `[batch, time]` (or `[batch,
    time, 1]`); `y_pred` tag ids `[batch, time]` (`kb.CRF`) or per-tag
    scores `[batch, time, len(tags)]` (argmax taken); `sample_weight`
    optional, `[batch]` or `[batch, time]`, zero leaves positions out.

    Example:

    >>> from keras_birnn.tagging.metrics import SpanF1
    >>> f1 = SpanF1(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])
    >>> f1.update_state([[1, 2, 0, 3]], [[1, 2, 0, 0]])
    >>> round(float(f1.result()), 4)  # 1 of 1 predicted span right, 1 of 2 gold ones
    0.6667
    >>> tokens = keras.Input((None,), dtype="int32")
    >>> x = keras.layers.Embedding(100, 8, mask_zero=True)(tokens)
    >>> x = kb.Bidirectional(kb.GRUCell(8), return_sequences=True)(x)
    >>> tagger = keras.Model(tokens, kb.CRF(5)(keras.layers.Dense(5)(x)))
    >>> tagger.compile("adam", loss=kb.CRFLoss(), metrics=[SpanF1(f1.tags)])
    """

    def __init__(self, tags: Sequence[str], scheme: str = "iob2", average: str = "micro",
                 name: str = "span_f1", dtype: Optional[str] = None):
        super().__init__(name=name, dtype=dtype)
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise TypeError(f"`tags` must be a sequence of tag names (strings), received {tags!r}.")
        self.tags, self.scheme = list(tags), check_scheme(scheme)
        if average not in AVERAGES:
            raise ValueError(f"`average` must be one of {AVERAGES}, received {average!r}.")
        self.average = average
        self._codes, self._type_ids, self.types = tag_tables(self.tags, self.scheme)
        if not self.types:
            raise ValueError(f"`tags` has no span tag (B-, I-, E- or S-), received {tags!r}.")
        shape = (len(self.types),)
        self.correct = self.add_variable(shape, initializer="zeros", dtype="float32", name="correct")
        self.predicted = self.add_variable(shape, initializer="zeros", dtype="float32", name="predicted")
        self.gold = self.add_variable(shape, initializer="zeros", dtype="float32", name="gold")

    def _positions_that_count(self, y_true, y_pred, sample_weight):
        """Bool `[batch, time]`: the positions scored (class docstring)."""
        valid = ops.logical_and(ops.greater_equal(y_true, 0), ops.less(y_true, len(self.tags)))
        mask = _output_mask(y_pred)
        if mask is not None:
            valid = ops.logical_and(valid, ops.cast(mask, "bool"))
        if sample_weight is not None:
            weight = ops.convert_to_tensor(sample_weight)
            weight = ops.reshape(weight, (-1, 1)) if len(weight.shape) == 1 else weight
            weight = weight[..., 0] if len(weight.shape) == 3 else weight
            valid = ops.logical_and(valid, ops.not_equal(weight, 0))
        return valid

    def _codes_and_types(self, ids, valid):
        ids = ops.clip(ids, 0, len(self.tags) - 1)
        codes = ops.take(ops.convert_to_tensor(np.array(self._codes, "int32")), ids)
        types = ops.take(ops.convert_to_tensor(np.array(self._type_ids, "int32")), ids)
        return ops.where(valid, codes, 0), ops.where(valid, types, 0)

    def _count(self, flags, types):
        """Per type (`[len(self.types)]`), how many positions are flagged."""
        one_hot = ops.one_hot(types, len(self.types) + 1, dtype="float32")[..., 1:]
        return ops.sum(one_hot * ops.cast(flags, "float32")[..., None], axis=(0, 1))

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.convert_to_tensor(y_true)
        y_true = y_true[..., 0] if len(y_true.shape) == 3 else y_true
        y_true = ops.cast(y_true, "int32")
        valid = self._positions_that_count(y_true, y_pred, sample_weight)
        y_pred = ops.convert_to_tensor(y_pred)
        ids = ops.argmax(y_pred, axis=-1) if len(y_pred.shape) == 3 else y_pred
        gold_codes, gold_types = self._codes_and_types(y_true, valid)
        codes, types = self._codes_and_types(ops.cast(ids, "int32"), valid)
        gold, predicted = span_boundaries(gold_codes, gold_types), span_boundaries(codes, types)
        correct, correct_types = correct_spans(gold, predicted, gold_types, types)
        self.gold.assign_add(self._count(gold[0], gold_types))
        self.predicted.assign_add(self._count(predicted[0], types))
        self.correct.assign_add(self._count(correct, correct_types))

    def result(self):
        correct, predicted, gold = self.correct, self.predicted, self.gold
        if self.average == "micro":
            correct, predicted, gold = ops.sum(correct), ops.sum(predicted), ops.sum(gold)
        precision, recall = ops.divide_no_nan(correct, predicted), ops.divide_no_nan(correct, gold)
        f1 = ops.divide_no_nan(2.0 * precision * recall, precision + recall)
        if self.average == "macro":
            found = ops.cast(ops.greater(predicted + gold, 0), "float32")
            f1 = ops.divide_no_nan(ops.sum(f1 * found), ops.sum(found))
        return ops.cast(f1, self.dtype)

    def scores(self) -> SpanScores:
        """The counts so far as `SpanScores` (overall and per type; eager)."""
        counts = [ops.convert_to_numpy(v).astype(int) for v in (self.gold, self.predicted, self.correct)]
        types = {kind: SpanScores.from_counts(*(int(c[i]) for c in counts))
                 for i, kind in enumerate(self.types) if counts[0][i] + counts[1][i]}
        return SpanScores.from_counts(*(int(c.sum()) for c in counts), types=types)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"tags": list(self.tags), "scheme": self.scheme, "average": self.average})
        return config


def _output_mask(y_pred):
    """The mask Keras attached to a model output, or None; `kb.CRF`'s tags
    also carry it in their CRF scores (which JAX's traced arrays keep)."""
    mask = tf_internal.keras_mask(y_pred)
    if mask is None:
        from keras_birnn.crf import layer as crf  # here: crf imports the CRF layers' whole machinery

        try:
            mask = crf.crf_scores(y_pred).mask
        except ValueError:
            return None
    return mask
