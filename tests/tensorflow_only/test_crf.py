"""kb.CRF and kb.CRFLoss against a brute-force NumPy CRF (crf_reference.py):
log Z, NLL, Viterbi and marginals under right padding, left padding, holes
and a fully masked row; gradients against finite differences; and the Keras
path: fit, .keras round trip, SavedModel export, mixed precision, XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import crf_reference as ref
import keras_birnn as kb
from keras_birnn.crf import maths as crf_maths
from helpers import MASK_5x5_HOLES as MASK, assert_all_close

IOB2 = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def random_case(num_tags, seed=0, mask=MASK, scale=1.5):
    """float32 emissions (NaN in masked slots), float32 chain parameters,
    gold tags (-1 in masked slots), and their float64 copies for the oracle."""
    rng = np.random.default_rng(seed)
    e = rng.normal(scale=scale, size=mask.shape + (num_tags,)).astype("float32")
    params = [rng.normal(size=s).astype("float32") for s in ((num_tags, num_tags), (num_tags,), (num_tags,))]
    tags = np.where(mask, rng.integers(0, num_tags, mask.shape), -1).astype("int32")
    oracle_e = np.where(mask[..., None], e, 0.0).astype("float64")
    e[~mask] = np.nan
    return e, tags, params, oracle_e, [p.astype("float64") for p in params]


def built_crf(num_tags, params, **kwargs):
    crf = kb.CRF(num_tags, **kwargs)
    crf.build((None, None, num_tags))
    crf.set_weights(params)
    return crf


def crf_outputs(crf, e, tags, mask):
    return {
        "log_z": crf.log_partition(e, mask),
        "nll": crf.negative_log_likelihood(e, tags, mask),
        "tags": crf(e, mask=mask),
        "marginals": crf.marginals(e, mask),
    }


def oracle_outputs(e, tags, mask, params, allowed=None):
    return {
        "log_z": ref.log_partition(e, mask, *params, allowed=allowed),
        "nll": ref.nll(e, tags, mask, *params, allowed=allowed),
        "tags": ref.viterbi(e, mask, *params, allowed=allowed),
        "marginals": ref.marginals(e, mask, *params, allowed=allowed),
    }


def graph_function(crf):
    """crf_outputs as a tf.function whose batch and time sizes are unknown."""
    spec = [
        tf.TensorSpec([None, None, crf.num_tags], tf.float32),
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None, None], tf.bool),
    ]
    return tf.function(lambda *args: crf_outputs(crf, *args), input_signature=spec)


def assert_matches(outputs, expected):
    for key in ("log_z", "nll", "marginals"):
        np.testing.assert_allclose(np.asarray(outputs[key]), expected[key], atol=1e-5, rtol=1e-5, err_msg=key)
    np.testing.assert_array_equal(np.asarray(outputs["tags"]), expected["tags"])


# --- the maths against enumeration -------------------------------------------


@pytest.mark.parametrize("num_tags", [2, 3, 4])
def test_matches_brute_force_eager_and_graph(num_tags):
    _, _, params, _, oracle_params = random_case(num_tags, seed=num_tags)
    crf = built_crf(num_tags, params)
    graph = graph_function(crf)  # one trace serves every batch and time size
    for seed, mask in enumerate([MASK, MASK[:, :2], MASK[:, 1:2]]):
        e, tags, _, oracle_e, _ = random_case(num_tags, seed=10 * num_tags + seed, mask=mask)
        expected = oracle_outputs(oracle_e, tags, mask, oracle_params)
        eager = crf_outputs(crf, e, tags, mask)
        assert_matches(eager, expected)
        assert_matches(graph(e, tags, mask), expected)
        assert eager["tags"].dtype == tf.int32
        # Rows with no valid position: log Z = NLL = 0, tags 0, marginals 0;
        # masked positions: tag 0 and marginals 0; valid ones' marginals sum to 1.
        empty = ~mask.any(1)
        for key in eager:
            assert np.all(np.asarray(eager[key])[empty] == 0), key
        assert np.all(np.asarray(eager["tags"])[~mask] == 0)
        assert np.all(np.asarray(eager["marginals"])[~mask] == 0)
        np.testing.assert_allclose(np.asarray(eager["marginals"]).sum(-1)[mask], 1.0, atol=1e-5)
    assert graph.experimental_get_tracing_count() == 1


def test_no_mask_is_every_position_and_extra_padding_changes_nothing():
    e, tags, params, oracle_e, oracle_params = random_case(3, seed=5)
    crf = built_crf(3, params)
    full = np.ones(MASK.shape, bool)
    assert_all_close(crf_outputs(crf, oracle_e.astype("float32"), tags.clip(0), None),
                     crf_outputs(crf, oracle_e.astype("float32"), tags.clip(0), full), atol=0, rtol=0)
    # Three more masked steps on the right, holding garbage: same values.
    longer = np.concatenate([e, np.full((5, 3, 3), 7.0, "float32")], 1)
    long_mask = np.concatenate([MASK, np.zeros((5, 3), bool)], 1)
    long_tags = np.concatenate([tags, np.full((5, 3), 99, "int32")], 1)
    out = crf_outputs(crf, longer, long_tags, long_mask)
    expected = oracle_outputs(oracle_e, tags, MASK, oracle_params)
    out = {k: np.asarray(v)[:, :5] if k in ("tags", "marginals") else v for k, v in out.items()}
    assert_matches(out, expected)


def test_zero_time_steps():
    crf = built_crf(3, [np.zeros((3, 3), "float32"), np.ones(3, "float32"), np.ones(3, "float32")])
    e = np.zeros((2, 0, 3), "float32")
    assert crf(e).shape == (2, 0)
    assert crf.marginals(e).shape == (2, 0, 3)
    assert np.all(crf.negative_log_likelihood(e, np.zeros((2, 0), "int32")).numpy() == 0)


def test_gradients_match_finite_differences_of_the_oracle():
    e, tags, params, oracle_e, oracle_params = random_case(3, seed=11)
    weights = np.array([1.0, 0.5, 2.0, 1.5, 3.0])  # one per row, to separate rows' gradients

    def oracle_loss(values):
        return float(weights @ ref.nll(values[0], tags, MASK, *values[1:]))

    variables = [tf.Variable(v) for v in [oracle_e] + oracle_params]
    with tf.GradientTape() as tape:
        nll = crf_maths.negative_log_likelihood(variables[0], tags, MASK, *variables[1:])
        loss = tf.reduce_sum(weights * nll)
    grads = tape.gradient(loss, variables)
    expected = ref.central_differences(oracle_loss, [oracle_e] + oracle_params)
    for grad, numeric in zip(grads, expected):
        np.testing.assert_allclose(grad.numpy(), numeric, atol=1e-6, rtol=1e-6)

    # The float32 layer, NaN in masked slots: finite, exact zeros there, same values.
    crf, e32 = built_crf(3, params), tf.constant(e)
    with tf.GradientTape() as tape:
        tape.watch(e32)
        loss = tf.reduce_sum(weights.astype("float32") * crf.negative_log_likelihood(e32, tags, MASK))
    layer_grads = tape.gradient(loss, [e32] + crf.trainable_weights)
    assert np.all(layer_grads[0].numpy()[~MASK] == 0)
    for got, want in zip(layer_grads, grads):
        np.testing.assert_allclose(np.nan_to_num(np.asarray(got)), want.numpy(), atol=1e-4)


# --- constraints ---------------------------------------------------------------


@pytest.mark.slow(reason="eager and graph for each constraint, ~3 s")
def test_iob2_constraints_match_enumeration_over_allowed_paths():
    # Emissions push hard towards I- tags, which an unconstrained CRF would emit
    # at the start and after O.
    e, tags, params, oracle_e, oracle_params = random_case(5, seed=3, scale=3.0)
    e[..., [2, 4]] += 4.0
    oracle_e[..., [2, 4]] += 4.0
    allowed = ref.iob2_checker(IOB2)
    gold = np.zeros_like(tags)  # all "O", an allowed path
    crf = built_crf(5, params, tags=IOB2, allowed_transitions="iob2")
    expected = oracle_outputs(oracle_e, gold, MASK, oracle_params, allowed=allowed)
    assert_matches(crf_outputs(crf, e, gold, MASK), expected)
    assert_matches(graph_function(crf)(e, gold, MASK), expected)
    # The unconstrained CRF does emit invalid paths on these emissions ...
    free = built_crf(5, params).decode(e, MASK).numpy()
    assert not all(allowed(row[m]) for row, m in zip(free, MASK))
    # ... the constrained one never does, also on many random batches.
    rng = np.random.default_rng(4)
    many = rng.normal(scale=5.0, size=(200, 7, 5)).astype("float32")
    many_mask = rng.random((200, 7)) < 0.7
    decoded = crf.decode(many, many_mask).numpy()
    assert all(allowed(row[m]) for row, m in zip(decoded, many_mask))
    transitions, start, _ = crf.chain_parameters()
    assert np.all(np.isfinite(transitions.numpy())) and transitions.numpy()[0, 2] == crf_maths.FORBIDDEN
    assert start.numpy()[2] == crf_maths.FORBIDDEN and start.numpy()[1] == params[1][1]


# --- the Keras path ---------------------------------------------------------------

NAMES = ["O", "B-X", "I-X"]
FEATURES = 4


def synthetic_batch(rows=48, time=6, seed=0):
    """Features that hint at IOB2-valid tags; rows right-padded (zeros), some
    with a hole and one left-padded."""
    rng = np.random.default_rng(seed)
    tags = ref.random_iob2_tags(rng, rows, time)
    x = np.eye(FEATURES, dtype="float32")[tags] * 2 + rng.normal(scale=0.5, size=(rows, time, FEATURES))
    lengths = rng.integers(1, time + 1, rows)
    mask = np.arange(time) < lengths[:, None]
    mask[0, :2] = False
    x = np.where(mask[..., None], x, 0.0).astype("float32")
    return x, np.where(mask, tags, -1).astype("int32"), mask


def make_tagger(allowed_transitions="iob2", run_eagerly=False):
    inputs = keras.Input((None, FEATURES))
    masked = keras.layers.Masking(0.0)(inputs)
    emissions = keras.layers.Dense(3, name="emissions")(masked)
    crf = kb.CRF(3, tags=NAMES, allowed_transitions=allowed_transitions, name="crf")
    model = keras.Model(inputs, crf(emissions))
    model.compile(
        keras.optimizers.Adam(0.05),
        loss=kb.CRFLoss(),
        metrics=[keras.metrics.Accuracy()],
        run_eagerly=run_eagerly,
    )
    return model


def expected_loss(model, x, y, mask):
    """The mean over rows of the CRF's NLL, from the Dense layer's emissions."""
    emissions = keras.Model(model.inputs[0], model.get_layer("emissions").output)(x)
    return float(np.mean(model.get_layer("crf").negative_log_likelihood(emissions, y, mask)))


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(3)
    x, y, mask = synthetic_batch()
    model = make_tagger()
    history = model.fit(x, y, epochs=8, batch_size=16, verbose=0).history["loss"]
    return model, history, (x, y, mask)


@pytest.mark.slow(reason="trains a model, ~9 s")
def test_fit_decreases_loss_and_metrics_are_masked(trained):
    model, history, (x, y, mask) = trained
    assert history[-1] < 0.5 * history[0], history
    loss, accuracy = model.evaluate(x, y, batch_size=len(x), verbose=0)
    np.testing.assert_allclose(loss, expected_loss(model, x, y, mask), rtol=1e-5)
    predicted = model.predict(x, verbose=0)
    assert predicted.dtype == np.int32 and np.all(predicted[~mask] == crf_maths.PAD_TAG)
    np.testing.assert_allclose(accuracy, np.mean(predicted[mask] == y[mask]), rtol=1e-6)
    assert accuracy > 0.9


@pytest.mark.slow(reason="saves and loads a model, ~6 s")
def test_keras_round_trip_safe_mode(trained, tmp_path):
    model, _, (x, y, mask) = trained
    path = str(tmp_path / "crf_tagger.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    # Eager calls (no tracing): the same tags, and the restored compiled loss
    # gives the same value.
    tags, loaded_tags = model(x), loaded(x)
    np.testing.assert_array_equal(loaded_tags.numpy(), tags.numpy())
    assert isinstance(loaded.loss, kb.CRFLoss)
    np.testing.assert_allclose(loaded.loss(y, loaded_tags), model.loss(y, tags), rtol=1e-6)
    np.testing.assert_allclose(loaded.loss(y, loaded_tags), expected_loss(model, x, y, mask), rtol=1e-5)
    crf = loaded.get_layer("crf")
    assert isinstance(crf, kb.CRF) and crf.tags == NAMES and crf.allowed_transitions == "iob2"


@pytest.mark.slow(reason="exports a SavedModel, ~4 s")
def test_export_saved_model_serves_the_decoded_tags(trained, tmp_path):
    model, _, _ = trained
    path = kb.export_saved_model(model, str(tmp_path / "tagger"))
    served = tf.saved_model.load(path).signatures
    x = np.random.default_rng(2).normal(size=(5, 6, FEATURES)).astype("float32")
    lengths = np.array([6, 4, 1, 0, 5], "int32")
    valid = (np.arange(6) < lengths[:, None])[..., None]
    # Served: garbage after each row's length. Keras: the same rows zero-padded.
    garbage = np.where(valid, x, 5.0).astype("float32")
    tags = served["serving_default"](inputs=tf.constant(garbage), lengths=tf.constant(lengths))["outputs"]
    expected = model.predict(np.where(valid, x, 0.0).astype("float32"), verbose=0)
    assert tags.dtype == tf.int32
    np.testing.assert_array_equal(tags.numpy(), expected)
    full = served["serving_unpadded"](inputs=tf.constant(x))["outputs"]
    np.testing.assert_array_equal(full.numpy(), model.predict(x, verbose=0))


@pytest.mark.slow(reason="builds under two policies, ~3 s")
def test_mixed_precision_recursion_in_float32():
    x, y, mask = synthetic_batch(rows=8, seed=1)
    try:
        keras.mixed_precision.set_global_policy("mixed_float16")
        model = make_tagger(allowed_transitions=None, run_eagerly=True)  # graph fit: `trained`
        explicit = kb.CRF(3, dtype="mixed_float16")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    crf = model.get_layer("crf")
    assert crf.compute_dtype == "float32" and all(w.dtype == "float32" for w in crf.weights)
    emissions = keras.Model(model.inputs[0], model.get_layer("emissions").output)(x)
    assert emissions.dtype == tf.float16
    nll = crf.negative_log_likelihood(emissions, y, mask)
    assert nll.dtype == tf.float32
    emissions32 = tf.cast(emissions, tf.float32)
    expected = crf_maths.negative_log_likelihood(emissions32, y, mask, *crf.chain_parameters())
    np.testing.assert_allclose(nll.numpy(), expected.numpy(), rtol=1e-6)
    assert explicit(tf.cast(emissions, tf.float16), mask=mask).dtype == tf.int32
    assert explicit.log_partition(emissions, mask).dtype == tf.float32
    # The first steps may overflow in float16 and be skipped (the loss scale halves).
    history = model.fit(x, y, epochs=6, verbose=0).history["loss"]
    assert np.all(np.isfinite(history)) and history[-1] < history[0]
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_float64_policy_runs_in_float64(float64_policy):
    _, tags, _, oracle_e, oracle_params = random_case(3, seed=12)
    crf = built_crf(3, oracle_params)
    assert crf.variable_dtype == "float64"
    nll = crf.negative_log_likelihood(oracle_e, tags, MASK)
    assert nll.dtype == tf.float64
    np.testing.assert_allclose(nll.numpy(), ref.nll(oracle_e, tags, MASK, *oracle_params), atol=1e-12)


@pytest.mark.slow(reason="XLA compilation, ~4 s")
def test_xla_jit_compile_on_fixed_shapes():
    e, tags, params, oracle_e, oracle_params = random_case(4, seed=8)
    crf = built_crf(4, params)

    @tf.function(jit_compile=True)
    def compiled(emissions, gold, mask):
        return crf_outputs(crf, emissions, gold, mask)

    assert_matches(compiled(e, tags, MASK), oracle_outputs(oracle_e, tags, MASK, oracle_params))


# --- the loss and bad arguments ------------------------------------------------


def test_loss_reduction_sample_weight_and_plain_tensor():
    e, tags, params, oracle_e, oracle_params = random_case(3, seed=9)
    crf = built_crf(3, params)
    decoded = crf(e, mask=MASK)
    nll = ref.nll(oracle_e, tags, MASK, *oracle_params)
    weights = np.array([1.0, 0.0, 2.0, 0.5, 3.0], "float32")
    rows = MASK.any(1).sum()  # the mean skips rows of padding alone
    np.testing.assert_allclose(kb.CRFLoss()(tags, decoded), nll.sum() / rows, rtol=1e-5)
    np.testing.assert_allclose(kb.CRFLoss(reduction=None)(tags[..., None], decoded), nll, atol=1e-5)
    np.testing.assert_allclose(kb.CRFLoss()(tags, decoded, weights), (weights * nll).sum() / rows, rtol=1e-5)
    with pytest.raises(ValueError, match="needs the output of a kb.CRF layer"):
        kb.CRFLoss()(tags, tf.constant(tags))
    with pytest.raises(ValueError, match="shape"):
        kb.CRFLoss()(np.zeros((5, 5, 3)), decoded)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(num_tags=1), ValueError, "`num_tags` must be an integer >= 2, received 1"),
        (dict(num_tags=True), ValueError, "received True"),
        (dict(num_tags=2.5), ValueError, "received 2.5"),
        (dict(num_tags=3, allowed_transitions="bio"), ValueError, "`allowed_transitions`.*'bio'"),
        (dict(num_tags=3, allowed_transitions="iob2"), ValueError, "needs `tags`"),
        (dict(num_tags=3, tags=["O", "B-X"]), ValueError, "num_tags=3 distinct names, received 2"),
        (dict(num_tags=2, tags=["O", "O"]), ValueError, "distinct"),
        (dict(num_tags=2, tags="OB"), TypeError, "`tags`"),
        (dict(num_tags=2, tags=["O", 1]), TypeError, "`tags`"),
        (dict(num_tags=2, tags=["O", "PER"], allowed_transitions="iob2"), ValueError, "'PER'"),
        (dict(num_tags=2, tags=["O", "E-PER"], allowed_transitions="iob1"), ValueError,
         "allowed_transitions='iob1' needs tag names 'O', 'B-<type>', 'I-<type>', received 'E-PER'"),
        (dict(num_tags=2, tags=["O", "U-PER"], allowed_transitions="bioes"), ValueError,
         "'S-<type>', received 'U-PER'"),
        (dict(num_tags=2, tags=["O", "B-"], allowed_transitions="bioes"), ValueError, "received 'B-'"),
        (dict(num_tags=2, tags=["O", "S-X"], allowed_transitions="bilou"), ValueError,
         "`allowed_transitions` must be one of .*'bioes'.*received 'bilou'"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        kb.CRF(**kwargs)


def test_bad_emissions():
    crf = kb.CRF(3)
    with pytest.raises(ValueError, match=r"rank 3 .* received shape \(2, 3\)"):
        crf(np.zeros((2, 3), "float32"))
    with pytest.raises(ValueError, match=r"num_tags=3 .* received shape \(2, 4, 5\)"):
        crf(np.zeros((2, 4, 5), "float32"))
    with pytest.raises(ValueError, match="num_tags=3"):
        crf(keras.Input((None, 4)))
    with pytest.raises(TypeError, match="float emissions, received dtype int32"):
        crf.decode(tf.zeros((2, 4, 3), tf.int32))
    with pytest.raises(ValueError, match="mask"):
        crf(np.zeros((2, 4, 3), "float32"), mask=np.ones((2, 5), bool))
