"""The fused engine (`keras_birnn/recurrence/fused.py`, PyTorch only):
PyTorch's own GRU/LSTM/RNN kernels on packed sequences.

Against the NumPy oracle and against the portable engine (the same layer
with `kb.configure_loops(fused_kernels=False)`), forward and gradients, on
every mask pattern, for the bidirectional pair (one bidirectional kernel
call) and for single directions (`kb.Recurrent`, and a `kb.Bidirectional`
whose directions read different inputs under input dropout); which loops
it takes and why the others are left to the portable engine.
"""

import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from birnn_cases import CELLS, B, F, T, U, make_case
from helpers import MASK_4x6, PADDING_PATTERNS_4x6, assert_all_close
from portable import BACKEND, to_numpy, value_and_gradients

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="the fused engine runs on PyTorch only")

MASKS = dict(PADDING_PATTERNS_4x6, unmasked=None, mixed=MASK_4x6)
FUSED_CELLS = ["gru_reset_after", "lstm", "simple_tanh", "simple_relu"]


def _paths(layer) -> list:
    return [plan["path"] for plan in layer.loop_report()["plans"]]


def _gradients(case, mask):
    """Loss sum(sequence outputs * w) and its gradients (inputs, then every weight)."""
    weights = keras.ops.convert_to_tensor(np.asarray(case.random_d_output(), np.float32))
    return value_and_gradients(case.layer, lambda out: keras.ops.sum(out[0] * weights), case.x, mask)


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("cell_name", FUSED_CELLS)
def test_bidirectional_pair_matches_oracle_and_portable_engine(cell_name, mask_name):
    case = make_case(cell_name, "concat", return_state=True)
    mask = MASKS[mask_name]
    fused = to_numpy(case.layer(case.x, mask=mask))
    assert_all_close(fused, case.oracle(mask))
    assert _paths(case.layer) == ["fused"]
    assert "bidirectional" in case.layer.loop_report()["plans"][0]["form"]
    case.rng = np.random.default_rng(7)
    _, fused_gradients = _gradients(case, mask)
    with kb.configure_loops(fused_kernels=False):
        assert_all_close(to_numpy(case.layer(case.x, mask=mask)), fused)
        case.rng = np.random.default_rng(7)
        _, portable_gradients = _gradients(case, mask)
    assert_all_close(fused_gradients, portable_gradients)
    assert "portable" in _paths(case.layer)


@pytest.mark.parametrize("mask_name", ["mixed", "left", "holes", "fully_masked", "unmasked"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("cell_name", ["gru_reset_after", "lstm"])
def test_one_direction_matches_oracle_with_gradients(cell_name, reverse, mask_name):
    cell, cell_kwargs, factory = CELLS[cell_name]
    rng = np.random.default_rng(3)
    params = {k: None if v is None else np.asarray(v, np.float32)
              for k, v in ref.random_params(cell, F, U, rng, **cell_kwargs).items()}
    layer = kb.Recurrent(factory(U), reverse=reverse, return_sequences=True, return_state=True,
                         initial_state=0.25)
    layer.build((None, None, F))
    layer.cell.set_weights([params["kernel"], params["recurrent_kernel"], params["bias"]])
    x = rng.normal(size=(B, T, F)).astype(np.float32)
    mask = MASKS[mask_name]
    initial = [np.full((B, U), 0.25)] * (2 if cell == "lstm" else 1)
    outputs, finals = ref.run_direction(cell, params, x, mask, reverse=reverse, initial_state=initial, **cell_kwargs)
    assert_all_close(to_numpy(layer(x, mask=mask)), [outputs] + list(finals))
    assert _paths(layer) == ["fused"]
    d_out = rng.normal(size=outputs.shape).astype(np.float32)
    grads = ref.direction_grads(cell, params, x, d_out, mask, reverse=reverse, initial_state=initial, **cell_kwargs)
    weights = keras.ops.convert_to_tensor(d_out)
    _, gradients = value_and_gradients(layer, lambda out: keras.ops.sum(out[0] * weights), x, mask)
    assert_all_close(gradients[0], grads["x"])
    assert_all_close(gradients[1:4], [grads[k] for k in ("kernel", "recurrent_kernel", "bias")])


def test_input_dropout_runs_each_direction_alone_with_the_portable_numbers():
    """Under input dropout the directions read different inputs: one fused
    call each, the same numbers as the portable engine with the same seed."""
    results = []
    for fused in (True, False):
        keras.utils.set_random_seed(11)
        case = make_case("lstm", "sum")
        case.layer.forward_layer.cell.dropout = case.layer.backward_layer.cell.dropout = 0.3
        with kb.configure_loops(fused_kernels=fused):
            results.append(to_numpy(case.layer(case.x, mask=MASK_4x6, training=True)))
        form = case.layer.loop_report()["plans"][0]["form"]
        assert form == ("torch.lstm packed" if fused else "hoisted loop")
    assert_all_close(results[0], results[1])


def test_float64_is_fused_and_exact():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        case = make_case("gru_reset_after", "concat")
        out = to_numpy(case.layer(case.x.astype(np.float64), mask=MASK_4x6))
    finally:
        keras.config.set_dtype_policy(previous)
    assert out.dtype == np.float64 and _paths(case.layer) == ["fused"]
    assert_all_close(out, case.oracle(MASK_4x6), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("make_cell, call, reason", [
    (lambda: kb.GRUCell(U, reset_after=False), {}, "reset_after=False"),
    (lambda: kb.LSTMCell(U, recurrent_dropout=0.5), {"training": True}, "recurrent dropout"),
    (lambda: kb.GRUCell(U, recurrent_activation="hard_sigmoid"), {}, "activations other than tanh/sigmoid"),
    (lambda: kb.SimpleRNNCell(U, activation="sigmoid"), {}, "simple RNN activation 'sigmoid'"),
    (lambda: kb.GRUCell(U), {}, "fused_kernels is off"),
])
def test_what_is_not_fused_runs_portable_and_says_why(make_cell, call, reason):
    layer = kb.Bidirectional(make_cell(), return_sequences=True)
    x = np.random.default_rng(0).normal(size=(B, T, F)).astype(np.float32)
    with kb.configure_loops(fused_kernels=reason != "fused_kernels is off"):
        layer(x, mask=MASK_4x6, **call)
    (plan,) = layer.loop_report()["plans"]
    assert plan["path"] == "portable" and reason in plan["not fused"], plan


def test_empty_batch_and_time_axis_run_portable():
    layer = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)
    assert to_numpy(layer(np.zeros((0, T, F), np.float32), mask=np.zeros((0, T), bool))).shape == (0, T, 2 * U)
    assert np.all(to_numpy(layer(np.zeros((B, 0, F), np.float32))) == 0)
    assert all("empty" in plan["not fused"] for plan in layer.loop_report()["plans"])
