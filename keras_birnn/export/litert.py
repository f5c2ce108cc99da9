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
- Dynamic time axis of at least one step: resize it per call with
  `interpreter.resize_tensor_input(...)` then `allocate_tensors()` (the
  file has no SignatureDef, so no signature runner). There is no branch
  for an empty axis (`config.no_empty_case`); time 0 fails.
- Numbers in, numbers out: LiteRT has no string ops, so a vocabulary
  lookup stays outside; integer token ids into an `Embedding` work.
"""

import contextlib
import logging
import os
import re
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from keras_birnn.config import for_export, lockstep_directions, no_empty_case, rows_kept
from keras_birnn.export.signatures import (INPUTS_KEY, LENGTHS_KEY, call_with_lengths, check_sequence_spec,
                                           model_input_spec, named_outputs, padding_marker, probe_lengths,
                                           quiet_model_mask_warning)
from keras_birnn.tf_internal import flatten_layers

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

    A model with several inputs (word ids and character ids, say) keeps
    them, in order and under their `keras.Input` names, each with batch
    `batch_size` and its other unknown sizes dynamic; it needs
    `lengths=False` and marks padding in the inputs themselves (id 0 of an
    `Embedding(mask_zero=True)`), so left padding and holes work as in the
    Keras model.

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
    buckets: `kb.for_export()`) and, for sequence-level encoders,
    without leaving out rows that have no valid step (`config.rows_kept`):
    the ops that row compaction needs are no LiteRT builtins.

    Args:
        model: A built Keras model (several inputs need `lengths=False`).
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
            LiteRT builtins (the message names each op and its layer).
    """
    path = _check_path(path)
    batch_size = _check_batch_size(batch_size)
    if not isinstance(lengths, (bool, np.bool_)):
        raise TypeError(f"`lengths` must be True or False, received {lengths!r}.")
    if _input_count(model, input_spec) > 1:
        concrete = _several_inputs_function(model, batch_size, lengths)
    else:
        concrete = _one_input_function(model, batch_size, lengths, input_spec)

    # Without the model as the converter's second argument: with it the
    # variables stay VAR_HANDLE ops and the outputs come out NaN.
    with _absl_warnings_off():
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    try:
        with _absl_warnings_off():
            flatbuffer = converter.convert()
    except Exception as error:  # the converter raises its own ConverterError
        raise ValueError(
            f"The model {model.name!r} does not convert to LiteRT builtin ops: "
            f"{_conversion_errors(error, model, concrete)}"
        ) from error
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        f.write(flatbuffer)
    return path


def flatbuffer_ops(path) -> set:
    """The op names in every subgraph of a `.tflite` file (loop bodies and
    branches included; the interpreter's own op list shows only the main
    graph), a custom or Flex op as `"CUSTOM:<name>"`. Needs `ai-edge-litert`
    (the `litert` extra), whose flatbuffer schema reads the file."""
    return set(_flatbuffer_op_list(path))


def _flatbuffer_op_list(path) -> list:
    """`flatbuffer_ops`, one name per operator (so counts can be read)."""
    from ai_edge_litert import schema_py_generated as schema

    with open(path, "rb") as f:
        model = schema.ModelT.InitFromPackedBuf(f.read(), 0)
    names = {code: name for name, code in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    ops = []
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            custom = code.builtinCode == schema.BuiltinOperator.CUSTOM
            ops.append("CUSTOM:" + code.customCode.decode() if custom else names[code.builtinCode])
    return ops


def _input_count(model, input_spec) -> int:
    if input_spec is not None:
        return 1
    try:
        return len(model.inputs or ())
    except (AttributeError, ValueError):
        return 0


def _one_input_function(model, batch_size: int, lengths: bool, input_spec):
    """`inputs` (and `lengths`) -> the flat outputs, traced for LiteRT."""
    spec = model_input_spec(model, input_spec)
    if lengths:
        check_sequence_spec(spec, _OFF_SWITCH)
    inputs_spec = tf.TensorSpec([batch_size, None] + spec.shape.as_list()[2:], spec.dtype, name=INPUTS_KEY)
    with _tracing_for_litert(model):
        if not lengths:
            return tf.function(lambda x: _flat(model(x, training=False))).get_concrete_function(inputs_spec)
        marker = padding_marker(model, _OFF_SWITCH)

        def padded(inputs, lengths):
            return call_with_lengths(model, inputs, lengths, marker)

        probe_lengths(
            model,
            spec,
            lambda x, n: named_outputs(padded(x, n)),
            lambda x: named_outputs(model(x, training=False)),
            _OFF_SWITCH,
        )
        lengths_spec = tf.TensorSpec([batch_size], tf.int32, name=LENGTHS_KEY)
        return tf.function(lambda x, n: _flat(padded(x, n))).get_concrete_function(inputs_spec, lengths_spec)


def _several_inputs_function(model, batch_size: int, lengths: bool):
    """The model's inputs, in order and under their `keras.Input` names, each
    with batch `batch_size` and its other unknown sizes dynamic. Padding is
    whatever the model masks (e.g. id 0 of an `Embedding(mask_zero=True)`):
    one `lengths` vector could not say which input it pads."""
    if lengths:
        raise ValueError(
            f"`lengths` applies to models with one input; {model.name!r} has {len(model.inputs)} "
            f"({[t.name for t in model.inputs]}). Pass lengths=False and mark padding in the inputs "
            "themselves (e.g. id 0 of an Embedding(mask_zero=True))."
        )
    specs = [
        tf.TensorSpec([batch_size] + list(t.shape[1:]), t.dtype, name=_input_name(t, i))
        for i, t in enumerate(model.inputs)
    ]
    with _tracing_for_litert(model):
        return tf.function(lambda *xs: _flat(model(list(xs), training=False))).get_concrete_function(*specs)


def _input_name(tensor, position: int) -> str:
    name = getattr(tensor, "name", None) or ""
    return name.split(":")[0] or f"{INPUTS_KEY}_{position}"


@contextlib.contextmanager
def _tracing_for_litert(model):
    """Plain `While` loops without time buckets, no row compaction (its
    `DynamicPartition` is no builtin), the forward pass alone, no branch
    for an empty time axis (see `config.no_empty_case`), and both
    directions in lockstep in one loop: the interpreter runs one op at a
    time, so a loop per direction would only pay the per-step overhead
    twice."""
    with (
        quiet_model_mask_warning(model),
        for_export(),
        lockstep_directions(),
        rows_kept(),
        no_empty_case(),
    ):
        yield


@contextlib.contextmanager
def _absl_warnings_off():
    """`from_concrete_functions` warns that leaving out `trackable_obj` is
    deprecated; with it, the variables stay resources and the outputs come
    out NaN (see `export_tflite`), so the warning only misleads."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


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


def _conversion_errors(error: Exception, model, concrete) -> str:
    """The converter's errors without repeats (it gives one per source
    location), each op named with the layers whose graph holds it, else the
    converter's whole message."""
    found = []
    for line in str(error).splitlines():
        if "error:" in line:
            message = line[line.index("error:") + len("error:") :].strip()
            if message not in found and not message.startswith("failed while converting"):
                found.append(message)
    if not found:
        return str(error)
    layers = [layer.name for layer in flatten_layers(model)]
    places = _op_places(concrete, {op for m in found for op in _OP.findall(m)})
    named = []
    for message in found[:8]:
        for op in _OP.findall(message):
            where = sorted({_layer_of(node, layers) for node in places.get(op, ())})
            if where:
                message += f" (op {op} in layer{'s' if len(where) > 1 else ''} {', '.join(map(repr, where))})"
        named.append(message)
    return "; ".join(named)


_OP = re.compile(r"'tf\.(\w+)' op")


def _op_places(concrete, op_types: set) -> dict:
    """Op type -> the names of the graph nodes of that type, a node inside
    a function (a loop body, a branch) prefixed with the function's name."""
    places = {}
    graph_def = concrete.graph.as_graph_def()
    nodes = [("", n) for n in graph_def.node]
    nodes += [(f.signature.name + "/", n) for f in graph_def.library.function for n in f.node_def]
    for prefix, node in nodes:
        if node.op in op_types:
            places.setdefault(node.op, []).append(prefix + node.name)
    return places


def _layer_of(node: str, layers) -> str:
    """The innermost of `layers` named in `node`'s scopes (traced again, a
    scope gets a `_1` suffix; inside a function, scopes are joined by `_`),
    else the node's name."""
    best = None
    for name in layers:
        for match in re.finditer(rf"(?:^|[/_]){re.escape(name)}(?:_\d+)?(?=$|[/_])", node):
            key = (match.end(), len(name))
            if best is None or key > best[0]:
                best = (key, name)
    return best[1] if best else node
