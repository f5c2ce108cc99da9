"""Seed 000's programs 092-094 and parameter table, through the public API.

Golden numbers: the figures of seed 000 (3 decimals); for figure 17-4 the
program 094 compiled with gcc -O0 and its printf precision raised to %.6f.
"""

import numpy as np
import pytest

import keras_birnn as kb
from helpers import eager_and_graph

SEQ_092 = np.array([1.0, 0.0, -1.0, 0.5, 2.0], "float32")
FIG_17_2 = np.array(  # t: fwd[0], fwd[1], bwd[0], bwd[1]
    [
        [+0.462, -0.291, -0.165, +0.519],
        [+0.154, -0.161, +0.069, -0.130],
        [-0.425, +0.217, +0.069, -0.482],
        [+0.101, -0.021, -0.289, +0.442],
        [+0.777, -0.550, -0.380, +0.834],
    ]
)


def _set_c_weights(recurrent, w_x, w_h):
    # The C code computes z_i = b_i + w_x[i] x + sum_j w_h[i][j] h_j, so
    # Keras's row-vector layout stores the transposes.
    cell = recurrent.cell
    cell.kernel.assign(np.array([w_x], "float32"))
    cell.recurrent_kernel.assign(np.array(w_h, "float32").T)
    cell.bias.assign(np.zeros(len(w_x), "float32"))


def _program_092(merge_mode):
    bi = kb.Bidirectional(kb.SimpleRNNCell(2), merge_mode=merge_mode, return_sequences=True)
    bi.build((None, None, 1))
    _set_c_weights(bi.forward_layer, [0.5, -0.3], [[0.4, 0.1], [-0.1, 0.4]])
    _set_c_weights(bi.backward_layer, [-0.2, 0.6], [[0.3, -0.1], [0.2, 0.3]])
    return bi


@pytest.mark.parametrize("graph", [False, True])
def test_figure_17_2_hidden_states(graph):
    bi = _program_092(None)
    eager, in_graph = eager_and_graph(bi, SEQ_092[None, :, None])
    fwd, bwd = in_graph if graph else eager
    table = np.concatenate([fwd[0], bwd[0]], axis=-1)
    np.testing.assert_allclose(np.round(table, 3), FIG_17_2, atol=1e-9)


def test_figure_17_3_combined_is_concatenation():
    combined = _program_092("concat")(SEQ_092[None, :, None]).numpy()[0]
    np.testing.assert_allclose(np.round(combined, 3), FIG_17_2, atol=1e-9)


FIG_17_4 = np.array(
    [
        [0.211285, 0.186734, 0.211074, 0.183138, 0.207770],
        [0.175516, 0.228384, 0.180387, 0.233964, 0.181749],
        [0.226190, 0.166681, 0.222158, 0.138130, 0.246841],
        [0.202592, 0.195618, 0.211056, 0.191426, 0.199308],
        [0.227637, 0.166512, 0.229416, 0.150187, 0.226248],
        [0.194430, 0.203852, 0.202461, 0.218822, 0.180436],
    ]
)
TAGS = ["DET", "ADJ", "NOUN", "VERB", "PREP"]
W_OUT = np.array(  # one row per tag, columns fwd[0..2] then bwd[0..2]
    [
        [1.0, 0.2, -0.3, 0.5, -0.1, 0.4],
        [-0.5, 0.8, 0.1, -0.2, 0.6, -0.3],
        [0.2, -0.4, 0.7, 0.1, -0.3, 0.5],
        [-0.3, 0.5, -0.2, 0.7, 0.2, -0.4],
        [0.4, 0.1, -0.6, -0.3, 0.5, 0.2],
    ],
    "float32",
)


def _program_094():
    bi = kb.Bidirectional(
        kb.SimpleRNNCell(3),
        merge_mode="projection",
        projection_units=5,
        projection_activation="softmax",
        return_sequences=True,
    )
    bi.build((None, None, 1))
    _set_c_weights(bi.forward_layer, [0.5, -0.3, 0.2], [[0.3, 0.1, 0], [0, 0.3, 0.1], [0.1, 0, 0.3]])
    _set_c_weights(bi.backward_layer, [-0.2, 0.4, 0.1], [[0.3, 0, -0.1], [0.1, 0.3, 0], [0, 0.1, 0.3]])
    bi.projection.forward_kernel.assign(W_OUT[:, :3].T)
    bi.projection.backward_kernel.assign(W_OUT[:, 3:].T)
    return bi


@pytest.mark.parametrize("graph", [False, True])
def test_figure_17_4_tag_probabilities(graph):
    seq = np.array([0.2, -0.5, 0.8, -0.1, 0.6, -0.3], "float32")[None, :, None]
    eager, in_graph = eager_and_graph(_program_094(), seq)
    probs = (in_graph if graph else eager)[0]
    np.testing.assert_allclose(probs, FIG_17_4, atol=5e-6)
    predicted = [TAGS[k] for k in probs.argmax(-1)]
    assert predicted == ["DET", "VERB", "PREP", "NOUN", "NOUN", "VERB"]


def test_parameter_table():
    uni = kb.Recurrent(kb.GRUCell(64, reset_after=False))
    uni.build((None, None, 32))
    bi = kb.Bidirectional(kb.GRUCell(64, reset_after=False))
    bi.build((None, None, 32))
    # 3 gates x (input->hidden 32*64 + hidden->hidden 64*64 + bias 64)
    assert uni.count_params() == 3 * (32 * 64 + 64 * 64 + 64) == 18_624
    assert bi.count_params() == 37_248
    assert uni.compute_output_shape((None, None, 32))[-1] == 64
    assert bi.compute_output_shape((None, None, 32))[-1] == 128
