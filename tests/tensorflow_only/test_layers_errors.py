"""Clear errors: the exception type, and a message that names the argument
and the offending value (issue 2, "Clear errors")."""

import re

import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from helpers import cell_params

X = np.zeros((2, 5, 3), np.float32)


def _built_bi(**kwargs):
    bi = kb.Bidirectional(kb.GRUCell(4), **kwargs)
    bi(X)
    return bi


# --- inputs --------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 5), (2, 5, 3, 1)])
@pytest.mark.parametrize("make", [lambda: kb.Bidirectional(kb.GRUCell(4)), lambda: kb.Recurrent(kb.LSTMCell(4))],
                         ids=["Bidirectional", "Recurrent"])
def test_wrong_input_rank_on_first_call(make, shape):
    with pytest.raises(ValueError, match=r"rank 3 \[batch, time, features\]") as info:
        make()(np.zeros(shape, np.float32))
    assert str(shape) in str(info.value)


@pytest.mark.parametrize("make", [_built_bi, lambda: _built(kb.Recurrent(kb.GRUCell(4)))],
                         ids=["Bidirectional", "Recurrent"])
def test_wrong_input_rank_after_build(make):
    layer = make()
    with pytest.raises(ValueError, match=r"expected ndim=3, found ndim=2"):
        layer(np.zeros((2, 5), np.float32))


def _built(layer):
    layer(X)
    return layer


@pytest.mark.parametrize("make", [_built_bi, lambda: _built(kb.Recurrent(kb.GRUCell(4)))],
                         ids=["Bidirectional", "Recurrent"])
def test_feature_size_changed_after_build(make):
    layer = make()
    with pytest.raises(ValueError, match=r"axis -1 of input shape to have value 3") as info:
        layer(np.zeros((2, 5, 4), np.float32))
    assert "(2, 5, 4)" in str(info.value)


def test_unknown_feature_size():
    with pytest.raises(ValueError, match=r"GRUCell needs a known, positive feature size") as info:
        kb.Bidirectional(kb.GRUCell(4)).build((None, None, None))
    assert "(None, None, None)" in str(info.value)


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_non_float_input(dtype):
    for layer in (kb.Bidirectional(kb.GRUCell(4)), _built_bi(), kb.Recurrent(kb.SimpleRNNCell(4))):
        with pytest.raises(TypeError, match=rf"expects float inputs, received dtype {dtype}") as info:
            layer(np.zeros((2, 5, 3), dtype))
        assert "Embedding" in str(info.value)  # says what to do


# --- constructor arguments ---------------------------------------------------------


@pytest.mark.parametrize("merge_mode", ["max", "Concat", "projections", 0])
def test_unknown_merge_mode(merge_mode):
    with pytest.raises(ValueError, match=r"`merge_mode` must be one of") as info:
        kb.Bidirectional(kb.GRUCell(4), merge_mode=merge_mode)
    assert repr(merge_mode) in str(info.value)
    assert "'projection'" in str(info.value)  # lists the valid modes


@pytest.mark.parametrize("units", [None, 0, -2, 2.5, True])
def test_projection_without_positive_integer_units(units):
    with pytest.raises(ValueError, match=r"needs a positive integer `projection_units`") as info:
        kb.Bidirectional(kb.GRUCell(4), merge_mode="projection", projection_units=units)
    assert f"received {units!r}" in str(info.value)


@pytest.mark.parametrize("merge_mode", ["concat", "sum", None])
def test_projection_units_with_another_merge_mode(merge_mode):
    with pytest.raises(ValueError, match=r"`projection_units` is only used with merge_mode=\"projection\"") as info:
        kb.Bidirectional(kb.GRUCell(4), merge_mode=merge_mode, projection_units=3)
    assert f"merge_mode={merge_mode!r}" in str(info.value)


@pytest.mark.parametrize("value", ["random", "Zeros", None, True, [0.5]])
def test_bad_initial_state_value(value):
    for make in (kb.Bidirectional, kb.Recurrent):
        with pytest.raises(ValueError, match=r"`initial_state` must be \"zeros\", \"learned\" or a float") as info:
            make(kb.GRUCell(4), initial_state=value)
        assert f"received {value!r}" in str(info.value)


@pytest.mark.parametrize("layer", [keras.layers.GRU(4), keras.layers.GRUCell(4), keras.layers.Dense(4), "gru"],
                         ids=["keras_GRU", "keras_GRUCell", "Dense", "string"])
def test_layer_argument_must_be_a_kb_cell_or_recurrent(layer):
    with pytest.raises(TypeError, match=r"`layer` must be a keras_birnn cell") as info:
        kb.Bidirectional(layer)
    assert repr(layer) in str(info.value)
    # Keras's recurrent layers and cells are named with the kb cell that takes their place.
    hint = "For Keras's {}, use kb.GRUCell(4, ...)".format(type(layer).__name__)
    assert (hint in str(info.value)) == isinstance(layer, (keras.layers.GRU, keras.layers.GRUCell))
    with pytest.raises(TypeError, match=r"`backward_layer` must be a keras_birnn cell"):
        kb.Bidirectional(kb.GRUCell(4), backward_layer=layer)
    with pytest.raises(TypeError, match=r"`cell` must be a keras_birnn cell"):
        kb.Recurrent(layer)


def test_directions_must_read_their_own_way():
    with pytest.raises(ValueError, match=r"backward layer must have reverse=True"):
        kb.Bidirectional(kb.GRUCell(4), backward_layer=kb.Recurrent(kb.GRUCell(4)))
    with pytest.raises(ValueError, match=r"forward layer must have reverse=False"):
        kb.Bidirectional(kb.Recurrent(kb.GRUCell(4), reverse=True))


@pytest.mark.parametrize("cell", [kb.SimpleRNNCell, kb.GRUCell, kb.LSTMCell])
@pytest.mark.parametrize("argument", ["dropout", "recurrent_dropout"])
def test_dropout_out_of_range(cell, argument):
    for value in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=rf"`{argument}` must be in \[0, 1\), received {re.escape(repr(value))}"):
            cell(4, **{argument: value})
    with pytest.raises(TypeError, match=rf"`{argument}` must be a float in \[0, 1\), received '0.1'"):
        cell(4, **{argument: "0.1"})


@pytest.mark.parametrize("units", [0, -1, 2.0, None])
def test_bad_units(units):
    with pytest.raises(ValueError, match=rf"`units` must be a positive integer, received {re.escape(repr(units))}"):
        kb.GRUCell(units)


# --- whole sequence needed -----------------------------------------------------------


def test_stateful_bidirectional_is_refused():
    with pytest.raises(ValueError, match=r"cannot be stateful") as info:
        kb.Bidirectional(kb.GRUCell(4), stateful=True)
    assert "needs the whole sequence" in str(info.value)
    assert "kb.Recurrent" in str(info.value)  # says what to use instead
    with pytest.raises(ValueError, match=r"cannot be stateful.*needs the whole sequence"):
        _built_bi().reset_states()


def test_bidirectional_step_is_refused():
    bi = _built_bi()
    with pytest.raises(ValueError, match=r"cannot run step by step.*needs the whole sequence"):
        bi.step(np.zeros((2, 3), np.float32), [np.zeros((2, 4), np.float32)] * 2)


def test_reverse_recurrent_step_is_refused_forward_one_streams():
    with pytest.raises(ValueError, match=r"reverse=True Recurrent cannot run step by step.*needs the whole sequence"):
        kb.Recurrent(kb.GRUCell(4), reverse=True).step(np.zeros((2, 3), np.float32), [np.zeros((2, 4), np.float32)])
    # A forward kb.Recurrent streams: step by step equals the whole-sequence run.
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)
    rec = kb.Recurrent(kb.LSTMCell(4), return_sequences=True)
    expected = rec(x).numpy()
    states = [np.zeros((2, 4), np.float32)] * 2
    for t in range(5):
        output, states = rec.step(x[:, t], states)
        np.testing.assert_allclose(output, expected[:, t], atol=1e-6)
    params = cell_params(rec.cell)
    np.testing.assert_allclose(expected, ref.run_direction("lstm", params, x)[0], atol=1e-5)


# --- call arguments ---------------------------------------------------------------------


def test_wrong_number_of_call_time_initial_states():
    bi = _built_bi()
    with pytest.raises(ValueError, match=r"`initial_state` must be a list of 2 tensors \(forward states, then "
                                         r"backward states\), received 1"):
        bi(X, initial_state=[np.zeros((2, 4), np.float32)])
    lstm = kb.Bidirectional(kb.LSTMCell(4))
    with pytest.raises(ValueError, match=r"must be a list of 4 tensors .* received 2"):
        lstm(X, initial_state=[np.zeros((2, 4), np.float32)] * 2)
    rec = kb.Recurrent(kb.LSTMCell(4))
    with pytest.raises(ValueError, match=r"`initial_state` must be a list of 2 tensors \[batch, 4\] for LSTMCell, "
                                         r"received 3"):
        rec(X, initial_state=[np.zeros((2, 4), np.float32)] * 3)


def test_call_time_initial_state_of_wrong_width():
    with pytest.raises(ValueError, match=r"initial state must have shape \[batch, 4\], received shape \(2, 5\)"):
        _built_bi()(X, initial_state=[np.zeros((2, 5), np.float32)] * 2)


@pytest.mark.parametrize("mask_shape", [(2, 4), (3, 5), (2, 5, 1), (5,)])
def test_mask_of_wrong_shape(mask_shape):
    with pytest.raises(ValueError, match=r"`mask` must have shape \[batch, time\] = \(2, 5\)") as info:
        _built_bi()(X, mask=np.ones(mask_shape, bool))
    assert f"received shape {mask_shape}" in str(info.value)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mask_of_wrong_dtype(dtype):
    for layer in (_built_bi(), kb.Recurrent(kb.GRUCell(4))):
        # (Keras may autocast a float64 mask to float32 before `call`.)
        with pytest.raises(TypeError, match=r"`mask` must be bool \(or 0/1 integers\), received dtype float"):
            layer(X, mask=np.ones((2, 5), dtype))
