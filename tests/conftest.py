import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402

BACKEND = keras.backend.backend()


def pytest_ignore_collect(collection_path, config):
    """The folder says which backends run a test: `all_backends/` runs on
    TensorFlow, JAX and PyTorch (its files import no TensorFlow:
    `backend_harness.py`); `tensorflow_only/` runs on TensorFlow alone (the
    TensorFlow engine, exports, examples, docs)."""
    if BACKEND == "tensorflow":
        return None
    return True if "tensorflow_only" in collection_path.parts else None


@pytest.fixture(autouse=True)
def _seeded():
    # Seeds only: keras.backend.clear_session() after every test cost ~0.4 s
    # each, and no test depends on Keras's global name counters.
    keras.utils.set_random_seed(1234)


@pytest.fixture
def float64_policy():
    """Every layer built in the test computes and keeps its weights in float64."""
    try:
        keras.mixed_precision.set_global_policy("float64")
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def compiled_loops(monkeypatch):
    """Loops that would be counted (`keras_birnn.recurrence.compile_policy`), or run
    plain as uncounted inference, are built XLA-compiled outright, without
    the run-time choice between the compiled and plain forms: for tests
    that read the compiled loops' structure."""
    from keras_birnn.recurrence.tensorflow import plan

    # Patched where the planner reads it: the plan's other choices follow
    # from the path (time buckets, runner), as for an uncounted layer.
    choose = plan.choose_path
    relaxed = (plan.Path.COUNTED, plan.Path.INFERENCE)

    def compiled_path(*args, **kwargs):
        path = choose(*args, **kwargs)
        return plan.Path.COMPILED if path in relaxed else path

    monkeypatch.setattr(plan, "choose_path", compiled_path)


def pytest_collection_modifyitems(config, items):
    """The fast subset (`-m "not slow"`) runs the first case of every
    parametrized test; its further cases are marked slow (CI runs them all)."""
    seen = set()
    for item in items:
        if getattr(item, "callspec", None) is None:
            continue
        function = item.nodeid.split("[", 1)[0]
        if function in seen:
            item.add_marker(pytest.mark.slow(reason="a further case of a parametrized test; -m 'not slow' runs the first"))
        seen.add(function)
