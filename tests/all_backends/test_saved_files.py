"""`.keras` files written by an earlier release load and give its numbers.

The files in `tests/fixtures/` were saved by `make_saved_files.py` before
the package's modules moved into folders; Keras finds the classes by their
registered names (`keras_birnn>GRUCell`, ...), which must never change.
Loaded in safe mode, on every backend (the string encoder on TensorFlow).
"""

import pathlib

import keras
import numpy as np
import pytest

import keras_birnn  # noqa: F401  (registers the classes)
from backend_harness import BACKEND, to_numpy

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"
NUMERIC = ["recurrent_layers", "crf_tagger", "char_tagger"]


def _stored(name):
    with np.load(FIXTURES / f"{name}.npz") as stored:
        inputs = [stored[k] for k in sorted(stored) if k.startswith("input_")]
        outputs = [stored[k] for k in sorted(stored) if k.startswith("output_")]
    return inputs, outputs


@pytest.mark.parametrize("name", NUMERIC)
def test_saved_file_loads_with_its_numbers(name):
    model = keras.saving.load_model(FIXTURES / f"{name}.keras", safe_mode=True)
    inputs, (expected,) = _stored(name)
    got = model.predict(inputs if len(inputs) > 1 else inputs[0], verbose=0)
    if np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(to_numpy(got), expected)   # CRF decoding: tag ids
    else:
        np.testing.assert_allclose(to_numpy(got), expected, rtol=1e-5, atol=1e-5)


def test_crf_tagger_keeps_its_compiled_loss_and_metric():
    """The loss and span metric come back compiled: scored against its own
    decoded paths, the loaded tagger's span F1 is exactly 1."""
    model = keras.saving.load_model(FIXTURES / "crf_tagger.keras", safe_mode=True)
    (ids,), (paths,) = _stored("crf_tagger")
    assert type(model.loss).__name__ == "CRFLoss"
    scores = model.evaluate(ids, paths, verbose=0, return_dict=True)
    assert scores["span_f1"] == pytest.approx(1.0)
    assert np.isfinite(scores["loss"])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="string tensors need TensorFlow")
def test_saved_token_encoder_keeps_its_vocabularies():
    model = keras.saving.load_model(FIXTURES / "token_encoder.keras", safe_mode=True)
    (tokens,), expected = _stored("token_encoder")
    got = model(tokens.astype(object))
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(to_numpy(g), e)
