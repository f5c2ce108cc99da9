"""Shared pieces of the heads, builders and diagnostics tests: a padded batch
(right, left, holes, fully masked), bidirectional layers with known random
weights, and the NumPy oracle of what they compute.

Weights are drawn in float64, rounded to float32 and handed to both sides.
"""

import numpy as np

import keras_birnn as kb
import reference as ref
from helpers import MASK_5x6, f32

F = 3  # input features
U = 4  # units per direction

B, T = MASK_5x6.shape

CELLS = {
    "gru": lambda units: kb.GRUCell(units),
    "lstm": lambda units: kb.LSTMCell(units),
    "simple": lambda units: kb.SimpleRNNCell(units),
}


def padded_inputs(seed=0, mask=MASK_5x6, features=F, fill=0.0):
    """Random float32 inputs whose padded slots hold `fill`."""
    x = np.random.default_rng(seed).uniform(-1, 1, mask.shape + (features,)).astype("float32")
    x[~mask] = fill
    return x


def extra_padding(x, mask, extra=3, fill=0.0):
    """The same batch with `extra` more padded steps on the right."""
    pad_x = np.full((x.shape[0], extra, x.shape[2]), fill, x.dtype)
    return np.concatenate([x, pad_x], 1), np.concatenate([mask, np.zeros((mask.shape[0], extra), bool)], 1)


def bidirectional(cell="gru", units=U, features=F, seed=0, **kwargs):
    """A built kb.Bidirectional with random weights and the oracle's copy.

    Returns (layer, oracle) where oracle(x, mask, **overrides) runs
    `ref.bidirectional` with the same weights and configuration.
    """
    layer = kb.Bidirectional(CELLS[cell](units), **kwargs)
    layer.build((None, None, features))
    fw = f32(ref.random_params(cell, features, units, seed))
    bw = f32(ref.random_params(cell, features, units, seed + 1))
    weights = ref.keras_bidirectional_weights(fw, bw)
    projection = None
    if kwargs.get("merge_mode") == "projection":
        projection = f32(ref.random_projection(units, kwargs["projection_units"], seed + 2))
        weights += [projection["V_f"], projection["V_b"], projection["c"]]
    layer.set_weights(weights)

    def oracle(x, mask=None, **overrides):
        options = dict(
            merge_mode=kwargs.get("merge_mode", "concat"),
            projection=projection,
            projection_activation=kwargs.get("projection_activation"),
            return_sequences=kwargs.get("return_sequences", False),
        )
        options.update(overrides)
        return ref.bidirectional(cell, fw, bw, x, mask, **options)

    oracle.fw, oracle.bw, oracle.projection = fw, bw, projection
    return layer, oracle
