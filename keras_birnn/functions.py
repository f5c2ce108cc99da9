"""Saving function arguments (activations) so that they load as themselves.

Keras saves a plain function by its name, and a name that is also a Keras
activation's loads as Keras's function: a user's own `def tanh(x): return
2 * tf.tanh(x)` would come back from a `.keras` file as Keras's tanh, with
no error. `serialize_activation` saves such a function under its
module-qualified name instead, which loading refuses, naming it.
"""

from keras import activations

# Functions from these packages that share a Keras activation's name are
# that activation (tf.math.tanh, tf.nn.relu, keras.ops.sigmoid, ...): their
# saved name may load as Keras's own.
_LIBRARIES = ("keras", "tensorflow")


def serialize_activation(activation):
    """`keras.activations.serialize(activation)`, except for an unregistered
    function from outside Keras and TensorFlow that Keras would save under a
    Keras activation's name: that one is saved under its module-qualified
    name, which loading refuses with Keras's error asking to register it
    (`@keras.saving.register_keras_serializable()`; Keras saves registered
    functions under their registered names, which load as themselves)."""
    config = activations.serialize(activation)
    if not isinstance(config, str) or _is_library_function(activation):
        return config
    try:
        if activations.get(config) is activation:
            return config
    except (ValueError, TypeError):
        return config
    name = f"{activation.__module__}.{activation.__qualname__}"
    return {"module": "builtins", "class_name": "function", "config": name, "registered_name": "function"}


def _is_library_function(function) -> bool:
    module = getattr(function, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARIES
