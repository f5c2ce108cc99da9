"""LSTM cell, gates in Keras's order i, f, c, o; states (h, c)."""

import tensorflow as tf
from keras import activations, initializers

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell


def lstm_step(projected, h, c, recurrent_kernel, activation, recurrent_activation, state_mask=None):
    """One LSTM step given the input projection `x_t W + b`; returns (h, c)."""
    h_in = h if state_mask is None else h * state_mask
    z = projected + tf.matmul(h_in, recurrent_kernel)
    z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
    c_new = recurrent_activation(z_f) * c + recurrent_activation(z_i) * activation(z_c)
    h_new = recurrent_activation(z_o) * activation(c_new)
    return h_new, c_new


class _ForgetGateOnes(initializers.Initializer):
    """Bias initializer: the wrapped one, with the forget-gate block set to 1."""

    def __init__(self, base, units):
        self.base = base
        self.units = units

    def __call__(self, shape, dtype=None):
        u = self.units
        base = self.base((u,), dtype=dtype)
        return tf.concat([base, tf.ones((u,), dtype), self.base((2 * u,), dtype=dtype)], 0)


@keras_birnn_export("keras_birnn.LSTMCell")
class LSTMCell(RecurrentCell):
    """Long short-term memory cell with Keras's weight layout.

    `kernel [input_dim, 4*units]`, `recurrent_kernel [units, 4*units]`,
    `bias [4*units]`, gates i, f, c, o. States are `[h, c]`.

    Args:
        units: Positive integer, size of the state.
        activation: Cell and output activation (default `"tanh"`).
        recurrent_activation: Gate activation (default `"sigmoid"`).
        unit_forget_bias: Start the forget-gate bias at 1 (Jozefowicz et
            al., 2015), as Keras does.
        **kwargs: See `RecurrentCell`.

    Example:

    >>> layer = kb.Bidirectional(kb.LSTMCell(32), return_sequences=True)
    """

    gate_count = 4
    state_count = 2

    def __init__(self, units: int, activation="tanh", recurrent_activation="sigmoid",
                 unit_forget_bias: bool = True, **kwargs):
        super().__init__(units, activation=activation, **kwargs)
        self.recurrent_activation = activations.get(recurrent_activation)
        self.unit_forget_bias = bool(unit_forget_bias)

    def build_bias_initializer(self):
        if self.unit_forget_bias:
            return _ForgetGateOnes(self.bias_initializer, self.units)
        return self.bias_initializer

    def recurrent_step(self, projected, states, recurrent_kernel, recurrent_bias, state_mask=None):
        h, c = lstm_step(
            projected,
            states[0],
            states[1],
            recurrent_kernel,
            self.activation,
            self.recurrent_activation,
            state_mask,
        )
        return [h, c]

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "recurrent_activation": activations.serialize(self.recurrent_activation),
                "unit_forget_bias": self.unit_forget_bias,
            }
        )
        return config
