"""LiteRT (TensorFlow Lite) export with builtin ops only.

`export_tflite(model, "tagger.tflite", batch_size=1)` writes a flatbuffer
that `ai_edge_litert.interpreter.Interpreter` (or `tf.lite.Interpreter`)
runs without the Flex delegate: every op is a LiteRT builtin.

Limits, and why:

- Fixed batch size. The recurrences are `While` loops whose per-step
  outputs live in TensorLists; LiteRT's builtin ops need a static
  TensorList element shape (`'tf.TensorListReserve' op requires
  element_shape to be static` otherwise, for Keras's own GRU as well),
  and that shape holds the batch.
- Dynamic time axis: resize it per call with
  `interpreter.resize_tensor_input(...)` then `allocate_tensors()` (the
  file has no SignatureDef, so no signature runner).
- Numbers in, numbers out: LiteRT has no string ops, so a vocabulary
  lookup stays outside; integer token ids into an `Embedding` work.
"""

import os
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from keras_birnn import recurrence
from keras_birnn.export import (
    INPUTS_KEY,
    LENGTHS_KEY,
    _call_with_lengths,
    _check_sequence_spec,
    _input_spec,
    _named_outputs,
    _padding_marker,
    _probe_lengths,
    _quiet_model_mask_warning,
)

_OFF_SWITCH = "lengths=False"


def export_tflite(
    model: keras.Model,
    path,
    batch_size: int = 1,
    lengths: bool = True,
    input_spec: Optional[tf.TensorSpec] = None,
) -> str:
    """Converts `model` to a LiteRT flatbuffer of builtin ops only, at `path`.

    The converted function takes

    - `inputs`: the model's input with batch `batch_size` and a dynamic
      time axis: float `[batch_size, None, features]`, or integer token ids
      `[batch_size, None]` for a model starting with an `Embedding`;
    - with `lengths=True`, `lengths`: int32 `[batch_size]`, the number of
      valid steps of each right-padded row. Positions `>= length` are
      masked exactly as `kb.export_saved_model`'s `"serving_default"` masks
      them (the model's padding marker for `Embedding(mask_zero=True)` /
      `Masking`, else `model(inputs, mask=...)`), checked by the same probe.

    The converted model has no SignatureDef (the conversion path that keeps
    the variables as constants writes none): find the inputs by their names
    `inputs` and `lengths` in `get_input_details()`; the outputs are in
    `get_output_details()` in the order of `keras.tree.flatten(outputs)`
    (named `Identity`, `Identity_1`, ...). Run it with

        interpreter = Interpreter(model_path=path)
        index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
        interpreter.resize_tensor_input(index["inputs"], x.shape)  # new time size
        interpreter.allocate_tensors()
        interpreter.set_tensor(index["inputs"], x)
        interpreter.set_tensor(index["lengths"], lengths)
        interpreter.invoke()
        y = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])

    The graph is traced with the loops as plain TensorFlow (no XLA, no time
    buckets: `recurrence.xla_disabled()`) and, for sequence-level encoders,
    without leaving out rows that have no valid step (`recurrence._rows_kept`):
    the ops that row compaction needs are no LiteRT builtins.

    Args:
        model: A built Keras model with one input.
        path: The `.tflite` file to write (its folder is created).
        batch_size: The fixed batch size of the converted model (a positive
            int): LiteRT's builtin TensorList ops need static element
            shapes. Pad a smaller batch with rows of length 0.
        lengths: Add the `lengths` input.
        input_spec: Optional `tf.TensorSpec` of the input, for models
            without a `keras.Input`; its batch and time sizes are replaced.

    Returns:
        `path`, as a string.

    Raises:
        TypeError: `batch_size`, `lengths` or `path` of the wrong type.
        ValueError: `batch_size` below 1, `path` not ending in `.tflite`, the
            model cannot take `lengths`, or the graph needs ops that are not
            LiteRT builtins.
    """
    path = _check_path(path)
    batch_size = _check_batch_size(batch_size)
    if not isinstance(lengths, (bool, np.bool_)):
        raise TypeError(f"`lengths` must be True or False, received {lengths!r}.")
    spec = _input_spec(model, input_spec)
    if lengths:
        _check_sequence_spec(spec, _OFF_SWITCH)
    inputs_spec = tf.TensorSpec([batch_size, None] + spec.shape.as_list()[2:], spec.dtype, name=INPUTS_KEY)

    with (
        _quiet_model_mask_warning(model),
        recurrence.xla_disabled(),
        recurrence._rows_kept(),
        recurrence._forward_only(),
    ):
        if lengths:
            marker = _padding_marker(model, _OFF_SWITCH)

            def padded(inputs, lengths):
                return _call_with_lengths(model, inputs, lengths, marker)

            _probe_lengths(
                model,
                spec,
                lambda x, n: _named_outputs(padded(x, n)),
                lambda x: _named_outputs(model(x, training=False)),
                _OFF_SWITCH,
            )
            lengths_spec = tf.TensorSpec([batch_size], tf.int32, name=LENGTHS_KEY)
            concrete = tf.function(lambda x, n: _flat(padded(x, n))).get_concrete_function(
                inputs_spec, lengths_spec
            )
        else:
            concrete = tf.function(lambda x: _flat(model(x, training=False))).get_concrete_function(
                inputs_spec
            )

    # Without the model as the converter's second argument: with it the
    # variables stay VAR_HANDLE ops and the outputs come out NaN.
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    try:
        flatbuffer = converter.convert()
    except Exception as error:  # the converter raises its own ConverterError
        raise ValueError(
            "The model does not convert to LiteRT builtin ops: "
            f"{_conversion_errors(error)}"
        ) from error
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    return path


def _flat(outputs) -> list:
    # A list, not a dict: the converted model's outputs then come in the
    # model's order (a dict's would come sorted as strings: outputs_10
    # before outputs_2).
    return keras.tree.flatten(outputs)


def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike ending in '.tflite', received {path!r}.")
    path = os.fspath(path)
    if not isinstance(path, str) or not path.endswith(".tflite"):
        raise ValueError(f"`path` must end in '.tflite', received {path!r}.")
    return path


def _check_batch_size(batch_size) -> int:
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(
            f"`batch_size` must be a positive int (LiteRT's builtin ops need a fixed batch), "
            f"received {batch_size!r}."
        )
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int, received {batch_size!r}.")
    return int(batch_size)


def _conversion_errors(error: Exception) -> str:
    """The converter's `error:` lines, without repeats (it prints each op's
    error once per source location), else its whole message."""
    text = str(error)
    lines = []
    for line in text.splitlines():
        if "error:" in line:
            line = line[line.index("error:") + len("error:") :].strip()
            if line not in lines:
                lines.append(line)
    return "; ".join(lines[:8]) if lines else text
