"""On JAX and PyTorch the package imports and runs without TensorFlow.

The GPU machines this library is measured on have JAX and PyTorch but no
TensorFlow, and a user training on JAX need not install it. A fresh
process in which `import tensorflow` fails builds, calls and fits every
public layer; the export functions raise the error that names the way
round.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO
from backend_harness import BACKEND

pytestmark = [
    pytest.mark.skipif(BACKEND == "tensorflow", reason="runs in the suite's JAX and PyTorch runs"),
    pytest.mark.slow(reason="a fresh process"),
]

# A `tensorflow` package that fails to import, first on the path: as on a
# machine without TensorFlow (`importlib.util.find_spec` still finds it, as
# PyTorch's start-up asks, but importing it fails).
FAILING_TENSORFLOW = 'raise ModuleNotFoundError("No module named \'tensorflow\' (blocked by the test)")\n'

USE_EVERY_LAYER = """
import sys
import numpy as np, keras
import keras_birnn as kb

assert "tensorflow" not in sys.modules, sorted(m for m in sys.modules if m.startswith("tensorflow"))[:5]
ids = keras.Input((None,), dtype="int32")
x = keras.layers.Embedding(20, 6, mask_zero=True)(ids)
x = kb.stacked_bidirectional("gru", [5, 4])(x)
attention = kb.AttentionPooling(6)(x)
mean, maximum = kb.MaskedMeanPooling()(x), kb.MaskedMaxPooling()(x)
bilstm = kb.Bidirectional(kb.LSTMCell(4), return_sequences=True)
emissions = keras.layers.Dense(3)(bilstm(x))
tags = kb.CRF(3)(emissions)
model = keras.Model(ids, [tags, attention, mean, maximum])
tokens = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], "int32")
outputs = model.predict(tokens, verbose=0)
assert [o.shape for o in outputs] == [(2, 4), (2, 8), (2, 8), (2, 8)], [o.shape for o in outputs]
norms = kb.diagnostics.direction_norms(model, tokens, layer=bilstm)
assert norms.forward.shape == (2, 4) and np.all(norms.forward[1, 2:] == 0), norms.forward
try:
    kb.export_saved_model(model, "unused")
except NotImplementedError as error:
    assert "KERAS_BACKEND=tensorflow" in str(error), error
else:
    raise AssertionError("export ran without TensorFlow")
assert "tensorflow" not in sys.modules
print("ok", keras.backend.backend())
"""


def test_imports_and_runs_without_tensorflow(tmp_path):
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAILING_TENSORFLOW)
    path = os.pathsep.join([str(tmp_path), REPO, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=path)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(USE_EVERY_LAYER)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split()[-2:] == ["ok", BACKEND]
