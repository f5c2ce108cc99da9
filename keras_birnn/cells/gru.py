"""GRU cell in both reset conventions, gates in Keras's order z, r, h."""

import tensorflow as tf
from keras import activations

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell


def gru_step(
    projected,
    h,
    recurrent_kernel,
    recurrent_bias,
    activation,
    recurrent_activation,
    reset_after,
    state_mask=None,
):
    """One GRU step given the input projection `x_t W + b_in` of this step.

    `reset_after=False` is seed 000's GRU: the reset gate scales the state
    before the recurrent matmul of the candidate. `reset_after=True` is
    Keras's (and cuDNN's) default: it scales the matmul's result.
    """
    h_in = h if state_mask is None else h * state_mask
    x_z, x_r, x_h = tf.split(projected, 3, axis=-1)
    if reset_after:
        recurrent = tf.matmul(h_in, recurrent_kernel)
        if recurrent_bias is not None:
            recurrent = recurrent + recurrent_bias
        h_z, h_r, h_h = tf.split(recurrent, 3, axis=-1)
        z = recurrent_activation(x_z + h_z)
        r = recurrent_activation(x_r + h_r)
        candidate = activation(x_h + r * h_h)
    else:
        gate_kernel, candidate_kernel = tf.split(recurrent_kernel, [-1, tf.shape(recurrent_kernel)[0]], axis=1)
        h_z, h_r = tf.split(tf.matmul(h_in, gate_kernel), 2, axis=-1)
        z = recurrent_activation(x_z + h_z)
        r = recurrent_activation(x_r + h_r)
        candidate = activation(x_h + tf.matmul(r * h_in, candidate_kernel))
    return z * h + (1.0 - z) * candidate


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

    def recurrent_step(self, projected, states, recurrent_kernel, recurrent_bias, state_mask=None):
        return [
            gru_step(
                projected,
                states[0],
                recurrent_kernel,
                recurrent_bias,
                self.activation,
                self.recurrent_activation,
                self.reset_after,
                state_mask,
            )
        ]

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "reset_after": self.reset_after,
                "recurrent_activation": activations.serialize(self.recurrent_activation),
            }
        )
        return config
