"""Reliability under a server's load (issue 41, "Concurrency and reliability"
and "One bounded, thread-safe cache").

- One loaded model, a `.keras` file and a SavedModel, called from 8 threads
  at once with mixed batch and time sizes, gives bit for bit the numbers of
  the same calls run one after another.
- A `tf.data` pipeline mapping a layer with parallel calls gives bit for
  bit the serial pipeline's numbers.
- Each thread traces under its own settings: a `kb.xla_disabled()` block
  in one thread does not change what another thread traces.
- 2,000 distinct (batch, time) shapes served eagerly keep the loop cache
  and a layer's shape count within their limits, and the process's memory
  within a stated bound.

Why exact: every request runs the same kernels on the same inputs whatever
runs beside it (TensorFlow's kernels split their work by shape, never by
load), so any difference is a bug (state shared between calls, a cache
filled by two threads with different loops), not rounding. The oracle for
the numbers themselves is the model as built, before saving (within float
rounding where another path may run, e.g. a graph for an eager call).

The layers here have sizes no other test file uses (7 units over 5
features), so their loops are not yet in the process-wide loop caches when
the first test of this file runs: the first threads find those caches cold.
"""

import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn.export.saved_model import INPUTS_KEY, LENGTHS_KEY, SIGNATURE_DEFAULT

F, U, HEAD = 5, 7, 3
THREADS = 8
# 24 requests: every batch size with every time size, twice (in another
# order the second time), each row right padded to its own length.
BATCHES, TIMES = (1, 3, 8), (5, 9, 17, 30)
N_REQUESTS = 24
BARRIER_TIMEOUT_S = 120  # a broken barrier fails the test instead of hanging it


# --- requests and the model ---------------------------------------------------------------------


def _requests(seed, garbage_in_padding=False):
    """`N_REQUESTS` (x, lengths) pairs: x `[batch, time, F]` float32, right
    padded (zeros, the model's `Masking` value, or garbage where the
    signature's `lengths` says where the padding starts); the first row of
    each batch full, the others of random lengths >= 1."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(N_REQUESTS):
        batch, steps = BATCHES[i % len(BATCHES)], TIMES[(i + i // 12) % len(TIMES)]
        x = rng.normal(size=(batch, steps, F)).astype("float32")
        lengths = rng.integers(1, steps + 1, size=batch).astype("int32")
        lengths[0] = steps
        padded = np.arange(steps)[None, :] >= lengths[:, None]
        x[padded] = rng.normal(size=(int(padded.sum()), F)) if garbage_in_padding else 0.0
        requests.append((x, lengths))
    assert len({x.shape[:2] for x, _ in requests}) == len(BATCHES) * len(TIMES)
    return requests


def make_model():
    """A sequence tagger and a sentence classifier in one: Masking ->
    kb.Bidirectional(GRU, return_sequences) -> (the per-step outputs, and a
    masked mean pooled into a Dense head). Weights perturbed away from their
    initialisers (zero biases included)."""
    features = keras.Input((None, F), name="features")
    masked = keras.layers.Masking(0.0)(features)
    steps = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)(masked)
    sentence = keras.layers.Dense(HEAD, activation="softmax")(kb.MaskedMeanPooling()(steps))
    model = keras.Model(features, [steps, sentence], name="tagger_and_classifier")
    rng = np.random.default_rng(3)
    model.set_weights([w + rng.uniform(-0.4, 0.4, w.shape).astype(w.dtype) for w in model.get_weights()])
    return model


def _numpy(outputs):
    return [np.asarray(y) for y in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]


def concurrently(call, requests):
    """`call(*request)` for every request from `THREADS` threads at once.

    A barrier holds each round of `THREADS` requests until all of them are
    about to be called, so the calls overlap (the barrier lets a round go
    only when every worker holds one request: `len(requests)` is a multiple
    of `THREADS`). Returns the results in request order and the most calls
    seen running at once. A call that raises breaks the barrier, so the
    first error is reported at once."""
    assert len(requests) % THREADS == 0
    barrier = threading.Barrier(THREADS)
    lock = threading.Lock()
    running, most = [0], [0]

    def one(request):
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return call(*request)
        except BaseException:
            barrier.abort()  # the other rounds fail at once instead of waiting out the timeout
            raise
        finally:
            with lock:
                running[0] -= 1

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(one, requests))
    return results, most[0]


def assert_same_numbers(actual, expected):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert len(a) == len(e), i
        for a_out, e_out in zip(a, e):
            np.testing.assert_array_equal(a_out, e_out, err_msg=f"request {i}")


def assert_close_numbers(actual, expected, atol):
    for i, (a, e) in enumerate(zip(actual, expected)):
        for a_out, e_out in zip(a, e):
            np.testing.assert_allclose(a_out, e_out, atol=atol, rtol=0, err_msg=f"request {i}")


@pytest.fixture(scope="module")
def built():
    """The model as built, and its outputs on every request (the oracle)."""
    keras.utils.set_random_seed(41)
    model = make_model()
    requests = _requests(seed=41)
    return model, requests, [_numpy(model(x, training=False)) for x, _ in requests]


@pytest.fixture(scope="module")
def keras_file(built, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("reliability") / "model.keras")
    built[0].save(path)
    return path


# --- 1. one loaded model, 8 threads ---------------------------------------------------------------


def _eager(model):
    return lambda x, lengths: _numpy(model(x, training=False))


def _traced(model):
    # A server's function: retraced for new shapes, then relaxed to unknown
    # batch and time sizes.
    serve = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    return lambda x, lengths: _numpy(serve(tf.constant(x)))


def _predict_on_batch(model):
    return lambda x, lengths: _numpy(model.predict_on_batch(x))


@pytest.mark.parametrize("calling", [_eager, _traced, _predict_on_batch],
                         ids=["eager", "tf_function", "predict_on_batch"])
def test_keras_file_served_from_8_threads_gives_the_serial_numbers(built, keras_file, calling):
    """A `.keras` file loaded once (the package registers its classes: no
    custom objects), called from 8 threads with 12 shapes. The threads come
    first, on a freshly loaded model (its functions traced by threads racing
    each other); the same calls one after another then give the same
    numbers, bit for bit, and the model as built gives them within float
    rounding."""
    _, requests, expected = built
    model = keras.saving.load_model(keras_file)
    call = calling(model)
    threaded, overlap = concurrently(call, requests)
    serial = [call(*request) for request in requests]
    assert overlap >= 2, overlap
    assert_same_numbers(threaded, serial)
    # The oracle: the model before saving (bit for bit in this build; the
    # tolerance leaves room for a graph running other kernels than eager ops).
    assert_close_numbers(serial, expected, atol=1e-6)


@pytest.fixture(scope="module")
def saved_model(built, tmp_path_factory):
    model = built[0]
    return kb.export_saved_model(model, str(tmp_path_factory.mktemp("reliability") / "served"), version=1)


@pytest.mark.slow(reason="exports a SavedModel and serves it, ~7 s")
def test_saved_model_signature_served_from_8_threads_gives_the_serial_numbers(built, saved_model):
    """`kb.export_saved_model`'s serving signature, loaded by plain
    `tf.saved_model.load`, called from 8 threads with `lengths` and garbage
    in the padded slots (the signature overwrites them with the `Masking`
    value): bit for bit the serial numbers, and within float rounding those
    of the model as built on the zero-padded batch."""
    model = built[0]
    requests = _requests(seed=42, garbage_in_padding=True)
    loaded = tf.saved_model.load(saved_model)  # kept: the signature's variables live in it
    signature = loaded.signatures[SIGNATURE_DEFAULT]

    def serve(x, lengths):
        outputs = signature(**{INPUTS_KEY: tf.constant(x), LENGTHS_KEY: tf.constant(lengths)})
        return [outputs[key].numpy() for key in sorted(outputs)]

    threaded, overlap = concurrently(serve, requests)
    serial = [serve(*request) for request in requests]
    assert overlap >= 2, overlap
    assert_same_numbers(threaded, serial)
    expected = []
    for x, lengths in requests:
        zero_padded = np.where((np.arange(x.shape[1])[None, :] < lengths[:, None])[..., None], x, 0.0)
        expected.append(_numpy(model(zero_padded.astype("float32"), training=False)))
    # Outputs sorted by key: "outputs_0" (per step), "outputs_1" (the head).
    assert_close_numbers(serial, expected, atol=1e-5)


# --- 2. tf.data with parallel calls ---------------------------------------------------------------


@pytest.mark.parametrize("return_sequences", [True, False], ids=["sequences", "final_states"])
def test_tf_data_parallel_map_gives_the_serial_numbers(return_sequences):
    """A layer called inside `dataset.map` (mask from `lengths`): 4 parallel
    calls, deterministic order, give bit for bit what the serial map gives;
    both give the layer's eager numbers within float rounding (the map runs
    a graph traced for any batch and time size)."""
    keras.utils.set_random_seed(43)
    layer = kb.Bidirectional(kb.LSTMCell(U), return_sequences=return_sequences)
    requests = _requests(seed=43, garbage_in_padding=True)
    layer.build((None, None, F))

    def apply(x, lengths):
        return layer(x, mask=tf.sequence_mask(lengths, tf.shape(x)[1]), training=False)

    def pipeline(num_parallel_calls):
        dataset = tf.data.Dataset.from_generator(
            lambda: iter(requests),
            output_signature=(tf.TensorSpec([None, None, F], tf.float32), tf.TensorSpec([None], tf.int32)),
        )
        if num_parallel_calls is None:
            dataset = dataset.map(apply)
        else:
            dataset = dataset.map(apply, num_parallel_calls=num_parallel_calls, deterministic=True)
        return [[y.numpy()] for y in dataset]

    parallel = pipeline(num_parallel_calls=4)
    serial = pipeline(num_parallel_calls=None)
    assert_same_numbers(parallel, serial)
    eager = [[np.asarray(apply(tf.constant(x), tf.constant(lengths)))] for x, lengths in requests]
    assert_close_numbers(serial, eager, atol=1e-6)


# --- 3. settings per thread, bounded caches (the API of issue 41) ----------------------------------


def _rss_mb() -> float:
    """The process's resident memory now (not its peak), in MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


RSS_GROWTH_BOUND_MB = 50  # between shape 500 and shape 2,000 (measured: about 3 MB)


@pytest.mark.slow(reason="2,000 eager calls, one per (batch, time) shape, ~40 s")
def test_2000_shapes_keep_caches_and_memory_bounded():
    """A small layer served eagerly at every (batch, time) of batch 1..40
    and time 1..50, in random order: the loop cache never holds more than
    its limit, the layer counts at most `max_counted_shapes` shapes, and the
    process's memory grows by less than `RSS_GROWTH_BOUND_MB` from the
    500th shape to the 2,000th (the first 500 fill the caches)."""
    keras.utils.set_random_seed(45)
    kb.clear_loop_cache()
    assert kb.loop_cache_info()["entries"] == 0
    layer = kb.Bidirectional(kb.GRUCell(3), return_sequences=False)
    rng = np.random.default_rng(45)
    shapes = [(b, t) for b in range(1, 41) for t in range(1, 51)]
    assert len(shapes) == 2000
    shapes = [shapes[i] for i in rng.permutation(len(shapes))]
    x = rng.normal(size=(40, 50, 2)).astype("float32")
    lengths = rng.integers(1, 51, size=40)
    largest = {"entries": 0, "shapes": 0}
    with kb.configure_loops(max_counted_shapes=64, loop_cache_size=32):
        assert kb.loop_config().max_counted_shapes == 64
        for n, (batch, steps) in enumerate(shapes, start=1):
            mask = np.arange(steps)[None, :] < np.minimum(lengths[:batch], steps)[:, None]
            layer(x[:batch, :steps], mask=mask)
            info = kb.loop_cache_info()
            assert info["limit"] == 32
            assert info["entries"] <= info["limit"], (n, info)
            largest["entries"] = max(largest["entries"], info["entries"])
            if n % 20 == 0 or n == len(shapes):
                counted = len(layer.loop_report()["shapes"])
                assert counted <= kb.loop_config().max_counted_shapes, (n, counted)
                largest["shapes"] = max(largest["shapes"], counted)
            if n == 500:
                gc.collect()
                rss_at_500, entries_at_500 = _rss_mb(), info["entries"]
        gc.collect()
        growth = _rss_mb() - rss_at_500
    assert largest["shapes"] == 64, largest  # the count stayed at its limit
    # New shapes add no loops: the loop cache is keyed by the loop's structure, not its sizes
    # (its least-recently-used bound: tests/tensorflow_only/test_recurrence_cache.py).
    assert 0 < entries_at_500 == kb.loop_cache_info()["entries"], (entries_at_500, kb.loop_cache_info())
    assert growth < RSS_GROWTH_BOUND_MB, f"RSS grew {growth:.0f} MB from shape 500 to 2,000"
    kb.clear_loop_cache()
    assert kb.loop_cache_info()["entries"] == 0
