"""The fused engine: PyTorch's own RNN kernels, fed packed sequences.

On the PyTorch backend an eligible direction runs as one call of
PyTorch's fused recurrence (`torch.gru`, `torch.lstm`, `torch.rnn_tanh`,
`torch.rnn_relu`: cuDNN on a GPU, PyTorch's own kernels on a CPU) instead
of the portable engine's step loop, with the same numbers.

Masks of any pattern are exact through packing: each row's valid steps
are gathered to the front (in their order, or in reverse order for a
reversed direction: a row reversed within its own length), run as a
packed sequence of the row's length, and the outputs are scattered back
to the positions they came from (zeros at masked ones). A row with no
valid step keeps its boundary states and outputs zeros. A masked step is
thus absent, as in the portable engine, whether the padding is on the
right, on the left or in holes.

On a CPU a masked call that records gradients runs unpacked over the
compacted rows instead (`_compacted`; see `_cpu_training` for why), and
a masked LSTM there is left to the portable engine.

Eligible (`reason_not_fused` says why not, recorded in `loop_report()`):
GRU with `reset_after=True` (PyTorch's convention), LSTM, simple RNN;
PyTorch's activations (tanh and sigmoid gates; tanh or relu for the simple
RNN); no recurrent dropout in effect (input dropout is applied before);
float32 or float64; `LoopConfig.fused_kernels` on. Weights are re-laid
from Keras's layout (GRU gates z, r, h; LSTM i, f, c, o) to PyTorch's
(GRU r, z, n; LSTM i, f, g, o) by differentiable slicing, so gradients
reach the layer's own variables through PyTorch's autograd.
"""

from typing import List, Optional, Sequence, Tuple

import torch
from torch.nn.utils import rnn as torch_rnn

from keras_birnn.cells.derivatives import activation_name
from keras_birnn.cells.gru import GRUMath
from keras_birnn.cells.lstm import LSTMMath
from keras_birnn.cells.simple_rnn import SimpleRNNMath
from keras_birnn.recurrence.vendor import packing
from keras_birnn.recurrence.direction import Direction, DirectionResult, FusedPlan, is_bidirectional_pair

_DTYPES = (torch.float32, torch.float64)


def _kernel_name(math) -> Tuple[Optional[str], str]:
    """(PyTorch's kernel for this step maths, or None; why not)."""
    gates = activation_name(getattr(math, "recurrent_activation", None))
    act = activation_name(math.activation)
    if isinstance(math, GRUMath):
        if not math.reset_after:
            return None, "GRU with reset_after=False (PyTorch's GRU resets after the matmul)"
        return ("gru", "") if (act, gates) == ("tanh", "sigmoid") else (None, "GRU activations other than tanh/sigmoid")
    if isinstance(math, LSTMMath):
        return ("lstm", "") if (act, gates) == ("tanh", "sigmoid") else (None, "LSTM activations other than tanh/sigmoid")
    if isinstance(math, SimpleRNNMath):
        return (f"rnn_{act}", "") if act in ("tanh", "relu") else (None, f"simple RNN activation {act or 'custom'!r}")
    return None, f"cell maths {type(math).__name__}"


def _cpu_training(directions: Sequence[Direction], mask) -> bool:
    """A masked call recording gradients on a CPU. There PyTorch's packed
    kernels differentiate slowly (a training step of PyTorch's GRU or LSTM
    packed took 2.3-3.2x the same kernel unpacked: benchmarks/README.md,
    "Backends on a CPU", `bench_packed_training.py`), so such calls run
    unpacked over the compacted rows (`_compacted`) instead."""
    return mask is not None and torch.is_grad_enabled() and directions[0].inputs.device.type == "cpu"


def reason_not_fused(directions: Sequence[Direction], mask=None) -> str:
    """Why PyTorch's kernels cannot run these directions ("" if they can;
    `engine` checked what keeps every fused engine off)."""
    for direction in directions:
        kernel, why = _kernel_name(direction.math)
        if kernel is None:
            return why
        if kernel == "lstm" and _cpu_training(directions, mask):
            return ("masked LSTM training on a CPU (PyTorch's packed backward is slow there, and an "
                    "unpacked LSTM has no exact final cell state)")
        if direction.inputs.dtype not in _DTYPES:
            return f"dtype {direction.inputs.dtype} (the fused kernels take float32/float64)"
    return ""


def plan(directions: Sequence[Direction], mask) -> FusedPlan:
    """The plan `run` follows for these directions, for `loop_report()`."""
    kernel = f"torch.{_kernel_name(directions[0].math)[0]}"
    if _cpu_training(directions, mask):
        return FusedPlan(f"{kernel} compacted")
    layout = (" bidirectional" if _pair(directions) else "") + (" packed" if mask is not None else "")
    return FusedPlan(kernel + layout)


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
    """One fused call on states `[directions, B, H]`; `batch_sizes` None for
    a padded batch-first input. Returns (outputs, final states)."""
    function = getattr(torch, kernel)
    hx = states if kernel == "lstm" else states[0]
    flags = (True, 1, 0.0, torch.is_grad_enabled(), bidirectional)  # biases, layers, dropout, train, both ways
    if batch_sizes is None:
        result = function(inputs, hx, params, *flags, True)
    else:
        result = function(inputs, batch_sizes, hx, params, *flags)
    return result[0], list(result[1:])


def _packed_call(kernel: str, x, lengths, states, params, bidirectional: bool = False):
    """The fused call on rows whose valid steps come first (`lengths` of
    them): outputs `[B, T, units]`, zeros past each row's length, and the
    final states, a row without a valid step keeping its initial states."""
    # Packing needs lengths >= 1: an empty row runs one step, then is reset below.
    packed = torch_rnn.pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
    sorted_states = [s.index_select(1, packed.sorted_indices) for s in states]
    data, final = _call(kernel, packed.data, packed.batch_sizes, sorted_states, params, bidirectional)
    final = [s.index_select(1, packed.unsorted_indices) for s in final]
    outputs, _ = torch_rnn.pad_packed_sequence(packed._replace(data=data), batch_first=True, total_length=x.shape[1])
    empty = (lengths == 0).unsqueeze(-1)
    # The one step an empty row ran is its only non-zero output past a length.
    outputs[:, 0] = torch.where(empty, 0.0, outputs[:, 0])
    return outputs, [torch.where(empty, s0, s) for s0, s in zip(states, final)]


def _compacted(direction: Direction, kernel: str, mask, params, states) -> DirectionResult:
    """One single-state direction unpacked over its rows' valid steps moved
    to the front: outputs before each row's length and the state after its
    last valid step (read off the outputs) are exact; what the kernel
    computes past a length lands on masked positions, which are zeroed."""
    destination, lengths = packing.destinations(mask, direction.reverse)
    outputs, _ = _call(kernel, packing.to_front(direction.inputs, destination), None, states, params)
    last = outputs[torch.arange(outputs.shape[0], device=outputs.device), (lengths - 1).clamp(min=0).long()]
    final = torch.where((lengths == 0).unsqueeze(-1), direction.initial_states[0], last)
    return DirectionResult(packing.to_positions(outputs, destination, mask), [final])


def _one(direction: Direction, kernel: str, mask) -> DirectionResult:
    """One direction as one fused call (a reversed one on its rows reversed
    within their lengths)."""
    params = _parameters(direction)
    states = [s.unsqueeze(0) for s in direction.initial_states]
    if _cpu_training([direction], mask):
        return _compacted(direction, kernel, mask, params, states)
    if mask is None:
        x = direction.inputs.flip(1) if direction.reverse else direction.inputs
        outputs, final = _call(kernel, x.contiguous(), None, states, params)
        outputs = outputs.flip(1) if direction.reverse else outputs
    else:
        destination, lengths = packing.destinations(mask, direction.reverse)
        outputs, final = _packed_call(kernel, packing.to_front(direction.inputs, destination), lengths,
                                      states, params)
        outputs = packing.to_positions(outputs, destination)
    return DirectionResult(outputs, [s[0] for s in final])


def _pair(directions: Sequence[Direction]) -> bool:
    """Whether the directions are a forward and a reversed run of one
    kernel over one input tensor: PyTorch's bidirectional call runs them."""
    return (is_bidirectional_pair(directions)
            and _kernel_name(directions[0].math)[0] == _kernel_name(directions[1].math)[0])


def _bidirectional(directions, kernel: str, mask) -> List[DirectionResult]:
    """A forward and a reversed direction as one bidirectional kernel call;
    PyTorch reverses each packed row within its length, as they need."""
    params = _parameters(directions[0]) + _parameters(directions[1])
    states = [torch.stack(pair) for pair in zip(*(d.initial_states for d in directions))]
    x = directions[0].inputs
    if mask is None:
        outputs, final = _call(kernel, x.contiguous(), None, states, params, bidirectional=True)
    else:
        destination, lengths = packing.destinations(mask)
        outputs, final = _packed_call(kernel, packing.to_front(x, destination), lengths, states, params, True)
        outputs = packing.to_positions(outputs, destination)
    units = outputs.shape[-1] // 2
    return [DirectionResult(outputs[..., k * units:(k + 1) * units], [s[k] for s in final]) for k in (0, 1)]


def run(directions: Sequence[Direction], mask=None, return_sequences: bool = True) -> List[DirectionResult]:
    """Runs the directions as fused kernel calls (see the module's doc): a
    forward and a reversed direction over one tensor as one bidirectional
    call, else one call each.

    Args:
        directions: Eligible recurrences (`reason_not_fused` is "");
            all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Keep per-step outputs (else None).
    """
    # On the inputs' device: a mask made on the CPU must not meet CUDA outputs.
    mask = None if mask is None else mask.to(device=directions[0].inputs.device, dtype=torch.bool)
    if _pair(directions) and not _cpu_training(directions, mask):
        results = _bidirectional(directions, _kernel_name(directions[0].math)[0], mask)
    else:
        results = [_one(d, _kernel_name(d.math)[0], mask) for d in directions]
    if not return_sequences:
        results = [DirectionResult(None, r.final_states) for r in results]
    return results
