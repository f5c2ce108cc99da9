"""The copies a layer makes of its cell: a `Bidirectional`'s backward
direction and the layers of `stacked_bidirectional`.

Each keeps the cell's objects (unregistered ones included, which Keras's
copy through a saved config cannot rebuild), starts from its own weights
and draws its own dropout masks.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb


def _all_cells(layer):
    bidirectionals = layer.bidirectionals if hasattr(layer, "bidirectionals") else [layer]
    return [d.cell for bi in bidirectionals for d in (bi.forward_layer, bi.backward_layer)]


def _assert_all_differ(arrays):
    """No two of `arrays` of the same shape are (nearly) equal."""
    for a, first in enumerate(arrays):
        for b in range(a + 1, len(arrays)):
            if first.shape == arrays[b].shape:
                assert not np.allclose(first, arrays[b]), (a, b)


def _assert_same(again, first):
    """Per cell, the same arrays, bit for bit."""
    for arrays_again, arrays_first in zip(again, first, strict=True):
        for x, y in zip(arrays_again, arrays_first, strict=True):
            np.testing.assert_array_equal(x, y)


class _Quarter(keras.initializers.Initializer):
    """Unregistered: Keras cannot rebuild a cell holding it from a config."""

    def __call__(self, shape, dtype=None):
        return keras.ops.full(shape, 0.25, dtype=dtype)


class _Cube(keras.regularizers.Regularizer):
    """Unregistered and without `get_config`: it cannot even be saved."""

    def __call__(self, w):
        return 0.01 * keras.ops.sum(keras.ops.abs(w) ** 3)


def _quarter_function(shape, dtype=None):
    """An initializer that is a plain function."""
    return keras.ops.full(shape, 0.25, dtype=dtype)


@pytest.mark.parametrize("initializer", [_Quarter, lambda: _quarter_function], ids=["object", "function"])
@pytest.mark.parametrize("builder", ["bidirectional", "stack"])
def test_copies_keep_objects_keras_cannot_rebuild(builder, initializer):
    """keras.layers.Bidirectional fails to build with any of these objects
    in its GRU; every copy of ours (backward direction, stacked layers)
    starts from the initializer's values and adds the regularizer's
    penalty."""
    cell = kb.GRUCell(4, kernel_initializer=initializer(), kernel_regularizer=_Cube())
    layer = kb.Bidirectional(cell) if builder == "bidirectional" else kb.stacked_bidirectional(cell, (4, 3))
    layer.build((None, None, 3))
    kernels = [np.asarray(c.kernel) for c in _all_cells(layer)]
    for kernel in kernels:
        np.testing.assert_array_equal(kernel, 0.25)
    penalty = sum(0.01 * np.sum(np.abs(kernel.astype(np.float64)) ** 3) for kernel in kernels)
    np.testing.assert_allclose(float(sum(layer.losses)), penalty, rtol=1e-6)


def _masks(cells):
    return [[np.asarray(m) for m in cell.dropout_masks(8, tf.float32, training=True)] for cell in cells]


def _seeded_cell():
    return kb.GRUCell(4, dropout=0.5, recurrent_dropout=0.5, seed=3)


@pytest.mark.parametrize("builder", ["bidirectional", "stack"])
def test_copies_draw_their_own_dropout_masks(builder):
    """With a seed, every copy's input and state masks differ from the
    others' (they were all the same: both directions dropped the same
    input features), the first cell's are those of its seed, and building
    again draws the same masks."""

    def build():
        layer = kb.Bidirectional(_seeded_cell()) if builder == "bidirectional" else kb.stacked_bidirectional(
            _seeded_cell(), (4, 4))
        layer.build((None, None, 4))
        return _masks(_all_cells(layer))

    masks = build()
    lone = _seeded_cell()
    lone.build((None, 4))
    np.testing.assert_array_equal(masks[0][0], _masks([lone])[0][0])
    for kind in (0, 1):
        drawn = [m[kind] for m in masks]
        assert all(0.0 < np.mean(m == 0) < 1.0 for m in drawn)
        _assert_all_differ(drawn)
    _assert_same(build(), masks)


@pytest.mark.parametrize("builder", ["bidirectional", "stack"])
def test_copies_of_seeded_initializers_start_from_their_own_weights(builder):
    """A seeded initializer draws the same values every time: remade with
    the same seed, both directions (and equal-width stacked layers) started
    from identical kernels. Each copy's kernel now differs from the others',
    the first is the seeded initializer's own draw, and a rebuild repeats
    them."""

    def cell():
        return kb.GRUCell(4, kernel_initializer=keras.initializers.GlorotUniform(seed=7),
                          recurrent_initializer=keras.initializers.Orthogonal(seed=8))

    def build():
        layer = kb.Bidirectional(cell()) if builder == "bidirectional" else kb.stacked_bidirectional(
            cell(), (4, 4, 4))
        layer.build((None, None, 8))
        return [(np.asarray(c.kernel), np.asarray(c.recurrent_kernel)) for c in _all_cells(layer)]

    kernels = build()
    np.testing.assert_array_equal(kernels[0][0], np.asarray(keras.initializers.GlorotUniform(seed=7)((8, 12))))
    for kind in (0, 1):
        _assert_all_differ([k[kind] for k in kernels])
    _assert_same(build(), kernels)


@pytest.mark.parametrize("make", [
    lambda: kb.SimpleRNNCell(4, seed=3),
    lambda: kb.GRUCell(4, reset_after=False, dropout=0.5, seed=3),
    lambda: kb.LSTMCell(4, unit_forget_bias=False, seed=3, kernel_regularizer="l2"),
], ids=["simple_rnn", "gru", "lstm"])
def test_clone_config_is_get_config_with_objects(make):
    """`clone_config` has `get_config`'s keys in its order and its values,
    except that the objects are the cell's own (initializers remade) and,
    with a salt, the seed is derived; making it changes no later
    `get_config`."""
    cell = make()
    saved = cell.get_config()
    for salt in (0, 5):
        copy = cell.clone_config(salt)
        assert list(copy) == list(saved)
        for name, value in copy.items():
            if name == "seed":
                assert value == kb.cells.base.derived_seed(3, salt) if salt else value == 3
            elif name in cell.object_arguments and name.endswith("_initializer"):
                assert type(value) is type(getattr(cell, name)) and value is not getattr(cell, name)
            elif name in cell.object_arguments:
                assert value is getattr(cell, name)
            else:
                assert value == saved[name], name
        assert cell.get_config() == saved
    assert type(cell).from_config(cell.clone_config(0)).get_config() == saved


def test_clone_config_needs_no_saved_form():
    """An object Keras cannot save fails `get_config`, as Keras's own layers
    do, but not a copy in this process."""
    cell = kb.GRUCell(4, kernel_regularizer=_Cube())
    with pytest.raises(NotImplementedError):
        cell.get_config()
    assert cell.clone_config(1)["kernel_regularizer"] is cell.kernel_regularizer
