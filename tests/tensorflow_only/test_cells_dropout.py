"""Dropout in training: the numbers, not only that masks are drawn.

With `dropout` and `recurrent_dropout`, each direction draws one input mask
and one state mask per sequence. Here the masks a layer draws are fixed
(each cell's `dropout_masks` returns the same draw again), and the layer's
training outputs and BPTT gradients must equal the NumPy oracle's given the
same masks: inputs multiplied by the input mask, the state multiplied by
the state mask where it enters the recurrent matmul (the oracle's state
mask is checked against finite differences in `test_reference_oracle.py`).
"""

import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
import reference as ref
from birnn_cases import B, CELLS, make_case
from helpers import MASK_4x6 as MASK, assert_all_close

RATES = dict(dropout=0.3, recurrent_dropout=0.4, seed=11)


def _dropout_case(cell_name):
    """A merge_mode=None case (each direction's outputs) whose cells drop."""
    cell, cell_kwargs, _ = CELLS[cell_name]
    factories = {
        "simple": lambda u: kb.SimpleRNNCell(u, activation=cell_kwargs["activation"], **RATES),
        "gru": lambda u: kb.GRUCell(u, reset_after=cell_kwargs["reset_after"], **RATES),
        "lstm": lambda u: kb.LSTMCell(u, **RATES),
    }
    return make_case(cell_name, "none", cell_spec=(cell, cell_kwargs, factories[cell]))


def _fix_masks(case):
    """Draws each direction's masks once; the cells then keep returning them."""
    masks = []
    for recurrent in (case.layer.forward_layer, case.layer.backward_layer):
        cell = recurrent.cell
        drawn = tuple(np.asarray(m) for m in cell.dropout_masks(B, tf.float32, training=True))
        cell.dropout_masks = lambda batch_size, dtype, training, drawn=drawn: (
            tuple(tf.constant(m) for m in drawn) if training else (None, None)
        )
        masks.append(drawn)
    return masks


def _oracle_inputs(case, masks):
    """Per direction: (params, dropped inputs, oracle kwargs, input mask)."""
    out = []
    for params, (input_mask, state_mask) in zip((case.fw, case.bw), masks):
        kwargs = dict(case.cell_kwargs, state_mask=state_mask)
        out.append((params, case.x * input_mask[:, None, :], kwargs, input_mask))
    return out


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_training_outputs_and_gradients_with_dropout_match_the_oracle(cell_name, graph):
    case = _dropout_case(cell_name)
    masks = _fix_masks(case)
    for input_mask, state_mask in masks:  # both kinds of units are dropped somewhere
        assert (input_mask == 0).any() and (state_mask == 0).any()
    directions = _oracle_inputs(case, masks)

    outputs = case.layer(case.x, mask=MASK, training=True)
    expected = [
        ref.run_direction(case.cell, params, x, MASK, reverse, **kwargs)[0]
        for reverse, (params, x, kwargs, _) in zip((False, True), directions)
    ]
    assert_all_close([np.asarray(o) for o in outputs], expected)

    d_output = case.random_d_output()
    actual = case.tf_grads(d_output, MASK, graph=graph, training=True)
    x_grad = np.zeros_like(case.x, dtype=np.float64)
    for side, reverse, d_seq, (params, x, kwargs, input_mask) in zip(
        ("fw", "bw"), (False, True), d_output, directions
    ):
        expected = ref.direction_grads(case.cell, params, x, d_seq, MASK, reverse, **kwargs)
        for key in ("kernel", "recurrent_kernel", "bias"):
            np.testing.assert_allclose(actual[side][key], expected[key], atol=1e-4, rtol=1e-4, err_msg=key)
        x_grad += expected["x"] * input_mask[:, None, :]
    np.testing.assert_allclose(actual["x"], x_grad, atol=1e-4, rtol=1e-4)


def test_inference_ignores_dropout():
    case = _dropout_case("lstm")
    _fix_masks(case)
    assert_all_close([np.asarray(o) for o in case.layer(case.x, mask=MASK)], case.oracle(MASK))
