"""Derivatives of elementwise activations, for the hand-written BPTT."""

import tensorflow as tf
from keras import activations

# Derivatives in terms of the activation's output: no extra transcendental.
_FROM_OUTPUT = {
    "tanh": lambda y: 1.0 - tf.square(y),
    "sigmoid": lambda y: y * (1.0 - y),
    "linear": tf.ones_like,
    "relu": lambda y: tf.cast(y > 0, y.dtype),
}


def activation_name(activation) -> str:
    try:
        name = activations.serialize(activation)
    except (ValueError, TypeError):
        return ""
    return name if isinstance(name, str) else ""


def derivative(activation, pre_activation, output):
    """d activation / d pre_activation, elementwise.

    Known activations use their output; any other elementwise activation
    (a user's callable) is differentiated by TensorFlow on this one step.
    """
    from_output = _FROM_OUTPUT.get(activation_name(activation))
    if from_output is not None:
        return from_output(output)
    with tf.GradientTape() as tape:
        tape.watch(pre_activation)
        recomputed = activation(pre_activation)
    return tape.gradient(recomputed, pre_activation)
