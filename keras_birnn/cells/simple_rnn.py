"""Simple RNN cell: h_t = σ(x_t U + h_{t-1} W + b) (BRNN, formal definition)."""

from __future__ import annotations

from typing import NamedTuple

from keras import ops

from keras_birnn import backend

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell
from keras_birnn.cells.derivatives import backprop, differentiates_from_output
from keras_birnn.cells.step_math import records_are_input_gradient, summed_kernel_gradient

if backend.IS_TENSORFLOW:  # the hand-written BPTT (`backward`) runs on the TensorFlow engine only
    import tensorflow as tf


class SimpleRNNMath(NamedTuple):
    """Pure step maths: forward, and its derivative for BPTT.

    `projected` is `x_t U + b`; `saved` is the step's output where the
    activation differentiates from it (tanh, sigmoid, linear, relu), else
    the pre-activation `projected + h_in W`: all the backward step needs,
    which neither recomputes the input projection nor keeps it.
    """

    activation: object

    # Not a field (no annotation): `StepMath.materialize_saved`; only the
    # LSTM's one-tanh backward was measured faster materialised
    # (benchmarks/README.md, "Design measurements").
    materialize_saved = False

    @staticmethod
    def saved_width(units: int) -> int:
        """Width of what `forward` saves per step for `backward`."""
        return units

    @staticmethod
    def record_width(units: int) -> int:
        """Width of what `backward` records per step for the bulk gradients."""
        return units

    @property
    def _saves_activation(self) -> bool:
        return differentiates_from_output(self.activation)

    def forward(self, projected, states, recurrent_kernel, recurrent_bias=None, state_mask=None, with_saved=True):
        h_in = states[0] if state_mask is None else states[0] * state_mask
        pre = projected + ops.matmul(h_in, recurrent_kernel)
        output = self.activation(pre)
        return [output], output if self._saves_activation else pre

    def backward(self, states, saved, transposed_kernel, state_mask, d_new):
        """One step back: returns (record, d_states); the record is the
        pre-activation gradient, summed over steps by the bulk gradients."""
        # An activation that differentiates from its output saved that; any
        # other is differentiated from the saved pre-activation alone.
        output, pre = (saved, None) if self._saves_activation else (None, saved)
        d_pre = backprop(self.activation, d_new[0], output, pre)
        d_h = tf.matmul(d_pre, transposed_kernel)
        if state_mask is not None:
            d_h = d_h * state_mask
        return d_pre, [d_h]

    input_gradient = staticmethod(records_are_input_gradient)
    kernel_gradient = staticmethod(summed_kernel_gradient)


@keras_birnn_export("keras_birnn.SimpleRNNCell")
class SimpleRNNCell(RecurrentCell):
    """Fully connected recurrent cell, the cell of the textbook's programs 092-094
    and of the BRNN's formal definition.

    Weights match `keras.layers.SimpleRNNCell`: `kernel [input_dim, units]`,
    `recurrent_kernel [units, units]`, `bias [units]`.

    Args:
        units: Positive integer, size of the state.
        activation: Any activation σ (default `"tanh"`).
        **kwargs: See `RecurrentCell` (bias, initializers, dropout...).

    Example:

    >>> cell = kb.SimpleRNNCell(4)
    >>> layer = kb.Bidirectional(cell, return_sequences=True)
    >>> layer(np.zeros((2, 5, 3), "float32")).shape
    TensorShape([2, 5, 8])
    """

    gate_count = 1
    state_count = 1

    def step_math(self) -> SimpleRNNMath:
        return SimpleRNNMath(self.activation)
