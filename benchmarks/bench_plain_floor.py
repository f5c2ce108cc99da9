"""How close are keras_birnn's plain loops to the leanest plain TensorFlow BiGRU we know?

Where a model trains or predicts in too few steps for an XLA compilation
to pay (`compile_policy`), its recurrences run as plain TensorFlow loops,
and then what bounds any implementation is the cost of a loop's operations,
not its arithmetic. This script writes out, by hand, a bidirectional GRU
with the fewest operations we know of, and times it beside
`kb.Bidirectional(kb.GRUCell)` (never compiled) and
`keras.layers.Bidirectional(keras.layers.GRU)` at the shapes of the models
of the examples (the classifier, the variable-length tagger, the demo),
each peer called in turn:

- the forward step: two matmuls, the gates, the masked update, one write
  (right padding: the state stands and the output is zero at a padded step);
- training keeps only the gates' activations and the recurrent term after
  reset, takes each step's incoming state from the outputs (exact only
  for right padding and zero boundary states, which keras_birnn cannot
  assume: it also serves holes, left padding and learned boundary
  states), walks back with the fused activation gradients, and sums the
  weights' gradients after the loop in three matmuls per direction.

`MinimalBiGRU` is the same BiGRU as a Keras layer, with which
`bench_recurrence_share.py --floor` trains a whole example.

Before timing, each shape checks that the hand-written GRU, given kb's
weights, computes kb's outputs and gradients (the loss: the sum of the
squared outputs). It swaps batch and time as kb's loops do (as
float64s, `layout.swap_batch_and_time`). It is the leanest plain loop
we know, not a proven bound: kb/minimal says how far kb's loops are from
it (below 1 where kb's choices, such as the functional `While` for small
steps, beat it), keras/minimal what that loop gains over Keras's layer.

    python benchmarks/bench_plain_floor.py
    python benchmarks/bench_plain_floor.py --shapes classifier --rounds 30
"""

import argparse
import os
import time
from typing import Callable, Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_birnn as kb  # noqa: E402

# Batch and time swapped as keras_birnn's loops swap them (as float64s:
# TensorFlow's oneDNN float transpose is several times slower at these
# sizes); nothing here is differentiated by TensorFlow.
from keras_birnn.recurrence.tensorflow.layout import swap_batch_and_time as swap  # noqa: E402

# name: (batch, time, features, units, modes): the examples' models
# (training batch 32; the classifier also predicts at
# 32, the demo serves at 1 and 64); time is the middle of three lengths.
SHAPES = {
    "classifier": (32, 20, 128, 64, ("inference", "training")),
    "classifier_b64": (64, 38, 128, 64, ("inference",)),  # its export's batch of 64, 7 to 38 words
    "variable": (32, 25, 64, 64, ("training",)),
    "demo_b64": (64, 24, 1, 8, ("inference",)),
    "demo_b1": (1, 24, 1, 8, ("inference",)),
    "quick": (4, 6, 3, 5, ("inference", "training")),
}


def _gates(x_t, h, weights):
    """One GRU step (Keras's layout, reset after): the new state and what
    training keeps, `[z, r, candidate, recurrent candidate term]`."""
    kernel, recurrent_kernel, bias = weights
    x_z, x_r, x_h = tf.split(tf.matmul(x_t, kernel) + bias[0], 3, axis=-1)
    h_z, h_r, h_h = tf.split(tf.matmul(h, recurrent_kernel) + bias[1], 3, axis=-1)
    z, r = tf.sigmoid(x_z + h_z), tf.sigmoid(x_r + h_r)
    candidate = tf.tanh(x_h + r * h_h)
    return z * h + (1.0 - z) * candidate, (z, r, candidate, h_h)


def minimal_forward(x_tm, m_tm, weights, keep: bool):
    """Time-major outputs `[T, B, U]` (zero where masked) and, with `keep`,
    the kept gates `[T, B, 4U]`."""
    steps, units = tf.shape(x_tm)[0], weights[1].shape[0]
    outputs = tf.TensorArray(x_tm.dtype, steps, element_shape=[None, units])
    kept = tf.TensorArray(x_tm.dtype, steps, element_shape=[None, 4 * units])

    def body(i, h, outputs, kept):
        new, gates = _gates(x_tm[i], h, weights)
        new = tf.where(m_tm[i], new, h)
        outputs = outputs.write(i, tf.where(m_tm[i], new, tf.zeros_like(new)))
        return i + 1, new, outputs, kept.write(i, tf.concat(gates, -1)) if keep else kept

    h0 = tf.zeros([tf.shape(x_tm)[1], units], x_tm.dtype)
    _, _, outputs, kept = tf.while_loop(lambda i, *_: i < steps, body, (0, h0, outputs, kept))
    return outputs.stack(), kept.stack() if keep else None


def minimal_bptt(kept, incoming, d_outputs, m_tm, recurrent_kernel):
    """Per step, the input projection's and the recurrent term's
    pre-activation gradients `[T, B, 3U]` each."""
    steps, units = tf.shape(kept)[0], recurrent_kernel.shape[0]
    transposed = tf.transpose(recurrent_kernel)
    d_inputs = tf.TensorArray(kept.dtype, steps, element_shape=[None, 3 * units])
    d_recurrent = tf.TensorArray(kept.dtype, steps, element_shape=[None, 3 * units])

    def body(j, d_h, d_inputs, d_recurrent):
        i = steps - 1 - j
        z, r, candidate, h_h = tf.split(kept[i], 4, axis=-1)
        d_in = d_h + d_outputs[i]
        d_new = tf.where(m_tm[i], d_in, tf.zeros_like(d_in))
        d_c = tf.raw_ops.TanhGrad(y=candidate, dy=d_new * (1.0 - z))
        d_z = tf.raw_ops.SigmoidGrad(y=z, dy=d_new * (incoming[i] - candidate))
        d_r = tf.raw_ops.SigmoidGrad(y=r, dy=d_c * h_h)
        d_rec = tf.concat([d_z, d_r, d_c * r], -1)
        d_h = tf.where(m_tm[i], d_new * z + tf.matmul(d_rec, transposed), d_in)
        return j + 1, d_h, d_inputs.write(i, tf.concat([d_z, d_r, d_c], -1)), d_recurrent.write(i, d_rec)

    start = (0, tf.zeros_like(d_outputs[0]), d_inputs, d_recurrent)
    _, _, d_inputs, d_recurrent = tf.while_loop(lambda j, *_: j < steps, body, start)
    return d_inputs.stack(), d_recurrent.stack()


def minimal_gradients(x_tm, m_tm, weights, outputs, kept, d_outputs):
    """One direction's gradients: (d inputs `[T, B, F]`, [d kernel, d
    recurrent kernel, d bias]); the incoming states are the outputs
    shifted one step (right padding, zero boundary state)."""
    incoming = tf.concat([tf.zeros_like(outputs[:1]), outputs[:-1]], 0)
    d_in, d_rec = minimal_bptt(kept, incoming, d_outputs, m_tm, weights[1])
    flat = lambda a: tf.reshape(a, [-1, a.shape[-1]])  # noqa: E731
    d_kernel = tf.matmul(flat(x_tm), flat(d_in), transpose_a=True)
    d_recurrent = tf.matmul(flat(incoming), flat(d_rec), transpose_a=True)
    d_bias = tf.stack([tf.reduce_sum(flat(d_in), 0), tf.reduce_sum(flat(d_rec), 0)])
    return tf.matmul(d_in, weights[0], transpose_b=True), [d_kernel, d_recurrent, d_bias]


def _time_major(x, mask, units):
    x_tm = swap(x)
    m_tm = tf.broadcast_to(tf.transpose(mask)[:, :, None], tf.concat([tf.shape(x_tm)[:2], [units]], 0))
    return x_tm, m_tm


def minimal_bigru(x, mask, forward_weights, backward_weights, keep: bool):
    """Outputs `[B, T, 2U]` (concat, zero where masked) and, with `keep`,
    `gradients(d_outputs)` -> [d inputs, then the forward direction's and
    the backward's (kernel, recurrent kernel, bias) gradients]; the output
    gradients at masked steps are ignored (those outputs are constant)."""
    units = forward_weights[1].shape[0]
    ahead_in = _time_major(x, mask, units)
    back_in = (tf.reverse(ahead_in[0], [0]), tf.reverse(ahead_in[1], [0]))
    y_f, kept_f = minimal_forward(*ahead_in, forward_weights, keep)
    y_b, kept_b = minimal_forward(*back_in, backward_weights, keep)
    outputs = swap(tf.concat([y_f, tf.reverse(y_b, [0])], -1))

    def gradients(d_outputs):
        d_tm = swap(d_outputs)
        d_f = tf.where(ahead_in[1], d_tm[..., :units], tf.zeros_like(y_f))
        d_b = tf.where(back_in[1], tf.reverse(d_tm[..., units:], [0]), tf.zeros_like(y_b))
        d_x_f, grads_f = minimal_gradients(*ahead_in, forward_weights, y_f, kept_f, d_f)
        d_x_b, grads_b = minimal_gradients(*back_in, backward_weights, y_b, kept_b, d_b)
        return [swap(d_x_f + tf.reverse(d_x_b, [0]))] + grads_f + grads_b

    return outputs, gradients if keep else None


def minimal_functions(forward_weights, backward_weights, features: int) -> Tuple[Callable, Callable]:
    """`infer(x, mask)` -> outputs `[B, T, 2U]` (concat), and `train(x,
    mask)` -> the gradients of sum(outputs**2) as kb lists its trainable
    weights, then the inputs'."""
    spec = [tf.TensorSpec([None, None, features]), tf.TensorSpec([None, None], tf.bool)]

    @tf.function(input_signature=spec, autograph=False)
    def infer(x, mask):
        return minimal_bigru(x, mask, forward_weights, backward_weights, False)[0]

    @tf.function(input_signature=spec, autograph=False)
    def train(x, mask):
        outputs, gradients = minimal_bigru(x, mask, forward_weights, backward_weights, True)
        d_x, *grads = gradients(2.0 * outputs)  # d sum(y**2) / dy
        return grads + [d_x]

    return infer, train


class MinimalBiGRU(keras.layers.Layer):
    """`minimal_bigru` as a Keras layer (concat merge, per-step outputs,
    kb's weight layout and initializers), for a whole model's floor
    (`bench_recurrence_share.py --floor`): exact only for right-padded
    masks and zero boundary states, which is all an example's padded
    batches need. Its gradient is the hand-written one
    (`tf.custom_gradient`); TensorFlow differentiates none of its loops.

    Args:
        units: Units per direction.
    """

    def __init__(self, units: int, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.supports_masking = True

    def build(self, input_shape):
        shapes = {"kernel": (input_shape[-1], 3 * self.units), "recurrent_kernel": (self.units, 3 * self.units),
                  "bias": (2, 3 * self.units)}
        initializers = {"kernel": "glorot_uniform", "recurrent_kernel": "orthogonal", "bias": "zeros"}
        self.directions = [
            [self.add_weight(shape=shapes[n], initializer=initializers[n], name=f"{side}_{n}") for n in shapes]
            for side in ("forward", "backward")
        ]

    def call(self, inputs, mask=None):
        if mask is None:
            mask = tf.ones(tf.shape(inputs)[:2], tf.bool)
        weights = [v.value for direction in self.directions for v in direction]

        @tf.custom_gradient
        def bigru(x, *weights):
            # stop_gradient: the tape must not record the loops; `gradients` is the way back.
            x, weights = tf.stop_gradient(x), [tf.stop_gradient(w) for w in weights]
            return minimal_bigru(x, mask, weights[:3], weights[3:], True)

        return bigru(inputs, *weights)

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (2 * self.units,)


def layer_functions(layer, features: int) -> Tuple[Callable, Callable]:
    """The same two functions around a Keras-API layer."""
    spec = [tf.TensorSpec([None, None, features]), tf.TensorSpec([None, None], tf.bool)]

    @tf.function(input_signature=spec)
    def infer(x, mask):
        return layer(x, mask=mask, training=False)

    @tf.function(input_signature=spec)
    def train(x, mask):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, mask=mask, training=True)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, layer.trainable_variables + [x])

    return infer, train


def peers(features: int, units: int) -> Dict[str, Tuple[Callable, Callable]]:
    """minimal (with kb's weights), kb, keras."""
    ours = kb.Bidirectional(kb.GRUCell(units), return_sequences=True)
    theirs = keras.layers.Bidirectional(keras.layers.GRU(units, return_sequences=True))
    for layer in (ours, theirs):
        layer.build((None, None, features))
    weights = [v.value for v in ours.trainable_variables]
    return {
        "minimal": minimal_functions(weights[:3], weights[3:], features),
        "kb": layer_functions(ours, features),
        "keras": layer_functions(theirs, features),
    }


def batches(batch: int, time_size: int, features: int, seed: int = 0) -> List[Tuple[tf.Tensor, tf.Tensor]]:
    """Three right-padded batches, `time_size` - 4, + 0, + 4 long (at least
    2), random lengths, the first row full."""
    rng = np.random.default_rng(seed)
    out = []
    for steps in (max(2, time_size - 4), time_size, time_size + 4):
        lengths = rng.integers(1, steps + 1, batch)
        lengths[0] = steps
        x = rng.normal(size=(batch, steps, features)).astype("float32")
        out.append((tf.constant(x), tf.constant(np.arange(steps)[None] < lengths[:, None])))
    return out


def largest_difference(functions, data) -> float:
    """The largest difference between the minimal GRU's and kb's outputs
    and gradients, relative to each tensor's largest magnitude."""
    worst = 0.0
    for mode in (0, 1):
        for x, mask in data:
            ref = tf.nest.flatten(functions["kb"][mode](x, mask))
            got = tf.nest.flatten(functions["minimal"][mode](x, mask))
            for a, b in zip(ref, got):
                a, b = np.asarray(a), np.asarray(b)
                worst = max(worst, float(np.abs(a - b).max() / (np.abs(a).max() + 1e-12)))
    return worst


def timed(functions, modes: Sequence[str], data, rounds: int) -> Dict[Tuple[str, str], float]:
    """Median seconds per batch of every (peer, mode), the peers called in turn."""
    samples = {(peer, mode): [] for peer in functions for mode in modes}
    for _ in range(rounds):
        for (peer, mode), times in samples.items():
            fn = functions[peer][0 if mode == "inference" else 1]
            start = time.perf_counter()
            for x, mask in data:
                tf.nest.map_structure(lambda t: t.numpy(), fn(x, mask))
            times.append((time.perf_counter() - start) / len(data))
    return {key: float(np.median(times)) for key, times in samples.items()}


def run_shape(name: str, rounds: int) -> List[str]:
    batch, time_size, features, units, modes = SHAPES[name]
    functions = peers(features, units)
    data = batches(batch, time_size, features)
    with kb.compilation(max_compiled_shapes=0):  # plain loops against plain loops
        difference = largest_difference(functions, data)
        if difference > 1e-4:
            raise SystemExit(f"{name}: the minimal GRU differs from kb's by {difference:.2e}")
        for fn in (f for pair in functions.values() for f in pair):
            for x, mask in data:
                fn(x, mask)  # trace every length once
        seconds = timed(functions, modes, data, rounds)
    lines = []
    for mode in modes:
        ms = {peer: 1e3 * seconds[(peer, mode)] for peer in functions}
        lines.append(
            f"{name:10s} {mode:9s} B{batch} T~{time_size} F{features} U{units}: minimal {ms['minimal']:6.2f} ms | "
            f"kb {ms['kb']:6.2f} ms | keras {ms['keras']:6.2f} ms | kb/minimal x{ms['kb'] / ms['minimal']:.2f} | "
            f"keras/kb x{ms['keras'] / ms['kb']:.2f} | keras/minimal x{ms['keras'] / ms['minimal']:.2f} "
            f"(outputs and gradients within {difference:.0e} of kb's)"
        )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES),
                        default=["classifier", "classifier_b64", "variable", "demo_b64", "demo_b1"])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    print("plain TensorFlow loops (kb never compiled), median ms per batch over three lengths; "
          "minimal: the hand-written BiGRU with the fewest operations (right padding only)")
    for name in args.shapes:
        for line in run_shape(name, args.rounds):
            print(line, flush=True)


if __name__ == "__main__":
    main()
