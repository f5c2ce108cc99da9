"""kb.Recurrent: one direction of a recurrence, a cell run by the loop."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import keras
from keras import ops

from keras_birnn import backend, recurrence
from keras_birnn.layers.reporting import LoopReporting
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell
from keras_birnn.masking import ragged_mask, sequence_input, zero_empty_rows, zero_padding
from keras_birnn.serialization import attributes, deserialized, refuse_config

if backend.IS_TENSORFLOW:  # run-time checks of shapes only a TensorFlow graph leaves unknown
    import tensorflow as tf

# Constructor arguments that Recurrent and Bidirectional share and keep as they are.
SEQUENCE_ARGUMENTS = ("return_sequences", "return_state", "initial_state")

InitialState = Union[str, float]


def parse_initial_state(initial_state: Any) -> InitialState:
    """`"zeros"`, `"learned"` or a float constant (0.5 in BRNN, boundary states)."""
    if isinstance(initial_state, str) and initial_state in ("zeros", "learned"):
        return initial_state
    if isinstance(initial_state, (int, float)) and not isinstance(initial_state, bool):
        return float(initial_state)
    raise ValueError(
        '`initial_state` must be "zeros", "learned" or a float constant, '
        f"received {initial_state!r}."
    )


def check_cell(cell: Any) -> RecurrentCell:
    """`cell` if it is a keras_birnn cell, else a TypeError saying what to pass."""
    refuse_config(cell, "cell", "kb.Recurrent")
    if not isinstance(cell, RecurrentCell):
        raise TypeError(
            "`cell` must be a keras_birnn cell (kb.SimpleRNNCell, kb.GRUCell, kb.LSTMCell), "
            f"received {cell!r}.{keras_equivalent(cell)}"
        )
    return cell


_KERAS_TWINS = {"SimpleRNN": "SimpleRNNCell", "GRU": "GRUCell", "LSTM": "LSTMCell"}


def keras_equivalent(layer) -> str:
    """For an error message: the keras_birnn cell that stands in for a
    Keras recurrent layer or cell (its cell arguments, its weight layout)."""
    name = type(layer).__name__.removesuffix("Cell")
    if name not in _KERAS_TWINS or not type(layer).__module__.startswith("keras"):
        return ""
    return (
        f" For Keras's {type(layer).__name__}, use kb.{_KERAS_TWINS[name]}({layer.units}, ...): "
        "Keras's cell arguments and weight layout (return_sequences and return_state go on the kb layer)."
    )


class LearnedBoundaryState(keras.layers.Layer):
    """Trainable boundary states (BRNN, boundary states): one vector per cell state."""

    def __init__(self, units: int, count: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.count = count

    def build(self, input_shape=None):
        self.states = [
            self.add_weight(shape=(self.units,), name=f"state_{k}", initializer="zeros")
            for k in range(self.count)
        ]

    def broadcast(self, batch_size, dtype) -> list:
        return [ops.broadcast_to(ops.cast(s, dtype), [batch_size, self.units]) for s in self.states]

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"units": self.units, "count": self.count})
        return config


def _refuse_keras_rnn_arguments(kwargs) -> None:
    """keras.layers.RNN arguments a kb.Recurrent does not take, with what to
    use instead (Keras's own message only says "Unrecognized keyword")."""
    if kwargs.get("go_backwards"):
        raise ValueError(
            "kb.Recurrent has no `go_backwards`: use reverse=True (outputs stay aligned with the "
            "inputs). keras.layers.Bidirectional cannot wrap a kb.Recurrent (it sets go_backwards); "
            "use kb.Bidirectional(cell or kb.Recurrent) instead."
        )
    if kwargs.get("stateful"):
        raise ValueError(
            "kb.Recurrent keeps no state between calls (stateful=True is not supported). To stream, "
            "call layer.step(x_t, states) and carry the states, or pass initial_state=[...] per call."
        )
    for name in ("go_backwards", "stateful"):
        kwargs.pop(name, None)  # False: Keras's default, accepted


@keras_birnn_export("keras_birnn.Recurrent")
class Recurrent(LoopReporting, keras.layers.Layer):
    """Runs a cell over a sequence in one direction.

    Unlike Keras's `go_backwards`, `reverse=True` returns outputs aligned
    with the input positions, each row read right to left within its own
    valid steps (padding stays where it is).

    Args:
        cell: A `kb.SimpleRNNCell`, `kb.GRUCell` or `kb.LSTMCell`.
        reverse: Read the sequence from its last step to its first.
        return_sequences: Return the output of every step (`[B, T, units]`)
            instead of the state after the last step read.
        return_state: Also return the final states.
        initial_state: Boundary state: `"zeros"`, a float constant, or
            `"learned"` (trainable).

    Call arguments:
        inputs: float `[batch, time, features]`.
        mask: optional bool `[batch, time]`; masked steps carry the state.
        initial_state: optional list of `[batch, units]` tensors.
        training: whether dropout is active.

    Example:

    >>> layer = kb.Recurrent(kb.GRUCell(8), reverse=True, return_sequences=True)
    >>> layer(np.zeros((2, 5, 3), "float32")).shape
    TensorShape([2, 5, 8])
    """

    def __init__(
        self,
        cell,
        reverse: bool = False,
        return_sequences: bool = False,
        return_state: bool = False,
        initial_state: InitialState = "zeros",
        **kwargs,
    ):
        _refuse_keras_rnn_arguments(kwargs)
        super().__init__(**kwargs)
        self.cell = check_cell(cell)
        self.reverse = bool(reverse)
        self.return_sequences = bool(return_sequences)
        self.return_state = bool(return_state)
        self.initial_state = parse_initial_state(initial_state)
        self.boundary = None
        if self.initial_state == "learned":
            self.boundary = LearnedBoundaryState(
                self.cell.units, self.cell.state_count, name="boundary_state", dtype=self.dtype_policy
            )
        self.supports_masking = True

    def build(self, input_shape: Sequence[Optional[int]]):
        if len(input_shape) != 3:
            raise ValueError(
                f"Layer {self.name!r} expects inputs of rank 3 [batch, time, features], "
                f"received shape {tuple(input_shape)}."
            )
        if not self.cell.built:
            self.cell.build(input_shape)
        elif self.cell.input_dim != input_shape[-1]:
            raise ValueError(
                f"The cell of layer {self.name!r} was built for {self.cell.input_dim} features, "
                f"received input shape {tuple(input_shape)}."
            )
        if self.boundary is not None and not self.boundary.built:
            self.boundary.build()
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: self.cell.input_dim})

    # --- the pieces Bidirectional shares -----------------------------------

    def initial_states(self, batch_size, dtype, given=None) -> list:
        count = self.cell.state_count
        if given is not None:
            given = list(given) if isinstance(given, (list, tuple)) else [given]
            if len(given) != count:
                raise ValueError(
                    f"`initial_state` must be a list of {count} tensors [batch, {self.cell.units}] "
                    f"for {type(self.cell).__name__}, received {len(given)}."
                )
            return [self._check_state(ops.cast(s, dtype), batch_size) for s in given]
        if self.boundary is not None:
            return self.boundary.broadcast(batch_size, dtype)
        value = 0.0 if self.initial_state == "zeros" else self.initial_state
        return [ops.full([batch_size, self.cell.units], value, dtype) for _ in range(count)]

    def _check_state(self, state, batch_size):
        if len(state.shape) != 2 or state.shape[-1] not in (None, self.cell.units):
            raise ValueError(
                f"Each initial state must have shape [batch, {self.cell.units}], "
                f"received shape {state.shape}."
            )
        # The batch must be the inputs' (a wrong one used to fail deep in the
        # XLA loop, "Incompatible shapes" or "loop body do not match").
        batch = tf.get_static_value(batch_size) if backend.IS_TENSORFLOW else batch_size
        if batch is not None and state.shape[0] is not None:
            if state.shape[0] != batch:
                raise ValueError(
                    f"Each initial state must have shape [batch, {self.cell.units}] with the inputs' "
                    f"batch size {batch}, received shape {state.shape}."
                )
            return state
        check = tf.debugging.assert_equal(
            tf.shape(state)[0],
            batch_size,
            message=f"Each initial state must have shape [batch, {self.cell.units}] with the batch size "
            "of the inputs (batch of the state, batch of the inputs):",
        )
        with tf.control_dependencies([check]):
            return tf.identity(state)

    def direction(self, inputs, mask=None, initial_state=None, training=None,
                  padded: bool = False) -> recurrence.Direction:
        """This layer's recurrence as a loop-ready `recurrence.Direction`
        (`padded`: the inputs' padded positions are zeros already)."""
        cell = self.cell
        dtype = self.compute_dtype
        inputs = ops.cast(inputs if padded else zero_padding(inputs, mask), dtype)
        batch_size = ops.shape(inputs)[0]
        weights = cell.step_weights(dtype)
        input_mask, state_mask = cell.dropout_masks(batch_size, dtype, training)
        if input_mask is not None:
            inputs = inputs * input_mask[:, None, :]
        return recurrence.Direction(
            math=cell.step_math(),
            inputs=inputs,
            kernel=weights["kernel"],
            input_bias=weights["input_bias"],
            recurrent_kernel=weights["recurrent_kernel"],
            recurrent_bias=weights["recurrent_bias"],
            initial_states=self.initial_states(batch_size, dtype, initial_state),
            reverse=self.reverse,
            state_mask=state_mask,
        )

    # --- Keras layer protocol ------------------------------------------------

    def call(self, inputs, mask=None, initial_state=None, training=None):
        inputs, mask = sequence_input(inputs, mask, self.name)
        direction = self.direction(inputs, mask, initial_state, training)
        result = recurrence.run(
            [direction], mask, self.return_sequences, bptt=training is True, counter=self.shape_counter
        )[0]
        if self.return_sequences:
            output = result.outputs
        else:
            output = zero_empty_rows(result.final_states[0], mask, inputs)
        if self.return_state:
            return [output] + result.final_states
        return output

    def step(self, inputs, states, training=None):
        """One streaming step: `(output, new_states)` for `inputs [B, F]`.

        Only a left-to-right recurrence can stream; a reversed one needs the
        last element of the sequence before its first output.
        """
        if self.reverse:
            raise ValueError(
                "A reverse=True Recurrent cannot run step by step: it starts at the last "
                "element, so it needs the whole sequence before producing any output."
            )
        return self.cell(inputs, states, training=training)

    def compute_mask(self, inputs, mask=None):
        output_mask = ragged_mask(inputs, mask) if self.return_sequences else None
        if self.return_state:
            return [output_mask] + [None] * self.cell.state_count
        return output_mask

    def compute_output_shape(self, input_shape):
        batch, time = input_shape[0], input_shape[1]
        units = self.cell.units
        output = (batch, time, units) if self.return_sequences else (batch, units)
        if self.return_state:
            return [output] + [(batch, units)] * self.cell.state_count
        return output

    def get_config(self) -> dict:
        config = self.config_without_cell()
        config["cell"] = keras.saving.serialize_keras_object(self.cell)
        return config

    def config_without_cell(self) -> dict:
        """`get_config()` but for the cell, which a copy made in this
        process takes as an object (`RecurrentCell.clone_config`)."""
        config = super().get_config()
        config.update(attributes(self, "reverse", *SEQUENCE_ARGUMENTS))
        return config

    @classmethod
    def from_config(cls, config: dict) -> "Recurrent":
        return cls(**deserialized(config, "cell"))
