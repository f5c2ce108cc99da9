"""LSTM cell, gates in Keras's order i, f, c, o; states (h, c)."""

from __future__ import annotations

from typing import NamedTuple

from keras import activations, initializers, ops

from keras_birnn import backend

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell
from keras_birnn.cells.derivatives import activation_name, backprop
from keras_birnn.cells.step_math import records_are_input_gradient, summed_kernel_gradient

if backend.IS_TENSORFLOW:  # the hand-written BPTT (`backward`) runs on the TensorFlow engine only
    import tensorflow as tf


class LSTMMath(NamedTuple):
    """Pure LSTM step maths, forward and backward (for BPTT).

    States are (h, c). With Keras's default activations (tanh, sigmoid) all
    four gates are one `tanh` over `[B, 4U]`, using sigmoid(x) = (1 +
    tanh(x / 2)) / 2, and `saved` is that activation, so the backward step
    rebuilds the gates without a transcendental; with any other activation
    `saved` is the gates' pre-activation (projected input plus recurrent
    matmul). Either way the backward step needs no matmul to rebuild them.
    """

    activation: object
    recurrent_activation: object

    @property
    def _one_tanh(self) -> bool:
        return activation_name(self.activation) == "tanh" and activation_name(self.recurrent_activation) == "sigmoid"

    @property
    def materialize_saved(self) -> bool:
        # The one-tanh backward reads the saved activation's four column
        # blocks directly in several kernels; with that slice fused into
        # them XLA did not vectorise those kernels, so the loop reads it
        # ahead, materialised (benchmarks/README.md, "Design measurements").
        return self._one_tanh

    def _gates(self, saved):
        """(pre-activations, (i, f, g, o)) from what `forward` saved; the
        one-tanh path has no pre-activations (Nones: tanh and sigmoid
        differentiate from their outputs)."""
        if self._one_tanh:
            t_i, t_f, g, t_o = ops.split(saved, 4, axis=-1)
            return [None] * 4, (0.5 + 0.5 * t_i, 0.5 + 0.5 * t_f, g, 0.5 + 0.5 * t_o)
        pre = ops.split(saved, 4, axis=-1)
        i, f, o = (self.recurrent_activation(pre[k]) for k in (0, 1, 3))
        return pre, (i, f, self.activation(pre[2]), o)

    @staticmethod
    def saved_width(units: int) -> int:
        """Width of what `forward` saves per step for `backward`."""
        return 4 * units

    @staticmethod
    def record_width(units: int) -> int:
        """Width of what `backward` records per step for the bulk gradients."""
        return 4 * units

    def forward(self, projected, states, recurrent_kernel, recurrent_bias=None, state_mask=None, with_saved=True):
        h, c = states
        h_in = h if state_mask is None else h * state_mask
        saved = projected + ops.matmul(h_in, recurrent_kernel)
        if not with_saved:  # for autodiff: the gates as written (the one-tanh form serves the hand-written BPTT)
            pre = ops.split(saved, 4, axis=-1)
            i, f, o = (self.recurrent_activation(pre[k]) for k in (0, 1, 3))
            c_new = f * c + i * self.activation(pre[2])
            return [o * self.activation(c_new), c_new], None
        if self._one_tanh:
            saved = ops.tanh(saved * _half_for_sigmoid_gates(recurrent_kernel.shape[0], saved.dtype))
        _, (i, f, g, o) = self._gates(saved)
        c_new = f * c + i * g
        return [o * self.activation(c_new), c_new], saved

    def backward(self, states, saved, transposed_kernel, state_mask, d_new):
        """One step back: returns (record, d_states); the record is the
        gates' pre-activation gradient `[B, 4U]`."""
        _, c = states
        pre, (i, f, g, o) = self._gates(saved)
        c_new = f * c + i * g
        tanh_c = self.activation(c_new)
        d_h, d_c = d_new
        rec = self.recurrent_activation
        d_c = d_c + backprop(self.activation, d_h * o, tanh_c, c_new)
        record = tf.concat(
            [
                backprop(rec, d_c * g, i, pre[0]),
                backprop(rec, d_c * c, f, pre[1]),
                backprop(self.activation, d_c * i, g, pre[2]),
                backprop(rec, d_h * tanh_c, o, pre[3]),
            ],
            axis=-1,
        )
        d_h_in = tf.matmul(record, transposed_kernel)
        if state_mask is not None:
            d_h_in = d_h_in * state_mask
        return record, [d_h_in, d_c * f]

    input_gradient = staticmethod(records_are_input_gradient)
    kernel_gradient = staticmethod(summed_kernel_gradient)


def _half_for_sigmoid_gates(units: int, dtype):
    """Column scales `[4U]`: 1/2 for the sigmoid gates i, f, o, 1 for c."""
    half = ops.full([units], 0.5, dtype)
    return ops.concatenate([half, half, ops.ones([units], dtype), half], 0)


class _ForgetGateOnes(initializers.Initializer):
    """Bias initializer: the wrapped one, with the forget-gate block set to 1."""

    def __init__(self, base, units):
        self.base = base
        self.units = units

    def __call__(self, shape, dtype=None):
        u = self.units
        base = self.base((u,), dtype=dtype)
        return ops.concatenate([base, ops.ones((u,), dtype), self.base((2 * u,), dtype=dtype)], 0)


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
    >>> layer(np.zeros((2, 5, 3), "float32")).shape
    TensorShape([2, 5, 64])
    """

    gate_count = 4
    state_count = 2
    object_arguments = RecurrentCell.object_arguments + ("recurrent_activation",)

    def __init__(self, units: int, activation="tanh", recurrent_activation="sigmoid",
                 unit_forget_bias: bool = True, **kwargs):
        super().__init__(units, activation=activation, **kwargs)
        self.recurrent_activation = activations.get(recurrent_activation)
        self.unit_forget_bias = bool(unit_forget_bias)

    def build_bias_initializer(self):
        if self.unit_forget_bias:
            return _ForgetGateOnes(self.bias_initializer, self.units)
        return self.bias_initializer

    def step_math(self) -> LSTMMath:
        return LSTMMath(self.activation, self.recurrent_activation)

    def _arguments_config(self) -> dict:
        config = super()._arguments_config()
        config.update({"unit_forget_bias": self.unit_forget_bias})
        return config
