"""Test helpers shared by the suite: graph-mode runs and saving round trips."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_graph(layer, inputs, mask=None, jit_compile=False, **call_kwargs):
    """Calls `layer` inside a `tf.function` whose batch and time sizes are unknown."""
    inputs = np.asarray(inputs)
    spec = [tf.TensorSpec([None, None, inputs.shape[-1]], tf.as_dtype(inputs.dtype))]
    if mask is not None:
        spec.append(tf.TensorSpec([None, None], tf.bool))

    @tf.function(input_signature=spec, jit_compile=jit_compile)
    def run(x, m=None):
        return layer(x, mask=m, **call_kwargs)

    return run(inputs, np.asarray(mask, bool)) if mask is not None else run(inputs)


def eager_and_graph(layer, inputs, mask=None, **call_kwargs):
    """The layer's outputs eagerly and in a shape-agnostic graph, as NumPy."""
    eager = layer(inputs, mask=mask, **call_kwargs)
    graph = in_graph(layer, inputs, mask=mask, **call_kwargs)
    to_np = lambda y: keras.tree.map_structure(lambda t: np.asarray(t), y)  # noqa: E731
    return to_np(eager), to_np(graph)


def assert_all_close(actual, expected, atol=1e-5, rtol=1e-5):
    """Compares nested structures of arrays."""
    flat_a, flat_e = keras.tree.flatten(actual), keras.tree.flatten(expected)
    assert len(flat_a) == len(flat_e), (len(flat_a), len(flat_e))
    for a, e in zip(flat_a, flat_e):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=atol, rtol=rtol)


def keras_round_trip(model, path, inputs):
    """Saves to `.keras`, reloads with `safe_mode=True` and no custom objects,
    checks identical outputs; returns the loaded model."""
    expected = model.predict(inputs, verbose=0)
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert_all_close(loaded.predict(inputs, verbose=0), expected, atol=0, rtol=0)
    return loaded


def run_python(code: str, timeout: int = 300) -> str:
    """Runs `code` in a fresh Python process (cwd = repo); returns stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout
