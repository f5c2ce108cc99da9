"""GRU cell in both reset conventions, gates in Keras's order z, r, h."""

from typing import NamedTuple

import tensorflow as tf
from keras import activations

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell
from keras_birnn.cells.derivatives import derivative


class GRUMath(NamedTuple):
    """Pure GRU step maths, forward and backward (for BPTT).

    `reset_after=False` is seed 000's GRU: the reset gate scales the state
    before the recurrent matmul of the candidate. `reset_after=True` is
    Keras's (and cuDNN's) default: it scales the matmul's result. `saved`
    is the recurrent matmul's result (`[B, 3U]`), so the backward step
    recomputes the gates elementwise instead of storing them.
    """

    activation: object
    recurrent_activation: object
    reset_after: bool

    def _gates(self, projected, saved):
        x_z, x_r, x_h = tf.split(projected, 3, axis=-1)
        h_z, h_r, h_h = tf.split(saved, 3, axis=-1)
        z = self.recurrent_activation(x_z + h_z)
        r = self.recurrent_activation(x_r + h_r)
        return (x_z + h_z, z), (x_r + h_r, r), (x_h, h_h)

    @staticmethod
    def saved_width(units: int) -> int:
        """Width of what `forward` saves per step for `backward`."""
        return 3 * units

    def forward(self, projected, states, recurrent_kernel, recurrent_bias=None, state_mask=None):
        h = states[0]
        h_in = h if state_mask is None else h * state_mask
        x_z, x_r, x_h = tf.split(projected, 3, axis=-1)
        if self.reset_after:
            saved = tf.matmul(h_in, recurrent_kernel)
            if recurrent_bias is not None:
                saved = saved + recurrent_bias
            h_z, h_r, h_h = tf.split(saved, 3, axis=-1)
            z = self.recurrent_activation(x_z + h_z)
            r = self.recurrent_activation(x_r + h_r)
            candidate = self.activation(x_h + r * h_h)
        else:
            units = recurrent_kernel.shape[0]
            gate_kernel, candidate_kernel = recurrent_kernel[:, : 2 * units], recurrent_kernel[:, 2 * units :]
            h_z, h_r = tf.split(tf.matmul(h_in, gate_kernel), 2, axis=-1)
            z = self.recurrent_activation(x_z + h_z)
            r = self.recurrent_activation(x_r + h_r)
            h_h = tf.matmul(r * h_in, candidate_kernel)
            candidate = self.activation(x_h + h_h)
            saved = tf.concat([h_z, h_r, h_h], axis=-1)
        return [z * h + (1.0 - z) * candidate], saved

    def backward(self, projected, states, saved, recurrent_kernel, recurrent_bias, state_mask, d_new):
        """Returns (d_projected, d_states, d_recurrent_kernel, d_recurrent_bias)."""
        h = states[0]
        h_in = h if state_mask is None else h * state_mask
        (pre_z, z), (pre_r, r), (x_h, h_h) = self._gates(projected, saved)
        pre_c = x_h + r * h_h if self.reset_after else x_h + h_h
        candidate = self.activation(pre_c)
        d_h = d_new[0]
        d_pre_c = d_h * (1.0 - z) * derivative(self.activation, pre_c, candidate)
        d_pre_z = d_h * (h - candidate) * derivative(self.recurrent_activation, pre_z, z)
        units = recurrent_kernel.shape[0]
        if self.reset_after:
            d_pre_r = d_pre_c * h_h * derivative(self.recurrent_activation, pre_r, r)
            d_saved = tf.concat([d_pre_z, d_pre_r, d_pre_c * r], axis=-1)
            d_h_in = tf.matmul(d_saved, recurrent_kernel, transpose_b=True)
            d_kernel = tf.matmul(h_in, d_saved, transpose_a=True)
            d_bias = tf.reduce_sum(d_saved, axis=0)
        else:
            gate_kernel, candidate_kernel = recurrent_kernel[:, : 2 * units], recurrent_kernel[:, 2 * units :]
            d_reset_in = tf.matmul(d_pre_c, candidate_kernel, transpose_b=True)
            d_pre_r = d_reset_in * h_in * derivative(self.recurrent_activation, pre_r, r)
            d_gates = tf.concat([d_pre_z, d_pre_r], axis=-1)
            d_h_in = tf.matmul(d_gates, gate_kernel, transpose_b=True) + d_reset_in * r
            d_kernel = tf.concat(
                [tf.matmul(h_in, d_gates, transpose_a=True), tf.matmul(r * h_in, d_pre_c, transpose_a=True)],
                axis=-1,
            )
            d_bias = None
        if state_mask is not None:
            d_h_in = d_h_in * state_mask
        d_projected = tf.concat([d_pre_z, d_pre_r, d_pre_c], axis=-1)
        return d_projected, [d_h * z + d_h_in], d_kernel, d_bias


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
            (Keras default) or before it (seed 000, classic GRU).
        activation: Candidate activation (default `"tanh"`).
        recurrent_activation: Gate activation (default `"sigmoid"`).
        **kwargs: See `RecurrentCell`.

    Example:

    >>> layer = kb.Bidirectional(kb.GRUCell(64, reset_after=False))
    """

    gate_count = 3
    state_count = 1

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

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "reset_after": self.reset_after,
                "recurrent_activation": activations.serialize(self.recurrent_activation),
            }
        )
        return config
