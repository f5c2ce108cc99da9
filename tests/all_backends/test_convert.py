"""keras_birnn.layers.convert: kb.Bidirectional <-> keras.layers.Bidirectional(GRU / LSTM / SimpleRNN).

On every backend. Each way, for every cell (GRU after and before reset,
LSTM, SimpleRNN), merge mode and `return_sequences`: the converted layer
gives the source's numbers (to 1e-6) on an unpadded and a right-padded
batch, and converting back gives the source's weights bit for bit. Cell
arguments, regularization losses, `return_state`, a traced call, the
refusals (each message names the argument and its value), and the
measured facts the docs state about left padding and holes and about
Keras's `unroll=True`.
"""

import keras
import numpy as np
import pytest

import keras_birnn as kb
from helpers import PADDING_PATTERNS_4x6, assert_all_close
from keras_birnn.layers.convert import from_keras_bidirectional, to_keras_bidirectional
from backend_harness import BACKEND, to_numpy, traced

B, T, F, U = 4, 6, 3, 4
RIGHT = PADDING_PATTERNS_4x6["right"]  # lengths 6, 4, 2, 1
ATOL = RTOL = 1e-6

# kind -> (Keras layer factory, kb cell factory); the first is the cheapest.
KINDS = {
    "simple_rnn": (lambda **kw: keras.layers.SimpleRNN(U, **kw), lambda **kw: kb.SimpleRNNCell(U, **kw)),
    "gru": (lambda **kw: keras.layers.GRU(U, **kw), lambda **kw: kb.GRUCell(U, **kw)),
    "gru_reset_before": (
        lambda **kw: keras.layers.GRU(U, reset_after=False, **kw),
        lambda **kw: kb.GRUCell(U, reset_after=False, **kw),
    ),
    "lstm": (lambda **kw: keras.layers.LSTM(U, **kw), lambda **kw: kb.LSTMCell(U, **kw)),
}
MERGES = ["concat", "sum", "mul", "ave", None]


def _randomize(layer, seed):
    """Weights away from their initializers (biases, the forget gate)."""
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()])


def _inputs(seed=0):
    return np.random.default_rng(100 + seed).normal(size=(B, T, F)).astype(np.float32)


def _keras_layer(kind, merge_mode="concat", weights_seed=0, **kwargs):
    layer = keras.layers.Bidirectional(KINDS[kind][0](**kwargs), merge_mode=merge_mode)
    layer.build((None, None, F))
    _randomize(layer, weights_seed)
    return layer


def _kb_layer(kind, merge_mode="concat", weights_seed=0, **kwargs):
    layer = kb.Bidirectional(KINDS[kind][1](), merge_mode=merge_mode, **kwargs)
    layer.build((None, None, F))
    _randomize(layer, weights_seed)
    return layer


def _outputs(layer, x, mask=None, **kwargs):
    return to_numpy(layer(x, mask=mask, **kwargs))


def _assert_same_numbers(converted, source, x, masks=(None, RIGHT)):
    for mask in masks:
        expected = keras.tree.flatten(_outputs(source, x, mask))
        actual = keras.tree.flatten(_outputs(converted, x, mask))
        assert len(actual) == len(expected)
        assert_all_close(actual, expected, atol=ATOL, rtol=RTOL)


def _assert_same_weights(a, b):
    wa, wb = a.get_weights(), b.get_weights()
    assert [w.shape for w in wa] == [w.shape for w in wb]
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)


def _assert_same_wrapper(a, b):
    for name in ("merge_mode", "return_sequences", "return_state", "name"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.fixture(autouse=True)
def _jax_op_by_op(request):
    """On JAX, eager calls run op by op (`jax.disable_jit`): an eager call
    of Keras's or kb's layer otherwise compiles its `lax.scan` anew (0.2-0.9 s
    a call, minutes for this file). `test_traced_calls_agree` runs both
    under `jax.jit`."""
    if BACKEND != "jax" or request.node.originalname == "test_traced_calls_agree":
        yield
        return
    import jax

    with jax.disable_jit():
        yield


# --- numbers and weights, each way ---------------------------------------------------------------


@pytest.mark.parametrize("merge_mode", MERGES, ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_from_keras_gives_keras_numbers_and_converts_back(kind, merge_mode):
    """Keras -> kb: Keras's numbers without a mask and with right padding;
    kb -> Keras gives the Keras layer's weights back bit for bit."""
    x = _inputs()
    for return_sequences in (True, False):
        source = _keras_layer(kind, merge_mode, return_sequences=return_sequences)
        converted = from_keras_bidirectional(source)
        assert isinstance(converted, kb.Bidirectional) and converted.built
        _assert_same_wrapper(converted, source)
        _assert_same_weights(converted, source)
        _assert_same_numbers(converted, source, x)
        back = to_keras_bidirectional(converted)
        assert type(back.forward_layer) is type(source.forward_layer)
        assert back.backward_layer.go_backwards and not back.forward_layer.go_backwards
        _assert_same_wrapper(back, source)
        _assert_same_weights(back, source)


@pytest.mark.parametrize("merge_mode", MERGES, ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_to_keras_gives_kb_numbers_and_round_trips(kind, merge_mode):
    """kb -> Keras: kb's numbers without a mask and with right padding;
    kb -> Keras -> kb gives identical weights."""
    x = _inputs(1)
    for return_sequences in (True, False):
        source = _kb_layer(kind, merge_mode, weights_seed=1, return_sequences=return_sequences)
        converted = to_keras_bidirectional(source)
        assert isinstance(converted, keras.layers.Bidirectional) and converted.built
        _assert_same_wrapper(converted, source)
        _assert_same_numbers(converted, source, x)
        again = from_keras_bidirectional(converted)
        _assert_same_wrapper(again, source)
        _assert_same_weights(again, source)
        assert type(again.forward_layer.cell) is type(source.forward_layer.cell)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_return_state_each_way(kind):
    """Outputs, then the forward states, then the backward ones, in the
    same order on both sides (merge_mode=None: two outputs first)."""
    x = _inputs(2)
    source = _keras_layer(kind, None, weights_seed=2, return_sequences=True, return_state=True)
    converted = from_keras_bidirectional(source)
    _assert_same_numbers(converted, source, x)
    states = {"gru": 1, "lstm": 2}[kind]
    assert len(_outputs(converted, x, RIGHT)) == 2 + 2 * states
    _assert_same_numbers(to_keras_bidirectional(converted), converted, x)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_traced_calls_agree(kind):
    """In the backend's traced form (`tf.function` with unknown batch and
    time, `jax.jit`; PyTorch eagerly), right-padded."""
    x = _inputs(3)
    source = _keras_layer(kind, "concat", weights_seed=3, return_sequences=True)
    converted = from_keras_bidirectional(source)
    assert_all_close(traced(converted, x, RIGHT), traced(source, x, RIGHT), atol=ATOL, rtol=RTOL)


def test_keras_rnn_around_a_keras_cell_converts():
    """`keras.layers.RNN(keras.layers.GRUCell(...))` is Keras's GRU without
    its cuDNN path: it converts like `keras.layers.GRU`."""
    source = keras.layers.Bidirectional(keras.layers.RNN(keras.layers.GRUCell(U), return_sequences=True))
    source.build((None, None, F))
    _randomize(source, 4)
    converted = from_keras_bidirectional(source)
    assert type(converted.forward_layer.cell) is kb.GRUCell
    _assert_same_numbers(converted, source, _inputs(4))
    assert type(to_keras_bidirectional(converted).forward_layer) is keras.layers.GRU


# --- cell arguments ------------------------------------------------------------------------------

CELL_ARGUMENTS = {
    "gru": dict(
        activation="relu",
        recurrent_activation="hard_sigmoid",
        use_bias=False,
        reset_after=False,
        dropout=0.1,
        recurrent_dropout=0.2,
        kernel_regularizer=keras.regularizers.L2(0.01),
        recurrent_regularizer=keras.regularizers.L1(0.02),
        recurrent_constraint=keras.constraints.NonNeg(),
        kernel_initializer="he_normal",
        seed=3,
    ),
    "lstm": dict(
        unit_forget_bias=False,
        activation="softsign",
        bias_regularizer=keras.regularizers.L2(0.03),
        kernel_constraint=keras.constraints.MaxNorm(2.0),
        bias_initializer="ones",
        dropout=0.25,
        seed=5,
    ),
    "simple_rnn": dict(activation="sigmoid", kernel_regularizer=keras.regularizers.L2(0.05), recurrent_dropout=0.3),
}


def _arguments(cell, names):
    return {name: keras.saving.serialize_keras_object(getattr(cell, name)) for name in names}


@pytest.mark.parametrize("kind", list(CELL_ARGUMENTS))
def test_cell_arguments_and_regularization_carry_over(kind):
    """Activations, bias, reset convention, unit_forget_bias, dropout rates,
    seeds, initializers, regularizers and constraints: the same on both
    sides, each way; inference numbers and regularization losses equal."""
    arguments = CELL_ARGUMENTS[kind]
    source = _keras_layer(kind, "sum", weights_seed=6, return_sequences=True, **arguments)
    converted = from_keras_bidirectional(source)
    back = to_keras_bidirectional(converted)
    for keras_layer, kb_layer in ((source.forward_layer, converted.forward_layer),
                                  (source.backward_layer, converted.backward_layer),
                                  (back.backward_layer, converted.backward_layer)):
        assert _arguments(kb_layer.cell, arguments) == _arguments(keras_layer.cell, arguments)
    x = _inputs(6)
    _assert_same_numbers(converted, source, x)
    _assert_same_numbers(back, converted, x)
    losses = [float(sum(to_numpy(layer.losses))) for layer in (source, converted, back)]
    assert losses[0] > 0
    np.testing.assert_allclose(losses[1:], [losses[0]] * 2, rtol=1e-6)


def test_name_trainable_and_wrapper_regularizer_carry_over():
    source = keras.layers.Bidirectional(
        keras.layers.GRU(U), name="encoder", activity_regularizer=keras.regularizers.L2(0.1)
    )
    source.build((None, None, F))
    source.backward_layer.trainable = False
    converted = from_keras_bidirectional(source)
    assert converted.name == "encoder"
    assert converted.forward_layer.trainable and not converted.backward_layer.trainable
    assert len(converted.trainable_weights) == len(source.trainable_weights) == 3
    assert isinstance(converted.activity_regularizer, keras.regularizers.L2)
    back = to_keras_bidirectional(converted)
    assert back.name == "encoder" and not back.backward_layer.trainable
    assert len(back.trainable_weights) == 3


# JAX without x64 keeps float64 as float32, on both sides alike.
@pytest.mark.filterwarnings("ignore:Explicitly requested dtype float64")
def test_a_direction_computing_in_its_own_dtype():
    """Keras's wrapped layers in float64 under a float32 wrapper: kb's
    directions become `kb.Recurrent`s in float64, and back."""
    source = keras.layers.Bidirectional(
        keras.layers.GRU(U, return_sequences=True, dtype="float64"),
        backward_layer=keras.layers.GRU(U, return_sequences=True, go_backwards=True, dtype="float64"),
    )
    source.build((None, None, F))
    _randomize(source, 9)
    converted = from_keras_bidirectional(source)
    assert isinstance(converted.forward_layer, kb.Recurrent)
    assert converted.dtype_policy.name == "float32"
    backward = converted.backward_layer
    assert backward.dtype_policy.name == backward.cell.dtype_policy.name == "float64"
    _assert_same_numbers(converted, source, _inputs(9), masks=(RIGHT,))
    back = to_keras_bidirectional(converted)
    assert back.forward_layer.dtype_policy.name == back.backward_layer.dtype_policy.name == "float64"
    _assert_same_weights(back, source)


# --- refusals ------------------------------------------------------------------------------------


class _CustomGRUCell(kb.GRUCell):
    pass


def _kb_tied():
    cell = kb.GRUCell(U)
    return kb.Bidirectional(cell, backward_layer=kb.Recurrent(cell, reverse=True))


KB_REFUSED = {
    "projection": (
        lambda: kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=3),
        "merge_mode='projection'",
    ),
    "learned_state": (
        lambda: kb.Bidirectional(kb.GRUCell(U), initial_state="learned"), "initial_state='learned'"
    ),
    "constant_state": (lambda: kb.Bidirectional(kb.LSTMCell(U), initial_state=0.5), "initial_state=0.5"),
    "backward_learned_state": (
        lambda: kb.Bidirectional(
            kb.GRUCell(U), backward_layer=kb.Recurrent(kb.GRUCell(U), reverse=True, initial_state="learned")
        ),
        "backward kb.Recurrent's initial_state='learned'",
    ),
    "tied_weights": (_kb_tied, "Tied weights"),
    "custom_cell": (lambda: kb.Bidirectional(_CustomGRUCell(U)), "received _CustomGRUCell"),
    "mismatched_kind": (
        lambda: kb.Bidirectional(kb.GRUCell(U), backward_layer=kb.LSTMCell(U)),
        "forward GRU, received backward_layer LSTM",
    ),
    "mismatched_units": (
        lambda: kb.Bidirectional(kb.GRUCell(U), backward_layer=kb.GRUCell(U + 1)),
        f"units \\({U}\\), received backward units={U + 1}",
    ),
    "unbuilt": (lambda: kb.Bidirectional(kb.GRUCell(U)), "is not built"),
}


@pytest.mark.parametrize("case", list(KB_REFUSED))
def test_to_keras_refuses_what_keras_has_no_twin_for(case):
    make, message = KB_REFUSED[case]
    with pytest.raises(ValueError, match=message):
        to_keras_bidirectional(make())


KERAS_REFUSED = {
    "stateful": (lambda: keras.layers.Bidirectional(keras.layers.GRU(U, stateful=True)), "received stateful=True"),
    "forward_go_backwards": (
        lambda: keras.layers.Bidirectional(
            keras.layers.GRU(U, go_backwards=True), backward_layer=keras.layers.GRU(U)
        ),
        "forward_layer must have go_backwards=False, received go_backwards=True",
    ),
    "unroll": (lambda: keras.layers.Bidirectional(keras.layers.LSTM(U, unroll=True)), "received unroll=True"),
    "stacked_cells": (
        lambda: keras.layers.Bidirectional(
            keras.layers.RNN(keras.layers.StackedRNNCells([keras.layers.GRUCell(U), keras.layers.GRUCell(U)]))
        ),
        "received forward_layer=RNN of StackedRNNCells",
    ),
    "mismatched_kind": (
        lambda: keras.layers.Bidirectional(
            keras.layers.GRU(U), backward_layer=keras.layers.LSTM(U, go_backwards=True)
        ),
        "forward GRU, received backward_layer LSTM",
    ),
    "mismatched_units": (
        lambda: keras.layers.Bidirectional(
            keras.layers.GRU(U), backward_layer=keras.layers.GRU(U + 1, go_backwards=True)
        ),
        f"received backward units={U + 1}",
    ),
    "activity_regularizer": (
        lambda: keras.layers.Bidirectional(keras.layers.GRU(U, activity_regularizer="l2")),
        "received activity_regularizer=",
    ),
    "unbuilt": (lambda: keras.layers.Bidirectional(keras.layers.GRU(U)), "is not built"),
}


@pytest.mark.parametrize("case", list(KERAS_REFUSED))
def test_from_keras_refuses_what_kb_has_no_twin_for(case):
    make, message = KERAS_REFUSED[case]
    with pytest.raises(ValueError, match=message):
        from_keras_bidirectional(make())


def test_wrong_layer_types_are_type_errors():
    with pytest.raises(TypeError, match="must be a keras.layers.Bidirectional"):
        from_keras_bidirectional(kb.Bidirectional(kb.GRUCell(U)))
    with pytest.raises(TypeError, match="must be a kb.Bidirectional"):
        to_keras_bidirectional(keras.layers.Bidirectional(keras.layers.GRU(U)))


# --- the measured facts the docs state ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_left_padding_and_holes_agree_where_keras_runs_its_loop(kind):
    """Left padding, holes and rows with no valid step give the same
    numbers on both sides wherever Keras runs its generic loop (a CPU; JAX
    and PyTorch with any mask): a masked step carries the state, so
    Keras's backward layer, which reverses the whole padded row, reads
    each row's valid steps in kb's order. (Only Keras's TensorFlow cuDNN
    kernels, on a GPU, take right padding alone: docs/deploy.md.)"""
    x = _inputs(7)
    source = _keras_layer(kind, None, weights_seed=7, return_sequences=True, return_state=True)
    converted = from_keras_bidirectional(source)
    unmasked = _outputs(source, x)
    for padding in ("left", "holes", "fully_masked"):
        mask = PADDING_PATTERNS_4x6[padding]
        expected = _outputs(source, x, mask)
        assert_all_close(_outputs(converted, x, mask), expected, atol=ATOL, rtol=RTOL)
        # Not vacuous: the mask changes outputs at valid positions (the
        # forward ones after left padding, both around holes).
        valid = mask[..., None]
        assert max(np.abs((e - u) * valid).max() for e, u in zip(expected[:2], unmasked[:2])) > 1e-2


def test_keras_unrolled_masked_layers_are_not_their_loop():
    """Why `unroll=True` is refused: Keras's unrolled layers, masked, do
    not give their own loop's numbers on every backend (Keras 3.15.1): on
    TensorFlow the backward layer's sequence output differs at valid
    positions, on PyTorch the call fails; on JAX they agree. Should this
    start failing, Keras has changed, and the refusal can be reconsidered."""
    x = _inputs(8)
    looped = _keras_layer("gru", None, weights_seed=8, return_sequences=True)
    unrolled = _keras_layer("gru", None, weights_seed=8, return_sequences=True, unroll=True)
    _assert_same_weights(looped, unrolled)
    assert_all_close(_outputs(unrolled, x), _outputs(looped, x), atol=1e-5, rtol=1e-5)  # unmasked: equal
    if BACKEND == "torch":
        with pytest.raises(AttributeError):
            unrolled(x, mask=RIGHT)
        return
    valid = RIGHT[..., None]
    pairs = zip(_outputs(unrolled, x, RIGHT), _outputs(looped, x, RIGHT))
    differences = [np.abs(u - v) * valid for u, v in pairs]
    assert differences[0].max() < 1e-5  # the forward layer agrees
    if BACKEND == "tensorflow":
        assert differences[1].max() > 0.1
    else:
        assert differences[1].max() < 1e-5
