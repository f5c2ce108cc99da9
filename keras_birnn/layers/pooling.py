"""Sentence-level heads: one vector per sequence from per-position outputs.

The textbook's last exercise asks how a bidirectional RNN serves sentence-level
classification (one output, not one per position). These layers answer it,
mask-exactly: each reads the mask that `kb.Bidirectional` propagates (Keras
passes it as `mask=` automatically), ignores padded positions wherever they
are (right, left, holes), gives the same vector whatever the padding length,
and returns zeros, never NaN or -inf, for a row with no valid position.

Written in `keras.ops`: the heads run on every Keras backend. TensorFlow
alone has ragged batches (read as padded ones) and keeps one op of its own
(`_take_per_row`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import keras
import ml_dtypes
from keras import initializers, ops

from keras_birnn import backend
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import check_units
from keras_birnn.masking import check_sequence_input, dense_mask, dense_sequence_and_mask
from keras_birnn.serialization import attributes, initializer_configs

if backend.IS_TENSORFLOW:
    import tensorflow as tf

Tensor = Any  # a tensor of the backend


def _is_sequence_list(inputs) -> bool:
    return isinstance(inputs, (list, tuple))


def _compatible(shape, expected) -> bool:
    """Whether two shapes can be the same (`None`: any size)."""
    return len(shape) == len(expected) and all(
        a is None or b is None or a == b for a, b in zip(shape, expected)
    )


def _combined_mask(mask) -> Optional[Tensor]:
    """One bool `[batch, time]` mask from a mask or a list of masks (AND of
    those given; entries that are None or not `[batch, time]` are skipped)."""
    if mask is None:
        return None
    masks = list(mask) if isinstance(mask, (list, tuple)) else [mask]
    combined = None
    for m in masks:
        if m is None:
            continue
        m = ops.convert_to_tensor(dense_mask(m))
        if len(m.shape) != 2:
            continue
        m = m if keras.backend.standardize_dtype(m.dtype) == "bool" else ops.not_equal(m, 0)
        combined = m if combined is None else ops.logical_and(combined, m)
    return combined


def _lowest(dtype) -> float:
    """The lowest finite value of a float dtype (bfloat16 included)."""
    return float(ml_dtypes.finfo(keras.backend.standardize_dtype(dtype)).min)


def _reduce(reduction, values: Tensor, axis: int, initial, keepdims: bool) -> Tensor:
    if backend.NAME == "torch" and 0 in tuple(values.shape):
        # Keras's PyTorch max and min return a scalar for an empty tensor,
        # whatever the axis.
        shape = list(values.shape)
        shape[axis] = 1
        full = ops.full(shape, initial, dtype=values.dtype)
        return full if keepdims else ops.squeeze(full, axis)
    return reduction(values, axis=axis, keepdims=keepdims, initial=initial)


def reduce_max(values: Tensor, axis: int, initial, keepdims: bool = False) -> Tensor:
    """`ops.max` along `axis`, at least `initial`, and right for an empty
    batch or axis on every backend: `ops.max` without `initial` refuses an
    empty tensor (eagerly, on TensorFlow, where `tf.reduce_max` took it)."""
    return _reduce(ops.max, values, axis, initial, keepdims)


def reduce_min(values: Tensor, axis: int, initial, keepdims: bool = False) -> Tensor:
    """`ops.min` along `axis`, at most `initial` (as `reduce_max`)."""
    return _reduce(ops.min, values, axis, initial, keepdims)


def _masked_max(values: Tensor, mask: Optional[Tensor], axis: int, keepdims: bool = False) -> Tensor:
    """The maximum over valid entries (`mask` broadcast to `values`; None:
    all): the dtype's lowest finite value where none is valid, never -inf
    (whose arithmetic would give NaN)."""
    lowest = _lowest(values.dtype)
    values = values if mask is None else ops.where(mask, values, lowest)
    return reduce_max(values, axis, lowest, keepdims=keepdims)


def _take_per_row(sequence: Tensor, positions: Tensor) -> Tensor:
    """`sequence[b, positions[b]]` for each row b: `[batch, features]`."""
    if backend.IS_TENSORFLOW:  # one batched GatherV2, the op the exported graphs hold
        return tf.gather(sequence, positions, batch_dims=1)
    index = ops.expand_dims(ops.expand_dims(positions, -1), -1)
    return ops.take_along_axis(sequence, index, axis=1)[:, 0]


def _sequence_and_mask(inputs, mask, layer_name):
    """`[B, T, D]` features and a bool `[B, T]` mask (or None).

    A list of sequences (the `merge_mode=None` pair) is concatenated on the
    feature axis.
    """
    if _is_sequence_list(inputs):
        parts = [ops.convert_to_tensor(x) for x in inputs]
        if not parts or any(len(p.shape) != 3 for p in parts):
            raise ValueError(
                f"Layer {layer_name!r} expects a [batch, time, features] tensor or a list of "
                f"them (the merge_mode=None pair), received shapes {[tuple(p.shape) for p in parts]}."
            )
        sequence = parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=-1)
        if not keras.backend.is_float_dtype(sequence.dtype):
            dtype = keras.backend.standardize_dtype(sequence.dtype)
            raise TypeError(f"Layer {layer_name!r} expects float inputs, received dtype {dtype}.")
    else:
        if backend.is_ragged(inputs):  # (TensorFlow only: no other backend has ragged tensors)
            inputs, lengths_mask = dense_sequence_and_mask(inputs, None)
            mask = [lengths_mask] + (list(mask) if isinstance(mask, (list, tuple)) else [mask])
        sequence = check_sequence_input(inputs, layer_name)
    mask = _combined_mask(mask)
    if mask is not None and not _compatible(tuple(mask.shape), tuple(sequence.shape[:2])):
        raise ValueError(
            f"`mask` must have shape [batch, time] = {tuple(sequence.shape[:2])}, "
            f"received shape {tuple(mask.shape)}."
        )
    return sequence, mask


def _is_shape_list(input_shape) -> bool:
    return _is_sequence_list(input_shape) and not isinstance(input_shape[0], (int, type(None)))


def _first_shape(input_shape):
    return input_shape[0] if _is_shape_list(input_shape) else input_shape


def _sequence_output_shape(input_shape):
    """`[batch, width]` of a pooled `[batch, time, width]` (or a list of them)."""
    if _is_shape_list(input_shape):
        widths = [s[-1] for s in input_shape]
        width = None if any(w is None for w in widths) else sum(widths)
        return (input_shape[0][0], width)
    return (input_shape[0], input_shape[-1])


class _SequencePooling(keras.layers.Layer):
    """Common ground: reads the propagated mask, outputs no mask."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # True so that Keras hands us the mask without a "destroys the mask"
        # warning; compute_mask ends it here (the output has no time axis).
        self.supports_masking = True

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return _sequence_output_shape(input_shape)


@keras_birnn_export("keras_birnn.MaskedMeanPooling")
class MaskedMeanPooling(_SequencePooling):
    """Mean over each row's valid positions.

    Inputs: a float `[batch, time, features]` tensor, or the
    `merge_mode=None` pair `[h_f, h_b]` (concatenated on the feature axis).
    Whatever sits in a padded slot (NaN included) never reaches the output
    or the gradient; a row with no valid position gives zeros.

    Example:

    >>> token_ids = np.array([[3, 7, 2, 0, 0], [5, 1, 4, 6, 0]])   # 0: padding
    >>> embedded = keras.layers.Embedding(10, 4, mask_zero=True)(token_ids)
    >>> x = kb.Bidirectional(kb.GRUCell(8), return_sequences=True)(embedded)
    >>> sentence = kb.MaskedMeanPooling()(x)
    >>> sentence.shape
    TensorShape([2, 16])
    """

    def call(self, inputs, mask=None):
        sequence, mask = _sequence_and_mask(inputs, mask, self.name)
        if mask is None:
            return ops.mean(sequence, axis=1)
        valid = ops.expand_dims(mask, -1)
        total = ops.sum(ops.where(valid, sequence, ops.zeros_like(sequence)), axis=1)
        count = ops.sum(ops.cast(mask, sequence.dtype), axis=1, keepdims=True)
        return total / ops.maximum(count, ops.ones_like(count))


@keras_birnn_export("keras_birnn.MaskedMaxPooling")
class MaskedMaxPooling(_SequencePooling):
    """Feature-wise maximum over each row's valid positions.

    Inputs as for `kb.MaskedMeanPooling`. A row with no valid position
    gives zeros (not -inf); the gradient reaches only the valid position
    holding each maximum.
    """

    def call(self, inputs, mask=None):
        sequence, mask = _sequence_and_mask(inputs, mask, self.name)
        if mask is None:
            return _masked_max(sequence, None, axis=1)
        maximum = _masked_max(sequence, ops.expand_dims(mask, -1), axis=1)
        has_steps = ops.any(mask, axis=1, keepdims=True)
        return ops.where(has_steps, maximum, ops.zeros_like(maximum))


def _masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """The softmax over valid positions only, written out so that no -inf
    ever appears: padded slots take weight exactly 0, and a row with no
    valid position all-zero weights."""
    top = _masked_max(scores, mask, axis=-1, keepdims=True)
    zeros = ops.zeros_like(scores)
    shifted = ops.where(mask, scores - ops.stop_gradient(top), zeros)
    exps = ops.where(mask, ops.exp(shifted), zeros)
    total = ops.sum(exps, axis=-1, keepdims=True)
    return exps / ops.where(total > 0, total, ops.ones_like(total))


@keras_birnn_export("keras_birnn.AttentionPooling")
class AttentionPooling(_SequencePooling):
    """Additive attention over positions with a masked softmax.

    score_t = v . tanh(h_t W + b),  a = softmax over valid t,
    output = sum_t a_t h_t.

    Padded positions get weight exactly 0; a row with no valid position
    gets all-zero weights and a zero vector.

    Args:
        units: Width of the attention's hidden layer (W is `[features, units]`).
        return_weights: Also return the weights `[batch, time]`, as
            `[pooled, weights]`, to see which positions the head read.
        use_bias: Whether the hidden layer has the bias b.
        kernel_initializer, bias_initializer: Initializers of W and v, and of b.

    Inputs as for `kb.MaskedMeanPooling`.
    """

    def __init__(
        self,
        units: int,
        return_weights: bool = False,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = check_units(units)
        self.return_weights = bool(return_weights)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.bias_initializer = initializers.get(bias_initializer)

    def build(self, input_shape):
        width = _sequence_output_shape(input_shape)[-1]
        if width is None:
            raise ValueError(f"Layer {self.name!r} needs a known feature size, received {input_shape}.")
        self.kernel = self.add_weight(
            shape=(width, self.units), name="kernel", initializer=self.kernel_initializer
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(shape=(self.units,), name="bias", initializer=self.bias_initializer)
        self.score_kernel = self.add_weight(
            shape=(self.units, 1), name="score_kernel", initializer=self.kernel_initializer
        )

    def scores(self, sequence: Tensor) -> Tensor:
        """Unnormalised scores `[batch, time]`."""
        hidden = ops.tensordot(sequence, ops.cast(self.kernel, sequence.dtype), axes=1)
        if self.bias is not None:
            hidden = hidden + ops.cast(self.bias, sequence.dtype)
        return ops.tensordot(ops.tanh(hidden), ops.cast(self.score_kernel, sequence.dtype), axes=1)[..., 0]

    def call(self, inputs, mask=None):
        sequence, mask = _sequence_and_mask(inputs, mask, self.name)
        if mask is not None:
            sequence = ops.where(ops.expand_dims(mask, -1), sequence, ops.zeros_like(sequence))
        scores = self.scores(sequence)
        weights = ops.softmax(scores, axis=-1) if mask is None else _masked_softmax(scores, mask)
        pooled = ops.einsum("bt,btd->bd", weights, sequence)
        return [pooled, weights] if self.return_weights else pooled

    def compute_mask(self, inputs, mask=None):
        return [None, None] if self.return_weights else None

    def compute_output_shape(self, input_shape):
        pooled = _sequence_output_shape(input_shape)
        if not self.return_weights:
            return pooled
        return [pooled, tuple(_first_shape(input_shape)[:2])]

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(attributes(self, "units", "return_weights", "use_bias"))
        config.update(initializer_configs(self, "kernel_initializer", "bias_initializer"))
        return config


@keras_birnn_export("keras_birnn.FinalStatePooling")
class FinalStatePooling(keras.layers.Layer):
    """The classic BiRNN sentence vector: [h_f at the last valid step, h_b at the first].

    For each row, the forward output at its last valid position
    concatenated with the backward output at its first valid position:
    what each direction holds after reading the whole row. Correct for
    right padding, left padding and holes; zeros for a row with no valid
    position.

    Accepted inputs (exactly these forms):

    1. `[h_f, h_b]`, two `[batch, time, units]` sequences: the output of
       `kb.Bidirectional(..., merge_mode=None, return_sequences=True)`,
       with its propagated mask (or a `mask=` argument). Without a mask
       every position is valid.
    2. `[h_f_final, h_b_final]`, two `[batch, units]` tensors: the output of
       `kb.Bidirectional(..., merge_mode=None)` (`return_sequences=False`);
       they are concatenated.
    3. The whole output list of `kb.Bidirectional(..., return_state=True)`,
       any `merge_mode` and `return_sequences`: `[output(s)..., forward
       states..., backward states...]`. The first forward state and the
       first backward state are taken (h, also for an LSTM, whose c is
       skipped). The list's length tells the layout when both directions
       have the same number of states (the default: the backward cell is
       a copy of the forward one): odd means one merged output, even means
       the `merge_mode=None` pair. With different cells per direction, pass
       `state_counts=(forward_count, backward_count)`. Rows with no valid
       position are zeroed when a sequence mask reaches the layer
       (`return_sequences=True`); with `return_sequences=False` no mask
       does, so such rows hold the boundary states (zeros unless
       `initial_state` is a constant or `"learned"`).

    Args:
        state_counts: Optional `(forward_count, backward_count)` for form 3.

    Example:

    >>> token_ids = np.array([[3, 7, 2, 0, 0], [5, 1, 4, 6, 0]])   # 0: padding
    >>> embedded = keras.layers.Embedding(10, 4, mask_zero=True)(token_ids)
    >>> pair = kb.Bidirectional(kb.GRUCell(8), merge_mode=None, return_sequences=True)(embedded)
    >>> sentence = kb.FinalStatePooling()(pair)
    >>> sentence.shape
    TensorShape([2, 16])
    """

    def __init__(self, state_counts: Optional[Sequence[int]] = None, **kwargs):
        super().__init__(**kwargs)
        if state_counts is not None:
            state_counts = tuple(int(n) for n in state_counts)
            if len(state_counts) != 2 or min(state_counts) < 1:
                raise ValueError(
                    "`state_counts` must be (forward_count, backward_count), two positive "
                    f"integers, received {state_counts!r}."
                )
        self.state_counts = state_counts
        self.supports_masking = True

    def _layout(self, count: int):
        """(number of leading outputs, forward count, backward count) of form 3."""
        if self.state_counts is not None:
            n_f, n_b = self.state_counts
            leading = count - n_f - n_b
            if leading not in (1, 2):
                raise ValueError(
                    f"With state_counts={self.state_counts}, expected a list of "
                    f"{n_f + n_b + 1} or {n_f + n_b + 2} tensors, received {count}."
                )
            return leading, n_f, n_b
        leading = 1 if count % 2 else 2
        n = (count - leading) // 2
        return leading, n, n

    def _parse(self, inputs):
        """Returns (kind, forward, backward, leading outputs count)."""
        if not _is_sequence_list(inputs) or len(inputs) < 2:
            raise ValueError(
                f"Layer {self.name!r} expects the [h_f, h_b] pair of a kb.Bidirectional with "
                "merge_mode=None, or the output list of a kb.Bidirectional with "
                f"return_state=True; received {inputs!r}."
            )
        parts = list(inputs)
        ranks = [len(p.shape) for p in parts]
        if len(parts) == 2 and ranks == [3, 3] and self.state_counts is None:
            return "sequences", parts[0], parts[1], 2
        if len(parts) == 2 and ranks == [2, 2] and self.state_counts is None:
            return "finals", parts[0], parts[1], 2
        leading, n_f, _ = self._layout(len(parts))
        if len(parts) < 3:
            raise ValueError(f"Layer {self.name!r} cannot read a list of {len(parts)} tensors.")
        forward, backward = parts[leading], parts[leading + n_f]
        if len(forward.shape) != 2 or len(backward.shape) != 2:
            raise ValueError(
                f"Layer {self.name!r}: expected [batch, units] states at positions {leading} and "
                f"{leading + n_f} of the return_state list, received shapes {forward.shape} and "
                f"{backward.shape}. Pass state_counts=(forward_count, backward_count) if the "
                "directions have different cells."
            )
        return "states", forward, backward, leading

    def call(self, inputs, mask=None):
        kind, forward, backward, leading = self._parse(inputs)
        forward, backward = ops.convert_to_tensor(forward), ops.convert_to_tensor(backward)
        masks = list(mask) if isinstance(mask, (list, tuple)) else [mask] * len(inputs)
        if kind == "finals":
            return ops.concatenate([forward, backward], axis=-1)
        if kind == "states":
            sequence_mask = _combined_mask(masks[:leading])
            pooled = ops.concatenate([forward, backward], axis=-1)
            if sequence_mask is None:
                return pooled
            has_steps = ops.any(sequence_mask, axis=1, keepdims=True)
            return ops.where(has_steps, pooled, ops.zeros_like(pooled))
        mask = _combined_mask(masks)
        if mask is None:
            return ops.concatenate([forward[:, -1], backward[:, 0]], axis=-1)
        if not _compatible(tuple(mask.shape), tuple(forward.shape[:2])):
            raise ValueError(
                f"`mask` must have shape [batch, time] = {tuple(forward.shape[:2])}, "
                f"received {tuple(mask.shape)}."
            )
        return self._pool_sequences(forward, backward, mask)

    def _pool_sequences(self, forward: Tensor, backward: Tensor, mask: Tensor) -> Tensor:
        """[forward at each row's last valid position, backward at its first];
        zeros for a row with none."""
        time_steps = ops.shape(forward)[1]
        positions = ops.expand_dims(ops.arange(time_steps, dtype="int32"), 0)
        last = reduce_max(ops.where(mask, positions, -1), 1, initial=-1)
        first = reduce_min(ops.where(mask, positions, time_steps), 1, initial=time_steps)
        has_steps = last >= 0
        last = ops.maximum(last, 0)
        first = ops.minimum(first, time_steps - 1)
        pooled = ops.concatenate([_take_per_row(forward, last), _take_per_row(backward, first)], axis=-1)
        return ops.where(ops.expand_dims(has_steps, -1), pooled, ops.zeros_like(pooled))

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        shapes = list(input_shape)
        if len(shapes) == 2 and self.state_counts is None:
            forward, backward = shapes
        else:
            leading, n_f, _ = self._layout(len(shapes))
            forward, backward = shapes[leading], shapes[leading + n_f]
        width = None if forward[-1] is None or backward[-1] is None else forward[-1] + backward[-1]
        return (forward[0], width)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"state_counts": None if self.state_counts is None else list(self.state_counts)})
        return config
