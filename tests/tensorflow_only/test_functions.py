"""keras_birnn.functions: activations saved so that they load as themselves.

Keras saves a plain function by its name, and a name that is also a Keras
activation's loads as Keras's function. A registered function named like a
built-in reloads as itself, an unregistered one is saved under its
module-qualified name (so loading refuses, naming it), and library functions
that are Keras's still save by name. (The cells computing with such
functions, against the oracle: test_cells_activations.py.)
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from helpers import keras_round_trip


def tanh(x):
    """Not Keras's tanh: twice it."""
    return 2.0 * tf.tanh(x)


@keras.saving.register_keras_serializable(package="kb_tests")
def swish(x):
    """Registered, and not Keras's swish: x * sigmoid(2x)."""
    return x * tf.sigmoid(2.0 * x)


def _model(cell):
    inputs = keras.Input((None, 3))
    return keras.Model(inputs, kb.Bidirectional(cell, return_sequences=True)(inputs))


@pytest.mark.slow(reason="two models and a .keras round trip, ~4 s; the other two tests stay fast")
def test_registered_function_named_like_a_built_in_saves_as_itself(tmp_path):
    """Keras would save `swish` as "swish" and load its own swish; ours
    reloads to identical outputs (keras_round_trip), which Keras's swish
    does not give."""
    model = _model(kb.GRUCell(4, activation=swish, recurrent_activation=swish))
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32") * 3
    loaded = keras_round_trip(model, str(tmp_path / "swish.keras"), x)
    assert loaded.layers[1].backward_layer.cell.activation is swish
    keras_swish = _model(kb.GRUCell(4))
    keras_swish.set_weights(model.get_weights())
    assert np.abs(keras_swish.predict(x, verbose=0) - model.predict(x, verbose=0)).max() > 1e-2


def test_unregistered_function_named_like_a_built_in_refuses_to_load(tmp_path):
    """Saved under its module-qualified name, so loading asks for it instead
    of silently putting Keras's tanh in its place."""
    path = str(tmp_path / "tanh.keras")
    _model(kb.LSTMCell(4, activation=tanh)).save(path)
    with pytest.raises(TypeError, match=r"test_functions\.tanh"):
        keras.saving.load_model(path)


def test_library_functions_still_save_by_name(tmp_path):
    """TensorFlow's tanh and sigmoid are Keras's: saved as "tanh" and
    "sigmoid", they reload (as Keras's) to identical outputs."""
    model = _model(kb.LSTMCell(4, activation=tf.math.tanh, recurrent_activation=tf.nn.sigmoid))
    config = model.layers[1].get_config()["layer"]["config"]["cell"]["config"]
    assert (config["activation"], config["recurrent_activation"]) == ("tanh", "sigmoid")
    x = np.random.default_rng(1).normal(size=(2, 5, 3)).astype("float32")
    keras_round_trip(model, str(tmp_path / "tf.keras"), x)
