"""The vendor engine on JAX: cuDNN's LSTM through `jax.experimental.rnn`.

On a GPU an eligible LSTM runs as one `jax.experimental.rnn.lstm` call
(cuDNN, with its own backward pass) instead of the scan engine's
`lax.scan`. JAX has no cuDNN GRU, so GRU and simple RNN stay on the scan,
as they do for Keras's own layers.

Masks of any pattern are exact through packing (`vendor.common`): each
row's valid steps move to the front, cuDNN runs each row over its
`seq_lengths`, and the outputs move back (zeros at masked positions). A
row without a valid step runs one step (cuDNN takes lengths >= 1) and then
keeps its boundary states. A forward and a reversed direction over one
input tensor are one bidirectional call: cuDNN reverses each row within
its own length, as the backward direction needs; a lone reversed
direction runs forward over its row reversed within its length.

Eligible (`reason_not_eligible` says why not, recorded in `loop_report()`):
a GPU backend; LSTM with tanh and sigmoid activations; no recurrent
dropout in effect; float32; `LoopConfig.vendor_kernels` on. Keras's LSTM
gate order (i, f, c, o) is cuDNN's (i, f, g, o): the weights are only
transposed and flattened, matrices of every direction first, then biases
(`b_ih` the layer's bias, `b_hh` zeros), the layout
`jax.experimental.rnn` documents.
"""

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import rnn as jax_rnn

from keras_birnn.cells.lstm import LSTMMath
from keras_birnn.recurrence.direction import Call, Direction
from keras_birnn.recurrence.vendor import common


def on_gpu() -> bool:
    """Whether JAX runs on a GPU (cuDNN's LSTM needs one)."""
    return jax.default_backend() == "gpu"


def _flat_weights(directions: Sequence[Direction]):
    """cuDNN's flat weight vector: every direction's W_ih, W_hh, then
    every direction's b_ih, b_hh."""
    matrices, biases = [], []
    for d in directions:
        matrices += [d.kernel.T.ravel(), d.recurrent_kernel.T.ravel()]
        b_ih = jnp.zeros(d.kernel.shape[1], d.kernel.dtype) if d.input_bias is None else d.input_bias
        biases += [b_ih, jnp.zeros_like(b_ih)]
    return jnp.concatenate(matrices + biases)


class JaxEngine(common.VendorEngine):
    """cuDNN's LSTM behind the vendor engines' shared run (`common.VendorEngine`)."""

    def kernel_reason(self, call: Call) -> Optional[str]:
        if not on_gpu():
            return "no cuDNN: JAX's backend is not a GPU"
        for direction in call.directions:
            if not isinstance(direction.math, LSTMMath):
                return f"JAX has no cuDNN kernel for {type(direction.math).__name__[:-4] or 'this cell'}"
            why = common.standard_kernel(direction.math)[1] or common.dtype_reason(
                direction, ("float32",), "cuDNN's LSTM here takes float32")
            if why:
                return why
        return None

    def kernel_label(self, call: Call) -> str:
        return "cudnn lstm"

    def bool_mask(self, mask, like):
        return jnp.asarray(mask, bool)

    def kernel_call(self, directions, x, lengths, states, bidirectional):
        if lengths is None:
            lengths = jnp.full((x.shape[0],), x.shape[1], jnp.int32)
        y, h, c = jax_rnn.lstm(
            x, states[0], states[1], _flat_weights(directions), lengths.astype(jnp.int32),
            input_size=x.shape[-1], hidden_size=directions[0].recurrent_kernel.shape[0], num_layers=1,
            dropout=0.0, bidirectional=bidirectional)
        return y, [h, c]


ENGINE = JaxEngine()
