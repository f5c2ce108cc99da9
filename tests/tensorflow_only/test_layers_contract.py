"""Every public layer keeps the same contract (`layer_contract.py`):
config and serialization round trips with identical outputs, symbolic
shapes and dtypes equal to the eager ones, the promised mask carried,
the same numbers traced for unknown batch and time sizes, through a
`.keras` file, and (to float16 rounding) under `mixed_float16`."""

import keras
import numpy as np
import pytest

import keras_birnn as kb
from layer_contract import check_layer_contract

B, T, F, U = 2, 5, 3, 4
RNG = np.random.default_rng(0)
X = RNG.normal(size=(B, T, F)).astype("float32")
MASK = np.arange(T)[None] < np.array([[T], [3]])
WORDS = RNG.normal(size=(B, 4, 3, F)).astype("float32")
WORD_MASK = np.ones((B, 4, 3), bool)
WORD_MASK[1, 2:] = False
WORD_MASK[0, :, 2] = False


LAYERS = {
    "bidirectional_gru_concat": (lambda: kb.Bidirectional(kb.GRUCell(U), return_sequences=True), [X], MASK),
    "bidirectional_lstm_projection": (
        lambda: kb.Bidirectional(kb.LSTMCell(U), merge_mode="projection", projection_units=2,
                                 projection_activation="softmax", return_sequences=True),
        [X], MASK),
    "bidirectional_pair_and_states": (
        lambda: kb.Bidirectional(kb.SimpleRNNCell(U), merge_mode=None, return_state=True,
                                 initial_state="learned"),
        [X], MASK),
    "recurrent_reverse": (lambda: kb.Recurrent(kb.GRUCell(U, reset_after=False), return_sequences=True,
                                               reverse=True), [X], MASK),
    "stacked": (lambda: kb.StackedBidirectional("gru", units=(U, U), residual=True, layer_norm=True), [X], MASK),
    "stacked_final": (lambda: kb.StackedBidirectional("lstm", units=(U, U), return_sequences=False), [X], MASK),
    "mean_pooling": (lambda: kb.MaskedMeanPooling(), [X], MASK),
    "max_pooling": (lambda: kb.MaskedMaxPooling(), [X], MASK),
    "attention_pooling": (lambda: kb.AttentionPooling(3), [X], MASK),
    "final_state_pooling": (lambda: kb.FinalStatePooling(), [[X, X[..., ::-1].copy()]], None),
    "directional_projection": (lambda: kb.DirectionalProjection(2, activation="tanh"),
                               [X, X[..., ::-1].copy()], None),
    "nested_encoder": (lambda: kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(U))), [WORDS], WORD_MASK),
    "crf": (lambda: kb.CRF(3, tags=["O", "B-X", "I-X"], allowed_transitions="iob2"), [X], MASK),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layer_contract(name):
    keras.utils.set_random_seed(0)
    make, inputs, mask = LAYERS[name]
    check_layer_contract(make, inputs, mask)


def test_every_public_layer_is_checked():
    """A new layer in `kb` without a contract entry fails here."""
    covered = {type(make()) for make, _, _ in LAYERS.values()}
    public = {getattr(kb, name) for name in kb.__all__}
    layers = {c for c in public if isinstance(c, type) and issubclass(c, keras.layers.Layer)
              and not issubclass(c, kb.RecurrentCell)}
    assert layers <= covered, layers - covered
