"""kb.Recurrent and kb.Bidirectional on every backend against the NumPy oracle.

Runs on TensorFlow, JAX and PyTorch (`KERAS_BACKEND`; CI runs all three):
forward numbers eager and traced for every cell and every mask pattern,
every merge mode, boundary states, gradients by the backend's autodiff
(the portable engine's scan; on TensorFlow, the hand-written BPTT), and
the layer contract (`fit`, `predict`, `.keras` files).
"""

import os

import keras
import numpy as np
import pytest

import keras_birnn as kb
import reference as ref
from birnn_cases import CELLS, MERGES, B, F, T, U, make_case
from helpers import MASK_4x6, PADDING_PATTERNS_4x6, assert_all_close
from backend_harness import BACKEND, to_numpy, traced, value_and_gradients

MASKS = dict(PADDING_PATTERNS_4x6, unmasked=None, mixed=MASK_4x6)


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_bidirectional_matches_oracle_eager_and_traced(cell_name, mask_name):
    case = make_case(cell_name, "concat")
    mask = MASKS[mask_name]
    expected = case.oracle(mask)
    assert_all_close(to_numpy(case.layer(case.x, mask=mask)), expected)
    assert_all_close(traced(case.layer, case.x, mask), expected)


@pytest.mark.parametrize("return_sequences", [True, False])
@pytest.mark.parametrize("merge_name", list(MERGES))
def test_every_merge_mode(merge_name, return_sequences):
    case = make_case("gru_reset_after", merge_name, return_sequences=return_sequences, return_state=True)
    assert_all_close(to_numpy(case.layer(case.x, mask=MASK_4x6)), case.oracle(MASK_4x6))
    assert_all_close(traced(case.layer, case.x, MASK_4x6), case.oracle(MASK_4x6))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("cell_name", ["gru_reset_before", "lstm"])
def test_recurrent_one_direction(cell_name, reverse):
    cell, cell_kwargs, factory = CELLS[cell_name]
    rng = np.random.default_rng(3)
    params = {k: None if v is None else np.asarray(v, np.float32) for k, v in
              ref.random_params(cell, F, U, rng, reset_after=cell_kwargs.get("reset_after", True)).items()}
    layer = kb.Recurrent(factory(U), reverse=reverse, return_sequences=True, return_state=True)
    layer.build((None, None, F))
    layer.cell.set_weights([params["kernel"], params["recurrent_kernel"], params["bias"]])
    x = rng.normal(size=(B, T, F)).astype(np.float32)
    outputs, finals = ref.run_direction(cell, params, x, MASK_4x6, reverse=reverse, **cell_kwargs)
    assert_all_close(to_numpy(layer(x, mask=MASK_4x6)), [outputs] + list(finals))


def test_boundary_states_constant_learned_and_passed():
    constant = make_case("simple_tanh", "concat", initial_state=0.5)
    half = [np.full((B, U), 0.5, np.float32)]
    assert_all_close(to_numpy(constant.layer(constant.x, mask=MASK_4x6)), constant.oracle(MASK_4x6, half, half))
    learned = make_case("lstm", "sum", initial_state="learned")
    states = [learned.layer.forward_layer.boundary.states, learned.layer.backward_layer.boundary.states]
    values = [[np.linspace(-0.5, 0.5, U).astype(np.float32) * (k + 1) for k in range(2)] for _ in states]
    for variables, vals in zip(states, values):
        for variable, value in zip(variables, vals):
            variable.assign(value)
    fw, bw = ([np.broadcast_to(v, (B, U)) for v in vals] for vals in values)
    assert_all_close(to_numpy(learned.layer(learned.x, mask=MASK_4x6)), learned.oracle(MASK_4x6, fw, bw))
    passed = make_case("gru_reset_after", "concat")
    given = [np.random.default_rng(5).normal(size=(B, U)).astype(np.float32) for _ in range(2)]
    out = passed.layer(passed.x, mask=MASK_4x6, initial_state=given)
    assert_all_close(to_numpy(out), passed.oracle(MASK_4x6, [given[0]], [given[1]]))


def _named_gradients(case, gradients):
    """`value_and_gradients`'s list keyed like the oracle's gradients."""
    by_id = {}
    for side, rec in (("fw", case.layer.forward_layer), ("bw", case.layer.backward_layer)):
        for k in ("kernel", "recurrent_kernel", "bias"):
            by_id[id(getattr(rec.cell, k))] = (side, k)
    if case.layer.projection is not None:
        proj = case.layer.projection
        for k, var in (("V_f", proj.forward_kernel), ("V_b", proj.backward_kernel), ("c", proj.bias)):
            by_id[id(var)] = ("projection", k)
    named = {"x": gradients[0], "fw": {}, "bw": {}, "projection": {}}
    for weight, gradient in zip(case.layer.trainable_weights, gradients[1:]):
        side, k = by_id[id(weight)]
        named[side][k] = gradient
    return named


@pytest.mark.parametrize("mask_name", ["mixed", "unmasked", "left"])
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_gradients_match_the_oracle(cell_name, mask_name):
    case = make_case(cell_name, "projection_softmax" if cell_name == "lstm" else "concat")
    mask = MASKS[mask_name]
    d_output = case.random_d_output()
    weights = keras.ops.convert_to_tensor(np.asarray(d_output, np.float32))

    def loss(outputs):
        return keras.ops.sum(outputs * weights)

    _, gradients = value_and_gradients(case.layer, loss, case.x, mask)
    case.assert_grads_match(_named_gradients(case, gradients), case.oracle_grads(d_output, mask))


def test_nothing_leaks_from_padding():
    """NaN in padded slots reaches no output and no gradient."""
    case = make_case("gru_reset_after", "concat")
    poisoned = np.where(MASK_4x6[..., None], case.x, np.nan).astype(np.float32)
    assert_all_close(to_numpy(case.layer(poisoned, mask=MASK_4x6)), case.oracle(MASK_4x6))
    _, gradients = value_and_gradients(case.layer, keras.ops.sum, poisoned, MASK_4x6)
    assert all(np.all(np.isfinite(g)) for g in gradients)
    assert np.all(gradients[0][~MASK_4x6] == 0)


def _tagger(dropout: float = 0.0) -> keras.Model:
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 6, mask_zero=True)(ids)
    x = kb.Bidirectional(kb.GRUCell(5, dropout=dropout, recurrent_dropout=dropout), return_sequences=True)(x)
    # Logits: on JAX and PyTorch Keras's probability losses divide by the
    # output's sum at every position, masked ones too, where the projection
    # outputs zeros (docs/backends.md, "Losses on padded positions").
    x = kb.Bidirectional(kb.LSTMCell(4), merge_mode="projection", projection_units=3,
                         return_sequences=True)(x)
    return keras.Model(ids, x)


def _tagging_data():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=32)
    ids = np.where(np.arange(8)[None, :] < lengths[:, None], rng.integers(1, 20, size=(32, 8)), 0)
    tags = (ids % 3).astype("int32")
    return ids.astype("int32"), tags


def test_fit_predict_and_keras_file(tmp_path):
    """The layer contract: fit lowers the loss (dropout on), predict
    matches the layer's call, a `.keras` file reloads identical."""
    model = _tagger(dropout=0.2)
    model.compile(optimizer=keras.optimizers.Adam(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ids, tags = _tagging_data()
    history = model.fit(ids, tags, epochs=4, batch_size=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    predicted = model.predict(ids, verbose=0)
    assert_all_close(to_numpy(model(ids)), predicted)
    path = os.path.join(tmp_path, "tagger.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(ids, verbose=0), predicted, atol=1e-6, rtol=0)


def test_symbolic_output_shapes():
    layer = kb.Bidirectional(kb.GRUCell(4), merge_mode=None, return_sequences=True, return_state=True)
    outputs = layer(keras.Input((None, F)))
    assert [tuple(o.shape) for o in outputs] == [(None, None, U)] * 2 + [(None, U)] * 2
    recurrent = kb.Recurrent(kb.LSTMCell(4), return_state=True)
    assert [tuple(o.shape) for o in recurrent(keras.Input((7, F)))] == [(None, U)] * 3


def test_bad_input_is_refused():
    layer = kb.Bidirectional(kb.GRUCell(4))
    with pytest.raises(TypeError, match="float inputs"):
        layer(np.zeros((2, 3, F), "int32"))
    with pytest.raises(ValueError, match="mask"):
        layer(np.zeros((2, 3, F), "float32"), mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="rank 3"):
        kb.Bidirectional(kb.GRUCell(4))(np.zeros((2, F), "float32"))


def test_tensorflow_only_features_name_the_way_round():
    if BACKEND == "tensorflow":
        pytest.skip("on TensorFlow these run: tests/tensorflow_only/test_export.py, tests/tensorflow_only/test_litert.py")
    for export in (kb.export_saved_model, kb.export_tflite):
        with pytest.raises(NotImplementedError, match=f"KERAS_BACKEND is '{BACKEND}'.*KERAS_BACKEND=tensorflow"):
            export(_tagger(), "unused")
