"""The fused engine on JAX: cuDNN's LSTM through `jax.experimental.rnn`.

On a GPU an eligible LSTM runs as one `jax.experimental.rnn.lstm` call
(cuDNN, with its own backward pass) instead of the portable engine's
`lax.scan`. JAX has no cuDNN GRU, so GRU and simple RNN stay on the scan,
as they do for Keras's own layers.

Masks of any pattern are exact through packing (`recurrence.vendor.packing`):
each row's valid steps move to the front, cuDNN runs each row over its
`seq_lengths`, and the outputs move back (zeros at masked positions). A
row without a valid step runs one step (cuDNN takes lengths >= 1) and then
keeps its boundary states. A forward and a reversed direction over one
input tensor are one bidirectional call: cuDNN reverses each row within
its own length, as the backward direction needs; a lone reversed
direction runs forward over its row reversed within its length.

Eligible (`reason_not_fused` says why not, recorded in `loop_report()`):
a GPU backend; LSTM with tanh and sigmoid activations; no recurrent
dropout in effect; float32; `LoopConfig.fused_kernels` on. Keras's LSTM
gate order (i, f, c, o) is cuDNN's (i, f, g, o): the weights are only
transposed and flattened, matrices of every direction first, then biases
(`b_ih` the layer's bias, `b_hh` zeros), the layout
`jax.experimental.rnn` documents.
"""

from typing import List, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import rnn as jax_rnn

from keras_birnn.cells.derivatives import activation_name
from keras_birnn.cells.lstm import LSTMMath
from keras_birnn.recurrence.vendor import packing
from keras_birnn.recurrence.direction import Direction, DirectionResult, FusedPlan, is_bidirectional_pair


def on_gpu() -> bool:
    """Whether JAX runs on a GPU (cuDNN's LSTM needs one)."""
    return jax.default_backend() == "gpu"


def reason_not_fused(directions: Sequence[Direction], mask=None) -> str:
    """Why cuDNN's LSTM cannot run these directions ("" if it can;
    `engine` checked what keeps every fused engine off)."""
    if not on_gpu():
        return "no cuDNN: JAX's backend is not a GPU"
    for direction in directions:
        math = direction.math
        if not isinstance(math, LSTMMath):
            return f"JAX has no cuDNN kernel for {type(math).__name__[:-4] or 'this cell'}"
        if (activation_name(math.activation), activation_name(math.recurrent_activation)) != ("tanh", "sigmoid"):
            return "LSTM activations other than tanh/sigmoid"
        if direction.inputs.dtype != jnp.float32:
            return f"dtype {direction.inputs.dtype} (cuDNN's LSTM here takes float32)"
    return ""


def plan(directions: Sequence[Direction], mask) -> FusedPlan:
    """The plan `run` follows for these directions, for `loop_report()`."""
    pair = " bidirectional" if is_bidirectional_pair(directions) else ""
    return FusedPlan("cudnn lstm" + pair + (" packed" if mask is not None else ""))


def _flat_weights(directions: Sequence[Direction]):
    """cuDNN's flat weight vector: every direction's W_ih, W_hh, then
    every direction's b_ih, b_hh."""
    matrices, biases = [], []
    for d in directions:
        matrices += [d.kernel.T.ravel(), d.recurrent_kernel.T.ravel()]
        b_ih = jnp.zeros(d.kernel.shape[1], d.kernel.dtype) if d.input_bias is None else d.input_bias
        biases += [b_ih, jnp.zeros_like(b_ih)]
    return jnp.concatenate(matrices + biases)


def _lstm(directions: Sequence[Direction], x, lengths, bidirectional: bool):
    """One cuDNN call; returns outputs `[B, T, dirs * H]` and final (h, c)
    `[dirs, B, H]` each, rows without a valid step keeping their initial states."""
    h0 = jnp.stack([d.initial_states[0] for d in directions])
    c0 = jnp.stack([d.initial_states[1] for d in directions])
    units = directions[0].recurrent_kernel.shape[0]
    y, h, c = jax_rnn.lstm(
        x, h0, c0, _flat_weights(directions), jnp.maximum(lengths, 1).astype(jnp.int32),
        input_size=x.shape[-1], hidden_size=units, num_layers=1, dropout=0.0, bidirectional=bidirectional)
    empty = (lengths == 0)[None, :, None]
    return y, [jnp.where(empty, h0, h), jnp.where(empty, c0, c)]


def _run(directions: Sequence[Direction], mask, reverse: bool, bidirectional: bool):
    x = directions[0].inputs
    batch, steps = x.shape[0], x.shape[1]
    if mask is None:
        x = jnp.flip(x, 1) if reverse else x
        y, final = _lstm(directions, x, jnp.full((batch,), steps, jnp.int32), bidirectional)
        return (jnp.flip(y, 1) if reverse else y), final
    destination, lengths = packing.destinations(mask, reverse)
    y, final = _lstm(directions, packing.to_front(x, destination), lengths, bidirectional)
    return packing.to_positions(y, destination, mask), final


def run(directions: Sequence[Direction], mask=None, return_sequences: bool = True) -> List[DirectionResult]:
    """Runs eligible directions on cuDNN (see the module's doc): a pair as
    one bidirectional call, else one call each."""
    mask = None if mask is None else jnp.asarray(mask, bool)
    if is_bidirectional_pair(directions):
        y, (h, c) = _run(directions, mask, reverse=False, bidirectional=True)
        units = y.shape[-1] // 2
        results = [DirectionResult(y[..., k * units:(k + 1) * units], [h[k], c[k]]) for k in (0, 1)]
    else:
        results = []
        for d in directions:
            y, (h, c) = _run([d], mask, reverse=d.reverse, bidirectional=False)
            results.append(DirectionResult(y, [h[0], c[0]]))
    if not return_sequences:
        results = [DirectionResult(None, r.final_states) for r in results]
    return results
