"""A direction's order told at run time (`DirectionSpec.runtime_order`: a
bool tensor beside the direction, `layout.runtime_orders`), which lets the two directions of a
bidirectional layer share one traced loop and one XLA program per shape:
its loops give bit for bit what the same loops with the order fixed when
traced give (forward outputs, final states, kept memory, BPTT records and
state gradients), for both orders, without a mask and with masks whose
span skips positions (right padding, left padding, holes), in a graph with
unknown batch and time sizes and inside XLA. (The static order is itself
checked against the NumPy oracle by every layer test.)"""

import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn.recurrence.tensorflow.layout import Direction
from keras_birnn.recurrence.tensorflow.loops import LoopForm, backward_loop, forward_loop

B, T, F, U = 4, 9, 3, 5

MASKS = {
    "none": None,
    "right_padding": np.arange(T)[None] < np.array([[6], [4], [1], [6]]),  # the last 3 steps skipped
    "left_padding": np.arange(T)[None] >= np.array([[2], [5], [8], [3]]),  # the first 2 skipped
    "holes": np.array([[1, 0, 1, 1, 0, 0, 1, 0, 0]] * 2 + [[0, 1, 0, 1, 1, 0, 0, 1, 0]] * 2, bool),
    "no_valid_step": np.zeros((B, T), bool),  # the span's one masked step
}
SPEC = [tf.TensorSpec([None, None, F]), tf.TensorSpec([None, None], tf.bool), tf.TensorSpec([None, None, U])]


def _cell_parts(cell_name: str):
    cell = {"gru": lambda: kb.GRUCell(U), "lstm": lambda: kb.LSTMCell(U)}[cell_name]()
    cell.build((None, F))
    rng = np.random.default_rng(3)
    weights = [tf.constant(rng.normal(size=v.shape).astype("float32") * 0.5) for v in cell.weights]
    kernel, recurrent_kernel, bias = weights
    return cell, kernel, recurrent_kernel, bias


def _loops_of(cell_name: str, order: str, has_mask: bool, return_sequences: bool = True, xla: bool = False):
    """The forward and BPTT loops of one direction, its order "static"
    (a Python bool) or "runtime" (a bool tensor), as a function of the
    inputs, the mask, the output gradient and the order; `xla`: built as
    the loops XLA compiles are."""
    cell, kernel, recurrent_kernel, bias = _cell_parts(cell_name)

    def run(x, mask, d_seq, reverse):
        states = [tf.zeros([tf.shape(x)[0], U])] * cell.state_count
        d = Direction(cell.step_math(), x, kernel, cell.input_bias(bias), recurrent_kernel, cell.recurrent_bias(bias),
                      states, reverse=reverse if order == "static" else False)
        orders = None if order == "static" else [tf.constant(reverse)]
        mask = mask if has_mask else None
        form = LoopForm(xla=xla, xla_reads=xla)
        sequences, finals, memory = forward_loop([d], mask, return_sequences, keep_for_bptt=True, form=form,
                                                 orders=orders)
        d_flat_out = [d_seq] * return_sequences + [tf.ones_like(s) for s in finals[0]]
        records, d_states = backward_loop([d], mask, return_sequences, memory, d_flat_out, form=form, orders=orders)
        return [s for s in sequences if s is not None], finals, memory, records, d_states

    return run


@pytest.mark.parametrize("return_sequences", [True, False], ids=["sequences", "final_states"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("cell_name", ["gru", "lstm"])
def test_runtime_order_is_the_static_order_bit_for_bit(cell_name, mask_name, jit_compile, return_sequences):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(B, T, F)).astype("float32")
    d_seq = rng.normal(size=(B, T, U)).astype("float32")
    mask = MASKS[mask_name]
    feed = (x, np.ones((B, T), bool) if mask is None else mask, d_seq)
    for reverse in (False, True):
        results = {}
        for order in ("static", "runtime"):
            loops = _loops_of(cell_name, order, mask is not None, return_sequences, xla=jit_compile)
            fn = tf.function(lambda x, m, g: loops(x, m, g, reverse), input_signature=SPEC, jit_compile=jit_compile,
                             autograph=False)
            results[order] = [np.asarray(t) for t in tf.nest.flatten(fn(*feed))]
        assert len(results["static"]) == len(results["runtime"])
        for got, expected in zip(results["runtime"], results["static"]):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("mask_name", ["none", "right_padding"])
def test_xla_compiles_one_program_for_both_orders(mask_name):
    """With the order an argument of the XLA-compiled function, as the
    shared loops get it, both orders give the same HLO program: nothing
    in the forward or BPTT loop turns the order into a compile-time
    constant (a strided slice at an index computed from it would, without
    a mask too, and XLA would compile once per direction)."""
    cell, kernel, recurrent_kernel, bias = _cell_parts("gru")
    has_mask = MASKS[mask_name] is not None

    @tf.function(jit_compile=True, autograph=False)
    def loops(x, mask, d_seq, reverse):
        states = [tf.zeros([tf.shape(x)[0], U])]
        d = Direction(cell.step_math(), x, kernel, cell.input_bias(bias), recurrent_kernel, cell.recurrent_bias(bias),
                      states)
        m = mask if has_mask else None
        form = LoopForm(xla=True, xla_reads=True)
        sequences, finals, memory = forward_loop([d], m, True, keep_for_bptt=True, form=form, orders=[reverse])
        records, d_states = backward_loop([d], m, True, memory, [d_seq] + finals[0], form=form, orders=[reverse])
        return sequences, records, d_states

    rng = np.random.default_rng(5)
    feed = (rng.normal(size=(B, T, F)).astype("float32"), MASKS["right_padding"],
            rng.normal(size=(B, T, U)).astype("float32"))
    programs = [loops.experimental_get_compiler_ir(*feed, tf.constant(r))(stage="hlo") for r in (False, True)]
    assert programs[0] == programs[1]


def test_both_directions_share_one_xla_program():
    """A bidirectional layer's training graph holds one XLA-compiled
    function per loop role (the forward loop that keeps what BPTT needs,
    and the BPTT loop), called for both directions: XLA compiles each
    once per shape, not once per direction."""
    layer = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)
    layer.build((None, None, F))

    @tf.function(input_signature=SPEC[:2])
    def train(x, mask):
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(layer(x, mask=mask, training=True))
        return tape.gradient(total, layer.trainable_variables)

    library = train.get_concrete_function().graph.as_graph_def().library.function
    compiled = {f.signature.name for f in library if f.attr["_XlaMustCompile"].b}
    calls = [n.attr["f"].func.name for f in library for n in f.node_def
             if n.op in ("PartitionedCall", "StatefulPartitionedCall") and n.attr["f"].func.name in compiled]
    assert len(compiled) == 2, compiled
    assert sorted(calls.count(name) for name in compiled) == [2, 2], calls
