"""kb.CRF and kb.CRFLoss on every backend against the brute-force NumPy CRF.

Runs on TensorFlow, JAX and PyTorch (`KERAS_BACKEND`; CI runs all three):
log Z, NLL, Viterbi tags and marginals for every mask pattern (right and
left padding, holes, fully masked rows), eagerly and traced; gradients of
the NLL by the backend's autodiff against central differences of the
oracle; and the Keras path: `fit` with `kb.CRFLoss` (whose scores ride on
the output tensor, also as JAX tracers), `evaluate`, `predict` and a
`.keras` round trip.
"""

import keras
import numpy as np
import pytest

import crf_reference as ref
import keras_birnn as kb
from helpers import MASK_5x5_HOLES, PADDING_PATTERNS_4x6, assert_all_close, keras_round_trip
from keras_birnn.crf import maths as crf_maths
from backend_harness import BACKEND, to_numpy, traced, value_and_gradients

K = 3
# Each 4x6 pattern (right and left padding, holes, fully masked rows, ...)
# in one batch, so that one trace serves them all (JAX compiles per shape);
# then the CRF's own 5x5 mask.
PATTERNS = list(PADDING_PATTERNS_4x6)
MASKS = {"4x6_patterns": np.concatenate([PADDING_PATTERNS_4x6[name] for name in PATTERNS]),
         "crf_holes": MASK_5x5_HOLES}

def random_case(mask, seed=0, num_tags=K):
    """float32 emissions (NaN in masked slots), gold tags (-1 in masked
    slots) and float32 chain parameters; the float64 copies for the oracle
    (emissions zeroed in masked slots)."""
    rng = np.random.default_rng(seed)
    e = rng.normal(scale=1.5, size=mask.shape + (num_tags,)).astype("float32")
    params = [rng.normal(size=s).astype("float32") for s in ((num_tags, num_tags), (num_tags,), (num_tags,))]
    tags = np.where(mask, rng.integers(0, num_tags, mask.shape), -1).astype("int32")
    oracle_e = np.where(mask[..., None], e, 0.0).astype("float64")
    e[~mask] = np.nan
    return e, tags, params, oracle_e, [p.astype("float64") for p in params]


def built_crf(params, **kwargs):
    crf = kb.CRF(len(params[1]), **kwargs)
    crf.build((None, None, len(params[1])))
    crf.set_weights(params)
    return crf


class NegativeLogLikelihood(keras.layers.Layer):
    """The CRF's NLL of fixed gold tags, a layer for `portable.value_and_gradients`."""

    def __init__(self, crf, tags, **kwargs):
        super().__init__(**kwargs)
        self.crf, self.tags = crf, tags
        self.supports_masking = True  # the mask is the CRF's, passed on explicitly
        self.built = True  # the CRF is

    def compute_mask(self, inputs, mask=None):
        return None

    def call(self, emissions, mask=None):
        return self.crf.negative_log_likelihood(emissions, self.tags, mask)


class AllOutputs(NegativeLogLikelihood):
    """The CRF's tags, log Z, NLL of fixed gold tags and marginals from one
    call, so that `portable.traced` traces them all."""

    def call(self, emissions, mask=None):
        return {
            "tags": self.crf(emissions, mask=mask),
            "log_z": self.crf.log_partition(emissions, mask),
            "nll": super().call(emissions, mask),
            "marginals": self.crf.marginals(emissions, mask),
        }


class NBestOutputs(NegativeLogLikelihood):
    """The CRF's k best paths and scores, their log-probabilities and the
    log-probability of fixed tags from one call (`tags` here: the k)."""

    def call(self, emissions, mask=None):
        paths, scores = self.crf.top_k(emissions, mask, k=self.tags)
        _, log_p = self.crf.top_k(emissions, mask, k=self.tags, log_probabilities=True)
        return {"paths": paths, "scores": scores, "log_p": log_p,
                "best_log_p": self.crf.path_log_probability(emissions, paths[:, 0], mask),
                "decoded": self.crf.decode(emissions, mask)}


def oracle(e, tags, mask, params, allowed=None):
    return {
        "tags": ref.viterbi(e, mask, *params, allowed=allowed),
        "log_z": ref.log_partition(e, mask, *params, allowed=allowed),
        "nll": ref.nll(e, tags, mask, *params, allowed=allowed),
        "marginals": ref.marginals(e, mask, *params, allowed=allowed),
    }


def assert_matches(outputs, expected, rows=None):
    """Every output as the oracle's; `rows` names the rows' patterns."""
    rows = rows or {"": slice(None)}
    assert np.asarray(outputs["tags"]).dtype == np.int32
    for pattern, part in rows.items():
        for key in ("log_z", "nll", "marginals"):
            np.testing.assert_allclose(np.asarray(outputs[key])[part], expected[key][part], atol=1e-5, rtol=1e-5,
                                       err_msg=f"{key} {pattern}")
        np.testing.assert_array_equal(np.asarray(outputs["tags"])[part], expected["tags"][part], err_msg=pattern)


# --- the maths against enumeration -------------------------------------------


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_matches_oracle_eager_and_traced(mask_name):
    mask = MASKS[mask_name]
    e, tags, params, oracle_e, oracle_params = random_case(mask, seed=len(mask_name))
    layer = AllOutputs(built_crf(params), tags)
    expected = oracle(oracle_e, tags, mask, oracle_params)
    rows = {name: slice(4 * i, 4 * i + 4) for i, name in enumerate(PATTERNS)} if mask_name == "4x6_patterns" else None
    eager = to_numpy(layer(e, mask=mask))
    assert_matches(eager, expected, rows)
    assert_matches(traced(layer, e, mask), expected, rows)
    # Masked positions: tag 0 and marginals 0; valid ones' marginals sum to 1;
    # rows with no valid position: log Z = NLL = 0.
    assert np.all(eager["tags"][~mask] == crf_maths.PAD_TAG) and np.all(eager["marginals"][~mask] == 0)
    np.testing.assert_allclose(eager["marginals"].sum(-1)[mask], 1.0, atol=1e-5)
    empty = ~mask.any(1)
    assert np.all(eager["log_z"][empty] == 0) and np.all(eager["nll"][empty] == 0)


def test_iob2_constraints_and_no_mask():
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    e, tags, params, oracle_e, oracle_params = random_case(MASK_5x5_HOLES, seed=3, num_tags=5)
    e[..., [2, 4]] += 4.0  # towards I- tags, which the constraints forbid at the start and after O
    oracle_e[..., [2, 4]] += 4.0
    gold = np.zeros_like(tags)  # all "O", an allowed path
    crf = built_crf(params, tags=names, allowed_transitions="iob2")
    expected = oracle(oracle_e, gold, MASK_5x5_HOLES, oracle_params, allowed=ref.iob2_checker(names))
    assert_matches(to_numpy(AllOutputs(crf, gold)(e, mask=MASK_5x5_HOLES)), expected)
    # No mask: every position valid, the same numbers as an all-True mask.
    full = np.ones(MASK_5x5_HOLES.shape, bool)
    dense = oracle_e.astype("float32")
    assert_all_close(to_numpy([crf(dense), crf.log_partition(dense)]),
                     to_numpy([crf(dense, mask=full), crf.log_partition(dense, full)]), atol=0, rtol=0)


# scheme -> (tag names, mask); masks small enough to enumerate.
SCHEME_CASES = {
    None: (["t0", "t1", "t2"], MASKS["4x6_patterns"]),
    "iob2": (ref.EXAMPLE_TAGS["iob2"], MASK_5x5_HOLES),
    "iob1": (ref.EXAMPLE_TAGS["iob1"], MASK_5x5_HOLES),
    "bioes": (ref.EXAMPLE_TAGS["bioes"], MASK_5x5_HOLES[:, 1:]),
}


@pytest.mark.parametrize("scheme", ["iob2", "iob1", "bioes", None])
def test_top_k_and_path_log_probability_eager_and_traced(scheme):
    """k=4 exceeds the paths of the 1-position rows (sentinels); ties are
    judged by scores and path sets (`crf_reference.assert_top_k`)."""
    names, mask = SCHEME_CASES[scheme]
    e, _, params, oracle_e, oracle_params = random_case(mask, seed=len(str(scheme)), num_tags=len(names))
    crf = built_crf(params, tags=names if scheme else None, allowed_transitions=scheme)
    allowed = ref.CHECKERS[scheme](names) if scheme else None
    layer, k = NBestOutputs(crf, 4), 4
    log_z = ref.log_partition(oracle_e, mask, *oracle_params, allowed=allowed)
    for outputs in (to_numpy(layer(e, mask=mask)), traced(layer, e, mask)):
        ref.assert_top_k(outputs["paths"], outputs["scores"], oracle_e, mask, *oracle_params, k=k, allowed=allowed)
        np.testing.assert_allclose(outputs["log_p"], outputs["scores"] - log_z[:, None], atol=1e-4)
        best = np.asarray(outputs["paths"])[:, 0]
        np.testing.assert_allclose(outputs["best_log_p"], -ref.nll(oracle_e, best, mask, *oracle_params, allowed=allowed),
                                   atol=1e-4)
        np.testing.assert_array_equal(best, outputs["decoded"])  # top 1 is decode's path
    # No mask: every position valid, as an all-True mask.
    dense, full = oracle_e.astype("float32"), np.ones(mask.shape, bool)
    assert_all_close(to_numpy(crf.top_k(dense, k=k)), to_numpy(crf.top_k(dense, full, k=k)), atol=0, rtol=0)


def test_zero_time_steps():
    crf = built_crf([np.zeros((K, K), "float32"), np.ones(K, "float32"), np.ones(K, "float32")])
    e = np.zeros((2, 0, K), "float32")
    assert tuple(crf(e).shape) == (2, 0)
    assert tuple(crf.marginals(e).shape) == (2, 0, K)
    assert np.all(to_numpy(crf.negative_log_likelihood(e, np.zeros((2, 0), "int32"))) == 0)


# --- gradients ----------------------------------------------------------------


def test_gradients_match_central_differences_of_the_oracle():
    mask = MASK_5x5_HOLES
    e, tags, params, oracle_e, oracle_params = random_case(mask, seed=11)
    row_weights = np.array([1.0, 0.5, 2.0, 1.5, 3.0])  # one per row, to tell rows' gradients apart

    def oracle_loss(values):
        return float(row_weights @ ref.nll(values[0], tags, mask, *values[1:]))

    expected = ref.central_differences(oracle_loss, [oracle_e] + oracle_params)
    layer = NegativeLogLikelihood(built_crf(params), tags)
    weights = keras.ops.convert_to_tensor(row_weights.astype("float32"))
    value, gradients = value_and_gradients(layer, lambda nll: keras.ops.sum(weights * nll), e, mask)
    np.testing.assert_allclose(value, oracle_loss([oracle_e] + oracle_params), rtol=1e-5)
    # Order: emissions, then the CRF's transitions, start, end. The NaN in
    # masked emission slots reaches no gradient: exact zeros there.
    assert np.all(gradients[0][~mask] == 0)
    for got, want in zip(gradients, expected):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


# --- the Keras path ---------------------------------------------------------------

NAMES = ["O", "B-X", "I-X"]
FEATURES = 4


def synthetic_batch(rows=32, time=6, seed=0):
    """Features that hint at IOB2-valid tags; rows right-padded (zeros), one
    left-padded."""
    rng = np.random.default_rng(seed)
    tags = ref.random_iob2_tags(rng, rows, time)
    x = np.eye(FEATURES, dtype="float32")[tags] * 2 + rng.normal(scale=0.5, size=(rows, time, FEATURES))
    mask = np.arange(time) < rng.integers(1, time + 1, rows)[:, None]
    mask[0, :2] = False
    x = np.where(mask[..., None], x, 0.0).astype("float32")
    return x, np.where(mask, tags, -1).astype("int32"), mask


def make_tagger():
    inputs = keras.Input((None, FEATURES))
    emissions = keras.layers.Dense(K, name="emissions")(keras.layers.Masking(0.0)(inputs))
    crf = kb.CRF(K, tags=NAMES, allowed_transitions="iob2", name="crf")
    model = keras.Model(inputs, crf(emissions))
    model.compile(keras.optimizers.Adam(0.05), loss=kb.CRFLoss(), metrics=[keras.metrics.Accuracy()])
    return model


def mean_nll(model, x, y, mask):
    """The mean over rows of the CRF's NLL, from the Dense layer's emissions."""
    emissions = keras.Model(model.inputs[0], model.get_layer("emissions").output)(x)
    return float(np.mean(to_numpy(model.get_layer("crf").negative_log_likelihood(emissions, y, mask))))


def test_fit_evaluate_predict_and_keras_file(tmp_path):
    keras.utils.set_random_seed(3)
    x, y, mask = synthetic_batch()
    model = make_tagger()
    history = model.fit(x, y, epochs=6, batch_size=16, verbose=0).history["loss"]
    assert history[-1] < 0.5 * history[0], history
    loss, accuracy = model.evaluate(x, y, batch_size=len(x), verbose=0)
    np.testing.assert_allclose(loss, mean_nll(model, x, y, mask), rtol=1e-5)
    predicted = model.predict(x, verbose=0)
    assert predicted.dtype == np.int32 and np.all(predicted[~mask] == crf_maths.PAD_TAG)
    np.testing.assert_allclose(accuracy, np.mean(predicted[mask] == y[mask]), rtol=1e-6)
    # The .keras file: identical tags, and the restored compiled loss gives
    # the same value on eager outputs (tensors that take the scores as an attribute).
    loaded = keras_round_trip(model, str(tmp_path / "crf_tagger.keras"), x)
    assert isinstance(loaded.loss, kb.CRFLoss)
    assert loaded.get_layer("crf").tags == NAMES and loaded.get_layer("crf").allowed_transitions == "iob2"
    np.testing.assert_allclose(to_numpy(loaded.loss(y, loaded(x))), loss, rtol=1e-5)


def test_loss_reduction_sample_weight_and_plain_tensor():
    e, tags, params, oracle_e, oracle_params = random_case(MASK_5x5_HOLES, seed=9)
    decoded = built_crf(params)(e, mask=MASK_5x5_HOLES)
    nll = ref.nll(oracle_e, tags, MASK_5x5_HOLES, *oracle_params)
    weights = np.array([1.0, 0.0, 2.0, 0.5, 3.0], "float32")
    rows = MASK_5x5_HOLES.any(1).sum()  # the mean skips rows of padding alone
    np.testing.assert_allclose(to_numpy(kb.CRFLoss()(tags, decoded)), nll.sum() / rows, rtol=1e-5)
    np.testing.assert_allclose(to_numpy(kb.CRFLoss(reduction=None)(tags[..., None], decoded)), nll, atol=1e-5)
    np.testing.assert_allclose(to_numpy(kb.CRFLoss()(tags, decoded, weights)), (weights * nll).sum() / rows, rtol=1e-5)
    with pytest.raises(ValueError, match="needs the output of a kb.CRF layer"):
        kb.CRFLoss()(tags, keras.ops.convert_to_tensor(tags))


def test_fit_of_a_model_not_ending_in_the_crf_names_the_fix():
    """Keras builds the compiled loss on placeholders first (JAX, PyTorch),
    which the loss lets through; the first real step still refuses."""
    inputs = keras.Input((None, FEATURES))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs)[..., 0])
    model.compile("adam", loss=kb.CRFLoss())
    x, y, _ = synthetic_batch(rows=4)
    with pytest.raises(ValueError, match="needs the output of a kb.CRF layer"):
        model.fit(x, y, epochs=1, verbose=0)


def test_symbolic_output_and_no_tensorflow_elsewhere():
    tags = kb.CRF(K)(keras.Input((None, K)))
    assert tags.dtype == "int32" and tuple(tags.shape) == (None, None)
    # The module imports TensorFlow only for the TensorFlow backend.
    assert hasattr(crf_maths, "tf") == (BACKEND == "tensorflow")
