"""The vendor engines: PyTorch's own GRU/LSTM/RNN kernels on packed
sequences (`keras_birnn/recurrence/vendor/torch_kernels.py`) and cuDNN's LSTM on
JAX (`vendor/jax_kernels.py`).

On PyTorch, against the NumPy oracle and against the scan engine (the
same layer with `kb.configure_loops(vendor_kernels=False)`), forward and
gradients, on every mask pattern, for the bidirectional pair (one
bidirectional kernel call) and for single directions (`kb.Recurrent`, and
a `kb.Bidirectional` whose directions read different inputs under input
dropout); which loops it takes and why the others are left to the
scan engine.

On JAX the cuDNN call needs a GPU. On a CPU these tests stand JAX's own
reference LSTM (`jax.experimental.rnn.lstm_ref`, which reads the flat
cuDNN weight blob through `unpack_lstm_weights` and honours
`seq_lengths` as cuDNN does, reversing a row within its length) in for
`jax.experimental.rnn.lstm`: everything but the kernel (weight layout,
packing, lengths, boundary states, empty rows) is checked against the
oracle; `benchmarks/gpu_run.sh` runs the kernel itself on the lent GPU.
"""

import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from birnn_cases import CELLS, B, F, T, U, make_case
from helpers import MASK_4x6, PADDING_PATTERNS_4x6, assert_all_close
from backend_harness import BACKEND, to_numpy, traced, value_and_gradients

torch_only = pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's vendor engine")
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="JAX's vendor engine")

MASKS = dict(PADDING_PATTERNS_4x6, unmasked=None, mixed=MASK_4x6)
KERNELS = {"gru_reset_after": "gru", "lstm": "lstm", "simple_tanh": "rnn_tanh", "simple_relu": "rnn_relu"}
VENDOR_CELLS = list(KERNELS)


def _paths(layer) -> list:
    return [plan["path"] for plan in layer.loop_report()["plans"]]


def _gradients_on_both_engines(case, mask):
    """The gradients (inputs, then every weight) of sum(sequence outputs * w)
    on the vendor engine, then on the scan one."""
    weights = keras.ops.convert_to_tensor(np.asarray(case.random_d_output(), np.float32))

    def loss(outputs):
        return keras.ops.sum(outputs[0] * weights)

    _, vendor = value_and_gradients(case.layer, loss, case.x, mask)
    with kb.configure_loops(vendor_kernels=False):
        _, scan = value_and_gradients(case.layer, loss, case.x, mask)
    return vendor, scan


def _forms(layer) -> list:
    return [f"{plan['path']} {plan['form']}" for plan in layer.loop_report()["plans"]]


@torch_only
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("cell_name", VENDOR_CELLS)
def test_bidirectional_pair_matches_oracle_and_scan_engine(cell_name, mask_name):
    """Inference (no gradients recorded): one bidirectional call, packed
    where there is a mask; with gradients recorded on a CPU, a masked call
    runs each direction unpacked over its compacted rows (an LSTM: the
    scan engine)."""
    import torch

    case = make_case(cell_name, "concat", return_state=True)
    mask = MASKS[mask_name]
    with torch.no_grad():
        vendor = to_numpy(case.layer(case.x, mask=mask))
    assert_all_close(vendor, case.oracle(mask))
    layout = "" if mask is None else " packed"
    assert _forms(case.layer) == [f"vendor torch.{KERNELS[cell_name]} bidirectional{layout}"]
    assert_all_close(to_numpy(case.layer(case.x, mask=mask)), vendor)
    training_form = _forms(case.layer)[-1]
    if mask is None:
        assert training_form.endswith("bidirectional")
    else:
        # A masked LSTM trains on the scan engine on a CPU (an unpacked LSTM
        # has no exact final cell state); a GRU runs unpacked over compacted rows.
        assert training_form.startswith("scan") if cell_name == "lstm" else training_form.endswith("compacted")
    with kb.configure_loops(vendor_kernels=False):
        assert_all_close(to_numpy(case.layer(case.x, mask=mask)), vendor)
    assert_all_close(*_gradients_on_both_engines(case, mask))


@torch_only
@pytest.mark.parametrize("mask_name", ["mixed", "left", "fully_masked", "unmasked"])
@pytest.mark.parametrize("cell_name", ["gru_reset_after", "lstm"])
def test_packed_gradients_as_on_a_gpu(monkeypatch, cell_name, mask_name):
    """The packed kernels' gradients (what training runs on a GPU), forced on a CPU."""
    from keras_birnn.recurrence.vendor import torch_kernels

    monkeypatch.setattr(torch_kernels, "cpu_training", lambda directions, mask: False)
    case = make_case(cell_name, "concat", return_state=True)
    vendor, scan = _gradients_on_both_engines(case, MASKS[mask_name])
    assert _forms(case.layer)[0].startswith("vendor torch.")
    assert_all_close(vendor, scan)


@torch_only
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
    import torch

    with torch.no_grad():
        assert_all_close(to_numpy(layer(x, mask=mask)), [outputs] + list(finals))
    assert _paths(layer) == ["vendor"]
    assert_all_close(to_numpy(layer(x, mask=mask)), [outputs] + list(finals))  # gradients recorded
    d_out = rng.normal(size=outputs.shape).astype(np.float32)
    grads = ref.direction_grads(cell, params, x, d_out, mask, reverse=reverse, initial_state=initial, **cell_kwargs)
    weights = keras.ops.convert_to_tensor(d_out)
    _, gradients = value_and_gradients(layer, lambda out: keras.ops.sum(out[0] * weights), x, mask)
    assert_all_close(gradients[0], grads["x"])
    assert_all_close(gradients[1:4], [grads[k] for k in ("kernel", "recurrent_kernel", "bias")])


@torch_only
def test_input_dropout_runs_each_direction_alone_with_the_scan_numbers():
    """Under input dropout the directions read different inputs: one kernel
    call each, the same numbers as the scan engine with the same seed."""
    results = []
    for vendor in (True, False):
        keras.utils.set_random_seed(11)
        case = make_case("gru_reset_after", "sum")
        case.layer.forward_layer.cell.dropout = case.layer.backward_layer.cell.dropout = 0.3
        with kb.configure_loops(vendor_kernels=vendor):
            results.append(to_numpy(case.layer(case.x, mask=MASK_4x6, training=True)))
        form = case.layer.loop_report()["plans"][0]["form"]
        assert form == ("torch.gru compacted" if vendor else "hoisted loop")
    assert_all_close(results[0], results[1])


@torch_only
@pytest.mark.parametrize("mask_name", ["mixed", "unmasked"])
def test_a_pair_of_different_kernels_runs_each_its_own(mask_name):
    """A tanh forward and a relu backward simple RNN: two calls, not one
    bidirectional call of the first's kernel."""
    import torch

    spec = ("simple", {"activation": "tanh"}, lambda u: kb.SimpleRNNCell(u, activation="tanh"))
    case = make_case("simple_tanh", "concat", cell_spec=spec)
    relu = kb.SimpleRNNCell(U, activation="relu")
    layer = kb.Bidirectional(kb.SimpleRNNCell(U, activation="tanh"), backward_layer=relu, return_sequences=True)
    layer.build((None, None, F))
    layer.set_weights(case.layer.get_weights())
    mask = MASKS[mask_name]
    outputs_f, _ = ref.run_direction("simple", case.fw, case.x, mask, activation="tanh")
    outputs_b, _ = ref.run_direction("simple", case.bw, case.x, mask, reverse=True, activation="relu")
    with torch.no_grad():
        assert_all_close(to_numpy(layer(case.x, mask=mask)), np.concatenate([outputs_f, outputs_b], -1))
    assert "bidirectional" not in layer.loop_report()["plans"][0]["form"]


@torch_only
def test_float64_runs_on_the_vendor_engine_exactly():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        case = make_case("gru_reset_after", "concat")
        out = to_numpy(case.layer(case.x.astype(np.float64), mask=MASK_4x6))
    finally:
        keras.config.set_dtype_policy(previous)
    assert out.dtype == np.float64 and _paths(case.layer) == ["vendor"]
    assert_all_close(out, case.oracle(MASK_4x6), atol=1e-12, rtol=1e-12)


@torch_only
@pytest.mark.parametrize("make_cell, call, reason", [
    (lambda: kb.GRUCell(U, reset_after=False), {}, "reset_after=False"),
    (lambda: kb.LSTMCell(U, recurrent_dropout=0.5), {"training": True}, "recurrent dropout"),
    (lambda: kb.GRUCell(U, recurrent_activation="hard_sigmoid"), {}, "activations other than tanh/sigmoid"),
    (lambda: kb.SimpleRNNCell(U, activation="sigmoid"), {}, "simple RNN activation 'sigmoid'"),
    (lambda: kb.GRUCell(U), {}, "vendor_kernels is off"),
])
def test_what_no_vendor_kernel_runs_goes_to_the_scan_engine_with_why(make_cell, call, reason):
    layer = kb.Bidirectional(make_cell(), return_sequences=True)
    x = np.random.default_rng(0).normal(size=(B, T, F)).astype(np.float32)
    with kb.configure_loops(vendor_kernels=reason != "vendor_kernels is off"):
        layer(x, mask=MASK_4x6, **call)
    (plan,) = layer.loop_report()["plans"]
    assert plan["path"] == "scan" and reason in plan["why not vendor"], plan


@torch_only
def test_empty_batch_and_time_axis_run_on_the_scan_engine():
    layer = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)
    assert to_numpy(layer(np.zeros((0, T, F), np.float32), mask=np.zeros((0, T), bool))).shape == (0, T, 2 * U)
    assert np.all(to_numpy(layer(np.zeros((B, 0, F), np.float32))) == 0)
    assert all("empty" in plan["why not vendor"] for plan in layer.loop_report()["plans"])


# --- JAX: cuDNN's LSTM, its reference standing in on a CPU ----------------------------


@pytest.fixture
def cudnn_stand_in(monkeypatch):
    """`jax_kernels` believing it is on a GPU, `jax.experimental.rnn.lstm`
    replaced by JAX's reference implementation of the same call."""
    from jax.experimental import rnn as jax_rnn

    from keras_birnn.recurrence.vendor import jax_kernels

    def reference_lstm(x, h0, c0, weights, seq_lengths, input_size, hidden_size, num_layers, dropout,
                       bidirectional):
        unpacked = jax_rnn.unpack_lstm_weights(weights, input_size, hidden_size, num_layers, bidirectional)
        return jax_rnn.lstm_ref(x, h0, c0, *unpacked, seq_lengths, input_size, hidden_size, num_layers,
                                dropout, bidirectional)

    monkeypatch.setattr(jax_kernels, "on_gpu", lambda: True)
    monkeypatch.setattr(jax_kernels, "jax_rnn", type("StandIn", (), {"lstm": staticmethod(reference_lstm)}))


@jax_only
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_jax_cudnn_lstm_pair_matches_oracle_with_gradients(cudnn_stand_in, mask_name):
    case = make_case("lstm", "concat", return_state=True, initial_state=0.5)
    mask = MASKS[mask_name]
    half = [np.full((B, U), 0.5)] * 2
    assert_all_close(traced(case.layer, case.x, mask), case.oracle(mask, half, half))
    assert case.layer.loop_report()["plans"][0]["form"].startswith("cudnn lstm bidirectional")
    assert_all_close(*_gradients_on_both_engines(case, mask))


@jax_only
@pytest.mark.parametrize("mask_name", ["mixed", "left", "fully_masked", "unmasked"])
@pytest.mark.parametrize("reverse", [False, True])
def test_jax_cudnn_lstm_one_direction_matches_oracle(cudnn_stand_in, reverse, mask_name):
    rng = np.random.default_rng(3)
    params = {k: np.asarray(v, np.float32) for k, v in ref.random_params("lstm", F, U, rng).items()}
    layer = kb.Recurrent(kb.LSTMCell(U), reverse=reverse, return_sequences=True, return_state=True)
    layer.build((None, None, F))
    layer.cell.set_weights([params["kernel"], params["recurrent_kernel"], params["bias"]])
    x = rng.normal(size=(B, T, F)).astype(np.float32)
    mask = MASKS[mask_name]
    outputs, finals = ref.run_direction("lstm", params, x, mask, reverse=reverse)
    assert_all_close(traced(layer, x, mask), [outputs] + list(finals))
    assert layer.loop_report()["plans"][0]["path"] == "vendor"


@jax_only
def test_jax_what_cudnn_does_not_run_says_why(cudnn_stand_in):
    x = np.random.default_rng(0).normal(size=(B, T, F)).astype(np.float32)
    for cell, reason in ((kb.GRUCell(U), "no cuDNN kernel for GRU"),
                         (kb.LSTMCell(U, activation="relu"), "activations other than tanh/sigmoid")):
        layer = kb.Bidirectional(cell)
        layer(x, mask=MASK_4x6)
        (plan,) = layer.loop_report()["plans"]
        assert plan["path"] == "scan" and reason in plan["why not vendor"], plan


def _jax_gpu() -> bool:
    if BACKEND != "jax":
        return False
    import jax

    return jax.default_backend() == "gpu"


@pytest.mark.skipif(not _jax_gpu(), reason="cuDNN needs a GPU (benchmarks/gpu_run.sh runs this on the lent one)")
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_jax_cudnn_lstm_on_a_gpu_matches_oracle_with_gradients(mask_name):
    """The cuDNN kernel itself (TF32 off: tests/backend_harness.py)."""
    case = make_case("lstm", "concat", return_state=True)
    mask = MASKS[mask_name]
    assert_all_close(traced(case.layer, case.x, mask), case.oracle(mask))
    assert case.layer.loop_report()["plans"][0]["path"] == "vendor"
    assert_all_close(*_gradients_on_both_engines(case, mask))


@jax_only
@pytest.mark.skipif(_jax_gpu(), reason="on a CPU only")
def test_jax_on_a_cpu_runs_the_scan_engine_and_says_why():
    layer = kb.Bidirectional(kb.LSTMCell(U))
    layer(np.zeros((B, T, F), np.float32))
    (plan,) = layer.loop_report()["plans"]
    assert plan["path"] == "scan" and "not a GPU" in plan["why not vendor"]
