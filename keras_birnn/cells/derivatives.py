"""Derivatives of elementwise activations, for the hand-written BPTT.

`activation_name` serves every backend (which activations a step may keep
outputs of); the derivatives themselves run on the TensorFlow engine only.
"""

from keras import activations, ops

from keras_birnn import backend

if backend.IS_TENSORFLOW:
    import tensorflow as tf

# The functions known by name, matched by identity: Keras serialises any
# plain function by its `__name__`, so a user's own `def tanh(x): return
# 2 * tf.tanh(x)` would pass for Keras's tanh and get tanh's derivative.
_KNOWN = {
    "tanh": (activations.tanh, ops.tanh),
    "sigmoid": (activations.sigmoid, ops.sigmoid),
    "linear": (activations.linear,),
    "relu": (activations.relu, ops.relu),
}
if backend.IS_TENSORFLOW:
    for _name, _function in (("tanh", tf.math.tanh), ("sigmoid", tf.math.sigmoid), ("relu", tf.nn.relu)):
        _KNOWN[_name] += (_function,)


def activation_name(activation) -> str:
    """The name of a built-in activation that `activation` is (tanh,
    sigmoid, linear, relu, as Keras's, Keras ops' or TensorFlow's function
    object), else "" (any other callable, whatever it is called)."""
    for name, functions in _KNOWN.items():
        if any(activation is function for function in functions):
            return name
    return ""


# The gradient through each known activation from its output `y` and the
# upstream gradient `dy`, one op each where TensorFlow has a fused one
# (`dy * (1 - y^2)` written out is four ops: a BPTT step outside XLA runs
# op by op). ReLU's output is positive exactly where its input is.
_FROM_OUTPUT = {
    "tanh": lambda y, dy: tf.raw_ops.TanhGrad(y=y, dy=dy),
    "sigmoid": lambda y, dy: tf.raw_ops.SigmoidGrad(y=y, dy=dy),
    "linear": lambda y, dy: dy,
    "relu": lambda y, dy: tf.raw_ops.ReluGrad(gradients=dy, features=y),
}


def differentiates_from_output(*activations) -> bool:
    """Whether `backprop` needs only the output of each of `activations`
    (tanh, sigmoid, linear, relu: `activation_name`), so a step may keep
    outputs instead of pre-activations."""
    return all(activation_name(a) in _FROM_OUTPUT for a in activations)


def backprop(activation, upstream, output, pre_activation=None):
    """`upstream * d activation / d pre_activation`, elementwise, at the
    point where `activation` gave `output`: the gradient through the
    activation. Known activations use their output; any other elementwise
    activation (a user's callable) is differentiated by TensorFlow on this
    one step, from `pre_activation`, needed only then."""
    from_output = _FROM_OUTPUT.get(activation_name(activation))
    if from_output is not None:
        return from_output(output, upstream)
    with tf.GradientTape() as tape:
        tape.watch(pre_activation)
        recomputed = activation(pre_activation)
    return tape.gradient(recomputed, pre_activation, output_gradients=upstream)
