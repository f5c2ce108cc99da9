"""Cells with activations other than Keras's defaults, against the oracle.

The BPTT differentiates each activation either from its output (Keras's
tanh, sigmoid, linear, relu), or, for any other callable, by TensorFlow on
one step; the LSTM with tanh and sigmoid computes its gates as one `tanh`.
Each path is checked here: forward outputs and gradients (both call modes,
and in a graph with unknown sizes) of a masked batch, with built-in
activations by name and with user functions, including ones whose names
are those of built-ins (Keras serialises a plain function by its name, so a
name must not be mistaken for the function). Saving such functions:
test_functions.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
import reference as ref
from birnn_cases import TRAINING_MODES, make_case
from helpers import MASK_4x6 as MASK, assert_all_close, eager_and_graph


def tanh(x):
    """Not Keras's tanh: twice it."""
    return 2.0 * tf.tanh(x)


def sigmoid(x):
    """Not Keras's sigmoid: sigmoid(2x)."""
    return tf.sigmoid(2.0 * x)


def relu(x):
    """Not Keras's relu: three times it."""
    return 3.0 * tf.nn.relu(x)


def linear(x):
    """Not Keras's linear: half the input."""
    return 0.5 * x


def softer_tanh(x):
    """A name no built-in has, not registered either."""
    return tf.tanh(0.5 * x)


def _scaled(name: str, outer: float = 1.0, inner: float = 1.0) -> tuple:
    """The oracle's (f, df/dz) pair of `outer * g(inner * z)`, from its own
    pair for the built-in `g` (`reference.ACTIVATIONS`)."""
    g, dg = ref.ACTIVATIONS[name]
    return (lambda z: outer * g(inner * z), lambda z: outer * inner * dg(inner * z))


# The oracle's pairs for the functions above.
TWICE_TANH = _scaled("tanh", outer=2.0)
SIGMOID_2X = _scaled("sigmoid", inner=2.0)
THRICE_RELU = _scaled("relu", outer=3.0)
HALF_LINEAR = _scaled("linear", outer=0.5)
SOFTER_TANH = _scaled("tanh", inner=0.5)

# name -> (oracle cell, oracle kwargs, factory of the kb cell)
CELLS = {
    "lstm_relu_hard_sigmoid": (
        "lstm", {"activation": "relu", "recurrent_activation": "hard_sigmoid"},
        lambda u: kb.LSTMCell(u, activation="relu", recurrent_activation="hard_sigmoid"),
    ),
    "lstm_tf_functions": (  # TensorFlow's own tanh and sigmoid: the one-tanh path
        "lstm", {}, lambda u: kb.LSTMCell(u, activation=tf.math.tanh, recurrent_activation=tf.nn.sigmoid),
    ),
    "lstm_user_named_tanh_sigmoid": (
        "lstm", {"activation": TWICE_TANH, "recurrent_activation": SIGMOID_2X},
        lambda u: kb.LSTMCell(u, activation=tanh, recurrent_activation=sigmoid),
    ),
    "gru_after_hard_sigmoid": (
        "gru", {"reset_after": True, "recurrent_activation": "hard_sigmoid"},
        lambda u: kb.GRUCell(u, reset_after=True, recurrent_activation="hard_sigmoid"),
    ),
    "gru_before_user_named_relu": (
        "gru", {"reset_after": False, "activation": THRICE_RELU},
        lambda u: kb.GRUCell(u, reset_after=False, activation=relu),
    ),
    "simple_sigmoid": ("simple", {"activation": "sigmoid"}, lambda u: kb.SimpleRNNCell(u, activation="sigmoid")),
    # Built-ins the BPTT differentiates from the outputs the forward kept.
    "simple_linear": ("simple", {"activation": "linear"}, lambda u: kb.SimpleRNNCell(u, activation="linear")),
    "gru_relu": ("gru", {"reset_after": True, "activation": "relu"}, lambda u: kb.GRUCell(u, activation="relu")),
    "simple_user_named_linear": (
        "simple", {"activation": HALF_LINEAR}, lambda u: kb.SimpleRNNCell(u, activation=linear),
    ),
    # Keras cannot rebuild a layer from this one's config (unregistered), so
    # the backward direction must not be made from a saved config.
    "gru_unregistered": (
        "gru", {"activation": SOFTER_TANH}, lambda u: kb.GRUCell(u, activation=softer_tanh),
    ),
}


@pytest.mark.slow(reason="eager, graph and gradients per activation, ~11 s")
@pytest.mark.parametrize("name", list(CELLS))
def test_other_activations_match_oracle(name):
    """Forward (eager and graph) and gradients of sum(y * dy) to 1e-4, in
    both call modes and in a graph with unknown batch and time sizes."""
    case = make_case(name, "concat", seed=5, cell_spec=CELLS[name])
    eager, graph = eager_and_graph(case.layer, case.x, mask=MASK)
    expected = case.oracle(MASK)
    assert_all_close(eager, expected)
    assert_all_close(graph, expected)
    d_output = case.random_d_output()
    expected_grads = case.oracle_grads(d_output, MASK)
    for training in TRAINING_MODES:
        case.assert_grads_match(case.tf_grads(d_output, MASK, training=training), expected_grads)
    case.assert_grads_match(case.tf_grads(d_output, MASK, graph=True, training=True), expected_grads)


def test_user_functions_named_like_built_ins_are_not_them():
    """Guards the cases above: with the built-in of the same name the
    outputs would differ, so a mix-up cannot pass unnoticed."""
    user = make_case("x", "concat", seed=5, cell_spec=CELLS["lstm_user_named_tanh_sigmoid"])
    built_in = make_case("x", "concat", seed=5, cell_spec=("lstm", {}, lambda u: kb.LSTMCell(u)))
    assert np.abs(np.asarray(user.layer(user.x)) - np.asarray(built_in.layer(built_in.x))).max() > 0.1
