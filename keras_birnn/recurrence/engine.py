"""`run`: the one place that picks the engine for a call.

Each backend has its engines in order of preference (`ENGINES`): on
TensorFlow, the TensorFlow engine (`recurrence.tensorflow`: the loop plan,
compiled loops, time buckets, the hand-written BPTT, exports), which runs
every call; on PyTorch and JAX, the backend's vendor engine
(`vendor.torch_kernels`: PyTorch's own kernels on packed sequences;
`vendor.jax_kernels`: cuDNN's LSTM on a GPU) for the calls it can run, and
the scan engine (`recurrence.scan`: a masked `keras.ops.scan`
differentiated by the backend's autodiff) for the rest; on any other
backend, the scan engine. The first engine whose `reason_not_eligible` is
None runs the call; the reasons of those passed over go into the plan it
records (`loop_report()["plans"]`, "why not vendor"). All give the same
numbers (the NumPy oracle tests run on every backend).

A backend's engines are imported when first asked, and a vendor engine
only once the checks every vendor engine makes pass
(`vendor.common.reason_not_eligible`), so with `vendor_kernels` off, or on
another backend, no vendor module (nor what it imports, such as
`jax.experimental.rnn`) is imported.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from keras_birnn import backend
from keras_birnn.recurrence import scan
from keras_birnn.recurrence.direction import Call, Direction, DirectionResult, Engine
from keras_birnn.recurrence.vendor import common as vendor_common


class TensorFlowEngine:
    """The TensorFlow engine (`recurrence.tensorflow.dispatch.run`) behind
    the engines' contract: it runs every call, and plans and records each
    of its loops itself (`recurrence.tensorflow.plan.LoopPlan`)."""

    name = "tensorflow"

    def reason_not_eligible(self, call: Call) -> Optional[str]:
        return None

    def run(self, call: Call, passed_over: str = "") -> List[DirectionResult]:
        from keras_birnn.recurrence.tensorflow import dispatch

        return dispatch.run(call.directions, call.mask, call.return_sequences, bptt=call.bptt, counter=call.counter)


class LazyVendorEngine:
    """A backend's vendor engine, imported only for a call that passes the
    checks every vendor engine makes."""

    name = "vendor"

    def __init__(self, load: Callable[[], vendor_common.VendorEngine]):
        self._load = load

    def reason_not_eligible(self, call: Call) -> Optional[str]:
        return vendor_common.reason_not_eligible(call) or self._load().kernel_reason(call)

    def run(self, call: Call, passed_over: str = "") -> List[DirectionResult]:
        return self._load().run(call, passed_over)


def _torch_kernels() -> vendor_common.VendorEngine:
    from keras_birnn.recurrence.vendor import torch_kernels

    return torch_kernels.ENGINE


def _jax_kernels() -> vendor_common.VendorEngine:
    from keras_birnn.recurrence.vendor import jax_kernels

    return jax_kernels.ENGINE


# Each backend's engines, in order of preference; the last runs every call.
ENGINES: Dict[str, Tuple[Engine, ...]] = {
    "tensorflow": (TensorFlowEngine(),),
    "torch": (LazyVendorEngine(_torch_kernels), scan.ENGINE),
    "jax": (LazyVendorEngine(_jax_kernels), scan.ENGINE),
}


def engines_for(backend_name: str) -> Tuple[Engine, ...]:
    """The engines a backend tries, in order (any backend not in `ENGINES`:
    the scan engine alone)."""
    return ENGINES.get(backend_name, (scan.ENGINE,))


def select(call: Call, backend_name: Optional[str] = None) -> Tuple[Engine, str]:
    """The engine that runs `call` on the backend (default: Keras's), and
    why the engines tried before it did not ("; "-joined, "" if none were)."""
    name = backend.NAME if backend_name is None else backend_name
    passed_over = [] if name in ENGINES else [f"no vendor engine on the {name} backend"]
    for engine in engines_for(name):
        why = engine.reason_not_eligible(call)
        if why is None:
            return engine, "; ".join(passed_over)
        passed_over.append(why)
    raise RuntimeError(f"No engine runs this call on {name}: {'; '.join(passed_over)}")


def run(
    directions: Sequence[Direction],
    mask=None,
    return_sequences: bool = True,
    bptt: bool = False,
    counter=None,
) -> List[DirectionResult]:
    """Runs every direction over the whole sequence, on the engine `select` picks.

    Args:
        directions, mask, return_sequences, bptt: The call, as the
            attributes of `direction.Call`.
        counter: The calling layer's `compile_policy.ShapeCounter`, which
            records each call's plan for `loop_report()`.

    Returns:
        One `DirectionResult` per direction.
    """
    call = Call(directions, mask, return_sequences, bptt, counter)
    engine, passed_over = select(call)
    return engine.run(call, passed_over)
