"""kb.Recurrent: one direction of a recurrence, against the NumPy oracle.

(Recurrent is also exercised wherever it is a direction of kb.Bidirectional,
and one direction alone in test_bidirectional.py's inference loops,
test_layers_keras_equivalence.py and test_layers_contract.py.)
"""

import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from birnn_cases import CELLS, B, F, T, U
from helpers import PADDING_PATTERNS_4x6 as PATTERNS, cell_params, to_numpy


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_recurrent_rows_within_their_own_length(cell_name, reverse):
    """kb.Recurrent: outputs aligned with input positions; reverse=True
    reads each row right to left within its own valid steps (unlike Keras's
    go_backwards), like the oracle run on the row's valid slice."""
    cell, cell_kwargs, factory = CELLS[cell_name]
    layer = kb.Recurrent(factory(U), reverse=reverse, return_sequences=True, return_state=True)
    layer.build((None, None, F))
    params = cell_params(layer.cell)
    x = np.random.default_rng(13).normal(size=(B, T, F)).astype(np.float32)
    for name, mask in PATTERNS.items():
        y, *states = to_numpy(layer(x, mask=mask))
        for b in range(B):
            valid = mask[b]
            if not valid.any():
                assert np.all(y[b] == 0.0)
                continue
            alone, final = ref.run_direction(cell, params, x[b:b + 1, valid], reverse=reverse, **cell_kwargs)
            np.testing.assert_allclose(y[b, valid], alone[0], atol=1e-5, rtol=1e-5, err_msg=name)
            assert np.all(y[b, ~valid] == 0.0)
            for s, s_ref in zip(states, final):
                np.testing.assert_allclose(s[b], s_ref[0], atol=1e-5, rtol=1e-5, err_msg=name)
    # Aligned, not flipped: with right padding, the reverse output at the
    # first position has read the whole row, and equals the final state.
    if reverse:
        y, *states = to_numpy(layer(x, mask=PATTERNS["right"]))
        np.testing.assert_allclose(y[:, 0], states[0], atol=1e-6)
    sentence = kb.Recurrent(layer.cell, reverse=reverse)
    full, final = ref.run_direction(cell, params, x, reverse=reverse, **cell_kwargs)
    np.testing.assert_allclose(sentence(x), final[0], atol=1e-5, rtol=1e-5)
