"""The vendor engine on PyTorch: PyTorch's own RNN kernels, fed packed sequences.

On the PyTorch backend an eligible direction runs as one call of
PyTorch's recurrent kernels (`torch.gru`, `torch.lstm`, `torch.rnn_tanh`,
`torch.rnn_relu`: cuDNN on a GPU, PyTorch's own kernels on a CPU) instead
of the scan engine's step loop, with the same numbers.

Masks of any pattern are exact through packing (`vendor.common`): each
row's valid steps are gathered to the front (in their order, or in
reverse order for a reversed direction: a row reversed within its own
length), run as a packed sequence of the row's length, and the outputs
are scattered back to the positions they came from (zeros at masked
ones). A row with no valid step keeps its boundary states and outputs
zeros. A masked step is thus absent, as in the scan engine, whether the
padding is on the right, on the left or in holes.

On a CPU a masked call that records gradients runs unpacked over the
compacted rows instead (`TorchEngine.compacted`; see `cpu_training` for
why), and a masked LSTM there is left to the scan engine.

Eligible (`reason_not_eligible` says why not, recorded in `loop_report()`):
GRU with `reset_after=True` (PyTorch's convention), LSTM, simple RNN;
PyTorch's activations (tanh and sigmoid gates; tanh or relu for the simple
RNN); no recurrent dropout in effect (input dropout is applied before);
float32 or float64; `LoopConfig.vendor_kernels` on. Weights are re-laid
from Keras's layout (GRU gates z, r, h; LSTM i, f, c, o) to PyTorch's
(GRU r, z, n; LSTM i, f, g, o) by differentiable slicing, so gradients
reach the layer's own variables through PyTorch's autograd.
"""

from typing import List, Optional, Sequence

import torch
from torch.nn.utils import rnn as torch_rnn

from keras_birnn.cells.gru import GRUMath
from keras_birnn.recurrence.direction import Call, Direction, DirectionResult
from keras_birnn.recurrence.vendor import common, packing


def cpu_training(directions: Sequence[Direction], mask) -> bool:
    """A masked call recording gradients on a CPU. There PyTorch's packed
    kernels differentiate slowly (a training step of PyTorch's GRU or LSTM
    packed took 2.3-3.2x the same kernel unpacked: benchmarks/README.md,
    "Backends on a CPU", `bench_packed_training.py`), so such calls run
    unpacked over the compacted rows (`TorchEngine.compacted`) instead."""
    return mask is not None and torch.is_grad_enabled() and directions[0].inputs.device.type == "cpu"


def kernel_of(direction: Direction) -> str:
    """The name of the `torch` function running an eligible direction."""
    return common.standard_kernel(direction.math)[0]


# --- weights ------------------------------------------------------------------------


def _gru_order(w: torch.Tensor) -> torch.Tensor:
    """Keras's GRU gate blocks (z, r, h) along axis 0 -> PyTorch's (r, z, n)."""
    z, r, h = torch.chunk(w, 3, dim=0)
    return torch.cat([r, z, h], dim=0)


def _parameters(direction: Direction) -> List[torch.Tensor]:
    """`[w_ih, w_hh, b_ih, b_hh]` in PyTorch's layout."""
    w_ih, w_hh = direction.kernel.t(), direction.recurrent_kernel.t()
    zeros = w_ih.new_zeros(w_ih.shape[0])
    b_ih = zeros if direction.input_bias is None else direction.input_bias
    b_hh = zeros if direction.recurrent_bias is None else direction.recurrent_bias
    if isinstance(direction.math, GRUMath):
        w_ih, w_hh, b_ih, b_hh = (_gru_order(w) for w in (w_ih, w_hh, b_ih, b_hh))
    return [w.contiguous() for w in (w_ih, w_hh, b_ih, b_hh)]


# --- the kernels --------------------------------------------------------------------


def _call(kernel: str, inputs, batch_sizes, states: List[torch.Tensor], params: List[torch.Tensor],
          bidirectional: bool = False):
    """One kernel call on states `[directions, B, H]`; `batch_sizes` None for
    a padded batch-first input. Returns (outputs, final states)."""
    function = getattr(torch, kernel)
    hx = states if kernel == "lstm" else states[0]
    flags = (True, 1, 0.0, torch.is_grad_enabled(), bidirectional)  # biases, layers, dropout, train, both ways
    if batch_sizes is None:
        result = function(inputs, hx, params, *flags, True)
    else:
        result = function(inputs, batch_sizes, hx, params, *flags)
    return result[0], list(result[1:])


def _packed_call(kernel: str, x, lengths, states, params, bidirectional: bool):
    """The kernel on rows whose valid steps come first (`lengths` >= 1 of
    them): outputs `[B, T, units]`, zeros past each row's length, and the
    final states."""
    packed = torch_rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    sorted_states = [s.index_select(1, packed.sorted_indices) for s in states]
    data, final = _call(kernel, packed.data, packed.batch_sizes, sorted_states, params, bidirectional)
    final = [s.index_select(1, packed.unsorted_indices) for s in final]
    outputs, _ = torch_rnn.pad_packed_sequence(packed._replace(data=data), batch_first=True, total_length=x.shape[1])
    return outputs, final


class TorchEngine(common.VendorEngine):
    """PyTorch's kernels behind the vendor engines' shared run (`common.VendorEngine`)."""

    def kernel_reason(self, call: Call) -> Optional[str]:
        for direction in call.directions:
            kernel, why = common.standard_kernel(direction.math)
            if kernel is None:
                return why
            if kernel == "lstm" and cpu_training(call.directions, call.mask):
                return ("masked LSTM training on a CPU (PyTorch's packed backward is slow there, and an "
                        "unpacked LSTM has no exact final cell state)")
            why = common.dtype_reason(direction, ("float32", "float64"), "PyTorch's kernels take float32/float64")
            if why:
                return why
        return None

    def kernel_label(self, call: Call) -> str:
        return f"torch.{kernel_of(call.directions[0])}"

    def plan(self, call: Call) -> common.VendorPlan:
        if cpu_training(call.directions, call.mask):
            return common.VendorPlan(f"{self.kernel_label(call)} compacted")
        return super().plan(call)

    def bool_mask(self, mask, like):
        # On the inputs' device: a mask made on the CPU must not meet CUDA outputs.
        return mask.to(device=like.device, dtype=torch.bool)

    def runs_as_pair(self, directions: Sequence[Direction], mask) -> bool:
        return common.is_bidirectional_pair(directions) and not cpu_training(directions, mask)

    def kernel_call(self, directions, x, lengths, states, bidirectional):
        kernel = kernel_of(directions[0])
        params = [p for d in directions for p in _parameters(d)]
        if lengths is None:
            return _call(kernel, x.contiguous(), None, states, params, bidirectional)
        return _packed_call(kernel, x, lengths, states, params, bidirectional)

    def run_one(self, direction: Direction, mask) -> DirectionResult:
        if cpu_training([direction], mask):
            return self.compacted(direction, mask)
        return super().run_one(direction, mask)

    def compacted(self, direction: Direction, mask) -> DirectionResult:
        """One single-state direction unpacked over its rows' valid steps
        moved to the front: outputs before each row's length and the state
        after its last valid step (read off the outputs) are exact; what
        the kernel computes past a length lands on masked positions, which
        are zeroed."""
        destination, lengths = packing.destinations(mask, direction.reverse)
        states = common.stacked_states([direction])
        outputs, _ = self.kernel_call([direction], packing.to_front(direction.inputs, destination), None, states,
                                      bidirectional=False)
        last = outputs[torch.arange(outputs.shape[0], device=outputs.device), (lengths - 1).clamp(min=0).long()]
        final = torch.where((lengths == 0).unsqueeze(-1), direction.initial_states[0], last)
        return DirectionResult(packing.to_positions(outputs, destination, mask), [final])


ENGINE = TorchEngine()
