"""The `>>>` examples in keras_birnn's docstrings, run as doctests.

One test per docstring that has examples, found by `doctest.DocTestFinder`
in every module of the package (`pkgutil.walk_packages`). Each runs in a
fresh namespace holding only `kb` (keras_birnn), `keras`, `np` (numpy) and
`tf` (tensorflow), as a user's session would: an example defines (or
imports) whatever else it uses. `# doctest: +SKIP` is only for lines that
need files that are not here (the dataset readers), with the reason in the
docstring. A case slower than a few seconds is in SLOW, with its reason.
"""

import doctest
import importlib
import io
import pathlib
import pkgutil
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb

PACKAGE_DIR = pathlib.Path(kb.__file__).parent
OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
PROMPT = re.compile(r"^\s*>>> ", re.MULTILINE)


def _modules():
    yield kb
    for info in pkgutil.walk_packages(kb.__path__, prefix="keras_birnn."):
        yield importlib.import_module(info.name)


def _docstrings_with_examples():
    """Every DocTest with examples, once each (a module re-exporting an object
    does not collect it twice: the finder keeps objects defined in the module)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = {}
    for module in _modules():
        for test in finder.find(module, module.__name__, globs={}):
            if test.examples:
                tests.setdefault(test.name, test)
    return sorted(tests.values(), key=lambda test: test.name)


DOCTESTS = _docstrings_with_examples()


def _namespace():
    return {"kb": kb, "keras": keras, "np": np, "tf": tf}


def run_doctest(test):
    """Runs `test` in a fresh namespace; returns (failures, report)."""
    test.globs = _namespace()
    keras.utils.set_random_seed(0)
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS, verbose=False)
    try:
        result = runner.run(test, out=report.write, clear_globs=True)
    finally:
        keras.backend.clear_session()
    return result.failed, report.getvalue()


def test_finder_collects_every_example():
    # The finder must see every `>>>` line of the package's source: an example
    # in a docstring it does not reach (a decorated function whose module it
    # misreads, a private module left out of the walk) would never run.
    on_disk = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        count = len(PROMPT.findall(path.read_text(encoding="utf-8")))
        if count:
            on_disk[str(path.resolve())] = count
    collected = {}
    for test in DOCTESTS:
        key = str(pathlib.Path(test.filename).resolve())
        collected[key] = collected.get(key, 0) + len(test.examples)
    assert collected == on_disk
    assert sum(on_disk.values()) >= 30
    assert len(DOCTESTS) >= 13


def test_a_wrong_output_fails():
    # The runner is not vacuous: an example whose printed output differs fails.
    wrong = doctest.DocTestParser().get_doctest(
        ">>> kb.GRUCell(3).units\n4\n", {}, "wrong", "wrong.py", 0
    )
    failed, report = run_doctest(wrong)
    assert failed == 1 and "Expected:\n    4\nGot:\n    3" in report


# Docstrings whose examples take more than a few seconds, with the reason.
SLOW = {
    "keras_birnn.crf.layer.CRF": "model.fit traces the CRF tagger's training step (about 10-20 s on 2 cores)",
    "keras_birnn.tagging.builder.build_tagger": "model.fit traces the tagger's training step (about 10 s)",
}


def _case(test):
    marks = [pytest.mark.slow(reason=SLOW[test.name])] if test.name in SLOW else []
    return pytest.param(test, id=test.name, marks=marks)


def test_slow_names_exist():
    # A renamed docstring must not leave a stale entry behind.
    assert set(SLOW) <= {test.name for test in DOCTESTS}


@pytest.mark.parametrize("test", [_case(test) for test in DOCTESTS])
def test_docstring_examples(test):
    failed, report = run_doctest(test)
    assert failed == 0, report
