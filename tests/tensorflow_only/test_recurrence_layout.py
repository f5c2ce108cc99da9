"""`keras_birnn/recurrence/tensorflow/layout.py`: the swap of batch and time that the
loops use, against `tf.transpose` as the oracle, bit for bit."""

import numpy as np
import pytest
import tensorflow as tf

from keras_birnn.recurrence.tensorflow.layout import swap_batch_and_time

# float32 and bfloat16 move as float64s where the width allows it (even,
# multiples of four); odd widths, float16 and float64 take tf.transpose.
CASES = [(tf.float32, 6), (tf.float32, 5), (tf.float32, 1), (tf.bfloat16, 8), (tf.bfloat16, 6),
         (tf.float16, 4), (tf.float64, 3)]


def _bits(x: tf.Tensor) -> np.ndarray:
    return tf.bitcast(x, {2: tf.int16, 4: tf.int32, 8: tf.int64}[x.dtype.size]).numpy()


@pytest.mark.parametrize("dtype, width", CASES, ids=[f"{d.name}-{w}" for d, w in CASES])
def test_swap_is_the_transpose_bit_for_bit_with_unknown_sizes(dtype, width):
    rng = np.random.default_rng(0)
    swap = tf.function(swap_batch_and_time, input_signature=[tf.TensorSpec([None, None, width], dtype)])
    for batch, time in [(3, 7), (1, 1), (0, 4)]:
        x = tf.cast(rng.normal(size=(batch, time, width)) * 1e3, dtype)
        got = swap(x)
        assert got.shape == (time, batch, width)
        np.testing.assert_array_equal(_bits(got), _bits(tf.transpose(x, [1, 0, 2])))
    assert swap.get_concrete_function().structured_outputs.shape.as_list() == [None, None, width]


def test_swap_under_autodiff_is_a_transpose_with_its_gradient():
    """The loops TensorFlow differentiates swap with `tf.transpose`: a tape
    gives the transpose's gradient there; through the bitcast form TensorFlow
    has no gradient to give."""
    x = tf.constant(np.arange(24, dtype="float32").reshape(2, 3, 4))
    weights = tf.constant(np.arange(24, dtype="float32").reshape(3, 2, 4))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(swap_batch_and_time(x, bitcast=False) * weights)
    np.testing.assert_array_equal(tape.gradient(loss, x), tf.transpose(weights, [1, 0, 2]))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(swap_batch_and_time(x) * weights)
    with pytest.raises(LookupError, match="Bitcast"):  # why the switch exists
        tape.gradient(loss, x)
