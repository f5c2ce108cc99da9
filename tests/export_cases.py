"""Models and checks shared by the export-target tests (ONNX, LiteRT): every
cell, every merge mode, the boundary states, the pooling heads and the
stacks, with weights drawn away from their initial zeros, and the check
that a converted model's outputs equal Keras's at every valid position."""

import keras
import numpy as np

import keras_birnn as kb

F, U = 3, 4  # input features, units per direction

CELLS = {
    "simple": lambda: kb.SimpleRNNCell(U),
    "gru_reset_after": lambda: kb.GRUCell(U, reset_after=True),
    "gru_reset_before": lambda: kb.GRUCell(U, reset_after=False),
    "lstm": lambda: kb.LSTMCell(U),
}


def randomize(model, seed=0):
    """Weights (biases and learned boundary states included) away from
    their initial zeros, so that each of them shows in the outputs."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        scale = 0.5 if len(w.shape) < 2 else 1.0 / np.sqrt(w.shape[0])
        w.assign((rng.normal(size=w.shape) * scale).astype(w.dtype))
    return model


def merge_modes(inputs, cell="gru_reset_after") -> list:
    """One layer per merge mode (None gives the [forward, backward] pair)."""
    outputs = []
    for merge in ["concat", "sum", "mul", "ave", None, "projection"]:
        layer = kb.Bidirectional(
            CELLS[cell](), merge_mode=merge, return_sequences=True, projection_units=2 if merge == "projection" else None
        )
        y = layer(inputs)
        outputs += y if merge is None else [y]
    return outputs


def boundary_states(inputs) -> list:
    """Zeros, constant and learned boundary states; sequence-level outputs
    (an empty row among them); return_state."""
    outputs = []
    for state in ["zeros", 0.5, "learned"]:
        outputs.append(kb.Bidirectional(kb.GRUCell(U), return_sequences=True, initial_state=state)(inputs))
        outputs.append(kb.Bidirectional(kb.LSTMCell(U), initial_state=state)(inputs))
    return outputs + kb.Bidirectional(kb.SimpleRNNCell(U), return_state=True, initial_state="learned")(inputs)


def heads_and_stacks(inputs) -> list:
    seq = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(inputs)
    pair = kb.Bidirectional(kb.LSTMCell(U), merge_mode=None, return_sequences=True)(inputs)
    return [
        kb.MaskedMeanPooling()(seq),
        kb.MaskedMaxPooling()(seq),
        kb.AttentionPooling(3)(seq),
        kb.FinalStatePooling()(pair),
        kb.StackedBidirectional("gru", units=(U, U), residual=True, layer_norm=True)(inputs),
        kb.StackedBidirectional("lstm", units=(U, U), return_sequences=False)(inputs),
    ]


def assert_outputs_match(got, expected, mask, label=""):
    """`got` (a converted model's outputs, in order) equal Keras's `expected`
    to 1e-5: per-position outputs at the valid positions of `mask`, the
    others whole."""
    expected = [np.asarray(e) for e in keras.tree.flatten(expected)]
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, (i, g.shape, e.shape)
        if e.ndim == 3 and e.shape[1] == mask.shape[1]:
            g, e = g[mask], e[mask]
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5, err_msg=f"output {i}, {label}")
