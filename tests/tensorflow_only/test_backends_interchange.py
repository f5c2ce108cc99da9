"""Train anywhere, serve with TensorFlow: a model trained on JAX or PyTorch,
saved as `.keras`, loads with the TensorFlow backend (identical outputs) and
exports through `kb.export_saved_model` and `kb.export_tflite` with the same
numbers; and a `.keras` file saved on TensorFlow loads on JAX and PyTorch.

Each other backend runs in its own process (a process has one Keras
backend); this file runs in the TensorFlow suite.
"""

import importlib.util
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from helpers import run_python

pytestmark = pytest.mark.slow

OTHER_BACKENDS = [b for b in ("jax", "torch") if importlib.util.find_spec(b) is not None]

# The model and its data, built the same way in every process.
MODEL_CODE = """
import numpy as np, keras, keras_birnn as kb
keras.utils.set_random_seed(7)
ids = keras.Input((None,), dtype="int32")
x = keras.layers.Embedding(30, 8, mask_zero=True)(ids)
x = kb.Bidirectional(kb.GRUCell(6, dropout=0.1), return_sequences=True)(x)
x = kb.Bidirectional(kb.LSTMCell(5), merge_mode="projection", projection_units=4,
                     initial_state="learned", return_sequences=True)(x)
model = keras.Model(ids, x)
rng = np.random.default_rng(0)
lengths = rng.integers(1, 10, size=48)
tokens = np.where(np.arange(9)[None, :] < lengths[:, None], rng.integers(1, 30, size=(48, 9)), 0).astype("int32")
tags = (tokens % 4).astype("int32")
"""


def _train_and_save(backend: str, directory: str) -> None:
    run_python(MODEL_CODE + f"""
model.compile(optimizer=keras.optimizers.Adam(0.02),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(tokens, tags, epochs=2, batch_size=16, verbose=0)
model.save({os.path.join(directory, "model.keras")!r})
np.save({os.path.join(directory, "predicted.npy")!r}, model.predict(tokens, verbose=0))
np.save({os.path.join(directory, "tokens.npy")!r}, tokens)
""", timeout=600, backend=backend)


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_trained_elsewhere_served_with_tensorflow(backend, tmp_path):
    _train_and_save(backend, str(tmp_path))
    trained = np.load(tmp_path / "predicted.npy")
    tokens = np.load(tmp_path / "tokens.npy")
    model = keras.saving.load_model(str(tmp_path / "model.keras"))
    np.testing.assert_allclose(model.predict(tokens, verbose=0), trained, atol=1e-6, rtol=0)

    lengths = (tokens != 0).sum(axis=1).astype("int32")
    served = tf.saved_model.load(kb.export_saved_model(model, str(tmp_path / "serving")))
    outputs = served.signatures["serving_default"](inputs=tf.constant(tokens), lengths=tf.constant(lengths))
    np.testing.assert_allclose(outputs["outputs"].numpy(), trained, atol=1e-5, rtol=0)

    from ai_edge_litert import interpreter as litert

    path = kb.export_tflite(model, str(tmp_path / "model.tflite"), batch_size=4)
    interpreter = litert.Interpreter(model_path=path)
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    for start in range(0, 12, 4):  # three batches of 4 rows, each at its own length
        rows = slice(start, start + 4)
        time = max(int(lengths[rows].max()), 1)
        interpreter.resize_tensor_input(index["inputs"], (4, time))
        interpreter.allocate_tensors()
        interpreter.set_tensor(index["inputs"], tokens[rows, :time])
        interpreter.set_tensor(index["lengths"], lengths[rows])
        interpreter.invoke()
        got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
        np.testing.assert_allclose(got, trained[rows, :time], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_saved_on_tensorflow_loads_elsewhere(backend, tmp_path):
    namespace = {}
    exec(MODEL_CODE, namespace)
    model, tokens = namespace["model"], namespace["tokens"]
    model.save(str(tmp_path / "model.keras"))
    np.save(tmp_path / "expected.npy", model.predict(tokens, verbose=0))
    np.save(tmp_path / "tokens.npy", tokens)
    report = run_python(f"""
import numpy as np, keras, keras_birnn as kb
model = keras.saving.load_model({str(tmp_path / "model.keras")!r})
tokens = np.load({str(tmp_path / "tokens.npy")!r})
got = model.predict(tokens, verbose=0)
print(float(np.max(np.abs(got - np.load({str(tmp_path / "expected.npy")!r})))), keras.backend.backend())
""", backend=backend)
    max_diff, ran_on = report.split()[-2:]
    assert ran_on == backend
    assert float(max_diff) <= 1e-6, max_diff
