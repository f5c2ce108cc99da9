"""When loops run XLA-compiled: a layer runs a loop shape as plain
TensorFlow until it has met that shape `compile_after` times (by default,
until it has run `auto_compile_steps` time steps at it), then
compiled. Both paths must give the NumPy oracle's numbers, and the layer
must never compile a program for each new batch size."""

import copy

import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
from keras_birnn.recurrence import compile_policy
from birnn_cases import CELLS, TRAINING_MODES, F, make_case
from helpers import MASK_4x6 as MASK, assert_all_close, run_python, to_numpy

UNKNOWN = [tf.TensorSpec([None, None, F]), tf.TensorSpec([None, None], tf.bool)]


def _shapes(layer, training=None):
    shapes = layer.loop_report()["shapes"]
    return [s for s in shapes if training is None or s["training"] == training]


@pytest.mark.slow(reason="gradients on both paths with XLA, ~10 s")
@pytest.mark.parametrize("training", TRAINING_MODES)
@pytest.mark.parametrize("cell_name", sorted(CELLS))
def test_plain_then_compiled_gradients_match_oracle(cell_name, training):
    """The first call at a shape runs plain, the second compiled (with
    `compile_after=2`): BPTT gradients of both against the oracle, on right
    padding, left padding with a hole and an empty row."""
    case = make_case(cell_name, "concat", seed=7)
    with kb.compilation(compile_after=2):
        for call, compiled in ((1, False), (2, True)):
            d_output = case.random_d_output()
            grads = case.tf_grads(d_output, MASK, graph=True, training=training)
            [shape] = _shapes(case.layer)
            assert (shape["calls"], shape["compiled"], shape["training"]) == (call, compiled, training is True)
            case.assert_grads_match(grads, case.oracle_grads(d_output, MASK))


@pytest.mark.parametrize("merge_name", ["concat", "projection_softmax"])
@pytest.mark.parametrize("cell_name", ["gru_reset_before", "lstm"])
def test_plain_then_compiled_outputs_match_oracle(cell_name, merge_name):
    case = make_case(cell_name, merge_name, seed=5, return_state=True)
    call = tf.function(lambda x, m: case.layer(x, mask=m), input_signature=UNKNOWN)
    with kb.compilation(compile_after=2):
        for compiled in (False, True):
            assert_all_close(to_numpy(call(case.x, MASK)), case.oracle(MASK))
            assert _shapes(case.layer)[0]["compiled"] is compiled


@pytest.mark.slow(reason="XLA compilation, ~4 s")
def test_a_shape_is_compiled_at_its_nth_call():
    layer = kb.Bidirectional(kb.GRUCell(3), return_sequences=True)
    call = tf.function(lambda x, m: layer(x, mask=m), input_signature=UNKNOWN)
    x = np.ones((2, 5, F), np.float32)
    with kb.compilation(compile_after=3):
        for n in range(1, 5):
            call(x, np.ones((2, 5), bool))
            [shape] = _shapes(layer)
            assert shape == {"batch": 2, "time": 8, "training": False, "calls": n, "compiled": n >= 3}
    assert set(layer.loop_report()["traced"]) == {"counted"}


@pytest.mark.slow(reason="XLA compilation, ~2.5 s")
@pytest.mark.parametrize("length, bucket", [(5, 8), (20, 24)])
def test_auto_compiles_after_a_number_of_steps(length, bucket):
    """By default a shape is compiled once the layer has run
    `auto_compile_steps` time steps at it: 40 steps are 5 calls at the
    8-step bucket and 2 at the 24-step one."""
    with kb.configure_loops(auto_compile_steps=40):
        _auto_compiles_after(length, bucket)


def _auto_compiles_after(length, bucket):
    layer = kb.Bidirectional(kb.GRUCell(3), return_sequences=True)
    call = tf.function(lambda x, m: layer(x, mask=m, training=True), input_signature=UNKNOWN)
    x = np.ones((2, length, F), np.float32)
    threshold = -(-40 // bucket)
    assert compile_policy.settings()["compile_after"] == "auto"
    assert compile_policy.calls_before_compiled(bucket, kb.loop_config()) == threshold
    for n in range(1, threshold + 2):
        call(x, np.ones((2, length), bool))
        [shape] = _shapes(layer)
        assert (shape["time"], shape["calls"], shape["compiled"]) == (bucket, n, n >= threshold)


@pytest.mark.slow(reason="compiles several shapes, ~5 s")
def test_at_most_max_compiled_shapes():
    layer = kb.Bidirectional(kb.GRUCell(3), return_sequences=True)
    call = tf.function(lambda x: layer(x), input_signature=UNKNOWN[:1])
    with kb.compilation(compile_after=1, max_compiled_shapes=2):
        for batch in (1, 2, 3, 2, 4):
            call(np.ones((batch, 4, F), np.float32))
    compiled = {s["batch"]: s["compiled"] for s in _shapes(layer)}
    assert compiled == {1: True, 2: True, 3: False, 4: False}
    assert {s["batch"]: s["calls"] for s in _shapes(layer)} == {1: 1, 2: 2, 3: 1, 4: 1}


@pytest.mark.slow(reason="XLA compilation, ~2.5 s")
def test_eager_calls_are_counted_and_exact():
    case = make_case("lstm", "sum", seed=3)
    with kb.compilation(compile_after=2):
        for compiled in (False, True):
            assert_all_close(to_numpy(case.layer(case.x, mask=MASK)), case.oracle(MASK))
            [shape] = _shapes(case.layer)
            assert shape["compiled"] is compiled and shape["time"] == case.x.shape[1]


@pytest.mark.parametrize(
    "how, path",
    [("static_shape", "counted"), ("unknown_shape", "inference"), ("training", "counted"),
     ("compile_after", "counted"), ("xla_disabled", "plain"), ("jit_compile", "inside-xla"), ("eager", "counted")],
)
def test_traced_path_is_reported(how, path):
    """Inference traced in a graph for any length runs plain loops,
    uncounted, unless `compile_after` is set; inference traced for one
    length, training calls and eager calls are counted."""
    layer = kb.Bidirectional(kb.GRUCell(3))
    x = np.ones((2, 5, F), np.float32)
    if how == "static_shape":
        tf.function(layer, input_signature=[tf.TensorSpec([2, 5, F])])(x)
    elif how == "unknown_shape":
        tf.function(layer, input_signature=UNKNOWN[:1])(x)
    elif how == "training":
        tf.function(lambda x: layer(x, training=True), input_signature=UNKNOWN[:1])(x)
    elif how == "compile_after":
        with kb.compilation(compile_after=2):
            tf.function(layer, input_signature=UNKNOWN[:1])(x)
    elif how == "xla_disabled":
        with kb.xla_disabled():
            tf.function(layer, input_signature=UNKNOWN[:1])(x)
    elif how == "jit_compile":
        tf.function(layer, input_signature=UNKNOWN[:1], jit_compile=True)(x)
    else:
        layer(x)
    assert set(layer.loop_report()["traced"]) == {path}
    counted = [(s["calls"], s["training"]) for s in layer.loop_report()["shapes"]]
    assert counted == ([] if path in ("inference", "plain", "inside-xla") else [(1, how == "training")])


@pytest.mark.slow(reason="traces an export, ~4 s")
def test_export_traces_fixed_loops(tmp_path):
    """A SavedModel cannot hold a layer's counts: saving traces the loops
    without them, and the reloaded model gives the same numbers."""
    case = make_case("gru_reset_after", "concat", seed=1)
    module = tf.Module()
    module.layer = case.layer
    module.call = tf.function(lambda x, m: case.layer(x, mask=m), input_signature=UNKNOWN)
    with kb.xla_disabled():
        tf.saved_model.save(module, str(tmp_path))
    assert "counted" not in case.layer.loop_report()["traced"]
    reloaded = tf.saved_model.load(str(tmp_path))
    assert_all_close(reloaded.call(case.x, MASK).numpy(), case.oracle(MASK))


def test_copies_count_afresh():
    layer = kb.Bidirectional(kb.GRUCell(3))
    layer(np.ones((2, 4, F), np.float32))
    assert len(_shapes(layer)) == 1
    assert _shapes(copy.deepcopy(layer)) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [({"compile_after": 0}, "compile_after"), ({"compile_after": 1.5}, "compile_after"),
     ({"max_compiled_shapes": -1}, "max_compiled_shapes"), ({"compile_after": True}, "compile_after"),
     ({"compile_after": "always"}, "compile_after"), ({"max_compiled_shapes": 2.0}, "max_compiled_shapes")],
)
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        with kb.compilation(**kwargs):
            pass


@pytest.mark.slow
def test_no_compilation_per_batch_size(tmp_path):
    """`model.fit` on batches whose batch and time sizes change every batch
    (a character encoder over the words of a sentence batch) compiles no
    XLA program with default settings; a shape met often enough is
    compiled once. Counted from XLA's own dump, in a fresh process."""
    code = f"""
        import os
        os.environ["XLA_FLAGS"] = "--xla_dump_to={tmp_path}"
        import numpy as np, tensorflow as tf, keras, keras_birnn as kb
        inputs = keras.Input((None, 3))
        layer = kb.Bidirectional(kb.GRUCell(4), return_sequences=True)
        model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
        model.compile("sgd", "mse")

        def compiled():
            return sum(name.endswith("before_optimizations.txt") for name in os.listdir("{tmp_path}"))

        for batch in range(3, 40):
            x = np.ones((batch, 3 + batch % 9, 3), np.float32)
            model.train_on_batch(x, np.zeros((batch, x.shape[1], 1), np.float32))
        varying = compiled()
        with kb.compilation(compile_after=5):
            layer2 = kb.Bidirectional(kb.GRUCell(4), return_sequences=True)
            model2 = keras.Model(inputs, keras.layers.Dense(1)(layer2(inputs)))
            model2.compile("sgd", "mse")
            for batch in [7] * 8 + [9]:
                x = np.ones((batch, 10, 3), np.float32)
                model2.train_on_batch(x, np.zeros((batch, 10, 1), np.float32))
        report = [(s["batch"], s["calls"], s["compiled"]) for s in layer2.loop_report()["shapes"]]
        print([varying, compiled() - varying, report])
    """
    varying, recurring, report = eval(run_python(code).strip().splitlines()[-1])
    assert varying == 0
    assert recurring > 0
    assert (7, 8, True) in report and (9, 1, False) in report, report


def _training_graph(layer):
    """The traced gradient of two calls of `layer` in training (unknown
    batch and time sizes): the nodes of its own graph, and the functions
    it calls."""

    @tf.function(input_signature=UNKNOWN)
    def gradients(x, mask):
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(layer(x, mask=mask, training=True))
            total += tf.reduce_sum(layer(tf.reverse(x, [1]), mask=mask, training=True))
        return tape.gradient(total, layer.trainable_variables)

    graph_def = gradients.get_concrete_function(*UNKNOWN).graph.as_graph_def()
    return list(graph_def.node), list(graph_def.library.function)


# 101 units over 3 features: 31,512 multiply-adds per row, under the
# per-row limit, but a 32-row batch is over the functional step limit.
@pytest.mark.parametrize("units, functional", [(3, True), (101, False)])
def test_training_graph_size(units, functional):
    """What keeps the first training step short (the numbers: this file's
    oracle tests, and test_bucketing's zero-length case). No `tf.cond`
    around the loops but the counted path's, between the plain and
    XLA-compiled loops (a bucketed call has at least one masked step, so
    no zero-length cond, whose gradient doubled the graph); every loop is
    in a non-inlined function, one per loop role and form, which both
    directions (their order is a tensor) and both calls share; a functional form (a `by_batch_size` cond in each
    plain branch) only for a layer that a 32-row batch would run as one."""
    per_row = (F + units) * 3 * units
    rows = kb.loop_config().functional_step_limit // per_row
    assert per_row <= kb.loop_config().functional_row_limit and (rows >= 32) == functional
    nodes, functions = _training_graph(kb.Bidirectional(kb.GRUCell(units), return_sequences=True))
    assert not [n.name for n in nodes if n.op in ("If", "StatelessIf", "While", "StatelessWhile")]
    with_loops = [f for f in functions if any(n.op in ("While", "StatelessWhile") for n in f.node_def)]
    assert all(f.attr["_noinline"].b and not f.attr["_XlaMustCompile"].b for f in with_loops)
    # the keeping and BPTT loops both directions share, in one or two forms
    assert len(with_loops) == 2 * (2 if functional else 1), [f.signature.name for f in with_loops]
    conds = [n.name for f in functions for n in f.node_def if n.op in ("If", "StatelessIf")]
    # the forward cond (in the shared runner and in the copy TensorFlow
    # rewrites for its gradient) and the BPTT's; with the functional form,
    # one per direction in each plain branch
    assert len(conds) == 3 + (4 if functional else 0), conds
    # The BPTT's sums over time (matmuls) follow its cond, not in its branches.
    by_name = {f.signature.name: f for f in functions}
    [bptt] = [n for f in functions for n in f.node_def if n.op in ("If", "StatelessIf") and "IdentityN_grad" in n.name
              and n.name.count("cond") == 1]
    for branch in (bptt.attr["then_branch"].func.name, bptt.attr["else_branch"].func.name):
        assert not [n.name for n in by_name[branch].node_def if n.op in ("MatMul", "BatchMatMulV2")], branch
