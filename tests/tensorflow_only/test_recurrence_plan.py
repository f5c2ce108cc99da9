"""The loop planner (`keras_birnn.recurrence.tensorflow.plan`): for every scenario, the
plan a call must take, checked against the plans the layer reports it ran
(`loop_report()["plans"]`), and the call's numbers against the NumPy oracle.

A plan's fields, in this order: path, form, runner, caller, rows, padding,
empty_case, lockstep, memory.
"""

import contextlib
import threading

import pytest
import tensorflow as tf

import keras_birnn as kb
from birnn_cases import F, make_case
from helpers import MASK_4x6 as MASK, assert_all_close, to_numpy
from keras_birnn import recurrence
from keras_birnn.config import no_empty_case, rows_kept
from keras_birnn.recurrence.tensorflow.plan import Grouping, plan_groups

FIELDS = ("path", "form", "runner", "caller", "rows", "padding", "empty_case", "lockstep", "memory")
UNKNOWN = [tf.TensorSpec([None, None, F], tf.float32), tf.TensorSpec([None, None], tf.bool)]


def _plan(text: str) -> dict:
    return dict(zip(FIELDS, text.split()))


def _eager(case, training=True):
    return case.layer(case.x, mask=MASK, training=training)


def _traced(case, training=None, signature=UNKNOWN, jit_compile=False):
    call = tf.function(lambda x, m: case.layer(x, mask=m, training=training), input_signature=signature,
                       jit_compile=jit_compile)
    return call(case.x, MASK)


def _static(case):
    shape = [tf.TensorSpec(case.x.shape, tf.float32), tf.TensorSpec(MASK.shape, tf.bool)]
    return _traced(case, signature=shape)


def _persistent_tape(case):
    @tf.function(input_signature=UNKNOWN)
    def call(x, m):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            y = case.layer(x, mask=m, training=True)
        return y, tape.gradient(y, x)

    return call(case.x, MASK)[0]


def _forward_mode(case):
    x = tf.constant(case.x)
    with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)):
        return case.layer(x, mask=MASK)


def _litert_trace(case):
    with kb.for_export(), kb.lockstep_directions(), rows_kept(), no_empty_case():
        return _traced(case)


def _converter_trace(case):
    """As `tf2onnx.convert.from_keras` traces a model: inside TensorFlow's
    legacy Keras call context, saving."""
    from tensorflow.python.keras.engine import base_layer_utils  # what tf2onnx imports to trace

    with base_layer_utils.call_context().enter(case.layer, None, build_graph=True, training=False, saving=True):
        return _traced(case)


def _in(context, run):
    def scenario(case):
        with context():
            return run(case)

    return scenario


# name: (how the call is made, return_sequences, the plans it must run)
SCENARIOS = {
    "eager": (_eager, True, ["counted shared differentiable eager all none static one-loop keep"]),
    "eager inference": (lambda c: _eager(c, None), True,
                        ["counted shared differentiable eager all none static one-loop recompute"]),
    "traced training": (lambda c: _traced(c, True), True,
                        ["counted chosen counted-function graph all buckets none per-direction keep"]),
    "traced inference": (_traced, True,
                         ["inference function differentiable graph all none branch per-direction recompute"]),
    "traced for one shape": (_static, True,
                             ["counted chosen counted-function graph all none static per-direction recompute"]),
    "sequence encoder": (_traced, False,
                         ["inference function differentiable graph valid none branch per-direction recompute"]),
    "inside XLA": (lambda c: _traced(c, jit_compile=True), True,
                   ["inside-xla xla differentiable xla all none branch one-loop recompute"]),
    "persistent tape": (_persistent_tape, True,
                        ["higher-order xla differentiable graph all buckets none per-direction keep"]),
    "persistent tape, no XLA": (_in(kb.xla_disabled, _persistent_tape), True,
                                ["plain inline differentiable graph all one-step none per-direction keep"]),
    "forward mode": (_forward_mode, True, ["forward-mode ops plain-ops eager all none static one-loop none"]),
    "xla disabled": (_in(kb.xla_disabled, _eager), True,
                     ["plain inline differentiable eager all none static one-loop keep"]),
    "export": (_in(kb.for_export, _traced), True,
               ["forward-only ops plain-ops graph all none branch per-direction none"]),
    "converter's trace": (_converter_trace, True,
                          ["forward-only ops plain-ops graph all none branch per-direction none"]),
    "LiteRT": (_litert_trace, False, ["forward-only ops plain-ops graph all none none one-loop none"]),
    "counted shape, before and after its compilation": (
        _in(lambda: kb.compilation(compile_after=2), lambda c: [_eager(c) for _ in range(3)][-1]), True,
        ["counted shared differentiable eager all none static one-loop keep",
         "counted shared-xla differentiable eager all none static one-loop keep"]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_call_takes_its_plan(name):
    run, return_sequences, expected = SCENARIOS[name]
    case = make_case("gru_reset_after", return_sequences=return_sequences)
    outputs = to_numpy(run(case))
    ran = [{k: v for k, v in p.items() if k != "calls"} for p in case.layer.loop_report()["plans"]]
    assert ran == [_plan(p) for p in expected]
    assert_all_close(outputs, case.oracle(MASK))


def test_every_path_is_in_the_table():
    """Each of the planner's paths and forms is some scenario's."""
    planned = [_plan(p) for _, _, plans in SCENARIOS.values() for p in plans]
    assert {p["path"] for p in planned} | {"compiled"} == {p.value for p in recurrence.tensorflow.plan.Path}
    assert {p["form"] for p in planned} == {f.value for f in recurrence.tensorflow.plan.Form}


def test_a_run_with_no_count_runs_compiled_loops():
    """The "compiled" path: a run without a layer's count (a diagnostic's
    run, `kb.diagnostics`), XLA-compiled outright."""
    case = make_case("gru_reset_after")
    bi, x, mask = case.layer, tf.constant(case.x), tf.constant(MASK)
    directions = [bi.forward_layer.direction(x, mask), bi.backward_layer.direction(x, mask)]
    flat = recurrence.tensorflow.layout.flatten(directions)
    call_plan = recurrence.tensorflow.plan.plan(directions, flat, mask, return_sequences=True, bptt=False,
                                                counted=False)
    assert call_plan.describe() == _plan("compiled xla compiled-function eager all none static one-loop recompute")
    forward, backward = recurrence.run(directions, mask, return_sequences=True)
    assert_all_close(to_numpy(bi.merge(forward.outputs, backward.outputs, mask)), case.oracle(MASK))


@pytest.mark.parametrize("training, taped, litert, grouping, groups", [
    (True, False, False, Grouping.GROUPS, [3]), (None, True, False, Grouping.GROUPS, [3]),
    (None, False, False, Grouping.BY_ITEM_COUNT, [1]), (True, False, True, Grouping.ONE_CALL, [1]),
], ids=["training", "under a tape", "inference", "LiteRT"])
def test_nested_groups_plan(training, taped, litert, grouping, groups, monkeypatch):
    """`kb.NestedEncoder`'s grouping is planned too: the planner's answer,
    the groups the encoder then ran (inference: by a `tf.cond` on the item
    count, below `grouped_from_items` one call), and the oracle's numbers;
    one group is always one call."""
    from tensorflow_only.test_nested import _case, _extents_mask, _oracle

    used = []
    encode = kb.NestedEncoder._encode_by_extent
    monkeypatch.setattr(kb.NestedEncoder, "_encode_by_extent",
                        lambda self, *a: used.append(a[-1]) or encode(self, *a))
    case, x = _case("gru_reset_after")
    nested = kb.NestedEncoder(case.layer, length_groups=3)
    context = no_empty_case if litert else contextlib.nullcontext
    with context(), tf.GradientTape() if taped else contextlib.nullcontext():
        assert plan_groups(3, training)[0] is grouping
        assert plan_groups(1, training)[0] is Grouping.ONE_CALL
        outputs = nested(x, mask=_extents_mask(), training=training)
    assert used == groups
    assert_all_close(to_numpy(outputs), _oracle(case, x, _extents_mask()))


def test_threads_trace_with_their_own_settings():
    """Two threads trace at the same time, one inside `kb.xla_disabled()`:
    each layer's plans follow its own thread's settings, and both give the
    oracle's numbers (the same weights)."""
    cases = [make_case("gru_reset_after"), make_case("gru_reset_after")]
    barrier = threading.Barrier(2)
    outputs, errors = [None, None], []

    def work(k):
        try:
            with kb.xla_disabled() if k == 0 else contextlib.nullcontext():
                barrier.wait(timeout=30)
                for _ in range(3):  # traced afresh each time, interleaved with the other thread
                    outputs[k] = to_numpy(_traced(cases[k], True))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    paths = [{p["path"] for p in c.layer.loop_report()["plans"]} for c in cases]
    assert paths == [{"plain"}, {"counted"}]
    for k in range(2):
        assert_all_close(outputs[k], cases[k].oracle(MASK))
