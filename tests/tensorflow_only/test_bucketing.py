"""Time buckets: loops traced with an unknown length run padded to a bucket
length, with the padding masked (and skipped), and must give exactly the
unpadded answer (NumPy oracle), outputs, final states and gradients alike."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
import reference as ref
from birnn_cases import B, F, make_case
from keras_birnn.recurrence.tensorflow import bucketing
from helpers import assert_all_close, run_python

# Below, on and just above bucket lengths (8, 12, 64 -> 96).
LENGTHS = (1, 7, 8, 9, 65)


def test_bucket_table():
    lengths = bucketing.bucket_lengths()
    assert lengths[:11] == [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    ratios = np.array(lengths[1:]) / np.array(lengths[:-1])
    # A buffer is at most half again as long as the sequence it holds.
    assert ((ratios > 1) & (ratios <= 1.5)).all()
    assert lengths[-1] == 1 << 24


@pytest.mark.parametrize(
    "steps, bucket",
    [(0, 0), (1, 8), (8, 8), (9, 12), (13, 16), (64, 64), (65, 96), (129, 192), (1000, 1024),
     ((1 << 24) + 1, (1 << 24) + 1)],
)
def test_bucket_length(steps, bucket):
    assert int(bucketing.bucket_length(tf.constant(steps))) == bucket


def _masks(steps):
    """Rows: full, right padding, left padding, and (for B = 4) fully masked."""
    mask = np.ones((B, steps), bool)
    mask[1, steps // 2 + 1 :] = False
    mask[2, : steps // 3] = False
    mask[3] = False
    return mask


def _unknown_length_call(layer, masked):
    spec = [tf.TensorSpec([None, None, F])] + ([tf.TensorSpec([None, None], tf.bool)] if masked else [])

    @tf.function(input_signature=spec)
    def call(x, mask=None):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outputs = layer(x, mask=mask, training=True)
            loss = tf.reduce_sum(tf.sin(3.0 * outputs[0])) + tf.reduce_sum(tf.add_n(outputs[1:]))
        grads = tape.gradient(loss, [x] + layer.trainable_variables)
        return outputs, grads

    return call


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("steps", (0,) + LENGTHS)  # 0: padded to masked steps, no zero-length cond
@pytest.mark.parametrize("cell_name", ["gru_reset_after", "lstm"])
def test_unknown_length_is_exact(cell_name, steps, masked):
    case = make_case(cell_name, "concat", seed=steps, return_state=True)
    case = dataclasses.replace(case, x=case.rng.normal(size=(B, steps, F)).astype(np.float32))
    mask = _masks(steps) if masked else None
    outputs, grads = _unknown_length_call(case.layer, masked)(*([case.x] + ([mask] if masked else [])))

    expected_outputs = case.oracle(mask)
    assert outputs[0].shape == expected_outputs[0].shape
    assert_all_close([np.asarray(o) for o in outputs], expected_outputs)

    # The oracle's BPTT of the same loss, direction by direction.
    units = case.layer.forward_layer.cell.units
    d_sequence = 3.0 * np.cos(3.0 * expected_outputs[0])
    d_final = [np.ones((B, units))] * case.n_states
    expected_x, expected_weights = 0.0, []
    directions = ((case.fw, False, d_sequence[..., :units]), (case.bw, True, d_sequence[..., units:]))
    for params, reverse, d_seq in directions:
        g = ref.direction_grads(case.cell, params, case.x, d_seq, mask, reverse, None, d_final, **case.cell_kwargs)
        expected_x = expected_x + g["x"]
        expected_weights += [g[k] for k in ("kernel", "recurrent_kernel", "bias")]
    assert_all_close([np.asarray(g) for g in grads], [expected_x] + expected_weights, atol=1e-4, rtol=1e-4)


def _pad_time_calls(monkeypatch):
    calls = []
    original = bucketing.pad_time

    def counting(*args, at_least_one=False):
        calls.append("one step" if at_least_one else "bucket")
        return original(*args, at_least_one=at_least_one)

    monkeypatch.setattr(bucketing, "pad_time", counting)
    return calls


@pytest.mark.slow(reason="traces each path, ~3 s")
@pytest.mark.parametrize(
    "how, bucketed",
    [("unknown_length", True), ("unknown_length_inference", False), ("static_length", False), ("eager", False),
     ("xla_disabled", False), ("jit_compile", False)],
)
def test_when_buckets_are_used(monkeypatch, how, bucketed):
    """Only loops that XLA would compile once per length: traced in a graph
    with an unknown time size, not inside an XLA-compiled caller, not as
    plain TensorFlow loops (among them inference traced for any length,
    which `recurrence.tensorflow.plan.counts_inference` leaves plain)."""
    calls = _pad_time_calls(monkeypatch)
    layer = kb.Bidirectional(kb.GRUCell(3), return_sequences=True)
    layer.build((None, None, F))
    x = np.random.default_rng(0).normal(size=(2, 5, F)).astype(np.float32)
    unknown = [tf.TensorSpec([None, None, F])]
    if how == "eager":
        layer(x)
    elif how == "static_length":
        tf.function(layer, input_signature=[tf.TensorSpec([None, 5, F])])(x)
    elif how == "jit_compile":
        tf.function(layer, input_signature=unknown, jit_compile=True)(x)
    elif how == "xla_disabled":
        with kb.recurrence.xla_disabled():
            tf.function(layer, input_signature=unknown)(x)
    elif how == "unknown_length_inference":
        tf.function(layer, input_signature=unknown)(x)
    else:
        tf.function(lambda x: layer(x, training=True), input_signature=unknown)(x)
    assert ("bucket" in calls) == bucketed


@pytest.mark.slow(reason="compiles one loop per bucket, ~16 s")
def test_one_compilation_per_bucket(tmp_path):
    """XLA compiles the loops once per bucket length: not again for another
    length in the same bucket, nor for another mask (a loop bound computed
    from the mask must not become a compile-time constant, which would make
    XLA compile once per mask). Counted from XLA's own dump of the modules
    it compiles, in a fresh process."""
    code = f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_dump_to={tmp_path}"
        import numpy as np, tensorflow as tf, keras_birnn as kb
        layer = kb.Bidirectional(kb.LSTMCell(4), return_sequences=True)
        layer.build((None, None, 3))
        spec = [tf.TensorSpec([None, None, 3]), tf.TensorSpec([None, None], tf.bool)]

        @tf.function(input_signature=spec)
        def train(x, mask):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(x, mask=mask, training=True))
            return tape.gradient(loss, layer.trainable_variables)

        def compiled():
            return sum(name.endswith("before_optimizations.txt") for name in os.listdir("{tmp_path}"))

        counts = []
        with kb.compilation(compile_after=1):  # every shape compiled when first met
            for steps, valid in ((9, 9), (11, 5), (12, 12), (10, 3), (13, 13)):  # buckets 12, 12, 12, 12, 16
                x = np.ones((2, steps, 3), np.float32)
                mask = np.arange(steps)[None, :] < np.array([[valid], [max(valid - 2, 1)]])
                train(x, mask)
                counts.append(compiled())
        print(counts)
    """
    counts = eval(run_python(code).strip().splitlines()[-1])
    assert counts[0] > 0
    assert counts[1] == counts[2] == counts[3] == counts[0], counts
    assert counts[4] > counts[3], counts
