"""Helpers shared by the test suite (not tests themselves).

- paths: `REPO`, `SHARED_DATA` and its data sets (`EWT`, `POLARITY`, `CONLL2002`, `CONLL2000`);
- weights and outputs: `f32`, `to_numpy`;
- the standard masks, one name each (rows: `True` = a valid step);
- comparisons and runs: `assert_all_close`, `in_graph`, `eager_and_graph`,
  `keras_round_trip`, `run_python`;
- examples/: `load_example`, `quietly`.

The NumPy oracles are their own modules (`reference.py`, `crf_reference.py`);
the case tables that build layers with oracle weights are `birnn_cases.py`,
`head_cases.py` and `export_cases.py`.
"""

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")
EWT = os.path.join(SHARED_DATA, "ud_english_ewt")
POLARITY = os.path.join(SHARED_DATA, "sentence_polarity")
CONLL2002 = os.path.join(SHARED_DATA, "conll2002_spanish")
CONLL2000 = os.path.join(SHARED_DATA, "conll2000_chunking")


# --- weights and outputs ---------------------------------------------------------------------------


def f32(params):
    """float64 weights rounded to float32 (then handed to both sides)."""
    if params is None:
        return None
    return {k: None if v is None else np.asarray(v, np.float32) for k, v in params.items()}


def cell_params(cell) -> dict:
    """A cell's weights as the NumPy oracle (`reference.py`) takes them."""
    return {k: getattr(cell, k).numpy() for k in ("kernel", "recurrent_kernel", "bias")}


def to_numpy(structure):
    return keras.tree.map_structure(lambda t: np.asarray(t), structure)


# --- the standard masks ----------------------------------------------------------------------------

# [4, 6] (birnn_cases.py's B, T). Rows: full, right padding, left padding with
# a hole, fully masked.
MASK_4x6 = np.array(
    [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0],
        [0, 1, 1, 0, 1, 1],
        [0, 0, 0, 0, 0, 0],
    ],
    dtype=bool,
)

# [5, 6] (head_cases.py's B, T). Rows: full, right padding, left padding,
# holes, fully masked.
MASK_5x6 = np.array(
    [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 1, 1, 0, 1, 0],
        [0, 0, 0, 0, 0, 0],
    ],
    dtype=bool,
)

# [5, 5], the CRF's. Rows: full, right padding, left padding, left padding
# with a hole, fully masked.
MASK_5x5_HOLES = np.array(
    [
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1],
        [0, 1, 1, 0, 1],
        [0, 0, 0, 0, 0],
    ],
    dtype=bool,
)

# [5, 5], the oracle self-tests'. Rows: full, right padding, left padding,
# one hole between valid steps, fully masked.
MASK_5x5_ONE_HOLE = np.array(
    [
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1],
        [1, 1, 0, 1, 1],
        [0, 0, 0, 0, 0],
    ],
    dtype=bool,
)

# [3, 5], the higher-order gradient tests'. Rows: right padding, left
# padding with a hole, full.
MASK_3x5 = np.array([[1, 1, 1, 0, 0], [0, 1, 0, 1, 1], [1, 1, 1, 1, 1]], bool)

# [4, 6] masks by kind of padding, one batch each (every row of a kind).
_B, _T = MASK_4x6.shape
PADDING_PATTERNS_4x6 = {
    "right": np.arange(_T)[None, :] < np.array([_T, 4, 2, 1])[:, None],
    "left": np.arange(_T)[None, :] >= np.array([0, 2, 3, 5])[:, None],
    "holes": np.array(
        [[1, 0, 1, 1, 0, 1], [1, 1, 0, 0, 1, 1], [0, 1, 0, 1, 0, 0], [1, 1, 1, 1, 1, 0]], bool
    ),
    "fully_masked": np.array(
        [[0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1]], bool
    ),
    # Steps masked in every row (a batch padded beyond its longest row, on
    # both sides): the loops skip them (`recurrence.tensorflow.timeloop.visited_span`).
    "beyond_longest": np.array(
        [[0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]], bool
    ),
    "none_valid": np.zeros((_B, _T), bool),
}


# --- comparisons and runs --------------------------------------------------------------------------


def in_graph(layer, inputs, mask=None, jit_compile=False, **call_kwargs):
    """Calls `layer` inside a `tf.function` whose batch and time sizes are unknown."""
    import tensorflow as tf  # here: the masks above serve the tests of every backend

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
    return to_numpy(eager), to_numpy(graph)


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


def run_python(code: str, timeout: int = 300, backend: str = "tensorflow") -> str:
    """Runs `code` in a fresh Python process (cwd = repo) with Keras's
    `backend`; returns stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=backend)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


# --- examples/ -------------------------------------------------------------------------------------


def load_example(name):
    """Imports examples/<name>.py once per session."""
    module_name = f"keras_birnn_example_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, os.path.join(REPO, "examples", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def quietly(fn, *args):
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        result = fn(*args)
    return result, text.getvalue()


NAMES = {"PER": ["Ada", "Alan", "Grace"], "LOC": ["Paris", "Rome", "Oslo"], "O": ["met", "in", "saw", "the", "near"]}


def names_conll(count: int, seed: int, separator: str = " ", longest: int = 6) -> str:
    """CoNLL text of `count` sentences of 2 to `longest` tokens: people
    (B-PER), places (B-LOC) and other words (O); the word decides the tag."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(count):
        for _ in range(rng.integers(2, longest + 1)):
            kind = ["O", "O", "PER", "LOC"][rng.integers(4)]
            lines.append(f"{rng.choice(NAMES[kind])}{separator}{'O' if kind == 'O' else 'B-' + kind}")
        lines.append("")
    return "\n".join(lines)
