"""GRU cell in both reset conventions, gates in Keras's order z, r, h."""

from __future__ import annotations

from typing import NamedTuple

from keras import activations, ops

from keras_birnn import backend

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell
from keras_birnn.cells.derivatives import backprop, differentiates_from_output
from keras_birnn.cells.step_math import column_sum

if backend.IS_TENSORFLOW:  # the hand-written BPTT (`backward`) runs on the TensorFlow engine only
    import tensorflow as tf


class GRUMath(NamedTuple):
    """Pure GRU step maths, forward and backward (for BPTT).

    `reset_after=False` is the textbook's GRU: the reset gate scales the state
    before the recurrent matmul of the candidate. `reset_after=True` is
    Keras's (and cuDNN's) default: it scales the matmul's result. `saved`
    holds z, r and the candidate (and, after reset, the candidate's
    recurrent term), so the backward step needs no matmul and no input
    projection to rebuild them: as activations where both activations
    differentiate from their outputs (tanh, sigmoid, linear, relu), so it
    needs no transcendental either; else as pre-activations.
    """

    activation: object
    recurrent_activation: object
    reset_after: bool

    # Not a field (no annotation): `StepMath.materialize_saved`; only the
    # LSTM's one-tanh backward was measured faster materialised
    # (benchmarks/README.md, "Design measurements").
    materialize_saved = False

    @property
    def _saves_activations(self) -> bool:
        return differentiates_from_output(self.activation, self.recurrent_activation)

    def saved_width(self, units: int) -> int:
        """Width of what `forward` saves per step for `backward`."""
        return 4 * units if self.reset_after else 3 * units

    @staticmethod
    def record_width(units: int) -> int:
        """Width of what `backward` records per step for the bulk gradients."""
        return 4 * units

    def forward(self, projected, states, recurrent_kernel, recurrent_bias=None, state_mask=None, with_saved=True):
        h = states[0]
        h_in = h if state_mask is None else h * state_mask
        x_z, x_r, x_h = ops.split(projected, 3, axis=-1)
        if self.reset_after:
            recurrent = ops.matmul(h_in, recurrent_kernel)
            if recurrent_bias is not None:
                recurrent = recurrent + recurrent_bias
            h_z, h_r, h_h = ops.split(recurrent, 3, axis=-1)
            pre_z, pre_r = x_z + h_z, x_r + h_r
            r = self.recurrent_activation(pre_r)
            pre_c = x_h + r * h_h
            extra = [h_h]
        else:
            units = recurrent_kernel.shape[0]
            gate_kernel, candidate_kernel = recurrent_kernel[:, : 2 * units], recurrent_kernel[:, 2 * units :]
            h_z, h_r = ops.split(ops.matmul(h_in, gate_kernel), 2, axis=-1)
            pre_z, pre_r = x_z + h_z, x_r + h_r
            r = self.recurrent_activation(pre_r)
            pre_c = x_h + ops.matmul(r * h_in, candidate_kernel)
            extra = []
        z = self.recurrent_activation(pre_z)
        candidate = self.activation(pre_c)
        if not with_saved:
            return [z * h + (1.0 - z) * candidate], None
        kept = [z, r, candidate] if self._saves_activations else [pre_z, pre_r, pre_c]
        return [z * h + (1.0 - z) * candidate], ops.concatenate(kept + extra, axis=-1)

    def _gates(self, saved):
        """((z, r, candidate), their pre-activations or Nones, the candidate's
        recurrent term after reset or None) from what `forward` saved."""
        parts = tf.split(saved, 4 if self.reset_after else 3, axis=-1)
        h_h = parts[3] if self.reset_after else None
        if self._saves_activations:
            return tuple(parts[:3]), (None, None, None), h_h
        pre_z, pre_r, pre_c = parts[:3]
        rec = self.recurrent_activation
        return (rec(pre_z), rec(pre_r), self.activation(pre_c)), (pre_z, pre_r, pre_c), h_h

    def backward(self, states, saved, transposed_kernel, state_mask, d_new):
        """One step back: returns (record, d_states).

        `record` is `[d_pre_z, d_pre_r, candidate_term, d_pre_c]`, from
        which `input_gradient` and `kernel_gradient` take their sums over
        all steps after the loop. After reset the candidate term is the
        gradient of the candidate's recurrent term (`d_pre_c * r`), before
        reset it is the candidate matmul's left operand (`r * h_in`).
        """
        h = states[0]
        units = transposed_kernel.shape[-1]  # static, where a state passed in may not be
        h_in = h if state_mask is None else h * state_mask
        (z, r, candidate), (pre_z, pre_r, pre_c), h_h = self._gates(saved)
        rec = self.recurrent_activation
        d_h = d_new[0]
        d_pre_c = backprop(self.activation, d_h * (1.0 - z), candidate, pre_c)
        d_pre_z = backprop(rec, d_h * (h - candidate), z, pre_z)
        if self.reset_after:
            d_pre_r = backprop(rec, d_pre_c * h_h, r, pre_r)
            d_recurrent = tf.concat([d_pre_z, d_pre_r, d_pre_c * r], axis=-1)
            d_h_in = tf.matmul(d_recurrent, transposed_kernel)
            record = tf.concat([d_recurrent, d_pre_c], axis=-1)
        else:
            gate_kernel_t, candidate_kernel_t = transposed_kernel[: 2 * units], transposed_kernel[2 * units :]
            d_reset_in = tf.matmul(d_pre_c, candidate_kernel_t)
            d_pre_r = backprop(rec, d_reset_in * h_in, r, pre_r)
            d_gates = tf.concat([d_pre_z, d_pre_r], axis=-1)
            d_h_in = tf.matmul(d_gates, gate_kernel_t) + d_reset_in * r
            record = tf.concat([d_gates, r * h_in, d_pre_c], axis=-1)
        if state_mask is not None:
            d_h_in = d_h_in * state_mask
        return record, [d_h * z + d_h_in]

    @staticmethod
    def input_gradient(records):
        """The projected inputs' gradient `[N, 3U]` from records `[N, 4U]`."""
        units = records.shape[-1] // 4
        return tf.concat([records[:, : 2 * units], records[:, 3 * units :]], axis=-1)

    def kernel_gradient(self, h_in, records):
        """(d_recurrent_kernel, d_recurrent_bias), summed over all steps
        stacked `[steps * batch, ...]`."""
        units = records.shape[-1] // 4
        if self.reset_after:
            d_recurrent = records[:, : 3 * units]
            return tf.matmul(h_in, d_recurrent, transpose_a=True), column_sum(d_recurrent)
        d_kernel = tf.concat(
            [
                tf.matmul(h_in, records[:, : 2 * units], transpose_a=True),
                tf.matmul(records[:, 2 * units : 3 * units], records[:, 3 * units :], transpose_a=True),
            ],
            axis=-1,
        )
        return d_kernel, None


@keras_birnn_export("keras_birnn.GRUCell")
class GRUCell(RecurrentCell):
    """Gated recurrent unit with Keras's weight layout.

    `kernel [input_dim, 3*units]`, `recurrent_kernel [units, 3*units]`,
    gates z (update), r (reset), h (candidate); `bias [2, 3*units]` (input
    and recurrent bias) when `reset_after=True`, else `[3*units]`.
    h_t = z * h_{t-1} + (1 - z) * candidate.

    Args:
        units: Positive integer, size of the state.
        reset_after: Apply the reset gate after the recurrent matmul
            (Keras default) or before it (the textbook, classic GRU).
        activation: Candidate activation (default `"tanh"`).
        recurrent_activation: Gate activation (default `"sigmoid"`).
        **kwargs: See `RecurrentCell`.

    Example:

    >>> layer = kb.Bidirectional(kb.GRUCell(64, reset_after=False))
    >>> layer.build((None, None, 32))
    >>> layer.count_params()     # 2 directions x 3 gates x (32*64 + 64*64 + 64)
    37248
    """

    gate_count = 3
    state_count = 1
    object_arguments = RecurrentCell.object_arguments + ("recurrent_activation",)

    def __init__(self, units: int, reset_after: bool = True, activation="tanh",
                 recurrent_activation="sigmoid", **kwargs):
        super().__init__(units, activation=activation, **kwargs)
        self.reset_after = bool(reset_after)
        self.recurrent_activation = activations.get(recurrent_activation)

    def bias_shape(self) -> tuple:
        if self.reset_after:
            return (2, 3 * self.units)
        return (3 * self.units,)

    def input_bias(self, bias):
        return bias[0] if self.reset_after else bias

    def recurrent_bias(self, bias):
        return bias[1] if self.reset_after else None

    def step_math(self) -> GRUMath:
        return GRUMath(self.activation, self.recurrent_activation, self.reset_after)

    def _arguments_config(self) -> dict:
        config = super()._arguments_config()
        config.update({"reset_after": self.reset_after})
        return config
