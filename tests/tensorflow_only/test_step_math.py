"""Every cell's step maths satisfies the loop's contract (`StepMath`).

The loop reads each member of `StepMath` unconditionally (no probing for
optional parts), so every cell's step maths must have them all, with the
widths it promises: `forward` saves `saved_width` columns, `backward`
records `record_width` ones, and the bulk gradients come back in the
shapes of the projected input and the recurrent weights.
"""

import inspect as std_inspect

import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn.cells.step_math import StepMath

UNITS, BATCH, FEATURES = 3, 2, 4

# Each cell in every variant whose step maths differs.
MAKERS = {
    "simple_rnn": lambda: kb.SimpleRNNCell(UNITS),
    "simple_rnn_relu": lambda: kb.SimpleRNNCell(UNITS, activation="relu"),
    "gru": lambda: kb.GRUCell(UNITS),
    "gru_reset_before": lambda: kb.GRUCell(UNITS, reset_after=False),
    "lstm": lambda: kb.LSTMCell(UNITS),
    "lstm_hard_sigmoid": lambda: kb.LSTMCell(UNITS, recurrent_activation="hard_sigmoid"),
}


def _protocol_members():
    """The names `StepMath` declares: its attributes, then its methods."""
    methods = [n for n, v in vars(StepMath).items() if not n.startswith("_") and std_inspect.isfunction(v)]
    return list(StepMath.__annotations__) + methods


def _cell_classes(cls=kb.RecurrentCell):
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("keras_birnn."):
            yield sub
        yield from _cell_classes(sub)


def test_protocol_lists_what_the_loop_reads():
    assert _protocol_members() == [
        "materialize_saved", "saved_width", "record_width", "forward", "backward",
        "input_gradient", "kernel_gradient",
    ]


def test_every_cell_class_is_covered():
    assert {type(make()) for make in MAKERS.values()} == set(_cell_classes())


@pytest.mark.parametrize("name", MAKERS)
def test_step_math_satisfies_the_protocol(name):
    math = MAKERS[name]().step_math()
    assert isinstance(math, StepMath)
    for name in _protocol_members():
        assert hasattr(math, name), name
    assert isinstance(math.materialize_saved, bool)
    hash(math)  # compiled loops are cached on it


@pytest.mark.parametrize("name", MAKERS)
def test_step_math_keeps_its_widths(name):
    """One step forward and back, with the widths the loop allocates for."""
    cell = MAKERS[name]()
    cell.build((None, FEATURES))
    math, weights = cell.step_math(), cell.step_weights()
    states = [tf.random.normal([BATCH, UNITS], seed=1) for _ in range(cell.state_count)]
    projected = tf.random.normal([BATCH, cell.gate_count * UNITS], seed=2)
    new_states, saved = math.forward(projected, states, weights["recurrent_kernel"], weights["recurrent_bias"])
    assert [tuple(s.shape) for s in new_states] == [(BATCH, UNITS)] * cell.state_count
    assert tuple(saved.shape) == (BATCH, math.saved_width(UNITS))
    # The output the Keras cell protocol returns is the step maths' first state.
    output, _ = cell.call(tf.zeros([BATCH, FEATURES]), states)
    expected, _ = math.forward(
        cell.input_projection(tf.zeros([BATCH, FEATURES]), weights["kernel"], weights["input_bias"]),
        states, weights["recurrent_kernel"], weights["recurrent_bias"],
    )
    assert bool(tf.reduce_all(output == expected[0]))

    transposed = tf.transpose(weights["recurrent_kernel"])
    record, d_states = math.backward(states, saved, transposed, None, [tf.ones_like(s) for s in new_states])
    assert tuple(record.shape) == (BATCH, math.record_width(UNITS))
    assert [tuple(d.shape) for d in d_states] == [(BATCH, UNITS)] * cell.state_count
    assert tuple(math.input_gradient(record).shape) == tuple(projected.shape)
    d_kernel, d_bias = math.kernel_gradient(states[0], record)
    assert tuple(d_kernel.shape) == tuple(weights["recurrent_kernel"].shape)
    assert (d_bias is None) == (weights["recurrent_bias"] is None)


def test_an_object_without_materialize_saved_is_no_step_math():
    """The contract is checked, not assumed: a step maths that leaves out
    `materialize_saved` does not pass for one."""

    class Partial:
        saved_width = record_width = forward = backward = input_gradient = kernel_gradient = staticmethod(len)

    assert not isinstance(Partial(), StepMath)
    Partial.materialize_saved = False
    assert isinstance(Partial(), StepMath)


def test_only_the_one_tanh_lstm_materializes():
    materialized = [name for name, make in MAKERS.items() if make().step_math().materialize_saved]
    assert materialized == ["lstm"]
