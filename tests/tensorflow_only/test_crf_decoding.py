"""n-best Viterbi (`kb.CRF.top_k`, `crf_decoding.viterbi_top_k`), path
log-probabilities and the tagging schemes (`crf_constraints`) on
TensorFlow, against brute-force enumeration (crf_reference.py): eagerly
and in a `tf.function` of unknown batch and time, under right and left
padding, holes, rows with no valid position and no mask; then a SavedModel
and a LiteRT flatbuffer serving the n-best list."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import crf_reference as ref
import keras_birnn as kb
from helpers import MASK_5x5_HOLES, PADDING_PATTERNS_4x6
from keras_birnn.crf import maths as crf_maths
from keras_birnn.crf import decoding as crf_decoding

PATTERNS = np.concatenate(list(PADDING_PATTERNS_4x6.values()))  # [24, 6]: every padding kind
IOB, BIOES = ref.EXAMPLE_TAGS["iob2"], ref.EXAMPLE_TAGS["bioes"]
# scheme -> (tag names, mask, checker); masks small enough to enumerate.
CASES = {
    None: (["t0", "t1", "t2"], PATTERNS, None),
    "iob2": (IOB, MASK_5x5_HOLES, ref.iob2_checker),
    "iob1": (IOB, MASK_5x5_HOLES, ref.iob1_checker),
    "bioes": (BIOES, MASK_5x5_HOLES[:, 1:], ref.bioes_checker),
}


def random_case(num_tags, mask, seed=0, scale=2.0):
    """float32 emissions (NaN in masked slots) and chain parameters, and
    their float64 copies for the oracle (emissions zeroed where masked)."""
    rng = np.random.default_rng(seed)
    e = rng.normal(scale=scale, size=mask.shape + (num_tags,)).astype("float32")
    params = [rng.normal(size=s).astype("float32") for s in ((num_tags, num_tags), (num_tags,), (num_tags,))]
    oracle_e = np.where(mask[..., None], e, 0.0)
    e[~mask] = np.nan
    return e, params, oracle_e, [p.astype("float64") for p in params]


def built_crf(names, params, scheme=None):
    crf = kb.CRF(len(names), tags=names if scheme else None, allowed_transitions=scheme)
    crf.build((None, None, len(names)))
    crf.set_weights(params)
    return crf


def graph_top_k(crf, k, log_probabilities=False):
    """`crf.top_k` in a tf.function whose batch and time sizes are unknown."""
    spec = [tf.TensorSpec([None, None, crf.num_tags], tf.float32), tf.TensorSpec([None, None], tf.bool)]
    return tf.function(lambda e, m: crf.top_k(e, m, k=k, log_probabilities=log_probabilities),
                       input_signature=spec)


def oracle_case(scheme, seed=0):
    names, mask, checker = CASES[scheme]
    e, params, oracle_e, oracle_params = random_case(len(names), mask, seed=seed)
    return built_crf(names, params, scheme), e, mask, oracle_e, oracle_params, checker and checker(names)


# --- n-best against enumeration --------------------------------------------------


@pytest.mark.parametrize("scheme", ["iob2", "iob1", "bioes", None])
def test_top_k_matches_enumeration_eager_and_graph(scheme):
    crf, e, mask, oracle_e, oracle_params, allowed = oracle_case(scheme, seed=len(str(scheme)))
    # k=4: more than the paths of some 1-position rows (sentinels); 40: more than most rows'.
    for k in (1, 4, 40):
        graph = graph_top_k(crf, k)
        for paths, scores in (crf.top_k(e, mask, k=k), graph(e, mask)):
            ref.assert_top_k(paths, scores, oracle_e, mask, *oracle_params, k=k, allowed=allowed)
        # One trace serves another batch and time size.
        part = mask[1:3, 1:]
        paths, scores = graph(e[1:3, 1:], part)
        ref.assert_top_k(paths, scores, oracle_e[1:3, 1:], part, *oracle_params, k=k, allowed=allowed)
        assert graph.experimental_get_tracing_count() == 1


def test_no_mask_pure_function_and_zero_time_steps():
    crf, _, mask, oracle_e, oracle_params, _ = oracle_case(None, seed=5)
    dense = oracle_e.astype("float32")  # every position valid
    full = np.ones(mask.shape, bool)
    paths, scores = crf.top_k(dense, k=6)
    ref.assert_top_k(paths, scores, dense.astype("float64"), full, *oracle_params, k=6)
    same = crf_decoding.viterbi_top_k(dense, None, *crf.chain_parameters(), k=6)
    np.testing.assert_array_equal(paths.numpy(), same[0].numpy())
    np.testing.assert_array_equal(scores.numpy(), same[1].numpy())
    # No time step: every row has the empty path (score 0), then sentinels.
    paths, scores = crf.top_k(np.zeros((2, 0, 3), "float32"), k=3)
    assert paths.shape == (2, 3, 0) and paths.dtype == tf.int32
    np.testing.assert_array_equal(scores.numpy(), [[0, -np.inf, -np.inf]] * 2)


@pytest.mark.parametrize("scheme", [None, "bioes", "iob2", "iob1"])
def test_top_1_is_decode(scheme):
    names = CASES[scheme][0]
    rng = np.random.default_rng(7)
    e = rng.normal(scale=3.0, size=(64, 7, len(names))).astype("float32")
    mask = rng.random((64, 7)) < 0.7
    crf = built_crf(names, [rng.normal(size=s).astype("float32") for s in ((len(names),) * 2, (len(names),), (len(names),))],
                    scheme)
    paths, scores = crf.top_k(e, mask, k=1)
    np.testing.assert_array_equal(paths.numpy()[:, 0], crf.decode(e, mask).numpy())
    best = crf_maths.path_score(e, paths[:, 0], mask, *crf.chain_parameters())
    np.testing.assert_allclose(scores.numpy()[:, 0], best.numpy(), rtol=1e-5, atol=1e-4)


def test_log_probabilities_and_path_log_probability():
    crf, e, mask, oracle_e, oracle_params, allowed = oracle_case("iob2", seed=9)
    log_z = ref.log_partition(oracle_e, mask, *oracle_params, allowed=allowed)
    for function in (crf.top_k, graph_top_k(crf, 48, log_probabilities=True)):
        paths, log_p = (function(e, mask, k=48, log_probabilities=True) if function == crf.top_k
                        else function(e, mask))
        _, want = ref.top_k(oracle_e, mask, *oracle_params, k=48, allowed=allowed)
        np.testing.assert_allclose(log_p.numpy(), want - log_z[:, None], atol=1e-4)
    # The 41 allowed paths of each 3-position row all fit in 48: they sum to 1.
    total = np.exp(log_p.numpy()).sum(1)
    np.testing.assert_allclose(total[[2, 3]], 1.0, rtol=1e-5)
    np.testing.assert_array_equal(total[4], 1.0)  # the empty row: one path, log p = 0
    # Any path, e.g. each of the n-best: score - log Z, also in a graph.
    for rank in (0, 1, 5):
        tags = paths[:, rank].numpy()
        want = -ref.nll(oracle_e, tags, mask, *oracle_params, allowed=allowed)
        got = crf.path_log_probability(e, tags, mask)
        np.testing.assert_allclose(got.numpy(), want, atol=1e-4, rtol=1e-5)
        listed = log_p.numpy()[:, rank] > -np.inf  # the empty row lists one path
        np.testing.assert_allclose(got.numpy()[listed], log_p.numpy()[listed, rank], atol=1e-4, rtol=1e-5)
    pure = crf_decoding.path_log_probability(e, tags, mask, *crf.chain_parameters())
    np.testing.assert_allclose(pure.numpy(), want, atol=1e-4, rtol=1e-5)


def test_schemes_forbid_exactly_what_they_say():
    rng = np.random.default_rng(3)
    params = [rng.normal(size=s).astype("float32") for s in ((9, 9), (9,), (9,))]
    transitions, start, end = (x.numpy() for x in built_crf(BIOES, params, "bioes").chain_parameters())
    forbidden = crf_maths.FORBIDDEN
    # B-A is followed only by I-A / E-A; E-A not by I-A; ends only on O, E-*, S-*.
    assert [BIOES[j] for j in np.flatnonzero(transitions[1] != forbidden)] == ["I-A", "E-A"]
    assert transitions[3, 2] == forbidden and transitions[3, 5] == params[0][3, 5]
    assert [BIOES[j] for j in np.flatnonzero(end != forbidden)] == ["O", "E-A", "S-A", "E-B", "S-B"]
    assert [BIOES[j] for j in np.flatnonzero(start != forbidden)] == ["O", "B-A", "S-A", "B-B", "S-B"]
    # IOB2 leaves every end allowed (an I-X may end a sentence); IOB1 forbids B-X first.
    iob_params = [p[:5, :5] if p.ndim == 2 else p[:5] for p in params]
    _, _, iob2_end = built_crf(IOB, iob_params, "iob2").chain_parameters()
    np.testing.assert_array_equal(iob2_end.numpy(), iob_params[2])
    iob1_transitions, iob1_start, _ = (x.numpy() for x in built_crf(IOB, iob_params, "iob1").chain_parameters())
    assert [IOB[j] for j in np.flatnonzero(iob1_start == forbidden)] == ["B-A", "B-B"]
    assert [IOB[i] for i in np.flatnonzero(iob1_transitions[:, 1] != forbidden)] == ["B-A", "I-A"]


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(k=0), ValueError, "`k` must be an integer >= 1, received 0"),
        (dict(k=2.5), ValueError, "received 2.5"),
        (dict(k=True), ValueError, "received True"),
        (dict(k=2, log_probabilities="yes"), TypeError, "`log_probabilities`.*'yes'"),
    ],
)
def test_bad_top_k_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        kb.CRF(3).top_k(np.zeros((1, 2, 3), "float32"), **kwargs)


# --- serving ------------------------------------------------------------------------

F = 4


class NBest(kb.CRF):
    """A CRF whose call serves its n-best list: paths laid out `[batch,
    time, k]` (export's lengths probe reads axis 1 of per-position outputs
    as time) and scores `[batch, k]`."""

    K_BEST = 4  # more than the 3 allowed paths of a 1-token row: a sentinel

    def call(self, emissions, mask=None):
        paths, scores = self.top_k(emissions, mask, k=self.K_BEST)
        return {"paths": keras.ops.transpose(paths, (0, 2, 1)), "scores": scores}

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_spec(self, emissions, mask=None):
        batch, time = emissions.shape[:2]
        return {"paths": keras.KerasTensor((batch, time, self.K_BEST), "int32"),
                "scores": keras.KerasTensor((batch, self.K_BEST), "float32")}


def n_best_model():
    inputs = keras.Input((None, F))
    emissions = keras.layers.Dense(len(IOB))(inputs)
    crf = NBest(len(IOB), tags=IOB, allowed_transitions="iob2", name="crf")
    model = keras.Model(inputs, crf(emissions))
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.weights])
    return model


def eager_n_best(model, x, mask):
    emissions = model.layers[1](x)
    paths, scores = model.get_layer("crf").top_k(emissions, mask, k=NBest.K_BEST)
    return np.transpose(paths.numpy(), (0, 2, 1)), scores.numpy()


@pytest.mark.slow(reason="exports a SavedModel, ~5 s")
def test_saved_model_serves_the_n_best_list(tmp_path):
    model = n_best_model()
    served = tf.saved_model.load(kb.export_saved_model(model, str(tmp_path / "n_best"))).signatures
    x = np.random.default_rng(1).normal(size=(4, 6, F)).astype("float32")
    lengths = np.array([6, 3, 1, 0], "int32")
    mask = np.arange(6) < lengths[:, None]
    out = served["serving_default"](inputs=tf.constant(x), lengths=tf.constant(lengths))
    paths, scores = eager_n_best(model, x, mask)
    np.testing.assert_array_equal(out["paths"].numpy(), paths)
    np.testing.assert_allclose(out["scores"].numpy(), scores, rtol=1e-6)
    assert scores[3, 0] == 0 and np.all(scores[3, 1:] == -np.inf) and scores[2, 3] == -np.inf


@pytest.mark.slow(reason="a LiteRT conversion, ~10 s")
def test_litert_converts_the_n_best_list_to_builtin_ops(tmp_path):
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    model = n_best_model()
    path = kb.export_tflite(model, str(tmp_path / "n_best.tflite"), batch_size=4)
    ops = kb.flatbuffer_ops(path)
    assert "TOPK_V2" in ops and not any("FLEX" in op.upper() or "CUSTOM" in op.upper() for op in ops), ops
    interpreter = litert.Interpreter(model_path=path)
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    for time in (6, 9):
        x = np.random.default_rng(time).normal(size=(4, time, F)).astype("float32")
        lengths = np.array([time, 3, 1, 0], "int32")
        interpreter.resize_tensor_input(index["inputs"], x.shape)
        interpreter.allocate_tensors()
        interpreter.set_tensor(index["inputs"], x)
        interpreter.set_tensor(index["lengths"], lengths)
        interpreter.invoke()
        got = {tuple(d["shape"]): interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}
        paths, scores = eager_n_best(model, x, np.arange(time) < lengths[:, None])
        np.testing.assert_array_equal(got[(4, time, NBest.K_BEST)], paths)
        # XNNPACK clamps float outputs to float32's range: the sentinel comes out -3.4e38.
        sentinel = got[(4, NBest.K_BEST)] <= np.finfo(np.float32).min
        assert np.array_equal(sentinel, scores == -np.inf) and sentinel[2, 3] and sentinel[3, 1:].all()
        np.testing.assert_allclose(got[(4, NBest.K_BEST)][~sentinel], scores[~sentinel], rtol=1e-5)
