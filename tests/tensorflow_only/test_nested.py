"""kb.NestedEncoder: an encoder over every valid item of a nested sequence,
against the NumPy oracle item by item and against the reshape route."""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from birnn_cases import F, make_case
from helpers import assert_all_close, keras_round_trip

ITEMS, ELEMENTS = 3, 5
UNKNOWN = [tf.TensorSpec([None, None, None, F]), tf.TensorSpec([None, None, None], tf.bool)]


def _nested_mask():
    """Batch 2 x 3 items: full, right padding, left padding with a hole,
    an empty item between valid ones, and padding items at the end."""
    mask = np.zeros((2, ITEMS, ELEMENTS), bool)
    mask[0, 0] = True
    mask[0, 1, :3] = True
    mask[0, 2, [1, 2, 4]] = True
    mask[1, 0, 2:] = True  # item 1 of row 1 is empty, item 2 valid
    mask[1, 2, :1] = True
    return mask


def _case(cell_name, merge_name="concat"):
    case = make_case(cell_name, merge_name, seed=11, return_sequences=False)
    x = case.rng.normal(size=(2, ITEMS, ELEMENTS, F)).astype(np.float32)
    return case, x


def _oracle(case, x, mask):
    """The oracle over every item of `[batch, items, elements, F]`."""
    flat_x, flat_mask = x.reshape(-1, x.shape[2], F), mask.reshape(-1, x.shape[2])
    return case.oracle(flat_mask, x=flat_x).reshape(x.shape[0], x.shape[1], -1)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("cell_name, merge_name", [("gru_reset_after", "concat"), ("lstm", "sum"),
                                                   ("simple_tanh", "projection_softmax")])
def test_outputs_match_oracle(cell_name, merge_name, graph):
    case, x = _case(cell_name, merge_name)
    nested = kb.NestedEncoder(case.layer)
    mask = _nested_mask()
    call = tf.function(lambda x, m: nested(x, mask=m), input_signature=UNKNOWN) if graph else nested.__call__
    outputs = call(x, mask=mask) if not graph else call(x, mask)
    expected = _oracle(case, x, mask)
    assert_all_close(outputs.numpy(), expected)
    assert not outputs.numpy()[1, 1].any()  # the empty item
    np.testing.assert_array_equal(nested.compute_mask(x, mask).numpy(), mask.any(axis=-1))


@pytest.mark.slow(reason="gradients on both routes, ~6 s")
@pytest.mark.parametrize("training", [True, None])
def test_gradients_equal_the_reshape_route(training):
    """Weights' and inputs' gradients against the encoder called on the
    reshaped batch (every item, padding items included), unknown sizes."""
    case, x = _case("gru_reset_before")
    nested = kb.NestedEncoder(case.layer)
    mask = _nested_mask()
    d_out = case.rng.normal(size=(2, ITEMS, 2 * case.layer.forward_layer.cell.units)).astype(np.float32)

    def reshaped(x, m):
        flat = case.layer(tf.reshape(x, [-1, ELEMENTS, F]), mask=tf.reshape(m, [-1, ELEMENTS]), training=training)
        return tf.reshape(flat, tf.shape(d_out))

    @tf.function(input_signature=UNKNOWN)
    def grads(x, m):
        results = []
        for route in (lambda x, m: nested(x, mask=m, training=training), reshaped):
            with tf.GradientTape() as tape:
                tape.watch(x)
                total = tf.reduce_sum(route(x, m) * d_out)
            results.append(tape.gradient(total, [x] + case.layer.trainable_variables))
        return results

    ours, theirs = grads(x, mask)
    assert_all_close([g.numpy() for g in ours], [g.numpy() for g in theirs])
    assert not ours[0].numpy()[~mask].any()  # nothing flows to padding elements


def _extents_mask():
    """Items of every extent from 0 to ELEMENTS, right padded, with holes
    and left padded, so that each length group of 1-4 gets items."""
    mask = np.zeros((2, ITEMS, ELEMENTS), bool)
    mask[0, 0, :1] = True                  # extent 1
    mask[0, 1, [0, 2]] = True              # extent 3, a hole
    mask[0, 2, :2] = True                  # extent 2
    mask[1, 0, [1, 3]] = True              # extent 4, left padding and a hole
    mask[1, 2, 4] = True                   # extent 5, one valid element
    return mask                            # row 1, item 1: no valid element


# Below the inference threshold every `length_groups` runs the same one
# call: that mode is checked once.
GROUPINGS = [(g, mode) for g in (1, 2, 3, 4, 7) for mode in ("training", "inference, grouped")]


@pytest.mark.parametrize("length_groups, mode", GROUPINGS + [(3, "inference, one call")])
def test_every_length_grouping_matches_oracle(length_groups, mode):
    """The groups only cut elements masked in every item of a group: the
    items' outputs are the oracle's, and the same for every grouping, with
    unknown sizes; the element extent 5 puts the items of extent 1-5 into
    different groups for 2-4 groups. Inference groups from a count of
    valid items on (a `tf.cond`): here set to 0 (always) or out of reach."""
    with kb.configure_loops(grouped_from_items=10**9 if mode == "inference, one call" else 0):
        _grouping_matches_oracle(length_groups, mode)


def _grouping_matches_oracle(length_groups, mode):
    case, x = _case("lstm", "concat")
    nested = kb.NestedEncoder(case.layer, length_groups=length_groups)
    training = True if mode == "training" else None  # no dropout in the case: the same numbers
    call = tf.function(lambda x, m: nested(x, mask=m, training=training), input_signature=UNKNOWN)
    mask = _extents_mask()
    outputs = call(x, mask)
    assert_all_close(outputs.numpy(), _oracle(case, x, mask))
    assert not outputs.numpy()[1, 1].any()
    short = call(x[:, :, :2], mask[:, :, :2])
    assert_all_close(short.numpy(), _oracle(case, x[:, :, :2], mask[:, :, :2]))


@pytest.mark.parametrize("training, threshold, taped, groups", [
    (None, 0, False, 3), (None, 10**9, False, 1), (True, 10**9, False, 3), (None, 10**9, True, 3),
], ids=["inference, many items", "inference, few items", "training", "inference under a tape"])
def test_when_the_groups_are_used(training, threshold, taped, groups, monkeypatch):
    """Eagerly a `tf.cond` runs one branch: the groups are used for
    training, under a tape, and at inference from the threshold on."""
    used = []
    encode = kb.NestedEncoder._encode_by_extent
    monkeypatch.setattr(kb.NestedEncoder, "_encode_by_extent",
                        lambda self, *a: used.append(a[-1]) or encode(self, *a))
    case, x = _case("gru_reset_after")
    nested = kb.NestedEncoder(case.layer)
    with kb.configure_loops(grouped_from_items=threshold):
        with tf.GradientTape() if taped else contextlib.nullcontext():
            nested(x, mask=_extents_mask(), training=training)
    assert used == [groups]


def test_a_tape_on_the_weights_alone_gets_their_gradients():
    """Inference (`training=None`) under a tape that watches only the
    weights (a frozen embedding before the encoder): the weights' gradients
    are the reshape route's, with unknown sizes."""
    case, x = _case("lstm")
    nested = kb.NestedEncoder(case.layer)
    mask = _extents_mask()

    def reshaped(x, m):
        flat = case.layer(tf.reshape(x, [-1, ELEMENTS, F]), mask=tf.reshape(m, [-1, ELEMENTS]))
        return tf.reshape(flat, [2, ITEMS, -1])

    @tf.function(input_signature=UNKNOWN)
    def grads(x, m):
        results = []
        for route in (lambda x, m: nested(x, mask=m), reshaped):
            with tf.GradientTape() as tape:
                total = tf.reduce_sum(route(x, m) ** 2)
            results.append(tape.gradient(total, case.layer.trainable_variables))
        return results

    ours, theirs = grads(x, mask)
    assert_all_close([g.numpy() for g in ours], [g.numpy() for g in theirs])


def test_length_groups_round_trip():
    layer = kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(3)), length_groups=np.int64(2))
    config = layer.get_config()
    assert config["length_groups"] == 2 and type(config["length_groups"]) is int
    assert kb.NestedEncoder.from_config(config).length_groups == 2
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert restored.length_groups == 2


def test_without_mask_every_item_is_encoded():
    case, x = _case("lstm")
    outputs = kb.NestedEncoder(case.layer)(x)
    assert_all_close(outputs.numpy(), _oracle(case, x, np.ones((2, ITEMS, ELEMENTS), bool)))


@pytest.mark.slow(reason="trains and saves a model, ~12 s")
def test_character_model_trains_and_round_trips(tmp_path):
    chars = keras.Input((None, None), dtype="int32")
    x = keras.layers.Embedding(20, 4, mask_zero=True)(chars)
    words = kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(3)))(x)
    tags = kb.Bidirectional(kb.LSTMCell(3), merge_mode="projection", projection_units=2,
                            projection_activation="softmax", return_sequences=True)(words)
    model = keras.Model(chars, tags)
    model.compile("adam", "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 20, size=(8, 4, 6))
    ids[:, 3] = 0  # a padding word in every sentence
    ids[:, :, 4:] = 0
    labels = rng.integers(0, 2, size=(8, 4))
    losses = model.fit(ids, labels, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    keras_round_trip(model, str(tmp_path / "nested.keras"), ids)


def test_bad_arguments():
    with pytest.raises(TypeError, match="encoder"):
        kb.NestedEncoder(keras.layers.Bidirectional(keras.layers.GRU(3)))
    with pytest.raises(ValueError, match="return_sequences=True"):
        kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(3), return_sequences=True))
    with pytest.raises(ValueError, match="merge_mode=None"):
        kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(3), merge_mode=None))
    for groups, error in ((0, ValueError), (-1, ValueError), (17, ValueError), (2.0, TypeError), (True, TypeError),
                          ("3", TypeError)):
        with pytest.raises(error, match=f"length_groups.*received {groups!r}"):
            kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(3)), length_groups=groups)
    with pytest.raises(ValueError, match="rank 4"):
        kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(3)))(np.ones((2, 3, F), np.float32))
