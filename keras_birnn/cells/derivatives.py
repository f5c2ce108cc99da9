"""Derivatives of elementwise activations, for the hand-written BPTT."""

import tensorflow as tf
from keras import activations, ops

# Derivatives in terms of the activation's output: no extra transcendental.
_FROM_OUTPUT = {
    "tanh": lambda y: 1.0 - tf.square(y),
    "sigmoid": lambda y: y * (1.0 - y),
    "linear": tf.ones_like,
    "relu": lambda y: tf.cast(y > 0, y.dtype),
}


# The functions known by name, matched by identity: Keras serialises any
# plain function by its `__name__`, so a user's own `def tanh(x): return
# 2 * tf.tanh(x)` would pass for Keras's tanh and get tanh's derivative.
_KNOWN = {
    "tanh": (activations.tanh, ops.tanh, tf.math.tanh),
    "sigmoid": (activations.sigmoid, ops.sigmoid, tf.math.sigmoid),
    "linear": (activations.linear,),
    "relu": (activations.relu, ops.relu, tf.nn.relu),
}


def activation_name(activation) -> str:
    """The name of a built-in activation that `activation` is (tanh,
    sigmoid, linear, relu, as Keras's, Keras ops' or TensorFlow's function
    object), else "" (any other callable, whatever it is called)."""
    for name, functions in _KNOWN.items():
        if any(activation is function for function in functions):
            return name
    return ""


def differentiates_from_output(activation) -> bool:
    """Whether `backprop` needs only the activation's output (tanh,
    sigmoid, linear, relu: `activation_name`), so a step may keep outputs
    instead of pre-activations."""
    return activation_name(activation) in _FROM_OUTPUT


# One fused op each (`dy * (1 - y^2)`, `dy * y * (1 - y)`), where the
# written-out product is four or five: a BPTT step outside XLA runs op by op.
_FUSED_BACKPROP = {
    "tanh": lambda y, dy: tf.raw_ops.TanhGrad(y=y, dy=dy),
    "sigmoid": lambda y, dy: tf.raw_ops.SigmoidGrad(y=y, dy=dy),
}


def backprop(activation, upstream, output, pre_activation=None):
    """`upstream * d activation / d pre_activation`, elementwise, at the
    point where `activation` gave `output`: the gradient through the
    activation. `pre_activation` is needed only where
    `differentiates_from_output(activation)` is False."""
    fused = _FUSED_BACKPROP.get(activation_name(activation))
    if fused is not None:
        return fused(output, upstream)
    return upstream * derivative(activation, pre_activation, output)


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
