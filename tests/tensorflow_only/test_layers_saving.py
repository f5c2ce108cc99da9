"""`.keras` files: every layer and head survives `model.save` ->
`keras.saving.load_model(path, safe_mode=True)` in a fresh process, without
`custom_objects`.

The models are built here, with weights perturbed away from their
initialisers (zero biases and boundary states included, so a weight that is
dropped or re-initialised on load is caught). One fresh interpreter then
loads every file and must give the same numbers, bit for bit: outputs
(`model.predict`), weights, and configs. The trained tagger also carries its
optimizer: training resumed in the fresh process continues exactly where it
stopped.

Loading needs `import keras_birnn` (it registers the classes): Keras only
imports its own packages by itself. The fresh process checks that too.
"""

import json

import keras
import numpy as np
import pytest

import keras_birnn as kb
from helpers import run_python

B, T, F, U = 4, 6, 3, 4



def _perturb(model, seed):
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.uniform(-0.4, 0.4, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def _masked_input():
    inputs = keras.Input((None, F), name="features")
    return inputs, keras.layers.Masking(0.0)(inputs)


def recurrent_model():
    """kb.Recurrent around every cell: both directions, sequences and states,
    every boundary state; cell options (activation, bias, dropout, seed,
    regularizer, recurrent activation, forget bias) in the configs."""
    inputs, x = _masked_input()
    outputs = [
        kb.Recurrent(kb.SimpleRNNCell(U, activation="relu", use_bias=False), return_sequences=True)(x),
        kb.Recurrent(kb.GRUCell(U, dropout=0.1, recurrent_dropout=0.2, seed=3), reverse=True,
                     return_sequences=True)(x),
        kb.Recurrent(kb.GRUCell(U, reset_after=False, recurrent_activation="hard_sigmoid"),
                     initial_state=0.5)(x),
        *kb.Recurrent(kb.LSTMCell(U, unit_forget_bias=False, kernel_regularizer="l2"),
                      reverse=True, return_state=True, initial_state="learned")(x),
    ]
    return keras.Model(inputs, outputs, name="recurrent_cells")


def bidirectional_model():
    """Every merge mode (projection with and without activation), boundary
    states, return_state, a different backward cell, and a stack."""
    inputs, x = _masked_input()
    outputs = [
        kb.Bidirectional(kb.SimpleRNNCell(U), return_sequences=True)(x),
        kb.Bidirectional(kb.GRUCell(U, reset_after=False), merge_mode="sum", initial_state=-0.3)(x),
        kb.Bidirectional(kb.GRUCell(U), merge_mode="mul", initial_state="learned", return_sequences=True)(x),
        kb.Bidirectional(kb.LSTMCell(U), merge_mode="ave")(x),
        *kb.Bidirectional(kb.SimpleRNNCell(U, activation="relu"), merge_mode=None, return_sequences=True)(x),
        *kb.Bidirectional(kb.LSTMCell(U), return_state=True, initial_state="learned")(x),
        kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=5,
                         projection_activation="softmax", return_sequences=True)(x),
    ]
    lower = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(x)
    outputs.append(kb.Bidirectional(
        kb.Recurrent(kb.GRUCell(U)), backward_layer=kb.Recurrent(kb.LSTMCell(3), reverse=True),
        merge_mode="projection", projection_units=2)(lower))
    return keras.Model(inputs, outputs, name="bidirectional_merges")


def heads_model():
    """DirectionalProjection on its own, the pooling heads and the stacked
    builder (with residuals and layer normalization)."""
    inputs, x = _masked_input()
    pair = kb.Bidirectional(kb.GRUCell(U), merge_mode=None, return_sequences=True)(x)
    stack = kb.stacked_bidirectional("gru", units=(U, U), merge_mode="sum", residual=True,
                                     layer_norm=True, reset_after=False)(x)
    outputs = [
        kb.DirectionalProjection(3, activation="tanh")(pair[0], pair[1]),
        kb.MaskedMeanPooling()(stack),
        kb.MaskedMaxPooling()(pair),
        kb.AttentionPooling(5)(stack),
        kb.FinalStatePooling()(pair),
        kb.StackedBidirectional("lstm", units=(U,), return_sequences=False)(x),
    ]
    return keras.Model(inputs, outputs, name="heads")


def bfloat16_model():
    """Built under the mixed_bfloat16 policy: the file keeps each layer's policy."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        inputs, x = _masked_input()
        y = kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=3,
                             return_sequences=True, initial_state="learned")(x)
        y = kb.Recurrent(kb.LSTMCell(U))(y)
        return keras.Model(inputs, y, name="bfloat16")
    finally:
        keras.mixed_precision.set_global_policy("float32")


MODELS = {
    "recurrent_cells": recurrent_model,
    "bidirectional_merges": bidirectional_model,
    "heads": heads_model,
    "bfloat16": bfloat16_model,
}


def _inputs():
    x = np.random.default_rng(40).normal(size=(B, T, F)).astype("float32")
    x[1, 4:] = 0.0    # right padding
    x[2, :2] = 0.0    # left padding
    x[2, 3] = 0.0     # and a hole
    return x


def _tagger_data():
    rng = np.random.default_rng(41)
    tokens = rng.integers(1, 9, size=(8, 7)).astype("int32")
    tokens[1, 5:] = 0
    tokens[6, 2:] = 0
    return tokens, (tokens % 2).astype("int32")


def trained_tagger():
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(9, 5, mask_zero=True)(tokens)
    tags = kb.Bidirectional(kb.GRUCell(U), merge_mode="projection", projection_units=2,
                            projection_activation="softmax", return_sequences=True,
                            initial_state="learned")(x)
    model = keras.Model(tokens, tags, name="tagger")
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    return model


FRESH = """
import json
import numpy as np
import keras

files = json.loads(FILES)
report = {"without_import": None, "models": {}}
# Keras does not import third-party packages by itself: without
# `import keras_birnn` the classes are unknown.
try:
    keras.saving.load_model(files["recurrent_cells"], safe_mode=True)
except Exception as error:
    report["without_import"] = f"{type(error).__name__}: {error}"

import keras_birnn  # registers every class under "keras_birnn>..."

data = np.load(files["data"])
for name, path in files.items():
    if name in ("data", "tagger"):
        continue
    model = keras.saving.load_model(path, safe_mode=True)
    outputs = model.predict(data["x"], verbose=0)
    outputs = outputs if isinstance(outputs, list) else [outputs]
    np.savez(path + ".out.npz", *[np.asarray(y, np.float32) for y in outputs])
    np.savez(path + ".weights.npz", *model.get_weights())
    report["models"][name] = {
        "config": json.dumps(model.get_config(), sort_keys=True),
        "classes": sorted({f"{type(l).__module__}.{type(l).__name__}" for l in model._flatten_layers()}),
        "compute_dtypes": sorted({l.compute_dtype for l in model.layers[2:]}),
    }

tagger = keras.saving.load_model(files["tagger"], safe_mode=True)
report["tagger_iterations"] = int(tagger.optimizer.iterations.numpy())
np.savez(files["tagger"] + ".loaded.npz", *tagger.get_weights())
tagger.fit(data["tokens"], data["labels"], batch_size=4, epochs=1, shuffle=False, verbose=0)
np.savez(files["tagger"] + ".resumed.npz", *tagger.get_weights())
print(json.dumps(report))
"""


pytestmark = pytest.mark.slow(reason="every test uses the saved fixture: all models built, saved and loaded in a fresh process, ~55 s")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every model built, perturbed and saved; its outputs, weights and
    config kept; then one fresh process loads them all."""
    root = tmp_path_factory.mktemp("keras_files")
    x = _inputs()
    tokens, labels = _tagger_data()
    files, expected = {}, {}
    for seed, (name, factory) in enumerate(MODELS.items()):
        keras.utils.set_random_seed(50 + seed)
        model = _perturb(factory(), seed=60 + seed)
        outputs = model.predict(x, verbose=0)
        files[name] = str(root / f"{name}.keras")
        model.save(files[name])
        expected[name] = {
            "outputs": [np.asarray(y, np.float32) for y in (outputs if isinstance(outputs, list) else [outputs])],
            "weights": model.get_weights(),
            "config": json.dumps(model.get_config(), sort_keys=True),
            "layers": [type(l) for l in model._flatten_layers()],
        }

    keras.utils.set_random_seed(55)
    tagger = trained_tagger()
    tagger.fit(tokens, labels, batch_size=4, epochs=1, shuffle=False, verbose=0)
    files["tagger"] = str(root / "tagger.keras")
    tagger.save(files["tagger"])
    expected["tagger"] = {
        "weights": tagger.get_weights(),
        "boundary": [np.asarray(v) for v in tagger.layers[2].weights if "state" in v.path],
    }
    tagger.fit(tokens, labels, batch_size=4, epochs=1, shuffle=False, verbose=0)
    expected["tagger"]["resumed"] = tagger.get_weights()

    files["data"] = str(root / "data.npz")
    np.savez(files["data"], x=x, tokens=tokens, labels=labels)
    stdout = run_python(f"FILES = {json.dumps(files)!r}\n" + FRESH, timeout=300)
    return files, expected, json.loads(stdout.strip().splitlines()[-1])


def _config_differences(saved, loaded, path="config"):
    """Paths where two JSON configs differ. `shared_object_id` is Keras's
    serialization bookkeeping (keyed on Python `id()`s, which get reused),
    not part of a layer's configuration."""
    if isinstance(saved, dict) and isinstance(loaded, dict):
        return [d for key in sorted((set(saved) | set(loaded)) - {"shared_object_id"})
                for d in _config_differences(saved.get(key), loaded.get(key), f"{path}/{key}")]
    if isinstance(saved, list) and isinstance(loaded, list) and len(saved) == len(loaded):
        return [d for k, (a, b) in enumerate(zip(saved, loaded))
                for d in _config_differences(a, b, f"{path}[{k}]")]
    return [] if saved == loaded else [f"{path}: {saved!r} != {loaded!r}"]


def _load_list(path):
    data = np.load(path)
    return [data[f"arr_{k}"] for k in range(len(data.files))]


def test_loading_needs_import_keras_birnn_only(saved):
    files, expected, report = saved
    assert report["without_import"] is not None and "keras_birnn" in report["without_import"]
    for name in MODELS:
        classes = report["models"][name]["classes"]
        ours = {c for c in classes if c.startswith("keras_birnn.")}
        assert ours, classes
        # The same classes as the saved model's, nothing left as a generic Keras layer.
        assert ours == {f"{c.__module__}.{c.__name__}" for c in expected[name]["layers"]
                        if c.__module__.startswith("keras_birnn.")}


@pytest.mark.parametrize("name", list(MODELS))
def test_fresh_process_gives_identical_numbers(saved, name):
    files, expected, report = saved
    got = _load_list(files[name] + ".out.npz")
    assert len(got) == len(expected[name]["outputs"])
    for g, e in zip(got, expected[name]["outputs"]):
        np.testing.assert_array_equal(g, e)
        assert np.abs(e).max() > 0
    weights = _load_list(files[name] + ".weights.npz")
    assert len(weights) == len(expected[name]["weights"])
    for g, e in zip(weights, expected[name]["weights"]):
        np.testing.assert_array_equal(g, e)
    differences = _config_differences(json.loads(expected[name]["config"]),
                                      json.loads(report["models"][name]["config"]))
    assert not differences, differences[:10]


def test_mixed_precision_policies_survive(saved):
    files, expected, report = saved
    assert report["models"]["bfloat16"]["compute_dtypes"] == ["bfloat16"]
    assert '"mixed_bfloat16"' in report["models"]["bfloat16"]["config"]


def test_trained_tagger_resumes_training(saved):
    """Learned boundary states and the optimizer's state come back: one more
    epoch in the fresh process gives the weights one more epoch gives here."""
    files, expected, report = saved
    assert report["tagger_iterations"] == 2
    boundary = expected["tagger"]["boundary"]
    assert len(boundary) == 2 and all(np.abs(b).max() > 1e-3 for b in boundary)  # they were trained
    loaded = _load_list(files["tagger"] + ".loaded.npz")
    assert len(loaded) == len(expected["tagger"]["weights"]) > 0
    for g, e in zip(loaded, expected["tagger"]["weights"]):
        np.testing.assert_array_equal(g, e)
    resumed = _load_list(files["tagger"] + ".resumed.npz")
    assert len(resumed) == len(expected["tagger"]["resumed"]) > 0
    for g, e in zip(resumed, expected["tagger"]["resumed"]):
        np.testing.assert_allclose(g, e, atol=1e-6, rtol=1e-6)


