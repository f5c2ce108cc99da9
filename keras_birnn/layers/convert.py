"""Conversion each way between `kb.Bidirectional` and Keras's
`keras.layers.Bidirectional(GRU / LSTM / SimpleRNN)`.

Train with Keras's layers (cuDNN on a GPU) and serve with keras_birnn
(`kb.export_saved_model`, `kb.export_tflite`, ONNX), or the other way
round. Both sides keep Keras's weight layout (`kernel`,
`recurrent_kernel`, `bias`; a GRU's bias `[2, 3U]` after reset, `[3U]`
before), so a conversion copies the weights' values into a new, built
layer with the same merge mode, `return_sequences`, `return_state` and
cell arguments. Plain Keras API: it runs on every Keras backend.

Numbers: the converted layer gives the source's numbers on unpadded and
right-padded batches (`tests/all_backends/test_convert.py`, to 1e-6). Where
Keras's layers run their own loop (on a CPU; on JAX and PyTorch for any
mask), left padding, holes and empty rows give the same numbers too: a
masked step carries the state, so Keras's backward layer, which reverses
the whole padded row, reads each row's valid steps in kb's order
(measured, the same test file). Keras's cuDNN kernels on TensorFlow (a
GPU) take right-padded masks only: docs/deploy.md, "Train with Keras's
layers, serve with keras_birnn".
"""

from typing import Any, Dict, List

import keras
import numpy as np

from keras_birnn.layers.bidirectional import Bidirectional
from keras_birnn.cells import GRUCell, LSTMCell, RecurrentCell, SimpleRNNCell
from keras_birnn.layers.recurrent import Recurrent

__all__ = ["from_keras_bidirectional", "to_keras_bidirectional"]

# Keras's recurrent layer, its cell class and kb's twin cell, by kind.
_KERAS_LAYERS = {
    "GRU": (keras.layers.GRU, keras.layers.GRUCell, GRUCell),
    "LSTM": (keras.layers.LSTM, keras.layers.LSTMCell, LSTMCell),
    "SimpleRNN": (keras.layers.SimpleRNN, keras.layers.SimpleRNNCell, SimpleRNNCell),
}
_KB_CELLS = {cells[2]: kind for kind, cells in _KERAS_LAYERS.items()}

# Cell arguments both sides have under the same name, by kind.
_COMMON = ("units", "use_bias", "dropout", "recurrent_dropout", "seed") + RecurrentCell.object_arguments
_CELL_ARGUMENTS = {
    "GRU": _COMMON + ("recurrent_activation", "reset_after"),
    "LSTM": _COMMON + ("recurrent_activation", "unit_forget_bias"),
    "SimpleRNN": _COMMON,
}
_WEIGHTS = ("kernel", "recurrent_kernel", "bias")


# --- Keras -> kb ---------------------------------------------------------------------------------


def from_keras_bidirectional(layer: keras.layers.Bidirectional) -> Bidirectional:
    """A `kb.Bidirectional` with the weights and arguments of a built
    `keras.layers.Bidirectional` of `GRU`, `LSTM` or `SimpleRNN`.

    The result is built and holds copies of the weights' values; merge
    mode, `return_sequences`, `return_state`, cell arguments (activations,
    `use_bias`, `reset_after`, `unit_forget_bias`, initializers,
    regularizers, constraints, dropout rates, seeds), dtype policies,
    `trainable` and the name are the source's. It gives the source's
    numbers on unpadded and right-padded batches, and on left padding and
    holes where Keras runs its generic loop (module docstring). Dropout
    draws its own masks (one per sequence: `docs/differences.md`).

    Args:
        layer: A built `keras.layers.Bidirectional` whose forward and
            backward layers are both `keras.layers.GRU`, both `LSTM` or
            both `SimpleRNN` (or `keras.layers.RNN` around that Keras cell),
            with the same `units`.

    Returns:
        A built `kb.Bidirectional`.

    Raises:
        TypeError: `layer` is not a `keras.layers.Bidirectional`.
        ValueError: What has no twin in `kb.Bidirectional`, named with its
            value: another wrapped layer or cell, `stateful=True`,
            `go_backwards=True` on the forward layer, `unroll=True`, a
            backward layer of another kind or size, an
            `activity_regularizer` on a wrapped layer, an unbuilt layer.

    Example:

    >>> keras_bi = keras.layers.Bidirectional(keras.layers.GRU(8, return_sequences=True))
    >>> keras_bi.build((None, None, 3))
    >>> bi = kb.from_keras_bidirectional(keras_bi)
    >>> type(bi).__name__, bi.merge_mode, bi.return_sequences
    ('Bidirectional', 'concat', True)
    """
    if not isinstance(layer, keras.layers.Bidirectional):
        raise TypeError(
            f"`layer` must be a keras.layers.Bidirectional, received {layer!r} "
            "(for a keras_birnn layer, use to_keras_bidirectional)."
        )
    forward, backward = layer.forward_layer, layer.backward_layer
    kind = _keras_kind(forward, "forward_layer")
    backward_kind = _keras_kind(backward, "backward_layer")
    _check_pair(kind, backward_kind, forward.cell.units, backward.cell.units, layer.merge_mode)
    for role, rnn in (("forward_layer", forward), ("backward_layer", backward)):
        _check_keras_rnn(rnn, role, go_backwards=role == "backward_layer")
    input_dim = _built_input_dim(layer, [forward.cell, backward.cell])

    directions = [
        _kb_direction(rnn, kind, reverse, layer.dtype_policy)
        for rnn, reverse in ((forward, False), (backward, True))
    ]
    result = Bidirectional(
        directions[0],
        merge_mode=layer.merge_mode,
        backward_layer=directions[1],
        return_sequences=layer.return_sequences,
        return_state=layer.return_state,
        name=layer.name,
        dtype=layer.dtype_policy,
        trainable=layer.trainable,
        activity_regularizer=layer.activity_regularizer,
    )
    return _with_weights_of(result, input_dim, forward, backward)


def _with_weights_of(result, input_dim: int, forward, backward):
    """`result` (either library's bidirectional layer) built, each direction
    holding a copy of `forward`'s or `backward`'s weights and its
    `trainable` flag (Keras makes its forward layer from the config: the
    flag is set on that copy)."""
    result.build((None, None, input_dim))
    for source, target in ((forward, result.forward_layer), (backward, result.backward_layer)):
        target.trainable = source.trainable
        _copy_weights(source.cell, target.cell)
    return result


def _keras_kind(rnn: Any, role: str) -> str:
    """"GRU", "LSTM" or "SimpleRNN" for Keras's layer (or `keras.layers.RNN`
    around Keras's cell, not a stack of cells); else a ValueError."""
    for kind, (layer_class, cell_class, _) in _KERAS_LAYERS.items():
        if type(rnn) is layer_class or (type(rnn) is keras.layers.RNN and type(rnn.cell) is cell_class):
            return kind
    wrapped = type(rnn).__name__
    if isinstance(rnn, keras.layers.RNN):
        wrapped += f" of {type(rnn.cell).__name__}"
    raise ValueError(
        f"The Bidirectional's {role} must be keras.layers.GRU, LSTM or SimpleRNN (or keras.layers.RNN "
        f"around keras.layers.GRUCell, LSTMCell or SimpleRNNCell), received {role}={wrapped} "
        f"({rnn.name!r}): kb.Bidirectional has no twin for it."
    )


def _check_pair(kind: str, backward_kind: str, units: int, backward_units: int, merge_mode) -> None:
    """Both directions the same kind of cell with the same size: what the
    two wrappers handle alike (Keras's `Bidirectional` derives its output
    and state shapes from the forward layer alone)."""
    if backward_kind != kind:
        raise ValueError(
            f"The backward layer must be the same kind as the forward one: forward {kind}, received "
            f"backward_layer {backward_kind} (a mismatched backward_layer has no twin on the other side)."
        )
    if backward_units != units:
        raise ValueError(
            f"The backward layer must have the forward layer's units ({units}), received "
            f"backward units={backward_units} (merge_mode={merge_mode!r})."
        )


def _check_keras_rnn(rnn: Any, role: str, go_backwards: bool) -> None:
    if rnn.stateful:
        raise ValueError(
            f"stateful=True (the {role}) has no twin in kb.Bidirectional, whose backward pass needs "
            "the whole sequence: received stateful=True."
        )
    if bool(rnn.go_backwards) != go_backwards:
        raise ValueError(
            f"The {role} must have go_backwards={go_backwards}, received go_backwards={rnn.go_backwards} "
            "(kb.Bidirectional's forward direction reads left to right, its backward one right to left)."
        )
    if rnn.unroll:
        raise ValueError(
            f"unroll=True (the {role}) is not converted, received unroll=True: Keras's unrolled "
            "layers give other numbers than their loop on masked batches (Keras 3.15.1: at valid "
            "positions of the backward layer's sequence output), so kb could not give the layer's "
            "numbers. Set unroll=False on both wrapped layers (same weights) and compare first."
        )
    if rnn.activity_regularizer is not None:
        raise ValueError(
            f"An activity_regularizer on the {role} has no twin in kb.Bidirectional (which applies "
            f"only its own, to the merged output), received activity_regularizer="
            f"{rnn.activity_regularizer!r}."
        )


def _built_input_dim(layer: Any, cells: List[Any]) -> int:
    """The features the cells were built for; a ValueError when there are
    no weights to copy yet."""
    if not all(cell.built and getattr(cell, "kernel", None) is not None for cell in cells):
        raise ValueError(
            f"Layer {layer.name!r} is not built, so it has no weights to convert: call it on data or "
            "call layer.build((None, None, features)) first."
        )
    dims = {int(cell.kernel.shape[0]) for cell in cells}
    if len(dims) != 1:
        raise ValueError(f"The two directions of {layer.name!r} were built for different features: {sorted(dims)}.")
    return dims.pop()


def _kb_direction(rnn: Any, kind: str, reverse: bool, wrapper_policy) -> Any:
    """kb's twin of one Keras direction: the cell, or a `kb.Recurrent`
    around it where the direction's dtype policy is not the wrapper's (kb
    builds a direction from a cell with the wrapper's policy)."""
    source = rnn.cell
    arguments = {name: getattr(source, name) for name in _CELL_ARGUMENTS[kind]}
    cell = _KERAS_LAYERS[kind][2](**arguments, dtype=rnn.dtype_policy, trainable=source.trainable)
    if rnn.dtype_policy.name == wrapper_policy.name:
        return cell
    prefix = "backward_" if reverse else "forward_"
    return Recurrent(cell, reverse=reverse, dtype=rnn.dtype_policy, name=prefix + rnn.name.removeprefix(prefix))


# --- kb -> Keras ---------------------------------------------------------------------------------


def to_keras_bidirectional(layer: Bidirectional) -> keras.layers.Bidirectional:
    """A `keras.layers.Bidirectional` of `GRU`, `LSTM` or `SimpleRNN` with
    the weights and arguments of a built `kb.Bidirectional`.

    The result is built and holds copies of the weights' values; merge
    mode, `return_sequences`, `return_state`, cell arguments, dtype
    policies, `trainable` and the name are the source's (Keras's GRU and
    LSTM keep `use_cudnn="auto"`: cuDNN on a GPU where the arguments allow
    it). It gives the source's numbers on unpadded and right-padded
    batches, and on left padding and holes where Keras runs its generic
    loop (module docstring).

    Keras copies the forward layer through its saved config to make its
    wrapper, so activations, initializers, regularizers and constraints
    must be Keras's own or registered (`docs/differences.md`).

    Args:
        layer: A built `kb.Bidirectional` of `kb.GRUCell`, `kb.LSTMCell` or
            `kb.SimpleRNNCell`, both directions the same kind and size,
            each with weights of its own.

    Returns:
        A built `keras.layers.Bidirectional`.

    Raises:
        TypeError: `layer` is not a `kb.Bidirectional`.
        ValueError: What has no twin in `keras.layers.Bidirectional`, named
            with its value: `merge_mode="projection"`, `initial_state` other
            than `"zeros"`, tied weights (both directions share a cell),
            another cell (a subclass too), a backward cell of another kind
            or size, an unbuilt layer.

    Example:

    >>> bi = kb.Bidirectional(kb.LSTMCell(8), merge_mode="sum")
    >>> bi.build((None, None, 3))
    >>> keras_bi = kb.to_keras_bidirectional(bi)
    >>> type(keras_bi.forward_layer).__name__, keras_bi.merge_mode
    ('LSTM', 'sum')
    """
    if not isinstance(layer, Bidirectional):
        raise TypeError(
            f"`layer` must be a kb.Bidirectional, received {layer!r} "
            "(for keras.layers.Bidirectional, use from_keras_bidirectional)."
        )
    if layer.merge_mode == "projection":
        raise ValueError(
            "merge_mode='projection' (y = V_f h_f + V_b h_b + c) has no twin in keras.layers.Bidirectional, "
            "received merge_mode='projection'. Use merge_mode=None and a Dense layer on each output, "
            "or convert a layer with merge_mode 'concat', 'sum', 'mul', 'ave' or None."
        )
    _check_zeros(layer.initial_state, "initial_state")
    forward, backward = layer.forward_layer, layer.backward_layer
    for role, recurrent in (("forward", forward), ("backward", backward)):
        _check_zeros(recurrent.initial_state, f"the {role} kb.Recurrent's initial_state")
    if forward.cell is backward.cell:
        raise ValueError(
            f"Tied weights (both directions share the cell {forward.cell.name!r}, backward_layer="
            "kb.Recurrent(cell, reverse=True) around the forward cell) have no twin in "
            "keras.layers.Bidirectional, whose directions have weights of their own."
        )
    kind = _kb_kind(forward.cell, "layer")
    backward_kind = _kb_kind(backward.cell, "backward_layer")
    _check_pair(kind, backward_kind, forward.cell.units, backward.cell.units, layer.merge_mode)
    input_dim = _built_input_dim(layer, [forward.cell, backward.cell])

    keras_forward, keras_backward = (
        _keras_direction(recurrent, kind, go_backwards, layer)
        for recurrent, go_backwards in ((forward, False), (backward, True))
    )
    result = keras.layers.Bidirectional(
        keras_forward,
        merge_mode=layer.merge_mode,
        backward_layer=keras_backward,
        name=layer.name,
        dtype=layer.dtype_policy,
        trainable=layer.trainable,
        activity_regularizer=layer.activity_regularizer,
    )
    return _with_weights_of(result, input_dim, forward, backward)


def _check_zeros(initial_state, argument: str) -> None:
    if initial_state != "zeros":
        raise ValueError(
            f"{argument}={initial_state!r} has no twin in keras.layers.Bidirectional, whose layers start "
            "from zero states: only initial_state='zeros' converts."
        )


def _kb_kind(cell: Any, role: str) -> str:
    kind = _KB_CELLS.get(type(cell))
    if kind is None:
        raise ValueError(
            f"The {role}'s cell must be kb.GRUCell, kb.LSTMCell or kb.SimpleRNNCell (not a subclass), "
            f"received {type(cell).__name__} ({cell.name!r}): keras.layers.Bidirectional has no twin for it."
        )
    return kind


def _keras_direction(recurrent: Recurrent, kind: str, go_backwards: bool, wrapper: Bidirectional) -> Any:
    """Keras's twin of one kb direction (unbuilt)."""
    cell = recurrent.cell
    arguments: Dict[str, Any] = {name: getattr(cell, name) for name in _CELL_ARGUMENTS[kind]}
    return _KERAS_LAYERS[kind][0](
        **arguments,
        return_sequences=wrapper.return_sequences,
        return_state=wrapper.return_state,
        go_backwards=go_backwards,
        dtype=recurrent.dtype_policy,
        name=recurrent.name,
    )


# --- both ways ------------------------------------------------------------------------------------


def _copy_weights(source: Any, target: Any) -> None:
    """Assigns copies of `source`'s kernel, recurrent kernel and bias to
    `target`'s (the same layout on both sides)."""
    for name in _WEIGHTS:
        value, variable = getattr(source, name, None), getattr(target, name, None)
        if value is None and variable is None:
            continue  # use_bias=False on both sides
        if value is None or variable is None or tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"Cannot copy {name!r} from {source.name!r} to {target.name!r}: shapes "
                f"{None if value is None else tuple(value.shape)} and "
                f"{None if variable is None else tuple(variable.shape)}."
            )
        value = np.array(keras.ops.convert_to_numpy(value))
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))

