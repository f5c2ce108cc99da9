"""What the SavedModel and LiteRT exports share: the input's spec, the
`lengths` input and how it reaches the model, the output names, and the
probe that checks a padded row gives what the row gives alone.
"""

import contextlib
import re
import warnings
from typing import Callable, Dict, Iterator, Optional

import keras
import numpy as np
import tensorflow as tf

from keras_birnn.tf_internal import inbound_nodes

INPUTS_KEY = "inputs"
LENGTHS_KEY = "lengths"
OUTPUTS_KEY = "outputs"

_PROBE_TIME = 5
_PROBE_LENGTHS = (_PROBE_TIME, 3)


def model_input_spec(model: keras.Model, input_spec: Optional[tf.TensorSpec]) -> tf.TensorSpec:
    """The spec of `model`'s one input, batch and time sizes dynamic.

    Args:
        model: The model to export.
        input_spec: The spec the caller gave, or None to read the model's
            `keras.Input`.

    Returns:
        A `tf.TensorSpec` `[None, None, ...]`.

    Raises:
        ValueError: The model does not know its input, has several, or it
            has no batch and time axes.
    """
    if input_spec is not None:
        shape, dtype = tf.TensorShape(input_spec.shape), tf.as_dtype(input_spec.dtype)
    else:
        try:
            inputs = model.inputs
        except (AttributeError, ValueError):
            inputs = None
        if not inputs:
            raise ValueError(
                "The model does not know its input (no `keras.Input`); pass `input_spec`, e.g. "
                "tf.TensorSpec([None, None, 16], tf.float32)."
            )
        if len(inputs) != 1:
            raise ValueError(
                f"export_saved_model handles models with one input, this one has {len(inputs)}. "
                "Use keras.export.ExportArchive directly for several inputs."
            )
        shape, dtype = tf.TensorShape(inputs[0].shape), tf.as_dtype(inputs[0].dtype)
    if shape.rank is None or shape.rank < 2:
        raise ValueError(f"The input must have batch and time axes, received shape {shape}.")
    return tf.TensorSpec([None, None] + shape.as_list()[2:], dtype)


def check_sequence_spec(spec: tf.TensorSpec, off_switch: str = "lengths_input=False") -> None:
    """Raises ValueError unless `spec` can take a `lengths` input: float
    `[batch, time, features]` or integer `[batch, time]`; the message names
    the exporter's `off_switch`."""
    rank, dtype = spec.shape.rank, spec.dtype
    if (dtype.is_floating and rank == 3) or (dtype.is_integer and rank == 2):
        return
    raise ValueError(
        "`lengths` needs a float [batch, time, features] or integer [batch, time] input, "
        f"the model's input is {dtype.name} of rank {rank}. Pass {off_switch}."
    )


def _direct_consumers(model):
    """The layers that read the model's input tensor."""
    try:
        source = model.inputs[0]
    except (AttributeError, ValueError, IndexError, TypeError):
        return []
    consumers = []
    for layer in model.layers:
        for node in inbound_nodes(layer):
            if any(t is source for t in keras.tree.flatten(node.input_tensors)):
                consumers.append(layer)
                break
    return consumers


def padding_marker(model: keras.Model, off_switch: str = "lengths_input=False") -> Optional[float]:
    """The value the model's first layers read as padding, or None.

    Args:
        model: The model to export.
        off_switch: The exporter's argument that turns `lengths` off, named
            in the error.

    Returns:
        0 for `Embedding(mask_zero=True)`, `mask_value` for `Masking`; None
        means: pass the mask through Keras mask propagation instead.
    """
    markers = []
    for layer in _direct_consumers(model):
        if isinstance(layer, keras.layers.Embedding) and layer.mask_zero:
            markers.append(0)
        elif isinstance(layer, keras.layers.Masking):
            markers.append(float(np.asarray(layer.mask_value)))
        else:
            markers.append(None)
    if not markers or all(m is None for m in markers):
        return None
    if any(m is None for m in markers) or len(set(markers)) != 1:
        raise ValueError(
            "The model's input feeds both layers that mask by value (Embedding(mask_zero=True) "
            "/ Masking) and other layers, or maskers with different padding values; "
            f"`lengths` cannot be applied consistently. Pass {off_switch}."
        )
    return markers[0]


def call_with_lengths(model: keras.Model, inputs: tf.Tensor, lengths: tf.Tensor, marker: Optional[float]):
    """`model` on right-padded `inputs` with `lengths` valid steps per row:
    the padded positions set to `marker` (`padding_marker`), or, without a
    marker, the mask passed as `model(inputs, mask=...)`. Returns the
    model's outputs."""
    # One length per row: a `lengths` of size 1 would otherwise broadcast
    # over the batch (silently, for models that mask by value).
    check = tf.debugging.assert_equal(
        tf.shape(lengths)[0],
        tf.shape(inputs)[0],
        message="`lengths` must have one entry per row of `inputs` (size of lengths, batch of inputs):",
    )
    with tf.control_dependencies([check]):
        mask = tf.sequence_mask(lengths, tf.shape(inputs)[1])
    if marker is not None:
        fill = tf.cast(marker, inputs.dtype)
        where = mask if inputs.shape.rank == 2 else tf.expand_dims(mask, -1)
        inputs = tf.where(where, inputs, fill)
    return model(inputs, mask=mask, training=False)


def named_outputs(outputs) -> Dict[str, tf.Tensor]:
    """The model's outputs under their signature names: `outputs` for one,
    `outputs_0`, `outputs_1`, ... for a list, the keys of a dict."""
    if isinstance(outputs, dict):
        return {str(k): v for k, v in outputs.items()}
    flat = keras.tree.flatten(outputs)
    if len(flat) == 1:
        return {OUTPUTS_KEY: flat[0]}
    return {f"{OUTPUTS_KEY}_{i}": y for i, y in enumerate(flat)}


def _probe_inputs(model, spec: tf.TensorSpec) -> np.ndarray:
    rng = np.random.default_rng(0)
    shape = (len(_PROBE_LENGTHS), _PROBE_TIME) + tuple(spec.shape.as_list()[2:])
    if spec.dtype.is_floating:
        return rng.normal(size=shape).astype(spec.dtype.as_numpy_dtype)
    vocab = [
        layer.input_dim
        for layer in _direct_consumers(model)
        if isinstance(layer, keras.layers.Embedding)
    ]
    high = min(vocab) if vocab else 3
    return rng.integers(1, max(high, 2), size=shape).astype(spec.dtype.as_numpy_dtype)


def probe_lengths(model: keras.Model, spec: tf.TensorSpec, padded_fn: Callable, unpadded_fn: Callable,
                  off_switch: str = "lengths_input=False") -> None:
    """Checks that `lengths` reaches the recurrence: a right-padded row must
    give what the same row gives unpadded.

    Args:
        model: The model to export.
        spec: Its input's spec (`model_input_spec`).
        padded_fn: `(inputs, lengths) -> named outputs`.
        unpadded_fn: `inputs -> named outputs`.
        off_switch: The exporter's argument that turns `lengths` off.

    Raises:
        ValueError: A padded row's outputs differ from the row's alone.
    """
    x = _probe_inputs(model, spec)
    lengths = np.asarray(_PROBE_LENGTHS, np.int32)
    padded = padded_fn(tf.constant(x), tf.constant(lengths))
    for row, length in enumerate(lengths):
        alone = unpadded_fn(tf.constant(x[row : row + 1, :length]))
        for key, expected in alone.items():
            got = np.asarray(padded[key])[row : row + 1]
            expected = np.asarray(expected)
            if got.ndim >= 2 and expected.ndim >= 2 and got.shape[1] == _PROBE_TIME and expected.shape[1] == length:
                got = got[:, :length]
            if got.shape != expected.shape or not np.allclose(got, expected, atol=1e-5, rtol=1e-5):
                raise ValueError(
                    f"The `lengths` input does not reach this model's recurrence: output "
                    f"{key!r} of a row padded to {_PROBE_TIME} steps with length {length} differs "
                    "from the same row unpadded. A layer between the input and the recurrent "
                    "layers drops Keras masks (e.g. Conv1D, Lambda, or Embedding without "
                    f"mask_zero). Make the mask reach the recurrence, or pass {off_switch}."
                )


@contextlib.contextmanager
def quiet_model_mask_warning(model: keras.Model) -> Iterator[None]:
    """Hides Keras's note that the outer model itself does not keep a mask.

    Passing `mask=` to a functional model warns that the *model's output*
    carries no mask, which is irrelevant here; the warnings of inner layers
    that drop a mask stay visible (and the probe catches their effect).
    """
    pattern = rf"Layer '{re.escape(model.name)}' \(of type \w+\) was passed an input with a mask"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=pattern)
        yield
