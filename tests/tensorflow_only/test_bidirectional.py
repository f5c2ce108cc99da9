"""kb.Bidirectional against the NumPy oracle (tests/reference.py).

Every cell x every merge mode, per-position and sentence outputs, returned
states, eagerly and inside a `tf.function` with unknown batch and time;
gradients against the oracle's hand-written BPTT (seed 001); the three
kinds of boundary state and call-time initial states; XLA.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import keras_birnn as kb
import reference as ref
from birnn_cases import CELLS, MERGES, TRAINING_MODES, B, U, make_case
from helpers import MASK_4x6 as MASK, PADDING_PATTERNS_4x6, assert_all_close, cell_params, eager_and_graph, in_graph, to_numpy
from keras_birnn.recurrence.tensorflow.compiled import by_batch_size

# A diagonal pairing cells with merge modes, for what needs one run per cell.
DIAGONAL = list(zip(CELLS, ["concat", "projection_softmax", "none", "mul", "sum"]))
# Inputs and mask with unknown batch and time sizes.
UNKNOWN_SIZES = [tf.TensorSpec([None, None, 3], tf.float32), tf.TensorSpec([None, None], tf.bool)]


@pytest.mark.parametrize("merge_name", list(MERGES))
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_forward_matches_oracle(cell_name, merge_name):
    """Per-position and sentence outputs and the returned states (forward
    then backward), masked batch, eager and in a graph."""
    for return_sequences in (True, False):
        case = make_case(cell_name, merge_name, return_sequences=return_sequences, return_state=True)
        expected = case.oracle(MASK)
        eager, graph = eager_and_graph(case.layer, case.x, mask=MASK)
        n_out = 2 if case.merge_mode is None else 1
        assert len(eager) == n_out + 2 * case.n_states
        assert_all_close(eager, expected)
        assert_all_close(graph, expected)


@pytest.mark.slow(reason="~3 s; the masked forward pass stays in the fast subset (test_forward_matches_oracle)")
@pytest.mark.parametrize("cell_name, merge_name", DIAGONAL)
def test_forward_without_mask(cell_name, merge_name):
    for return_sequences in (True, False):
        case = make_case(cell_name, merge_name, seed=1, return_sequences=return_sequences)
        expected = case.oracle()
        eager, graph = eager_and_graph(case.layer, case.x)
        if case.merge_mode is None:
            assert isinstance(eager, list) and len(eager) == 2
        assert_all_close(eager, expected)
        assert_all_close(graph, expected)


def test_outputs_are_not_trivial():
    """Guards the oracle comparisons: outputs differ per direction, position and cell."""
    case = make_case("gru_reset_after", "none")
    out_f, out_b = to_numpy(case.layer(case.x))
    assert np.abs(out_f - out_b).max() > 0.05
    assert np.abs(out_f[:, 1:] - out_f[:, :-1]).max() > 0.05
    other = make_case("gru_reset_before", "none")
    assert np.abs(to_numpy(other.layer(case.x))[0] - out_f).max() > 1e-3


@pytest.mark.parametrize("merge_name", list(MERGES))
@pytest.mark.parametrize("cell_name", list(CELLS))
def test_gradients_match_oracle_bptt(cell_name, merge_name):
    """TF gradients of sum(y * dy) = the oracle's BPTT, to 1e-4: weights of
    both directions, projection and inputs (per-position output, masked),
    through the training path (hand-written BPTT) and TF autodiff."""
    case = make_case(cell_name, merge_name, seed=2, return_sequences=True)
    d_output = case.random_d_output()
    expected = case.oracle_grads(d_output, MASK)
    for training in TRAINING_MODES:
        case.assert_grads_match(case.tf_grads(d_output, MASK, training=training), expected)


@pytest.mark.parametrize(
    "cell_name, merge_name",
    [("simple_relu", "projection_softmax"), ("gru_reset_before", "mul"), ("lstm", "none")],
)
def test_gradients_of_sentence_output(cell_name, merge_name):
    """return_sequences=False: BPTT from the final states, masked batch
    (training path; test_constant_initial_state takes this output's gradient
    through an inference call for every cell)."""
    case = make_case(cell_name, merge_name, seed=3, return_sequences=False)
    d_output = case.random_d_output()
    expected = case.oracle_grads(d_output, MASK)
    case.assert_grads_match(case.tf_grads(d_output, MASK, training=True), expected)


@pytest.mark.slow(reason="traces gradients for unknown sizes, ~6 s")
@pytest.mark.parametrize(
    "cell_name, merge_name, return_sequences, masked, training",
    [("lstm", "projection_softmax", True, True, True), ("gru_reset_before", "concat", False, False, None)],
)
def test_gradients_in_graph_with_unknown_sizes(cell_name, merge_name, return_sequences, masked, training):
    case = make_case(cell_name, merge_name, seed=4, return_sequences=return_sequences)
    d_output = case.random_d_output()
    mask = MASK if masked else None
    grads = case.tf_grads(d_output, mask, graph=True, training=training)
    case.assert_grads_match(grads, case.oracle_grads(d_output, mask))


# --- boundary states ---------------------------------------------------------


def _constant_states(case, value):
    return [np.full((B, U), value) for _ in range(case.n_states)]


def _sequence_d_output(case):
    """A cotangent for the merged output only (states are not in the loss)."""
    return_state, case.return_state = case.return_state, False
    d_output = case.random_d_output()
    case.return_state = return_state
    return d_output


@pytest.mark.slow(reason="traces eager and graph with states, ~4 s")
@pytest.mark.parametrize(
    "cell_name, merge_name, initial_state", [(c, m, 0.5) for c, m in DIAGONAL] + [("lstm", "sum", "zeros")]
)
def test_constant_initial_state(cell_name, merge_name, initial_state):
    """h_0 = 0 (seed 002) or the constant 0.5 (seed 001) in both directions,
    for h and, for the LSTM, c."""
    value = 0.0 if initial_state == "zeros" else initial_state
    cases = []
    for return_sequences in (True, False):
        case = make_case(
            cell_name, merge_name, seed=5, return_sequences=return_sequences, return_state=True,
            initial_state=initial_state,
        )
        init = _constant_states(case, value)
        expected = case.oracle(MASK, fw_initial=init, bw_initial=init)
        eager, graph = eager_and_graph(case.layer, case.x, mask=MASK)
        assert_all_close(eager, expected)
        assert_all_close(graph, expected)
        # The fully masked row keeps the boundary state.
        np.testing.assert_allclose(eager[-1][3], value)
        if initial_state == 0.5:
            # 0.5 really changes the numbers (so the comparison can fail).
            assert np.abs(case.oracle(MASK)[0] - expected[0]).max() > 1e-3
        cases.append(case)
    # Per-position output through the training path, sentence output through
    # an inference call's gradient.
    for case, training in zip(cases, TRAINING_MODES):
        d_output = _sequence_d_output(case)
        expected = case.oracle_grads(d_output, MASK, fw_initial=init, bw_initial=init)
        case.assert_grads_match(case.tf_grads(d_output, MASK, training=training), expected)


@pytest.mark.slow(reason="trains initial states, ~4 s")
@pytest.mark.parametrize("cell_name, merge_name", DIAGONAL)
def test_learned_initial_state(cell_name, merge_name):
    """Trainable boundary states (seed 001): values used as h_0 / h_{T+1} of
    every row, gradients = the oracle's boundary gradients summed over batch."""
    case = make_case(cell_name, merge_name, seed=6, return_sequences=True, initial_state="learned")
    bi = case.layer
    fw_vars, bw_vars = bi.forward_layer.boundary.states, bi.backward_layer.boundary.states
    assert len(fw_vars) == len(bw_vars) == case.n_states
    # Learned states are trainable weights of the layer.
    trainable = {id(v) for v in bi.trainable_variables}
    assert all(v.trainable and id(v) in trainable for v in fw_vars + bw_vars)
    fw_init = [case.rng.normal(scale=0.5, size=(U,)).astype(np.float32) for _ in fw_vars]
    bw_init = [case.rng.normal(scale=0.5, size=(U,)).astype(np.float32) for _ in bw_vars]
    for var, value in zip(fw_vars + bw_vars, fw_init + bw_init):
        var.assign(value)
    fw_b = [np.broadcast_to(v, (B, U)) for v in fw_init]
    bw_b = [np.broadcast_to(v, (B, U)) for v in bw_init]
    eager, graph = eager_and_graph(bi, case.x, mask=MASK)
    expected = case.oracle(MASK, fw_initial=fw_b, bw_initial=bw_b)
    assert_all_close(eager, expected)
    assert_all_close(graph, expected)

    d_output = case.random_d_output()
    oracle = case.oracle_grads(d_output, MASK, fw_initial=fw_b, bw_initial=bw_b)
    expected_boundary = [g.sum(axis=0) for g in oracle["fw_initial"] + oracle["bw_initial"]]
    assert all(np.abs(g).max() > 1e-3 for g in expected_boundary)  # the boundary matters
    for training in TRAINING_MODES:
        grads = case.tf_grads(d_output, MASK, extra_variables=fw_vars + bw_vars, training=training)
        case.assert_grads_match(grads, oracle)
        for k, (got, want) in enumerate(zip(grads["extra"], expected_boundary)):
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"boundary state {k}")


@pytest.mark.slow(reason="traces eager and graph with states, ~3 s")
@pytest.mark.parametrize("cell_name, merge_name", DIAGONAL)
def test_call_time_initial_state_list(cell_name, merge_name):
    """`initial_state=[forward states..., backward states...]` like Keras's;
    its gradients are the oracle's boundary gradients, per row."""
    case = make_case(cell_name, merge_name, seed=7, return_sequences=True, return_state=True)
    rng = case.rng
    fw_init = [rng.normal(scale=0.5, size=(B, U)).astype(np.float32) for _ in range(case.n_states)]
    bw_init = [rng.normal(scale=0.5, size=(B, U)).astype(np.float32) for _ in range(case.n_states)]
    expected = case.oracle(MASK, fw_initial=fw_init, bw_initial=bw_init)
    eager, graph = eager_and_graph(case.layer, case.x, mask=MASK, initial_state=fw_init + bw_init)
    assert_all_close(eager, expected)
    assert_all_close(graph, expected)
    # The fully masked row returns its given states unchanged.
    n = case.n_states
    n_out = len(eager) - 2 * n
    for k in range(n):
        np.testing.assert_allclose(eager[n_out + k][3], fw_init[k][3], atol=1e-7)
        np.testing.assert_allclose(eager[n_out + n + k][3], bw_init[k][3], atol=1e-7)

    d_output = _sequence_d_output(case)
    oracle = case.oracle_grads(d_output, MASK, fw_initial=fw_init, bw_initial=bw_init)
    for training in TRAINING_MODES:
        grads = case.tf_grads(d_output, MASK, initial_state=fw_init + bw_init, training=training)
        case.assert_grads_match(grads, oracle)
        for k, (got, want) in enumerate(zip(grads["initial_state"], oracle["fw_initial"] + oracle["bw_initial"])):
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"initial_state[{k}]")


@pytest.mark.parametrize("cell_name", CELLS)
def test_call_time_initial_state_of_unknown_width(cell_name):
    """States handed in as graph inputs of unknown shape, with a mask: the
    loops and cells take their widths from the weights, not from the
    states (a state of unknown width once failed the masks' broadcast, the
    LSTM's gate scales and the classic GRU's BPTT). Outputs and the inputs'
    gradients are the oracle's."""
    case = make_case(cell_name, "concat", seed=17, return_sequences=True)
    rng = case.rng
    fw_init = [rng.normal(scale=0.5, size=(B, U)).astype(np.float32) for _ in range(case.n_states)]
    bw_init = [rng.normal(scale=0.5, size=(B, U)).astype(np.float32) for _ in range(case.n_states)]
    n = 2 * case.n_states
    spec = [tf.TensorSpec([None, None, case.x.shape[-1]]), tf.TensorSpec([None, None], tf.bool)]
    spec += [tf.TensorSpec([None, None])] * n
    d_output = _sequence_d_output(case)

    @tf.function(input_signature=spec)
    def run(x, mask, *states):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = case.layer(x, mask=mask, initial_state=list(states), training=True)
        return y, tape.gradient(y, x, output_gradients=tf.constant(d_output, tf.float32))

    y, d_x = run(case.x, np.asarray(MASK, bool), *fw_init, *bw_init)
    assert_all_close(y.numpy(), case.oracle(MASK, fw_initial=fw_init, bw_initial=bw_init))
    oracle = case.oracle_grads(d_output, MASK, fw_initial=fw_init, bw_initial=bw_init)
    np.testing.assert_allclose(d_x.numpy(), oracle["x"], atol=1e-4, rtol=1e-4)


# --- XLA -----------------------------------------------------------------------


@pytest.mark.slow(reason="XLA compilation, ~4 s")
@pytest.mark.parametrize(
    "cell_name, merge_name", [("simple_relu", "projection_softmax"), ("gru_reset_after", "none"), ("lstm", "sum")]
)
def test_jit_compile_equals_eager(cell_name, merge_name):
    case = make_case(cell_name, merge_name, seed=8, return_sequences=True, return_state=True)
    eager = to_numpy(case.layer(case.x, mask=MASK))
    compiled = to_numpy(in_graph(case.layer, case.x, mask=MASK, jit_compile=True))
    assert_all_close(compiled, eager, atol=1e-6, rtol=1e-6)
    assert_all_close(compiled, case.oracle(MASK))


@pytest.mark.slow(reason="XLA-compiled gradients, ~4 s")
@pytest.mark.parametrize("training", TRAINING_MODES, ids=["bptt", "autodiff"])
def test_jit_compile_gradients(training):
    case = make_case("simple_tanh", "projection_softmax", seed=9, return_sequences=False)
    bi = case.layer
    d_output = tf.constant(case.random_d_output(), tf.float32)
    weights = bi.trainable_variables

    @tf.function(
        jit_compile=True,
        input_signature=UNKNOWN_SIZES,
    )
    def grads(x, mask):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(bi(x, mask=mask, training=training) * d_output)
        return tape.gradient(loss, weights)

    got = [np.asarray(g) for g in grads(case.x, MASK)]
    oracle = case.oracle_grads(np.asarray(d_output), MASK)
    expected = [oracle[s][k] for s in ("fw", "bw") for k in ("kernel", "recurrent_kernel", "bias")]
    expected += [oracle["projection"][k] for k in ("V_f", "V_b", "c")]
    assert_all_close(got, expected, atol=1e-4, rtol=1e-4)


def _graph_def(fn, *args):
    return fn.get_concrete_function(*args).graph.as_graph_def()


def _compiled_functions(fn, *args):
    """Names of the XLA-compiled functions a traced graph calls."""
    library = _graph_def(fn, *args).library
    return sorted(f.signature.name for f in library.function if f.attr["_XlaMustCompile"].b)


def _loop_variables(fn, *args) -> dict:
    """How many values each while loop in a traced function (and the
    functions it calls) carries, sorted, by phase: "bptt" for the loops of
    a gradient (XLA's `backward_loop` functions, or a tf.cond branch's
    `..._grad_...` function without XLA), "forward" for the others. A
    differentiated tf.cond branch also exists as a `..._rewritten` copy
    (cond_v2 adds outputs for its gradient); its loops are counted once."""
    graph_def = _graph_def(fn, *args)
    placed = [("", n) for n in graph_def.node]
    placed += [(f.signature.name.removesuffix("_rewritten"), n) for f in graph_def.library.function for n in f.node_def]
    loops = {(where, n.name): n for where, n in placed if n.op in ("While", "StatelessWhile")}
    carried = {"forward": [], "bptt": []}
    for (where, _), loop in loops.items():
        phase = "bptt" if "backward_loop" in where or "_grad_" in where else "forward"
        carried[phase].append(sum(not name.startswith("^") for name in loop.input))
    return {phase: sorted(counts) for phase, counts in carried.items()}


@pytest.mark.slow(reason="compiles every loop layout, ~14 s")
@pytest.mark.parametrize("lockstep", [False, True], ids=["one_loop_per_direction", "lockstep_directions"])
def test_graph_loop_layouts(compiled_loops, lockstep):
    """In a graph each direction is its own compiled loop (TensorFlow runs
    the two at the same time); under `kb.lockstep_directions()` one loop
    advances both. Both layouts give the oracle's outputs and BPTT gradients."""
    case = make_case("lstm", "concat", seed=10, return_sequences=True, return_state=True)
    spec = UNKNOWN_SIZES
    layout = kb.lockstep_directions() if lockstep else contextlib.nullcontext()
    with layout:
        infer = tf.function(lambda x, mask: case.layer(x, mask=mask), input_signature=spec)
        # An unknown batch size leaves both inference loops in the graph (a
        # tf.cond picks one by the step's size, see
        # test_inference_loop_variants), which both directions share (their
        # order is a tensor); the lockstep loop has one variant.
        assert len(_compiled_functions(infer, *spec)) == (1 if lockstep else 2)
        assert_all_close(to_numpy(infer(case.x, MASK)), case.oracle(MASK))
        d_output = case.random_d_output()
        grads = case.tf_grads(d_output, MASK, graph=True, training=True)
    case.assert_grads_match(grads, case.oracle_grads(d_output, MASK))


@pytest.fixture
def loop_switch():
    """`switch(xla=..., inline_step_limit=..., functional_step_limit=...,
    functional_row_limit=...)` sets how `recurrence` builds loops for one test; loops built under other
    settings are dropped from the caches before and after."""
    settings = contextlib.ExitStack()

    def switch(**changes):
        settings.close()  # one block of settings at a time
        settings.enter_context(kb.configure_loops(**changes))

    with settings:
        yield switch


@pytest.fixture
def loop_settings(compiled_loops, loop_switch):
    """`loop_switch`, with the loops that would be counted or run as
    uncounted inference built XLA-compiled outright (`compiled_loops`)."""
    return loop_switch


def _training_loop_variables(layer) -> dict:
    """`_loop_variables` of a traced gradient of `layer` (unknown batch and
    time): its forward loops and its BPTT loops."""

    @tf.function(input_signature=UNKNOWN_SIZES)
    def gradients(x, mask):
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(layer(x, mask=mask, training=True))
        return tape.gradient(total, layer.trainable_variables)

    return _loop_variables(gradients, *UNKNOWN_SIZES)


@pytest.mark.slow(reason="XLA-compiles the training loops, ~15 s")
@pytest.mark.parametrize("lockstep", [False, True], ids=["one_loop_per_direction", "lockstep_directions"])
@pytest.mark.parametrize("cell", ["gru_reset_after", "gru_reset_before", "lstm", "simple_tanh"])
def test_training_loop_reads(loop_settings, cell, lockstep):
    """The training loops' per-step reads: sliced in the step inside XLA,
    read one iteration ahead as loop-carried values without it. Both give
    the oracle's BPTT gradients, masked, with unknown batch and time sizes,
    and the in-step loop, forward and BPTT, carries fewer values than every
    loop reading ahead. The XLA loops are functions both directions share
    (their order is a tensor); the plain loops under `xla_disabled` are
    traced inline, one per direction. (Plain loops in their lowered form
    only: test_plain_loop_forms has both.)"""
    case = make_case(cell, "concat", seed=13, return_sequences=True)
    layout = kb.lockstep_directions if lockstep else contextlib.nullcontext
    d_output = case.random_d_output()
    carried = {}
    for xla in (True, False):
        loop_settings(xla=xla, functional_step_limit=0)
        with layout():
            grads = case.tf_grads(d_output, MASK, graph=True, training=True)
            carried[xla] = _training_loop_variables(case.layer)
        case.assert_grads_match(grads, case.oracle_grads(d_output, MASK))
    for phase in ("forward", "bptt"):
        in_step, ahead = carried[True][phase], carried[False][phase]
        assert len(in_step) == 1 and len(ahead) == (1 if lockstep else 2), carried
        assert all(in_step[0] < b for b in ahead), carried


@pytest.mark.slow(reason="XLA-compiled BPTT, ~10 s")
def test_lstm_bptt_reads_its_kept_gates_ahead(loop_settings):
    """Inside XLA the LSTM with Keras's default activations keeps its gates'
    one-tanh activation and asks for that slice to be read one step ahead in
    the BPTT loop (`materialize_saved`); with other activations it keeps the
    pre-activations, sliced in the step. So the BPTT loop both directions
    share carries two values more (the slice, and the last index a loop
    reading ahead reads at, computed once before it: `time_loop`), the
    forward loop as many; without XLA every slice is read ahead either way. (Both paths' gradients against the
    oracle: test_training_loop_reads here, test_other_activations_match_oracle
    in test_cells_activations.py.)"""
    def carried(**cell_kwargs):
        layer = kb.Bidirectional(kb.LSTMCell(U, **cell_kwargs), return_sequences=True)
        layer.build((None, None, 3))
        assert layer.forward_layer.cell.step_math().materialize_saved == (not cell_kwargs)
        return _training_loop_variables(layer)

    loop_settings(xla=True)
    one_tanh, other = carried(), carried(recurrent_activation="hard_sigmoid")
    assert len(one_tanh["bptt"]) == len(one_tanh["forward"]) == 1, one_tanh
    assert one_tanh["forward"] == other["forward"], (one_tanh, other)
    assert [a - b for a, b in zip(one_tanh["bptt"], other["bptt"])] == [2], (one_tanh, other)
    loop_settings(xla=False, functional_step_limit=0)
    assert carried() == carried(recurrent_activation="hard_sigmoid")


@pytest.mark.slow(reason="traces every inference loop, ~4 s")
@pytest.mark.parametrize("limit", [0, 10**12], ids=["reads_ahead", "reads_in_step"])
@pytest.mark.parametrize("cell", ["gru_reset_after", "lstm", "simple_tanh"])
def test_inference_loop_variants(loop_settings, limit, cell):
    """Both inference loops of a direction (inputs and mask read one step
    ahead, or sliced inside the step for small steps) give the oracle's
    outputs, with a mask and unknown batch and time sizes (the tf.cond
    path), and without one. The two directions share their loops."""
    loop_settings(inline_step_limit=limit)
    case = make_case(cell, "concat", seed=11, return_sequences=True, return_state=True)
    spec = UNKNOWN_SIZES
    infer = tf.function(lambda x, mask: case.layer(x, mask=mask), input_signature=spec)
    assert len(_compiled_functions(infer, *spec)) == (1 if limit == 0 else 2)
    assert_all_close(to_numpy(infer(case.x, MASK)), case.oracle(MASK))
    no_mask = tf.function(lambda x: case.layer(x), input_signature=spec[:1])
    assert_all_close(to_numpy(no_mask(case.x)), case.oracle(None))


@pytest.mark.slow(reason="traces both inference loops, in XLA too, ~5 s")
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "inside_xla"])
def test_unidirectional_inference_loops(loop_settings, jit_compile, reverse):
    """`kb.Recurrent` (one direction, so an inline-read candidate) with an
    unknown batch and time size, in a graph and inside an XLA-compiled
    function (where the tf.cond is compiled too), under both inference
    loops: the oracle's outputs."""
    x = np.random.default_rng(12).normal(size=(5, 7, 3)).astype(np.float32)
    for limit in (0, 10**12):
        loop_settings(inline_step_limit=limit)
        layer = kb.Recurrent(kb.GRUCell(U), return_sequences=True, reverse=reverse)
        layer.build((None, None, 3))
        params = cell_params(layer.cell)
        expected, _ = ref.run_direction("gru", params, x, reverse=reverse)
        run = tf.function(lambda x: layer(x), jit_compile=jit_compile, input_signature=UNKNOWN_SIZES[:1])
        np.testing.assert_allclose(run(x), expected, atol=1e-5)


def _while_lowering(fn, *args) -> list:
    """Per while loop of a traced function (and the functions it calls):
    its `_lower_using_switch_merge` attribute, None where unset."""
    graph_def = _graph_def(fn, *args)
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    flags = []
    for node in nodes:
        if node.op in ("While", "StatelessWhile"):
            attr = node.attr.get("_lower_using_switch_merge")
            flags.append(None if attr is None else attr.b)
    return flags


@pytest.mark.parametrize("lockstep", [False, True], ids=["one_loop_per_direction", "lockstep_directions"])
@pytest.mark.parametrize("how", ["xla_disabled", "counted_plain_form", "uncounted_inference"])
@pytest.mark.parametrize("limit", [0, 10**12], ids=["lowered", "functional"])
def test_plain_loop_forms(loop_switch, how, limit, lockstep):
    """Plain TensorFlow loops run as functional `While` ops for small steps
    and lowered for large ones (`compiled._loop`): both forms give the
    oracle's outputs and BPTT gradients with a mask and unknown batch and
    time sizes (limit 0: the lowered form; otherwise the functional, which
    the tf.cond picks for any batch), under `kb.xla_disabled()`, in the
    counted path's plain form and as uncounted inference. The graph holds
    the lowered form's loops, and the functional form's unless the limit
    rules it out."""
    loop_switch(xla=how != "xla_disabled", functional_step_limit=limit)
    case = make_case("gru_reset_after", "concat", seed=15, return_sequences=True)
    never = kb.compilation(compile_after=10**9)
    layout = kb.lockstep_directions() if lockstep else contextlib.nullcontext()
    with layout, never if how == "counted_plain_form" else contextlib.nullcontext():
        infer = tf.function(lambda x, mask: case.layer(x, mask=mask), input_signature=UNKNOWN_SIZES)
        expected = {True} if limit == 0 else {True, False}
        flags = _while_lowering(infer, *UNKNOWN_SIZES)
        assert set(flags) == expected, flags
        assert_all_close(to_numpy(infer(case.x, MASK)), case.oracle(MASK))
        if how == "uncounted_inference":
            return
        d_output = case.random_d_output()
        grads = case.tf_grads(d_output, MASK, graph=True, training=True)
        case.assert_grads_match(grads, case.oracle_grads(d_output, MASK))

        @tf.function(input_signature=UNKNOWN_SIZES)
        def gradients(x, mask):
            with tf.GradientTape() as tape:
                total = tf.reduce_sum(case.layer(x, mask=mask, training=True))
            return tape.gradient(total, case.layer.trainable_variables)

        flags = _while_lowering(gradients, *UNKNOWN_SIZES)
        # At least a forward and a BPTT loop: the lockstep one, or one per
        # direction (inline under xla_disabled), or one both directions
        # share (the counted path's functions).
        assert set(flags) == expected and len(flags) >= (4 if how == "xla_disabled" and not lockstep else 2), flags


def test_plain_loop_form_chosen_by_step_size(loop_switch):
    """With an unknown batch, both plain forms are traced and a tf.cond
    picks one by the step's multiply-adds; with a known batch only the form
    for that batch is; past the limit per row, only the lowered form."""
    layer = kb.Bidirectional(kb.GRUCell(U), return_sequences=True)
    layer.build((None, None, 3))
    per_row = (3 + U) * 3 * U  # one direction per loop
    loop_switch(xla=False, functional_step_limit=4 * per_row)
    for batch, flags in ((None, {True, False}), (4, {False}), (5, {True})):
        spec = tf.TensorSpec([batch, None, 3])
        infer = tf.function(lambda x: layer(x), input_signature=[spec])
        assert sorted(_while_lowering(infer, spec)) == sorted(list(flags) * 2), batch  # two directions
    # Steps too large per row run lowered at any batch: no functional form is traced.
    loop_switch(xla=False, functional_step_limit=4 * per_row, functional_row_limit=per_row - 1)
    spec = tf.TensorSpec([None, None, 3])
    infer = tf.function(lambda x: layer(x), input_signature=[spec])
    assert _while_lowering(infer, spec) == [True, True]


def test_inline_read_chosen_by_batch_size():
    """`by_batch_size` calls the small-step loop up to `max_batch` rows:
    statically when the batch size is known, by a tf.cond otherwise; with
    `max_batch` 0, the large one always."""
    small = lambda flat, mask: ([flat[0][:, 0, 0] * 0 + 1.0], [])  # noqa: E731
    large = lambda flat, mask: ([flat[0][:, 0, 0] * 0 + 2.0], [])  # noqa: E731
    for max_batch, cases in ((3, ((3, 1.0), (4, 2.0))), (0, ((1, 2.0), (4, 2.0)))):
        forward = by_batch_size(max_batch, small=small, large=large)
        for rows, expected in cases:
            x = tf.zeros([rows, 2, 1])
            assert float(forward([x], None)[0][0][0]) == expected
            traced = tf.function(lambda x: forward([x], None)[0][0], input_signature=[tf.TensorSpec([None, None, 1])])
            assert float(traced(x)[0]) == expected


@pytest.mark.parametrize("pattern", ["right", "holes"])
def test_backward_layer_of_another_cell_in_a_graph(pattern):
    """A GRU forward and an LSTM backward: two loop structures, so each
    direction gets loops of its own (no shared function), on the default
    path in a graph with unknown batch and time sizes. Outputs (sum merge)
    and every weight's and the inputs' gradients against the NumPy oracle's
    forward and hand-written BPTT."""
    backward = kb.Recurrent(kb.LSTMCell(U), reverse=True)
    layer = kb.Bidirectional(kb.GRUCell(U), backward_layer=backward, return_sequences=True, merge_mode="sum")
    layer.build((None, None, 3))
    rng = np.random.default_rng(5)
    x = rng.normal(size=MASK.shape + (3,)).astype(np.float32)
    mask = MASK if pattern == "holes" else PADDING_PATTERNS_4x6["right"]
    weights = rng.normal(size=(mask.shape[0], mask.shape[1], U)).astype(np.float32)

    @tf.function(input_signature=UNKNOWN_SIZES)
    def run(x, mask):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, mask=mask, training=True)
            loss = tf.reduce_sum(y * weights)
        return y, tape.gradient(loss, [x] + layer.forward_layer.trainable_variables + backward.trainable_variables)

    y, grads = run(x, mask)
    out_f, _ = ref.run_direction("gru", cell_params(layer.forward_layer.cell), x, mask)
    out_b, _ = ref.run_direction("lstm", cell_params(backward.cell), x, mask, reverse=True)
    g_f = ref.direction_grads("gru", cell_params(layer.forward_layer.cell), x, weights, mask)
    g_b = ref.direction_grads("lstm", cell_params(backward.cell), x, weights, mask, reverse=True)
    expected = [g_f["x"] + g_b["x"]] + [g[k] for g in (g_f, g_b) for k in ("kernel", "recurrent_kernel", "bias")]
    assert_all_close(to_numpy(y), out_f + out_b)
    assert_all_close([to_numpy(g) for g in grads], expected)


# --- structure -----------------------------------------------------------------


def test_directions_are_independent_copies():
    """The backward direction has its own weights (a fresh copy), reads
    right to left, and a given `backward_layer` is used as is."""
    bi = kb.Bidirectional(kb.GRUCell(U))
    bi.build((None, None, 3))
    assert bi.forward_layer.cell is not bi.backward_layer.cell
    assert not bi.forward_layer.reverse and bi.backward_layer.reverse
    assert not np.allclose(bi.forward_layer.cell.kernel.numpy(), bi.backward_layer.cell.kernel.numpy())
    backward = kb.Recurrent(kb.LSTMCell(U), reverse=True)
    mixed = kb.Bidirectional(kb.GRUCell(U), backward_layer=backward, return_sequences=True, merge_mode="sum")
    assert mixed.backward_layer is backward
    mixed.build((None, None, 3))
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype(np.float32)
    out_f, _ = ref.run_direction("gru", cell_params(mixed.forward_layer.cell), x)
    out_b, _ = ref.run_direction("lstm", cell_params(backward.cell), x, reverse=True)
    np.testing.assert_allclose(mixed(x), out_f + out_b, atol=1e-5)
