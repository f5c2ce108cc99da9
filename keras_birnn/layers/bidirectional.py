"""kb.Bidirectional: two independent recurrences that meet at the output."""

from typing import Optional, Tuple

import keras
from keras import activations, ops

from keras_birnn.layers.reporting import LoopReporting
from keras_birnn import recurrence
from keras_birnn.api_export import keras_birnn_export
from keras_birnn.cells.base import RecurrentCell
from keras_birnn.functions import serialize_activation
from keras_birnn.masking import ragged_mask, sequence_input, zero_empty_rows, zero_padding
from keras_birnn.layers.recurrent import SEQUENCE_ARGUMENTS, Recurrent, keras_equivalent, parse_initial_state
from keras_birnn.serialization import attributes, deserialized, refuse_config

MERGE_MODES = ("concat", "sum", "mul", "ave", None, "projection")

WHOLE_SEQUENCE_NEEDED = (
    "A bidirectional layer cannot {what}: its backward pass starts at the last element, "
    "so it needs the whole sequence before it can produce any output. Streaming, "
    "real-time and autoregressive use need a unidirectional kb.Recurrent instead."
)

_ELEMENTWISE = {
    "concat": lambda f, b: ops.concatenate([f, b], axis=-1),
    "sum": lambda f, b: f + b,
    "mul": lambda f, b: f * b,
    "ave": lambda f, b: (f + b) / 2,
}


@keras_birnn_export("keras_birnn.DirectionalProjection")
class DirectionalProjection(keras.layers.Layer):
    """y = activation(h_f V_f + h_b V_b + c): per-direction output matrices (BRNN, formal definition).

    Used on its own (after `merge_mode=None`), it keeps the pair's sequence
    mask: padded positions output zeros, not `activation(c)`, and the mask
    propagates to the next layer.

    Args:
        units: Number of outputs P.
        activation: Applied to the sum (e.g. `"softmax"` for a tagger).

    Call arguments:
        forward, backward: The two directions' outputs, `[batch, units_f]`
            and `[batch, units_b]`, or sequences `[batch, time, ...]`.
        forward_mask, backward_mask: Optional bool `[batch, time]` masks
            (filled in by Keras from the inputs; either one is used).
    """

    def __init__(self, units: int, activation=None, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.activation = activations.get(activation)
        self.supports_masking = True

    def build(self, forward_shape, backward_shape):
        self.forward_kernel = self.add_weight(
            shape=(forward_shape[-1], self.units), name="forward_kernel", initializer="glorot_uniform"
        )
        self.backward_kernel = self.add_weight(
            shape=(backward_shape[-1], self.units), name="backward_kernel", initializer="glorot_uniform"
        )
        self.bias = self.add_weight(shape=(self.units,), name="bias", initializer="zeros")

    def call(self, forward, backward, forward_mask=None, backward_mask=None):
        outputs = self.activation(self.contributions(forward, backward, with_bias=True))
        mask = forward_mask if forward_mask is not None else backward_mask
        if mask is None or len(outputs.shape) != 3:
            return outputs
        return ops.where(ops.expand_dims(ops.cast(mask, "bool"), -1), outputs, ops.zeros_like(outputs))

    def compute_mask(self, forward, previous_mask=None):
        return previous_mask

    def contributions(self, forward, backward, with_bias=False):
        """V_f h_f + V_b h_b (+ c): the pre-activation the directions share."""
        total = ops.matmul(forward, self.forward_kernel) + ops.matmul(backward, self.backward_kernel)
        return total + self.bias if with_bias else total

    def compute_output_shape(self, forward_shape, backward_shape):
        return tuple(forward_shape[:-1]) + (self.units,)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update({"units": self.units, "activation": serialize_activation(self.activation)})
        return config


def _check_merge(merge_mode, projection_units) -> None:
    if merge_mode not in MERGE_MODES:
        raise ValueError(f"`merge_mode` must be one of {MERGE_MODES}, received {merge_mode!r}.")
    if merge_mode == "projection":
        if isinstance(projection_units, bool) or not isinstance(projection_units, int) or projection_units <= 0:
            raise ValueError(
                '`merge_mode="projection"` needs a positive integer `projection_units`, '
                f"received {projection_units!r}."
            )
    elif projection_units is not None:
        raise ValueError(
            f'`projection_units` is only used with merge_mode="projection", received '
            f"projection_units={projection_units!r} with merge_mode={merge_mode!r}."
        )


def _as_recurrent(layer, reverse: bool, initial_state, role: str, dtype=None) -> Recurrent:
    argument = "layer" if role == "forward" else "backward_layer"
    refuse_config(layer, argument, "kb.Bidirectional")
    if isinstance(layer, RecurrentCell):
        return Recurrent(
            layer, reverse=reverse, initial_state=initial_state, name=f"{role}_{layer.name}", dtype=dtype
        )
    if not isinstance(layer, Recurrent):
        raise TypeError(
            f"`{argument}` must be a keras_birnn cell "
            f"(e.g. kb.GRUCell(64)) or a kb.Recurrent, received {layer!r}.{keras_equivalent(layer)}"
        )
    if layer.reverse != reverse:
        raise ValueError(
            f"The {role} layer must have reverse={reverse}, received a kb.Recurrent with "
            f"reverse={layer.reverse}."
        )
    return layer


def _reversed_copy(forward: Recurrent) -> Recurrent:
    """An independent copy of `forward` that runs in reverse: its cell keeps
    the forward cell's objects, starts from weights of its own and derives
    its seeds (`clone_config(salt=1)`)."""
    config = forward.config_without_cell()
    config.update(reverse=True, name="backward_" + forward.name.removeprefix("forward_"))
    cell = forward.cell
    return Recurrent(type(cell).from_config(cell.clone_config(salt=1)), **config)


def _cast_result(result: recurrence.DirectionResult, dtype) -> recurrence.DirectionResult:
    outputs = None if result.outputs is None else ops.cast(result.outputs, dtype)
    return recurrence.DirectionResult(outputs, [ops.cast(s, dtype) for s in result.final_states])


@keras_birnn_export("keras_birnn.Bidirectional")
class Bidirectional(LoopReporting, keras.layers.Layer):
    """Two independent recurrences over the same sequence, merged per position.

    The forward direction reads left to right, the backward one right to
    left with its own weights; both skip each row's padding, so every valid
    position gets exactly what the unpadded sequence gives. In a graph each
    direction is its own compiled loop, the two run at the same time
    (`keras_birnn.recurrence`). The wrapper's `return_sequences` / `return_state` govern (those of
    a passed `kb.Recurrent` are ignored).

    Args:
        layer: A cell, or a `kb.Recurrent` with `reverse=False`.
        merge_mode: `"concat"`, `"sum"`, `"mul"`, `"ave"`, `None` (return
            both outputs) or `"projection"`: y_t = V_f h_f,t + V_b h_b,t + c.
        backward_layer: Optional cell or `kb.Recurrent(reverse=True)`;
            default: an independent copy of the forward one (weights of its
            own; with seeds, seeds derived from the forward cell's). A
            `kb.Recurrent(cell, reverse=True)` around the forward cell ties
            the two directions' weights (the textbook's concat-versus-sum
            exercise, `examples/merge_modes.py`).
        projection_units: Output size of the `"projection"` merge.
        projection_activation: Activation of the projection (e.g. softmax).
        return_sequences: Return every position instead of the sentence
            pair (forward state after the last valid step, backward state
            after the first).
        return_state: Also return the forward then the backward final states.
        initial_state: Boundary states for directions built from a cell:
            `"zeros"`, a float constant or `"learned"`.

    Call arguments:
        inputs: float `[batch, time, features]`.
        mask: optional bool `[batch, time]`.
        initial_state: optional list, forward states then backward states.
        training: whether dropout is active.

    Example:

    >>> bi = kb.Bidirectional(kb.GRUCell(64), return_sequences=True)
    >>> bi(np.zeros((2, 7, 32), "float32")).shape
    TensorShape([2, 7, 128])
    """

    def __init__(
        self,
        layer,
        merge_mode: Optional[str] = "concat",
        backward_layer=None,
        projection_units: Optional[int] = None,
        projection_activation=None,
        return_sequences: bool = False,
        return_state: bool = False,
        initial_state="zeros",
        **kwargs,
    ):
        if kwargs.pop("stateful", False):
            raise ValueError(WHOLE_SEQUENCE_NEEDED.format(what="be stateful"))
        super().__init__(**kwargs)
        _check_merge(merge_mode, projection_units)
        self.merge_mode = merge_mode
        self.initial_state = parse_initial_state(initial_state)
        # Directions and projection built here follow the wrapper's dtype
        # policy, so `dtype="float32"` under a mixed policy computes in float32.
        self.forward_layer = _as_recurrent(layer, False, self.initial_state, "forward", self.dtype_policy)
        if backward_layer is None:
            backward_layer = _reversed_copy(self.forward_layer)
        self.backward_layer = _as_recurrent(backward_layer, True, self.initial_state, "backward", self.dtype_policy)
        self.return_sequences = bool(return_sequences)
        self.return_state = bool(return_state)
        self.projection_units = projection_units
        self.projection = None
        if merge_mode == "projection":
            self.projection = DirectionalProjection(
                projection_units, projection_activation, name="projection", dtype=self.dtype_policy
            )
        self.supports_masking = True

    def build(self, input_shape):
        self.forward_layer.build(input_shape)
        self.backward_layer.build(input_shape)
        if self.projection is not None:
            self.projection.build((None, self.forward_layer.cell.units), (None, self.backward_layer.cell.units))
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: self.forward_layer.cell.input_dim})

    def call(self, inputs, mask=None, initial_state=None, training=None):
        inputs, mask = sequence_input(inputs, mask, self.name)
        forward, backward = self.run_directions(inputs, mask, initial_state, training)
        # A kb.Recurrent passed in may compute in another dtype: outputs are the wrapper's.
        forward, backward = (_cast_result(r, self.compute_dtype) for r in (forward, backward))
        if self.return_sequences:
            merged = self.merge(forward.outputs, backward.outputs, mask)
        else:
            merged = self.merge(forward.final_states[0], backward.final_states[0], None)
            merged = keras.tree.map_structure(lambda y: zero_empty_rows(y, mask, inputs), merged)
        if not self.return_state:
            return merged
        outputs = list(merged) if self.merge_mode is None else [merged]
        return outputs + forward.final_states + backward.final_states

    def run_directions(
        self,
        inputs,
        mask=None,
        initial_state=None,
        training: Optional[bool] = None,
        return_sequences: Optional[bool] = None,
        counted: bool = True,
    ) -> Tuple[recurrence.DirectionResult, recurrence.DirectionResult]:
        """Both recurrences over `inputs`, before the merge: one loop run,
        in which a graph runs the two at the same time.

        Args:
            inputs: float `[batch, time, features]`, as `call` reads them
                (`sequence_input`).
            mask: Optional bool `[batch, time]`.
            initial_state: Optional list, forward states then backward states.
            training: Whether dropout is active (and BPTT runs when True).
            return_sequences: Whether the results hold output sequences
                (default: the layer's `return_sequences`).
            counted: Whether the run counts in `loop_report()` (a
                diagnostic's run does not).

        Returns:
            The forward and the backward `recurrence.DirectionResult`, each
            in its direction's compute dtype.
        """
        forward_init, backward_init = self._split_initial_state(initial_state)
        # Padding zeroed once: without input dropout both directions then read
        # one tensor, which lets a vendor engine run them as one kernel call.
        inputs = zero_padding(inputs, mask)
        return tuple(recurrence.run(
            [
                self.forward_layer.direction(inputs, mask, forward_init, training, padded=True),
                self.backward_layer.direction(inputs, mask, backward_init, training, padded=True),
            ],
            mask,
            self.return_sequences if return_sequences is None else return_sequences,
            bptt=training is True,
            counter=self.shape_counter if counted else None,
        ))

    def merge(self, forward, backward, mask=None):
        """The one place where the two directions meet.

        `mask` (for per-position outputs) zeros padded positions, which only
        the projection's bias could make non-zero.
        """
        if self.merge_mode is None:
            return [forward, backward]
        if self.merge_mode != "projection":
            return _ELEMENTWISE[self.merge_mode](forward, backward)
        merged = self.projection(forward, backward)
        if mask is not None:
            merged = ops.where(ops.expand_dims(mask, -1), merged, ops.zeros_like(merged))
        return merged

    def _split_initial_state(self, initial_state):
        if initial_state is None:
            return None, None
        states = list(initial_state) if isinstance(initial_state, (list, tuple)) else [initial_state]
        forward_count = self.forward_layer.cell.state_count
        expected = forward_count + self.backward_layer.cell.state_count
        if len(states) != expected:
            raise ValueError(
                f"`initial_state` must be a list of {expected} tensors (forward states, then "
                f"backward states), received {len(states)}."
            )
        return states[:forward_count], states[forward_count:]

    def step(self, *args, **kwargs):
        """Refused: a bidirectional layer cannot stream."""
        raise ValueError(WHOLE_SEQUENCE_NEEDED.format(what="run step by step"))

    def reset_states(self, *args, **kwargs):
        raise ValueError(WHOLE_SEQUENCE_NEEDED.format(what="be stateful"))

    def compute_mask(self, inputs, mask=None):
        output_mask = ragged_mask(inputs, mask) if self.return_sequences else None
        output_masks = [output_mask, output_mask] if self.merge_mode is None else [output_mask]
        if not self.return_state:
            return output_masks if self.merge_mode is None else output_mask
        states = self.forward_layer.cell.state_count + self.backward_layer.cell.state_count
        return output_masks + [None] * states

    def compute_output_shape(self, input_shape):
        batch, time = input_shape[0], input_shape[1]
        f_units, b_units = self.forward_layer.cell.units, self.backward_layer.cell.units
        width = {
            "concat": f_units + b_units,
            "projection": self.projection_units,
        }.get(self.merge_mode, f_units)
        lead = (batch, time) if self.return_sequences else (batch,)
        outputs = [lead + (f_units,), lead + (b_units,)] if self.merge_mode is None else [lead + (width,)]
        if self.return_state:
            outputs += [(batch, f_units)] * self.forward_layer.cell.state_count
            outputs += [(batch, b_units)] * self.backward_layer.cell.state_count
            return outputs
        return outputs if self.merge_mode is None else outputs[0]

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "layer": keras.saving.serialize_keras_object(self.forward_layer),
                "backward_layer": keras.saving.serialize_keras_object(self.backward_layer),
                "merge_mode": self.merge_mode,
                "projection_units": self.projection_units,
                "projection_activation": (
                    None if self.projection is None else serialize_activation(self.projection.activation)
                ),
                **attributes(self, *SEQUENCE_ARGUMENTS),
            }
        )
        return config

    @classmethod
    def from_config(cls, config: dict) -> "Bidirectional":
        # Keras's own from_config: the dtype policy, and errors named after the class.
        return super().from_config(deserialized(config, "layer", "backward_layer"))
