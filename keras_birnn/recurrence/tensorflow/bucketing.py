"""Shapes the loops run on: only the rows that have a valid step, and a few
sequence lengths for XLA to compile (time buckets) instead of every one.

Rows with no valid step (the padding words of a character encoder written
as a reshape to `[batch * words, chars]`, often more than half the rows)
change nothing but their own outputs, zeros, and final states, their
initial states. So masked loops of sequence-level encoders run on the
other rows only (`valid_rows`), and the results are put back in place
(`restore_rows`).

XLA compiles one program per input shape. A graph traced with an unknown
time size (`model.fit` on a `tf.data` pipeline of padded batches, each as
long as its longest row) meets a new length at almost every batch, and each
costs a compilation: a tagger-shaped model's first epoch spent most of its
time compiling (benchmarks/README.md, "Variable lengths"). So such loops run on inputs
padded at the end to the next bucket length, with the padded steps masked,
and their outputs are cut back to the real length. A zero-length sequence
is padded to the shortest bucket, so the loops always have a step and need
no `tf.cond` for the empty case (its gradient holds the loops again, in a
second `tf.cond`; benchmarks/README.md, "The first step").

This is exact, not an approximation: a masked step carries the state and
its gradient through unchanged, so padding at the end changes neither the
forward direction (it meets the padding after every real step) nor the
backward one (it meets it first and keeps its initial state across it).
Nor does it cost steps: the loops skip steps masked in every row
(`recurrence.tensorflow.timeloop.visited_span`), so the padding costs only the longer buffers.

Bucket lengths: 8, 12, 16, 24, 32, 48, 64, 96, ... (two per doubling), so a
buffer is at most half again as long as the sequence, and lengths up to 256
need at most 11 programs.
"""

from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from keras_birnn.config import LoopConfig

_LONGEST = 1 << 24


def bucket_lengths(config: LoopConfig = LoopConfig()) -> List[int]:
    """Every bucket length, in increasing order, up to 2**24 steps
    (`bucket_shortest`, `buckets_per_doubling`)."""
    lengths = [config.bucket_shortest]
    per_doubling = config.buckets_per_doubling
    while lengths[-1] < _LONGEST:
        start = lengths[-1]
        lengths.extend(start + max(start // per_doubling, 1) * k for k in range(1, per_doubling + 1))
    return lengths


def bucket_length(steps: tf.Tensor, config: LoopConfig = LoopConfig()) -> tf.Tensor:
    """The bucket a sequence of `steps` steps is padded to (0 stays 0;
    lengths beyond the table are left as they are)."""
    table = tf.constant(bucket_lengths(config), tf.int32)
    index = tf.searchsorted(table, tf.reshape(steps, [1]), side="left")[0]
    bucket = tf.gather(table, tf.minimum(index, tf.size(table) - 1))
    return tf.where((steps == 0) | (steps > table[-1]), steps, bucket)


def pad_time(
    directions: Sequence, mask: Optional[tf.Tensor], config: LoopConfig, at_least_one: bool = False
) -> Tuple[list, tf.Tensor, tf.Tensor]:
    """Pads every direction's inputs and the mask to the bucket length (a
    zero-length sequence to the shortest bucket), or with `at_least_one`
    only a zero-length sequence, to one masked step. Either way the loops
    see at least one step, so no `tf.cond` for an empty sequence is needed
    around them (exact: a masked step reads nothing).

    Returns the padded directions, the padded mask (built when there was
    none: the padded steps must be masked) and the real number of steps.
    """
    inputs = directions[0].inputs
    steps = tf.shape(inputs)[1]
    padding = tf.maximum(1 - steps, 0) if at_least_one else bucket_length(tf.maximum(steps, 1), config) - steps
    if mask is None:
        mask = tf.ones(tf.shape(inputs)[:2], tf.bool)
    mask = tf.pad(mask, [[0, 0], [0, padding]], constant_values=False)
    padded = {}  # the directions of one layer share their inputs: pad them once
    for d in directions:
        if id(d.inputs) not in padded:
            padded[id(d.inputs)] = tf.pad(d.inputs, [[0, 0], [0, padding], [0, 0]])
    return [d._replace(inputs=padded[id(d.inputs)]) for d in directions], mask, steps


def crop_time(results: Sequence, steps: tf.Tensor) -> list:
    """Cuts the per-step outputs back to the real number of steps.

    `tf.slice`, not `outputs[:, :steps]`: the strided slice's gradient is a
    general scatter, slower than `tf.slice`'s, a pad
    (benchmarks/README.md, "Design measurements")."""
    return [r if r.outputs is None else r._replace(outputs=_first_steps(r.outputs, steps)) for r in results]


def _first_steps(sequence: tf.Tensor, steps: tf.Tensor) -> tf.Tensor:
    return tf.slice(sequence, [0, 0, 0], tf.stack([-1, steps, -1]))


def valid_rows(directions: Sequence, mask: tf.Tensor) -> Tuple[list, tf.Tensor, tf.Tensor]:
    """The directions and mask cut down to the rows with a valid step, and
    those rows' indices. With no such row, row 0 stays (fully masked, it
    changes nothing), so the loops never run on an empty batch."""
    valid = tf.reduce_any(mask, axis=1)
    first = tf.equal(tf.range(tf.shape(mask)[0]), 0)
    valid = valid | (first & ~tf.reduce_any(valid))
    rows = tf.where(valid)[:, 0]
    part = tf.cast(valid, tf.int32)

    def take(tensor):
        # dynamic_partition, not gather: its gradient is a dense tensor (an
        # initial state's gradient must not come back as IndexedSlices).
        return None if tensor is None else tf.dynamic_partition(tensor, part, 2)[1]

    taken = {}  # the directions of one layer share their inputs: gather them once
    for d in directions:
        if id(d.inputs) not in taken:
            taken[id(d.inputs)] = take(d.inputs)
    compact = [
        d._replace(
            inputs=taken[id(d.inputs)],
            initial_states=[take(s) for s in d.initial_states],
            state_mask=take(d.state_mask),
        )
        for d in directions
    ]
    return compact, take(mask), rows


def restore_rows(results: Sequence, directions: Sequence, rows: tf.Tensor) -> list:
    """`valid_rows`' inverse: zeros for the left-out rows' outputs, their
    initial states for their final states."""
    restored = []
    for r, d in zip(results, directions):
        outputs = None
        if r.outputs is not None:
            shape = tf.concat([tf.shape(d.inputs, out_type=tf.int64)[:2], tf.shape(r.outputs, out_type=tf.int64)[2:]], 0)
            outputs = tf.scatter_nd(rows[:, None], r.outputs, shape)
            outputs.set_shape(d.inputs.shape[:2].concatenate(r.outputs.shape[2:]))
        finals = []
        for initial, final in zip(d.initial_states, r.final_states):
            restored_state = tf.tensor_scatter_nd_update(tf.cast(initial, final.dtype), rows[:, None], final)
            restored_state.set_shape(initial.shape)
            finals.append(restored_state)
        restored.append(r._replace(outputs=outputs, final_states=finals))
    return restored
