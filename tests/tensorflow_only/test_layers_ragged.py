"""`tf.RaggedTensor` batches: rows of their own lengths, no padding to choose.

A ragged `[batch, (time), features]` input is padded with zeros to its
longest row and its rows' lengths become the mask, so the numbers are the
NumPy oracle's on right-padded rows; outputs are dense and carry that mask
for the layers after them (Keras 3's own recurrent layers reject ragged
inputs). This is what `TextVectorization(ragged=True)` and `Embedding` on
ragged ids produce.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from birnn_cases import CELLS, F, T, make_case
from helpers import assert_all_close

LENGTHS = [6, 4, 0, 3]  # a full row, right padding, an empty row


def _ragged(x, lengths=LENGTHS):
    return tf.RaggedTensor.from_tensor(tf.constant(x), lengths=lengths)


def _mask(lengths=LENGTHS, steps=T):
    return np.arange(steps)[None, :] < np.array(lengths)[:, None]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_outputs_states_and_mask_match_the_oracle(cell_name, graph):
    case = make_case(cell_name, "projection_softmax", return_state=True)
    call = case.layer
    if graph:
        spec = tf.RaggedTensorSpec([None, None, F], tf.float32, ragged_rank=1)
        call = tf.function(case.layer, input_signature=[spec])
    outputs = call(_ragged(case.x))
    assert_all_close([np.asarray(o) for o in outputs], case.oracle(_mask()))
    if not graph:
        np.testing.assert_array_equal(np.asarray(outputs[0]._keras_mask), _mask())


def test_gradients_match_the_oracle():
    """Weights' and inputs' gradients (zero on the padding that the ragged
    batch never had) against the oracle on right-padded rows."""
    case = make_case("lstm", "concat")
    d_output = case.random_d_output()
    layer = case.layer
    variables = [getattr(r.cell, k) for r in (layer.forward_layer, layer.backward_layer)
                 for k in ("kernel", "recurrent_kernel", "bias")]
    x = tf.constant(case.x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        output = layer(tf.RaggedTensor.from_tensor(x, lengths=LENGTHS), training=True)
        loss = tf.reduce_sum(output * d_output)
    grads = tape.gradient(loss, variables + [x])
    keys = [(side, k) for side in ("fw", "bw") for k in ("kernel", "recurrent_kernel", "bias")]
    actual = {"fw": {}, "bw": {}, "x": np.asarray(grads[-1])}
    for (side, key), grad in zip(keys, grads):
        actual[side][key] = np.asarray(grad)
    case.assert_grads_match(actual, case.oracle_grads(d_output, _mask()))


def test_recurrent_and_stack_read_ragged_rows_as_right_padded_ones():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, T, F)).astype("float32")
    dense, mask = tf.constant(x * _mask()[..., None]), tf.constant(_mask())
    for layer in (kb.Recurrent(kb.LSTMCell(5), reverse=True, return_sequences=True),
                  kb.StackedBidirectional("gru", units=(4, 4), residual=True)):
        expected = layer(dense, mask=mask)  # the masked path, checked against the oracle elsewhere
        actual = layer(_ragged(x))
        assert_all_close(actual, expected)
        np.testing.assert_array_equal(np.asarray(layer.compute_mask(_ragged(x))), _mask())


def _sentence_classifier(seed):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(30, 6, mask_zero=True)(ids)
    sequence = kb.Bidirectional(kb.GRUCell(4), return_sequences=True)(embedded)
    sentence = keras.layers.Dense(1)(kb.MaskedMeanPooling()(sequence))
    return keras.Model(ids, sentence)


@pytest.mark.slow(reason="trains two models, ~10 s")
def test_ragged_ids_train_like_zero_padded_ids():
    """Embedding(mask_zero=True) on ragged ids hands a ragged mask on; one
    SGD step on ragged ids moves the weights exactly as on zero-padded ids."""
    ids = tf.ragged.constant([[3, 4], [5, 6, 7, 8, 9], [10], [11, 12, 13]])
    labels = np.array([[1.0], [0.0], [1.0], [0.0]], "float32")
    updated = []
    for batch in (ids, ids.to_tensor()):
        model = _sentence_classifier(seed=3)
        model.compile(keras.optimizers.SGD(0.5), "mse")
        model.fit(tf.data.Dataset.from_tensors((batch, labels)), epochs=1, verbose=0, shuffle=False)
        updated.append(model.get_weights())
    assert_all_close(*updated)
    assert not np.allclose(updated[0][0], _sentence_classifier(seed=3).get_weights()[0])


def test_pooling_heads_take_ragged_sequences():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(4, T, F)).astype("float32")
    dense, mask = tf.constant(x), tf.constant(_mask())
    for head in (kb.MaskedMeanPooling(), kb.MaskedMaxPooling(), kb.AttentionPooling(3)):
        assert_all_close(head(_ragged(x)), head(dense, mask=mask))
    expected = x[0, :6].mean(axis=0)
    np.testing.assert_allclose(np.asarray(kb.MaskedMeanPooling()(_ragged(x)))[0], expected, rtol=1e-6)


@pytest.mark.slow(reason="~5 s")
def test_inspect_reads_ragged_rows():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, T, F)).astype("float32")
    for layer, which in ((kb.Bidirectional(kb.GRUCell(4)), None), (kb.StackedBidirectional("lstm", units=(3, 3)), 1)):
        expected = kb.diagnostics.direction_states(layer, tf.constant(x), mask=_mask(), layer=which)
        actual = kb.diagnostics.direction_states(layer, _ragged(x), layer=which)
        assert_all_close(actual, expected)
