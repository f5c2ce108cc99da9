"""`keras_birnn.recurrence.engine`: which engine runs a call, per backend,
and the reason recorded when a vendor engine does not.

Each case runs a bidirectional GRU or LSTM (eagerly, and traced:
`tf.function` with unknown batch and time, `jax.jit`) and checks the
numbers against the NumPy oracle (tests/reference.py) as well as the plan
`loop_report()` records: on PyTorch an eligible pair runs PyTorch's kernels
(the vendor engine), on JAX cuDNN's LSTM (JAX's reference LSTM standing in
on a CPU, as in test_recurrence_vendor.py), on TensorFlow the TensorFlow
engine; with `vendor_kernels` off, or under recurrent dropout, PyTorch and
JAX run the scan engine and say why. A fresh process checks that no vendor
module is imported where none is asked for.
"""

import contextlib
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from all_backends.test_recurrence_vendor import cudnn_stand_in  # noqa: F401  (a fixture)
from backend_harness import BACKEND, to_numpy, traced
from birnn_cases import B, T, U, make_case
from helpers import MASK_4x6, assert_all_close
from keras_birnn.recurrence import engine
from keras_birnn.recurrence.compile_policy import ShapeCounter
from keras_birnn.recurrence.direction import Call

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENDOR_BACKENDS = ("torch", "jax")
# The cell each backend's vendor engine runs: PyTorch's GRU, cuDNN's LSTM.
VENDOR_CELL = {"torch": "gru_reset_after", "jax": "lstm"}.get(BACKEND, "gru_reset_after")


class EngineCall(keras.layers.Layer):
    """`engine.run` on a `kb.Bidirectional`'s two directions, outputs and
    final states of both returned, its plans recorded in `counter`;
    `state_mask`: every direction given an all-ones recurrent-dropout mask
    (the numbers of no dropout, but a state mask all the same)."""

    def __init__(self, bidirectional, state_mask: bool = False):
        super().__init__()
        self.bidirectional = bidirectional
        self.state_mask = state_mask
        self.counter = ShapeCounter()
        self.supports_masking = True  # it reads the mask; its outputs carry none

    def compute_mask(self, inputs, mask=None):
        return None

    def call(self, inputs, mask=None):
        if mask is not None:
            inputs = keras.ops.where(keras.ops.expand_dims(mask, -1), inputs, keras.ops.zeros_like(inputs))
        directions = [side.direction(inputs, mask, padded=True)
                      for side in (self.bidirectional.forward_layer, self.bidirectional.backward_layer)]
        if self.state_mask:
            directions = [d._replace(state_mask=keras.ops.ones_like(d.initial_states[0])) for d in directions]
        results = engine.run(directions, mask, True, counter=self.counter)
        return [r.outputs for r in results] + [s for r in results for s in r.final_states]

    def plans(self) -> list:
        return self.counter.report()["plans"]


def _oracle_per_direction(case, mask) -> list:
    """Forward and backward outputs, then their final states, from the oracle."""
    fw_out, fw_final = ref.run_direction(case.cell, case.fw, case.x, mask, **case.cell_kwargs)
    bw_out, bw_final = ref.run_direction(case.cell, case.bw, case.x, mask, reverse=True, **case.cell_kwargs)
    return [fw_out, bw_out] + list(fw_final) + list(bw_final)


def _inference():
    """No gradients recorded: PyTorch's eager call then runs the packed kernels."""
    if BACKEND == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def _eager_and_traced(layer, x, mask) -> list:
    with _inference():
        eager = to_numpy(layer(x, mask=mask))
    return [eager, traced(layer, x, mask)]


def _assert_tensorflow_plans(plans):
    """The TensorFlow engine's plans (`LoopPlan.describe()`), not another engine's."""
    assert plans and all(p["path"] not in ("scan", "vendor") and "runner" in p for p in plans), plans


def _assert_scan_plans(plans, reason: str):
    assert plans and all(p["path"] == "scan" and reason in p["why not vendor"] for p in plans), plans


# --- the registry ------------------------------------------------------------------


@pytest.mark.parametrize("backend_name, names", [
    ("tensorflow", ["tensorflow"]),
    ("torch", ["vendor", "scan"]),
    ("jax", ["vendor", "scan"]),
    ("numpy", ["scan"]),
    ("openvino", ["scan"]),
])
def test_each_backend_tries_its_engines_in_order(backend_name, names):
    assert [e.name for e in engine.engines_for(backend_name)] == names


@pytest.mark.parametrize("mask", [MASK_4x6, None], ids=["masked", "unmasked"])
def test_a_backend_without_engines_of_its_own_runs_the_scan_engine(mask):
    """`select` for a backend not in the registry: the scan engine, saying
    why no vendor engine ran; it runs on this backend's tensors with the
    oracle's numbers."""
    case = make_case("lstm", "concat")
    layer = EngineCall(case.layer)
    with _inference():
        layer(case.x, mask=mask)  # builds; the directions below are the layer's
    x = keras.ops.convert_to_tensor(case.x if mask is None else np.where(mask[..., None], case.x, 0))
    m = None if mask is None else keras.ops.convert_to_tensor(mask)
    directions = [side.direction(x, m, padded=True) for side in (case.layer.forward_layer, case.layer.backward_layer)]
    call = Call(directions, m, True, False, None)
    chosen, why = engine.select(call, "numpy")
    assert chosen.name == "scan" and why == "no vendor engine on the numpy backend"
    with _inference():
        results = chosen.run(call, why)
    outputs = [r.outputs for r in results] + [s for r in results for s in r.final_states]
    assert_all_close(to_numpy(outputs), _oracle_per_direction(case, mask))


# --- selection on this backend -----------------------------------------------------


@pytest.mark.parametrize("mask", [MASK_4x6, None], ids=["masked", "unmasked"])
def test_an_eligible_pair_runs_on_the_backends_first_engine(request, mask):
    """PyTorch: one bidirectional call of `torch.gru`; JAX: of cuDNN's LSTM
    (its reference standing in on a CPU); TensorFlow: its own engine."""
    if BACKEND == "jax":
        request.getfixturevalue("cudnn_stand_in")
    case = make_case(VENDOR_CELL, "concat", return_state=True)
    for outputs in _eager_and_traced(case.layer, case.x, mask):
        assert_all_close(outputs, case.oracle(mask))
    plans = case.layer.loop_report()["plans"]
    packed = "" if mask is None else " packed"
    if BACKEND == "tensorflow":
        _assert_tensorflow_plans(plans)
    else:
        kernel = {"torch": "torch.gru", "jax": "cudnn lstm"}[BACKEND]
        assert (plans[0]["path"], plans[0]["form"]) == ("vendor", f"{kernel} bidirectional{packed}"), plans


@pytest.mark.parametrize("cell_name", ["gru_reset_after", "lstm"])
def test_vendor_kernels_off_runs_the_scan_engine_and_says_why(cell_name):
    case = make_case(cell_name, "concat", return_state=True)
    with kb.configure_loops(vendor_kernels=False):
        for outputs in _eager_and_traced(case.layer, case.x, MASK_4x6):
            assert_all_close(outputs, case.oracle(MASK_4x6))
    plans = case.layer.loop_report()["plans"]
    if BACKEND in VENDOR_BACKENDS:
        _assert_scan_plans(plans, "LoopConfig.vendor_kernels is off")
    else:
        _assert_tensorflow_plans(plans)


def test_recurrent_dropout_keeps_the_vendor_engine_off(request):
    """A state mask (all ones here, so the oracle's numbers hold) keeps
    every vendor engine off, before any kernel's own check."""
    if BACKEND == "jax":
        request.getfixturevalue("cudnn_stand_in")
    case = make_case(VENDOR_CELL, "concat")
    layer = EngineCall(case.layer, state_mask=True)
    for outputs in _eager_and_traced(layer, case.x, MASK_4x6):
        assert_all_close(outputs, _oracle_per_direction(case, MASK_4x6))
    if BACKEND in VENDOR_BACKENDS:
        _assert_scan_plans(layer.plans(), "recurrent dropout in effect")
    else:
        _assert_tensorflow_plans(layer.plans())


def test_without_a_state_mask_the_same_call_runs_the_vendor_engine(request):
    """The counterpart of the test above: only the state mask differs."""
    if BACKEND == "jax":
        request.getfixturevalue("cudnn_stand_in")
    case = make_case(VENDOR_CELL, "concat")
    layer = EngineCall(case.layer)
    for outputs in _eager_and_traced(layer, case.x, MASK_4x6):
        assert_all_close(outputs, _oracle_per_direction(case, MASK_4x6))
    paths = {p["path"] for p in layer.plans()}
    assert paths == {"vendor"} if BACKEND in VENDOR_BACKENDS else paths.isdisjoint({"vendor", "scan"}), paths


def test_the_deprecated_fused_kernels_setting_warns_and_still_works():
    case = make_case(VENDOR_CELL, "concat", return_state=True)
    with pytest.warns(DeprecationWarning, match=r"configure_loops\(vendor_kernels=\.\.\.\)"):
        with kb.configure_loops(fused_kernels=False):
            with pytest.warns(DeprecationWarning, match="LoopConfig.vendor_kernels"):
                assert kb.loop_config().fused_kernels is False
            assert kb.loop_config().vendor_kernels is False
            for outputs in _eager_and_traced(case.layer, case.x, MASK_4x6):
                assert_all_close(outputs, case.oracle(MASK_4x6))
    assert kb.loop_config().vendor_kernels is True
    plans = case.layer.loop_report()["plans"]
    if BACKEND in VENDOR_BACKENDS:
        _assert_scan_plans(plans, "LoopConfig.vendor_kernels is off")
    else:
        _assert_tensorflow_plans(plans)


def test_old_and_new_setting_names_together_are_refused():
    with pytest.raises(TypeError, match="both `fused_kernels`.*`vendor_kernels`"):
        with pytest.warns(DeprecationWarning):
            with kb.configure_loops(fused_kernels=False, vendor_kernels=True):
                pass
    assert kb.loop_config().vendor_kernels is True


# --- what is imported -----------------------------------------------------------


IMPORTS_CHECK = """
import sys
import numpy as np
import keras_birnn as kb
import reference as ref

x = np.random.default_rng(0).normal(size=({B}, {T}, 3)).astype(np.float32)
layer = kb.Recurrent(kb.LSTMCell({U}), return_sequences=True)
with kb.configure_loops(vendor_kernels=False):
    y = np.asarray(layer(x))
params = dict(zip(("kernel", "recurrent_kernel", "bias"), (w.numpy() if hasattr(w, "numpy") else np.asarray(w)
                                                          for w in layer.cell.get_weights())))
expected, _ = ref.run_direction("lstm", params, x)
np.testing.assert_allclose(y, expected, atol=1e-5, rtol=1e-5)
plan, = layer.loop_report()["plans"]
assert plan["path"] == "scan", plan
loaded = sorted(m for m in sys.modules
                if m.startswith(("keras_birnn.recurrence.vendor.torch_kernels",
                                 "keras_birnn.recurrence.vendor.jax_kernels", "jax.experimental.rnn")))
assert not loaded, loaded
print("ok", plan["why not vendor"])
"""


@pytest.mark.skipif(BACKEND != "jax", reason="checked once, from the JAX run (the subprocesses pick their backends)")
@pytest.mark.parametrize("backend_name, reason", [
    ("jax", "LoopConfig.vendor_kernels is off"),
    ("numpy", "no vendor engine on the numpy backend"),
])
def test_no_vendor_module_is_imported_unless_a_vendor_engine_may_run(backend_name, reason):
    """A fresh process on JAX with `vendor_kernels` off, and on NumPy: an
    LSTM runs on the scan engine with the oracle's numbers, and neither
    vendor engine nor `jax.experimental.rnn` was imported."""
    env = dict(os.environ, KERAS_BACKEND=backend_name, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.path.join(REPO, "tests"),
                                                        os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", IMPORTS_CHECK.format(B=B, T=T, U=U)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"ok {reason}"
