"""Sentence-level heads: one vector per sequence from per-position outputs.

The textbook's last exercise asks how a bidirectional RNN serves sentence-level
classification (one output, not one per position). These layers answer it,
mask-exactly: each reads the mask that `kb.Bidirectional` propagates (Keras
passes it as `mask=` automatically), ignores padded positions wherever they
are (right, left, holes), gives the same vector whatever the padding length,
and returns zeros, never NaN or -inf, for a row with no valid position.
"""

from typing import Optional, Sequence

import keras
import tensorflow as tf
from keras import initializers

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import check_units
from keras_birnn.masking import check_sequence_input, dense_mask, dense_sequence_and_mask
from keras_birnn.serialization import attributes, initializer_configs


def _is_sequence_list(inputs) -> bool:
    return isinstance(inputs, (list, tuple))


def _combined_mask(mask) -> Optional[tf.Tensor]:
    """One bool `[batch, time]` mask from a mask or a list of masks (AND of
    those given; entries that are None or not `[batch, time]` are skipped)."""
    if mask is None:
        return None
    masks = list(mask) if isinstance(mask, (list, tuple)) else [mask]
    combined = None
    for m in masks:
        if m is None:
            continue
        m = tf.convert_to_tensor(dense_mask(m))
        if m.shape.rank != 2:
            continue
        m = m if m.dtype == tf.bool else tf.not_equal(m, 0)
        combined = m if combined is None else tf.logical_and(combined, m)
    return combined


def _sequence_and_mask(inputs, mask, layer_name):
    """`[B, T, D]` features and a bool `[B, T]` mask (or None).

    A list of sequences (the `merge_mode=None` pair) is concatenated on the
    feature axis.
    """
    if _is_sequence_list(inputs):
        parts = [tf.convert_to_tensor(x) for x in inputs]
        if not parts or any(p.shape.rank != 3 for p in parts):
            raise ValueError(
                f"Layer {layer_name!r} expects a [batch, time, features] tensor or a list of "
                f"them (the merge_mode=None pair), received shapes {[p.shape for p in parts]}."
            )
        sequence = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
        if not sequence.dtype.is_floating:
            raise TypeError(f"Layer {layer_name!r} expects float inputs, received dtype {sequence.dtype.name}.")
    else:
        if isinstance(inputs, tf.RaggedTensor):
            inputs, lengths_mask = dense_sequence_and_mask(inputs, None)
            mask = [lengths_mask] + (list(mask) if isinstance(mask, (list, tuple)) else [mask])
        sequence = check_sequence_input(inputs, layer_name)
    mask = _combined_mask(mask)
    if mask is not None and not mask.shape.is_compatible_with(sequence.shape[:2]):
        raise ValueError(
            f"`mask` must have shape [batch, time] = {sequence.shape[:2]}, received shape {mask.shape}."
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
            return tf.reduce_mean(sequence, axis=1)
        valid = tf.expand_dims(mask, -1)
        total = tf.reduce_sum(tf.where(valid, sequence, tf.zeros_like(sequence)), axis=1)
        count = tf.reduce_sum(tf.cast(mask, sequence.dtype), axis=1, keepdims=True)
        return total / tf.maximum(count, tf.ones_like(count))


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
            return tf.reduce_max(sequence, axis=1)
        valid = tf.expand_dims(mask, -1)
        lowest = tf.fill(tf.shape(sequence), tf.constant(sequence.dtype.min, sequence.dtype))
        maximum = tf.reduce_max(tf.where(valid, sequence, lowest), axis=1)
        has_steps = tf.reduce_any(mask, axis=1, keepdims=True)
        return tf.where(has_steps, maximum, tf.zeros_like(maximum))


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

    def scores(self, sequence):
        """Unnormalised scores `[batch, time]`."""
        hidden = tf.tensordot(sequence, tf.cast(self.kernel, sequence.dtype), axes=1)
        if self.bias is not None:
            hidden = hidden + tf.cast(self.bias, sequence.dtype)
        return tf.tensordot(tf.tanh(hidden), tf.cast(self.score_kernel, sequence.dtype), axes=1)[..., 0]

    def call(self, inputs, mask=None):
        sequence, mask = _sequence_and_mask(inputs, mask, self.name)
        if mask is not None:
            sequence = tf.where(tf.expand_dims(mask, -1), sequence, tf.zeros_like(sequence))
        scores = self.scores(sequence)
        if mask is None:
            weights = tf.nn.softmax(scores, axis=-1)
        else:
            # The softmax over valid positions only, written out so that no
            # -inf ever appears: padded slots take weight exactly 0.
            lowest = tf.fill(tf.shape(scores), tf.constant(scores.dtype.min, scores.dtype))
            top = tf.reduce_max(tf.where(mask, scores, lowest), axis=-1, keepdims=True)
            zeros = tf.zeros_like(scores)
            shifted = tf.where(mask, scores - tf.stop_gradient(top), zeros)
            exps = tf.where(mask, tf.exp(shifted), zeros)
            total = tf.reduce_sum(exps, axis=-1, keepdims=True)
            weights = exps / tf.where(total > 0, total, tf.ones_like(total))
        pooled = tf.einsum("bt,btd->bd", weights, sequence)
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
        forward, backward = tf.convert_to_tensor(forward), tf.convert_to_tensor(backward)
        masks = list(mask) if isinstance(mask, (list, tuple)) else [mask] * len(inputs)
        if kind == "finals":
            return tf.concat([forward, backward], axis=-1)
        if kind == "states":
            sequence_mask = _combined_mask(masks[:leading])
            pooled = tf.concat([forward, backward], axis=-1)
            if sequence_mask is None:
                return pooled
            has_steps = tf.reduce_any(sequence_mask, axis=1, keepdims=True)
            return tf.where(has_steps, pooled, tf.zeros_like(pooled))
        mask = _combined_mask(masks)
        time_steps = tf.shape(forward)[1]
        if mask is None:
            return tf.concat([forward[:, -1], backward[:, 0]], axis=-1)
        if not mask.shape.is_compatible_with(forward.shape[:2]):
            raise ValueError(
                f"`mask` must have shape [batch, time] = {forward.shape[:2]}, received {mask.shape}."
            )
        positions = tf.expand_dims(tf.range(time_steps), 0)
        last = tf.reduce_max(tf.where(mask, positions, -1), axis=1)
        first = tf.reduce_min(tf.where(mask, positions, time_steps), axis=1)
        has_steps = last >= 0
        last = tf.maximum(last, 0)
        first = tf.minimum(first, time_steps - 1)
        pooled = tf.concat(
            [tf.gather(forward, last, batch_dims=1), tf.gather(backward, first, batch_dims=1)], axis=-1
        )
        return tf.where(tf.expand_dims(has_steps, -1), pooled, tf.zeros_like(pooled))

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
