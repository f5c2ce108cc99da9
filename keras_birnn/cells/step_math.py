"""The contract between a cell's pure step maths and the loop, and the BPTT
helpers the cells share.

A cell's `step_math()` returns an object the loop (`keras_birnn.recurrence`)
runs forward and backward over time; `StepMath` is what the loop relies on,
so the loop never probes an object for optional parts. The step maths is a
hashable value (a `NamedTuple`): compiled loops are cached on it.

`forward` is written in `keras.ops` and runs on every backend (the scan
engine, `recurrence.scan`, differentiates it by the backend's
autodiff); `backward` and the bulk gradients are the TensorFlow engine's
hand-written BPTT and run on TensorFlow only.
"""

from __future__ import annotations

from typing import Any, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from keras_birnn import backend

if backend.IS_TENSORFLOW:
    import tensorflow as tf


@runtime_checkable
class StepMath(Protocol):
    """A cell's pure step maths, forward and backward (for BPTT).

    Attributes:
        materialize_saved: True asks the training loop compiled by XLA to
            materialise each step's `saved` before `backward` reads it,
            instead of fusing its slice into `backward`'s kernels (see
            `LSTMMath`); False for most cells.
    """

    materialize_saved: bool

    def saved_width(self, units: int) -> int:
        """Width of what `forward` saves per step for `backward`."""

    def record_width(self, units: int) -> int:
        """Width of what `backward` records per step for the bulk gradients."""

    def forward(
        self,
        projected: tf.Tensor,
        states: Sequence[tf.Tensor],
        recurrent_kernel: tf.Tensor,
        recurrent_bias: Optional[tf.Tensor] = None,
        state_mask: Optional[tf.Tensor] = None,
        with_saved: bool = True,
    ) -> Tuple[List[tf.Tensor], Optional[tf.Tensor]]:
        """One step: `(new_states, saved)`, `saved` `[B, saved_width(units)]`
        for `backward` (None without `with_saved`: the scan engine,
        differentiated by autodiff, needs no saved record and computes the
        gates as written); the step's output is `new_states[0]`."""

    def backward(
        self,
        states: Sequence[tf.Tensor],
        saved: tf.Tensor,
        transposed_kernel: tf.Tensor,
        state_mask: Optional[tf.Tensor],
        d_new: Sequence[tf.Tensor],
    ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
        """One BPTT step: `(record, d_states)`. `transposed_kernel` is the
        recurrent kernel transposed, `[gates * units, units]`; `record` is
        `[B, record_width(units)]`."""

    def input_gradient(self, records: tf.Tensor) -> tf.Tensor:
        """The projected input's gradient from the records of all steps
        stacked `[N, record_width]`."""

    def kernel_gradient(self, h_in: tf.Tensor, records: tf.Tensor) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
        """`(d_recurrent_kernel, d_recurrent_bias or None)`, summed over the
        same N rows as `input_gradient`."""


# Helpers for the gradients the loop sums over all steps after BPTT
# (`StepMath.input_gradient`, `StepMath.kernel_gradient`, the bias sums).


def records_are_input_gradient(records: tf.Tensor) -> tf.Tensor:
    """`input_gradient` of a cell whose per-step records are exactly its
    gates' pre-activation gradients (LSTM, simple RNN): the records."""
    return records


def summed_kernel_gradient(h_in: tf.Tensor, records: tf.Tensor) -> Tuple[tf.Tensor, None]:
    """`kernel_gradient` of such a cell, which has no recurrent bias:
    `(h_in^T records, None)` over all steps stacked `[steps * batch, ...]`."""
    return tf.matmul(h_in, records, transpose_a=True), None


def column_sum(x: tf.Tensor) -> tf.Tensor:
    """`reduce_sum(x, axis=0)` of a `[steps * batch, width]` matrix as a
    matmul with a row of ones: the same sum, which CPU matmul kernels
    compute faster than a reduction down the long axis (benchmarks/README.md,
    "Design measurements": bias gradients as `ones @ x`)."""
    ones = tf.ones([1, tf.shape(x)[0]], x.dtype)
    return tf.matmul(ones, x)[0]
