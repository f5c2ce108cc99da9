"""Simple RNN cell: h_t = σ(x_t U + h_{t-1} W + b) (seed 002)."""

import tensorflow as tf

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell


def simple_rnn_step(projected, h, recurrent_kernel, activation, state_mask=None):
    """One step given the input projection `x_t U + b` of this step."""
    h_in = h if state_mask is None else h * state_mask
    return activation(projected + tf.matmul(h_in, recurrent_kernel))


@keras_birnn_export("keras_birnn.SimpleRNNCell")
class SimpleRNNCell(RecurrentCell):
    """Fully connected recurrent cell, the cell of seeds 000 and 002.

    Weights match `keras.layers.SimpleRNNCell`: `kernel [input_dim, units]`,
    `recurrent_kernel [units, units]`, `bias [units]`.

    Args:
        units: Positive integer, size of the state.
        activation: Any activation σ (default `"tanh"`).
        **kwargs: See `RecurrentCell` (bias, initializers, dropout...).

    Example:

    >>> cell = kb.SimpleRNNCell(4)
    >>> layer = kb.Bidirectional(cell, return_sequences=True)
    """

    gate_count = 1
    state_count = 1

    def recurrent_step(self, projected, states, recurrent_kernel, recurrent_bias, state_mask=None):
        return [simple_rnn_step(projected, states[0], recurrent_kernel, self.activation, state_mask)]
