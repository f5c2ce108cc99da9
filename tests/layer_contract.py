"""The contract every public layer keeps, checked the same way for each
(in the spirit of Keras's own layer test helper, written here):

- `get_config` -> `from_config` gives a layer with the same config, and
  with the same weights the same outputs; so does
  `keras.saving.serialize_keras_object` -> `deserialize_keras_object`;
- the symbolic call (`keras.Input`, unknown batch and time) gives the
  shapes and dtypes of the eager outputs, and the mask `compute_mask`
  promises is the one the eager outputs carry;
- inside a `tf.function` traced for unknown batch and time sizes the
  outputs equal the eager ones;
- a model holding the layer, saved to a `.keras` file and loaded with
  `safe_mode=True`, gives the same outputs;
- under the `mixed_float16` policy, with the same weights, float outputs
  come in the layer's compute dtype and within float16 rounding of the
  float32 ones;
- every weight is either trainable or not, once.
"""

import os
import tempfile
from typing import Callable, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf


def check_layer_contract(make: Callable[[], keras.layers.Layer], inputs: Sequence[np.ndarray],
                         mask: Optional[np.ndarray] = None) -> None:
    """`make()` builds a fresh layer; `inputs` are its positional inputs
    (arrays, or lists of arrays for a layer taking a list; batch and time
    first); `mask` is passed as `mask=` when given."""
    layer = make()
    eager = _outputs(layer(*inputs, **_mask_kwargs(mask)))
    _check_weights(layer)
    _check_round_trip(layer, inputs, mask, eager)
    _check_symbolic(make, layer, inputs, mask, eager)
    _check_traced(layer, inputs, mask, eager)
    _check_keras_file(layer, inputs)
    _check_mixed_precision(make, layer, inputs, mask, eager)


def _mask_kwargs(mask) -> dict:
    return {} if mask is None else {"mask": tf.constant(mask)}


def _outputs(result) -> list:
    return [np.asarray(y) for y in keras.tree.flatten(result)]


def _check_weights(layer) -> None:
    trainable = {id(w) for w in layer.trainable_weights}
    frozen = {id(w) for w in layer.non_trainable_weights}
    assert not trainable & frozen
    assert trainable | frozen == {id(w) for w in layer.weights}
    assert len(layer.weights) == len(trainable) + len(frozen)


def _check_round_trip(layer, inputs, mask, eager) -> None:
    config = layer.get_config()
    copies = [
        type(layer).from_config(config),
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)),
    ]
    for copy in copies:
        assert type(copy) is type(layer)
        assert copy.get_config() == config
        copy(*inputs, **_mask_kwargs(mask))  # builds
        copy.set_weights(layer.get_weights())
        got = _outputs(copy(*inputs, **_mask_kwargs(mask)))
        for g, e in zip(got, eager, strict=True):
            np.testing.assert_array_equal(g, e)


def _check_symbolic(make, layer, inputs, mask, eager) -> None:
    symbolic_inputs = _symbolic_like(inputs)
    if mask is not None:
        # Masking by a value no input holds: a mask reaches the layer.
        symbolic_inputs[0] = keras.layers.Masking(mask_value=np.inf)(symbolic_inputs[0])
    outputs = make()(*symbolic_inputs)
    for spec, value in zip(keras.tree.flatten(outputs), eager, strict=True):
        assert spec.dtype == value.dtype.name, (spec.dtype, value.dtype)
        assert len(spec.shape) == value.ndim, (spec.shape, value.shape)
        for declared, actual in zip(spec.shape, value.shape):
            assert declared is None or declared == actual, (spec.shape, value.shape)
    if len(inputs) == 1 and isinstance(inputs[0], np.ndarray):
        promised = keras.tree.flatten(layer.compute_mask(tf.constant(inputs[0]), _tensor(mask)))
        for expected, value in zip(promised, keras.tree.flatten(layer(*inputs, **_mask_kwargs(mask)))):
            carried = getattr(value, "_keras_mask", None)
            assert (carried is None) == (expected is None)
            if expected is not None:
                np.testing.assert_array_equal(np.asarray(carried), np.asarray(expected))


def _tensor(mask):
    return None if mask is None else tf.constant(mask)


def _check_traced(layer, inputs, mask, eager) -> None:
    leaves = keras.tree.flatten(list(inputs))
    specs = [tf.TensorSpec([None, None] + list(np.shape(x)[2:]), tf.as_dtype(x.dtype)) for x in leaves]
    if mask is not None:
        specs.append(tf.TensorSpec([None] * np.ndim(mask), tf.bool))

    @tf.function(input_signature=specs)
    def traced(*args):
        call_args = keras.tree.pack_sequence_as(list(inputs), list(args[: len(leaves)]))
        kwargs = {} if mask is None else {"mask": args[-1]}
        return keras.tree.flatten(layer(*call_args, **kwargs))

    args = [tf.constant(x) for x in leaves] + ([tf.constant(mask)] if mask is not None else [])
    for g, e in zip(_outputs(traced(*args)), eager, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-6, rtol=1e-6)


def _symbolic_like(inputs) -> list:
    return keras.tree.map_structure(
        lambda x: keras.Input(shape=(None,) + np.shape(x)[2:], dtype=x.dtype.name), list(inputs))


def _check_keras_file(layer, inputs) -> None:
    symbolic = _symbolic_like(inputs)
    model = keras.Model(symbolic, layer(*symbolic))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
    values = [tf.constant(x) for x in keras.tree.flatten(list(inputs))]
    args = keras.tree.pack_sequence_as(list(inputs), values)
    for g, e in zip(_outputs(loaded(args)), _outputs(model(args)), strict=True):
        np.testing.assert_array_equal(g, e)


def _check_mixed_precision(make, layer, inputs, mask, eager) -> None:
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        mixed = make()
        mixed(*inputs, **_mask_kwargs(mask))  # builds
        mixed.set_weights(layer.get_weights())
        got = keras.tree.flatten(mixed(*inputs, **_mask_kwargs(mask)))
    finally:
        keras.config.set_dtype_policy(previous)
    for g, e in zip(got, eager, strict=True):
        if not np.issubdtype(e.dtype, np.floating):
            np.testing.assert_array_equal(np.asarray(g), e)
            continue
        assert g.dtype == mixed.compute_dtype, (g.dtype, mixed.compute_dtype)
        np.testing.assert_allclose(np.asarray(g, np.float32), e, atol=2e-2, rtol=2e-2)
