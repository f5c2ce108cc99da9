"""The loop: runs cells' step maths over time, one or several directions at once.

The only module that iterates over time. It knows nothing of Keras layers:
a direction is a cell's pure step maths, its weights as tensors, its
per-step inputs and its initial states.

How directions run: inside a graph (`tf.function`, `model.fit`), each
direction is its own compiled loop, and TensorFlow's executor runs the two
loops of a bidirectional layer at the same time, one per core, neither
waiting for the other. Eagerly, and inside an XLA-compiled function (where
XLA would run two loops one after the other), all directions advance in the
same loop iteration and pay the per-step overhead once (benchmarks/README.md
measures both). `fused_directions()` asks for the fused loop in graphs too:
slower, but for a GRU with a training step's peak memory about 20% lower
(for an LSTM it is no lower).

Masked steps carry the state unchanged and output zeros, which is exact for
right padding, left padding and holes alike, in both directions: a backward
direction simply meets a row's padding before its valid steps. Steps masked
in every row change nothing, so the loops skip them (`_span`): a batch
padded beyond its longest row costs no steps for the padding.

XLA compiles a program per input shape, so in a graph traced with an
unknown sequence length the loops run on inputs padded to a few bucket
lengths (`bucketing`), the padding masked and skipped; a layer's loops
run XLA-compiled only for the shapes it meets often, and as plain
TensorFlow otherwise (`compile_policy`, the "counted" path of `_path`);
sequence-level encoders leave rows without a valid step out
(`bucketing.valid_rows`).

Each step projects its own input (`x_t W + b`) inside the loop rather than
projecting the whole sequence up front: with the per-step reads below,
hoisting the projection measured no faster under XLA, and without them
it was twice as slow (benchmarks/README.md).

Per-step slices (inputs, kept memory, output gradients, mask) are read
either inside the step, where XLA fuses each into the kernels that use it,
or one iteration ahead into loop-carried tensors (`_time_loop` says which
loops do which, and why).

Training uses `run(..., bptt=True)`: the gradient is the hand-written BPTT of
the BRNN text (BRNN, BPTT and boundary states) instead of autodiff through `tf.while_loop`. The forward loop keeps
each step's incoming states and what the cell's step maths save (the
gates' pre-activations, or an LSTM's activations, so the backward step
needs no matmul to rebuild them); one reverse loop then walks every
direction back over time (the forward direction from the last step to the
first, the backward one from the first to the last) and records each
step's gate gradients. Every
gradient that is a sum over time (input and recurrent kernels, biases) and
the inputs' gradient are then single large matmuls over all steps at once,
outside the compiled loop. Differentiating those gradients again (a gradient
penalty) goes through autodiff of the plain forward loop (`_bptt`); under a
`tf.autodiff.ForwardAccumulator` the plain loop runs instead of all this
(`_plain_loop`), as TensorFlow carries no tangent through a custom gradient.
"""

import contextlib
import functools
from typing import Any, List, NamedTuple, Optional, Sequence

import tensorflow as tf
from tensorflow.python.eager import forwardprop_util
from tensorflow.python.ops import gradients_util

from tensorflow.python.saved_model import save_context

from keras_birnn import bucketing, compile_policy
from keras_birnn.cells.base import RecurrentCell, column_sum

input_projection = RecurrentCell.input_projection


class Direction(NamedTuple):
    """One recurrence to run.

    Attributes:
        math: The cell's step maths (see `RecurrentCell.step_math`).
        inputs: `[batch, time, features]`, padding already zeroed.
        kernel, input_bias: Input projection `x_t kernel + input_bias`.
        recurrent_kernel, recurrent_bias: The weights the step maths use.
        initial_states: list of `[batch, units]` tensors.
        reverse: Iterate from the last step to the first; outputs stay
            aligned with the input positions.
        state_mask: Optional recurrent-dropout mask `[batch, units]`.
    """

    math: Any
    inputs: tf.Tensor
    kernel: tf.Tensor
    input_bias: Optional[tf.Tensor]
    recurrent_kernel: tf.Tensor
    recurrent_bias: Optional[tf.Tensor]
    initial_states: Sequence[tf.Tensor]
    reverse: bool = False
    state_mask: Optional[tf.Tensor] = None


class DirectionResult(NamedTuple):
    outputs: Optional[tf.Tensor]  # [batch, time, units], zeros where masked
    final_states: List[tf.Tensor]


def _accumulation_dtype(dtype) -> tf.DType:
    """The dtype the sums over time are taken in: at least float32 (in
    float16 a thousand-step sum loses several percent), and never narrower
    than the layer's own (a float64 layer keeps float64 gradients)."""
    dtype = tf.as_dtype(dtype)
    return dtype if dtype.size >= 4 else tf.float32

_DIFFERENTIABLE = ("inputs", "kernel", "input_bias", "recurrent_kernel", "recurrent_bias")


def run(
    directions: Sequence[Direction],
    mask: Optional[tf.Tensor] = None,
    return_sequences: bool = True,
    bptt: bool = False,
    counter: Optional[compile_policy.ShapeCounter] = None,
) -> List[DirectionResult]:
    """Runs every direction over the whole sequence.

    Args:
        directions: The recurrences; all share batch and time sizes.
        mask: Optional bool `[batch, time]`.
        return_sequences: Collect per-step outputs (else only final states).
        bptt: Keep what the hand-written BPTT needs during the forward loop
            (training). Without it a gradient is still exact, at the price
            of running the forward loop again.
        counter: The calling layer's `compile_policy.ShapeCounter`: with
            it, loops whose shapes can change run XLA-compiled only for
            the shapes that recur (`compile_policy`); without it, they
            always run compiled while XLA is on.
    """
    if mask is not None and not return_sequences and _CompactRows.enabled and not _in_xla():
        # Rows without a valid step (padding words of a character encoder)
        # are left out of sequence-level encoders' loops. Not for per-step
        # outputs, whose rows are rarely empty (the gather and scatter cost a
        # BiGRU tagger's training step about 20%), nor inside XLA (the count
        # of rows left is dynamic), nor when tracing for LiteRT
        # (`_rows_kept`).
        compact, compact_mask, rows = bucketing.valid_rows(directions, mask)
        results = _run_bucketed(compact, compact_mask, return_sequences, bptt, counter)
        return bucketing.restore_rows(results, directions, rows)
    return _run_bucketed(directions, mask, return_sequences, bptt, counter)


def _run_bucketed(directions, mask, return_sequences, bptt, counter) -> List[DirectionResult]:
    if _compiles_per_length(directions):
        directions, mask, steps = bucketing.pad_time(directions, mask)
        return bucketing.crop_time(_run(directions, mask, return_sequences, bptt, counter), steps)
    return _run(directions, mask, return_sequences, bptt, counter)


def _compiles_per_length(directions) -> bool:
    """Whether the loops about to be built are XLA programs that would each
    be compiled again for every new sequence length: in a graph traced with
    an unknown time size, outside an XLA-compiled caller (which has its own
    static shapes). Those run on time buckets (`bucketing`)."""
    unknown_length = directions[0].inputs.shape[1] is None
    return unknown_length and _XLA.enabled and not tf.executing_eagerly() and not _in_xla()


def _run(directions, mask, return_sequences, bptt, counter) -> List[DirectionResult]:
    static = (tuple(_static(d) for d in directions), mask is not None, return_sequences, bptt)
    no_mask = tf.zeros([0], tf.bool)  # a tensor placeholder keeps one signature
    split = len(directions) > 1 and _runs_concurrently()

    flat = _flatten(directions)
    path = _path(directions, flat, counter)
    if counter is not None:
        counter.note_path(path)
    if path in ("forward-mode", "forward-only"):
        runner = functools.partial(_plain_loop, static)
    elif path == "counted" and tf.executing_eagerly():
        compiled = bool(counter.decide(*tf.shape(directions[0].inputs)[:2], bptt))
        runner = functools.partial(_differentiable_loop, static, "shared-xla" if compiled else "shared", split)
    elif path == "counted":
        decide = functools.partial(counter.decide, *tf.unstack(tf.shape(directions[0].inputs)[:2]), bptt)
        runner = functools.partial(_counted_runner(static, split), decide)
    elif path == "compiled":
        runner = _compiled_runner(static, split)
    else:
        # Eagerly the custom gradient goes on the tape directly: a gradient
        # taken through the cached tf.function after it had been traced in
        # another graph (model.fit) failed with "TensorList crossing the
        # XLA/TF boundary". So it does in graphs where a gradient may be
        # differentiated again: the second-order gradient (`_bptt`) must be
        # built in the caller's graph, which a function's gradient is not.
        runner = functools.partial(_differentiable_loop, static, _XLA.enabled, split)

    def loop():
        return runner(flat, mask if mask is not None else no_mask)

    def no_steps():
        # A zero-length sequence: nothing read, so the boundary states stand.
        sequences = [tf.zeros_like(d.inputs[:, :, :1]) * tf.expand_dims(d.initial_states[0], 1) for d in directions]
        return _flatten_outputs(sequences, [d.initial_states for d in directions], return_sequences)

    # XLA cannot compile a loop body over a zero-length axis, so the empty
    # case never reaches it (a static check eagerly, a tf.cond in graphs).
    # Traced for LiteRT (`_no_empty_case`) there is no cond: the converter
    # then sees the weights as constants in the loop body and multiplies
    # with FULLY_CONNECTED instead of BATCH_MATMUL.
    steps = directions[0].inputs.shape[1]
    if steps is None and not _EmptyCase.enabled:
        flat_out = loop()
    elif steps is None:
        flat_out = tf.cond(tf.shape(directions[0].inputs)[1] > 0, loop, no_steps)
    else:
        flat_out = loop() if steps > 0 else no_steps()
    return _unflatten_outputs(flat_out, directions, return_sequences)


def _path(directions, flat, counter) -> str:
    """How the loops of this call are built (`compile_policy` explains
    "counted"); `counter.note_path` records it for `loop_report()`."""
    if _forward_mode(flat):
        return "forward-mode"
    if not _CustomGradient.enabled:
        return "forward-only"
    if not _XLA.enabled:
        return "plain"
    if _in_xla():
        return "inside-xla"
    eager = tf.executing_eagerly()
    if not eager and _higher_order(flat):
        return "higher-order"
    # A SavedModel cannot hold the layer's counts: exports trace fixed loops.
    # Static shapes are counted too: `model.fit` traces its first batch's
    # shape, which may never come again, before relaxing it.
    if counter is None or save_context.in_save_context():
        return "compiled"
    return "counted"


def _higher_order(flat) -> bool:
    """Whether a gradient of these tensors may be differentiated again (two
    tapes, or a persistent one, are watching them)."""
    return gradients_util.PossibleTapeGradientTypes(flat) == gradients_util.POSSIBLE_GRADIENT_TYPES_HIGHER_ORDER


def _forward_mode(flat) -> bool:
    """Whether a `tf.autodiff.ForwardAccumulator` carries tangents of these
    tensors: TensorFlow pushes tangents through a plain loop's ops, but not
    through a custom gradient (it would silently report no tangent)."""
    return bool(forwardprop_util.pack_tangents(flat).tangents)


def _plain_loop(static, flat, mask):
    """The forward loop as plain TensorFlow ops, without custom gradient or
    XLA: for forward-mode derivatives, which TensorFlow takes op by op."""
    specs, has_mask, return_sequences, _ = static
    directions = _unflatten(list(flat), specs)
    sequences, final_states, _ = _forward_loop(directions, mask if has_mask else None, return_sequences, False)
    return _flatten_outputs(sequences, final_states, return_sequences)


class _XLA:
    enabled = True


class _Concurrent:
    enabled = True


class _CompactRows:
    enabled = True


class _CustomGradient:
    enabled = True


class _EmptyCase:
    enabled = True


@contextlib.contextmanager
def _switched_off(setting):
    """Sets `setting.enabled` to False for the `with` block (read when
    functions are traced, so it decides how loops traced inside are built)."""
    previous, setting.enabled = setting.enabled, False
    try:
        yield
    finally:
        setting.enabled = previous


def xla_disabled():
    """Runs loops as plain TensorFlow graphs instead of XLA clusters (used when
    exporting SavedModels, so that serving needs no XLA JIT)."""
    return _switched_off(_XLA)


def _rows_kept():
    """Sequence-level encoders run every row instead of leaving rows without
    a valid step out (`bucketing.valid_rows`). For `litert.export_tflite`:
    the row compaction's DynamicPartition / ScatterNd are no LiteRT builtin
    ops, and a batch of dynamic size would make the loops' TensorLists
    dynamic. Exact either way: a fully masked row changes nothing. Read when
    functions are traced, like `xla_disabled`."""
    return _switched_off(_CompactRows)


def _no_empty_case():
    """Loops traced inside have no branch for a zero-length time axis, for
    `litert.export_tflite`: the branch hides the weights from the
    converter, which then multiplies with slow BATCH_MATMULs, not
    FULLY_CONNECTED. Such a graph needs at least one time step (with none
    it fails, it is not silently wrong). Read when functions are traced."""
    return _switched_off(_EmptyCase)


def _forward_only():
    """Loops traced inside are the forward pass alone, as plain ops, without
    the custom gradient and its BPTT functions: for exported serving graphs
    (`export.export_saved_model`, `litert.export_tflite`), which then hold
    no function a reload warns about ("unsaved custom gradients"); a
    gradient asked of a reloaded model comes from TensorFlow's own autodiff
    through the `While` loop. Read when functions are traced."""
    return _switched_off(_CustomGradient)


def fused_directions():
    """Builds bidirectional layers with both directions in one loop even in
    graphs, instead of one loop per direction run concurrently: slower, but
    for a GRU a training step's peak memory is about 20% lower (0.8-0.85
    against 0.96-1.04 times Keras's growth per step; for an LSTM it is not
    lower: 0.99-1.07 against 0.96-1.00, benchmarks/README.md), for very long
    sequences. Read when functions are traced, like `xla_disabled`."""
    return _switched_off(_Concurrent)


def _runs_concurrently() -> bool:
    """Whether independent loops built now would run at the same time: in a
    graph TensorFlow's executor starts both at once; eagerly each call
    blocks, and XLA serialises the loops of one computation."""
    if not _Concurrent.enabled or tf.executing_eagerly():
        return False
    return tf.__internal__.get_enclosing_xla_context() is None


def _static(d: Direction) -> tuple:
    """What a compiled loop is specialised on: everything but tensor values
    and the batch and time sizes. The weights' shapes are part of it, so a
    function traced for several batch/time sizes relaxes only those."""
    present = tuple(getattr(d, name) is not None for name in _DIFFERENTIABLE + ("state_mask",))
    shapes = (tuple(d.kernel.shape.as_list()), tuple(d.recurrent_kernel.shape.as_list()))
    return (d.math, d.reverse, len(d.initial_states), present, shapes, d.inputs.dtype.name)


def _flatten(directions) -> list:
    flat = []
    for d in directions:
        flat.extend(getattr(d, name) for name in _DIFFERENTIABLE if getattr(d, name) is not None)
        flat.extend(d.initial_states)
        if d.state_mask is not None:
            flat.append(d.state_mask)
    return flat


def _unflatten(flat, specs) -> List[Direction]:
    rebuilt, pos = [], 0
    for math, reverse, n_states, present, _, _ in specs:
        fields = {}
        for name, there in zip(_DIFFERENTIABLE, present):
            fields[name] = flat[pos] if there else None
            pos += int(there)
        states = list(flat[pos : pos + n_states])
        pos += n_states
        state_mask = None
        if present[-1]:
            state_mask, pos = flat[pos], pos + 1
        rebuilt.append(Direction(math, initial_states=states, reverse=reverse, state_mask=state_mask, **fields))
    return rebuilt


@functools.lru_cache(maxsize=None)
def _counted_runner(static, split: bool):
    """`_compiled_runner` choosing at run time, per call, between the
    XLA-compiled loops and the plain ones: `decide()` (the layer's count,
    built in the caller's graph, where the layer's table is) says which."""
    runner = tf.function(
        lambda flat, mask, use_compiled: _differentiable_loop(static, None, split, flat, mask, use_compiled),
        reduce_retracing=True,
        autograph=False,
    )
    return lambda decide, flat, mask: runner(flat, mask, decide())


@functools.lru_cache(maxsize=None)
def _compiled_runner(static, split: bool):
    # A plain tf.function holding the custom gradient, around XLA-compiled
    # loops: TensorFlow differentiates this function, never an XLA one.
    runner = functools.partial(_differentiable_loop, static, True, split)
    return tf.function(runner, reduce_retracing=True, autograph=False)


def _differentiable_loop(static, xla, split, flat, mask, use_compiled=None):
    """The loops under `tf.custom_gradient`, from outside: TensorFlow never
    differentiates a loop, nor an XLA-compiled function (which it cannot do
    when the gradient needs the loop's TensorLists), it only calls them.

    With `keep` (training) the forward loop keeps what BPTT needs; without it
    (inference) it keeps nothing, and a gradient asked for anyway recomputes
    the forward loop first. The state masks (recurrent dropout) are constants.
    The BPTT is itself differentiable (`_bptt`), for gradient penalties and
    other derivatives of gradients. With `use_compiled` (a bool tensor),
    every loop is a `tf.cond` between its XLA-compiled and plain forms.
    """
    if use_compiled is None:
        forward, recompute, backward = _loop_functions(static, xla, split)
    else:
        forward, recompute, backward = _chosen_loop_functions(static, split, use_compiled)
    keep = static[3]
    constant = _state_mask_positions(static[0])

    @tf.custom_gradient
    def recurrence(*originals):
        # stop_gradient: an active tape must not record the loops themselves
        # (it would ask the XLA function for its TensorList intermediates);
        # `grad` below is the only way back.
        flat_inputs = [tf.stop_gradient(t) for t in originals]
        flat_out, memory = forward(flat_inputs, mask)

        def fast_gradients(d_flat_out):
            kept = memory if keep else recompute(flat_inputs, mask)[1]
            return backward(flat_inputs, mask, kept, d_flat_out)

        def grad(*d_flat_out):
            d_flat_out = [tf.zeros_like(o) if g is None else g for g, o in zip(d_flat_out, flat_out)]
            grads = iter(_bptt(static, fast_gradients, list(originals), mask, d_flat_out, constant))
            return [None if k in constant else next(grads) for k in range(len(originals))]

        return flat_out, grad

    return recurrence(*flat)


def _bptt(static, fast_gradients, flat, mask, d_flat_out, constant) -> list:
    """The gradients of the non-constant inputs, by the fast hand-written
    BPTT; differentiating them again (a gradient penalty, a persistent tape
    asked twice) goes through `_autodiff_gradients` instead, which
    TensorFlow can differentiate to any order (the compiled loops cannot be
    differentiated at all)."""
    n = len(flat)

    @tf.custom_gradient
    def bptt(*flat_and_d_out):
        d_out = [tf.stop_gradient(g) for g in flat_and_d_out[n:]]

        def second_order(*upstream):
            with tf.GradientTape() as tape:
                slots = _distinct(flat_and_d_out, tape)
                first = _autodiff_gradients(static, slots[:n], mask, slots[n:], constant)
            upstream = [tf.zeros_like(f) if u is None else u for u, f in zip(upstream, first)]
            return tape.gradient(first, slots, output_gradients=upstream)

        return fast_gradients(d_out), second_order

    return bptt(*flat, *d_flat_out)


def _autodiff_gradients(static, flat, mask, d_flat_out, constant) -> list:
    """What the BPTT computes, by autodiff through the forward loop run as
    plain TensorFlow (slower; used only to differentiate gradients)."""
    with tf.GradientTape() as tape:
        flat = _distinct(flat, tape)
        flat_out = _plain_loop(static, flat, mask)
    variables = [t for k, t in enumerate(flat) if k not in constant]
    return tape.gradient(
        flat_out, variables, output_gradients=d_flat_out, unconnected_gradients=tf.UnconnectedGradients.ZERO
    )


def _distinct(tensors, tape) -> list:
    """A watched copy of each tensor: one tensor may fill several slots (both
    directions read the same inputs), and a tape asked for the gradient of
    each slot would give every one of them the sum over all."""
    copies = [tf.identity(t) for t in tensors]
    tape.watch(copies)
    return copies


def _flat_size(spec) -> int:
    """How many tensors `_flatten` lays out for one direction: its present
    fields, its initial states, then its state mask if it has one."""
    _, _, n_states, present, _, _ = spec
    return sum(present) + n_states


def _state_mask_positions(specs) -> set:
    positions, end = set(), 0
    for spec in specs:
        end += _flat_size(spec)
        if spec[3][-1]:  # a direction's state mask is its last tensor
            positions.add(end - 1)
    return positions


def _chosen_loop_functions(static, split: bool, use_compiled: tf.Tensor):
    """`_loop_functions`' three functions, each running the XLA-compiled
    form where `use_compiled` holds and the plain one elsewhere (in a graph
    XLA compiles a branch only when it runs). Both forms call the same
    traced loops (`_shared_leaf`), so a new signature is traced once."""
    compiled, plain = _loop_functions(static, "shared-xla", split), _loop_functions(static, "shared", split)

    def choose(k):
        return lambda *args: tf.cond(use_compiled, lambda: compiled[k](*args), lambda: plain[k](*args))

    return choose(0), choose(1), choose(2)


_SHARED_LEAVES: dict = {}


def _shared_leaf(key, fn):
    """One plain `tf.function` per loop role and structure, which the plain
    form calls directly and the XLA form calls inside its own compiled
    function: tracing a loop (not compiling it) is most of a new
    signature's graph-building time, and a graph holding both forms traced
    each loop twice."""
    leaf = _SHARED_LEAVES.get(key)
    if leaf is None:
        leaf = _SHARED_LEAVES[key] = tf.function(fn, reduce_retracing=True, autograph=False)
    return leaf


@functools.lru_cache(maxsize=None)
def _loop_functions(static, xla, split: bool):
    """forward(flat, mask) -> (flat outputs, flat memory), the same keeping
    memory, and backward(flat, mask, memory, d_outputs) -> gradients. With
    XLA, the loops (not backward's bulk matmuls) are compiled once per loop
    structure and reused across calls (eagerly too); XLA compiles each once
    per concrete input shape. An inference forward of one direction has two
    loops, for small and large steps (`_by_batch_size`). With `split`,
    every direction has loops of its own (`_split_loop_functions`)."""
    if split:
        return _split_loop_functions(static, xla)
    specs, has_mask, return_sequences, keep = static
    # The shared forms read slices as XLA's do (`_time_loop`), in both.
    xla_reads = xla in (True, "shared", "shared-xla")

    def forward_fn(keep_for_bptt, read_in_step=False):
        def forward(flat, mask):
            directions = _unflatten(list(flat), specs)
            sequences, final_states, memory = _forward_loop(
                directions, mask if has_mask else None, return_sequences, keep_for_bptt, read_in_step, xla_reads
            )
            flat_out = _flatten_outputs(sequences, final_states, return_sequences)
            return flat_out, [t for kept in memory for t in kept]

        return forward

    def backward_loop(flat, mask, memory, d_flat_out):
        directions = _unflatten(list(flat), specs)
        records, d_initial = _backward_loop(
            directions,
            mask if has_mask else None,
            return_sequences,
            _group_memory(directions, memory),
            d_flat_out,
            xla_reads,
        )
        return records, d_initial

    def backward(flat, mask, memory, d_flat_out):
        # Only the loop is compiled: the sums over time are a few large
        # matmuls that TensorFlow's own kernels run as fast, and leaving
        # them out of XLA cut the backward pass's compile time from 1.45 to
        # 1.03 s (textbook GRU).
        records, d_initial = compiled_backward_loop(flat, mask, memory, d_flat_out)
        directions = _unflatten(list(flat), specs)
        memory = _group_memory(directions, memory)
        return _bulk_gradients(directions, memory, records, d_initial, mask if has_mask else None)

    def compiled(role, fn):
        # xla: True (XLA-compiled), "function" (a plain tf.function: eager
        # calls run graphs, not Python loops), False (inline ops), "shared"
        # / "shared-xla" (the plain and XLA forms of the counted path,
        # around one traced function per role).
        if not xla:
            return fn
        if xla in ("shared", "shared-xla"):
            plain = _shared_leaf((static, role), fn)
            if xla == "shared":
                return plain
            return tf.function(lambda *args: plain(*args), jit_compile=True, reduce_retracing=True, autograph=False)
        return tf.function(fn, jit_compile=xla is True, reduce_retracing=True, autograph=False)

    compiled_backward_loop = compiled("backward", backward_loop)
    keeping = compiled("keeping", forward_fn(True))
    if keep:
        return keeping, keeping, backward
    forward = compiled("forward", forward_fn(False))
    max_inline_batch = _max_inline_batch(specs) if xla_reads else 0
    if max_inline_batch:
        small = compiled("small", forward_fn(False, read_in_step=True))
        forward = _by_batch_size(max_inline_batch, small=small, large=forward)
    return forward, keeping, backward


# Multiply-adds of one step's matmuls (batch x (features + units) x gate
# width) up to which a one-direction inference loop reads its inputs inside
# the step. Such a step has at most 8 XLA kernels, which XLA's CPU runtime
# then runs in order on the calling thread instead of handing them to
# TensorFlow's intra-op pool. Measured (A/B in one process, inference time
# new / old): 0.92-0.95 at 1.2-3.1 M multiply-adds, 0.94-1.01 at 4.7-6.3 M,
# 1.23-1.26 at 9.4-12.6 M (one thread's matmuls are then too slow).
_INLINE_STEP_LIMIT = 5_000_000


def _max_inline_batch(specs) -> int:
    """The largest batch for which the inline-read loop is used (0: never):
    only one direction per loop (the bidirectional layer's concurrent parts,
    or `kb.Recurrent`); a fused loop has too many kernels per step."""
    if len(specs) != 1:
        return 0
    kernel_shape, recurrent_shape = specs[0][4]
    per_row = (kernel_shape[0] + recurrent_shape[0]) * recurrent_shape[1]
    return _INLINE_STEP_LIMIT // per_row


def _by_batch_size(max_batch: int, small, large):
    """A forward function calling `small` up to `max_batch` rows, else
    `large`: decided when traced if the batch size is known then, by a
    `tf.cond` otherwise (in a graph only the branch taken is ever compiled
    by XLA; inside an XLA-compiled caller both are, as part of it)."""

    def forward(flat, mask):
        batch = flat[0].shape[0]  # a direction's inputs come first
        if batch is not None:
            return (small if batch <= max_batch else large)(flat, mask)
        return tf.cond(
            tf.shape(flat[0])[0] <= max_batch, lambda: small(flat, mask), lambda: large(flat, mask)
        )

    return forward


def _split_loop_functions(static, xla: bool):
    """The same three functions, made of one direction's loops each: in a
    graph TensorFlow's executor runs the directions' loops at the same time."""
    specs, has_mask, return_sequences, keep = static
    parts = [_loop_functions(((spec,), has_mask, return_sequences, keep), xla, False) for spec in specs]
    n_states = [n for _, _, n, _, _, _ in specs]
    # Per direction, as _flatten, _group_memory and _flatten_outputs lay them out.
    inputs = _splitter([_flat_size(spec) for spec in specs])
    memories = _splitter([1 + n for n in n_states])
    outputs = _splitter([int(return_sequences) + n for n in n_states])

    def forward_fn(which):
        def forward(flat, mask):
            flat_out, memory = [], []
            for part, flat_part in zip(parts, inputs(flat)):
                part_out, part_memory = part[which](flat_part, mask)
                flat_out.extend(part_out)
                memory.extend(part_memory)
            return flat_out, memory

        return forward

    def backward(flat, mask, memory, d_flat_out):
        grads = []
        pieces = zip(parts, inputs(flat), memories(memory), outputs(d_flat_out))
        for part, flat_part, part_memory, part_d_out in pieces:
            grads.extend(part[2](flat_part, mask, part_memory, part_d_out))
        return grads

    return forward_fn(0), forward_fn(1), backward


def _splitter(sizes):
    """A function cutting a flat list into consecutive pieces of `sizes`."""

    def split(flat):
        pieces, pos = [], 0
        for size in sizes:
            pieces.append(list(flat[pos : pos + size]))
            pos += size
        return pieces

    return split


def _group_memory(directions, memory) -> list:
    # Per direction: what the step maths saved, then the incoming states.
    return _splitter([1 + len(d.initial_states) for d in directions])(memory)


class _Span(NamedTuple):
    """The time positions a loop visits: `first` to `first + count - 1`."""

    first: Any  # the Python int 0 when every position is visited
    count: Any


def _span(mask: Optional[tf.Tensor], steps) -> _Span:
    """Every position without a mask; with one, the positions from the first
    that some row has valid to the last (at least one). A step masked in
    every row changes no state and outputs zeros, so skipping it is exact:
    a batch padded beyond its longest row, or to a time bucket
    (`bucketing`), costs no steps for the padding."""
    if mask is None:
        return _Span(0, steps)
    positions = tf.range(steps)
    any_valid = tf.reduce_any(mask, axis=0)
    first = tf.reduce_min(tf.where(any_valid, positions, steps))
    last = tf.reduce_max(tf.where(any_valid, positions, -1))
    # No valid step at all: one masked step, so that every loop writes
    # something (a plain TensorArray with nothing written cannot be stacked).
    first = tf.where(last < 0, 0, first)
    return _Span(first, tf.maximum(last + 1 - first, 1))


def _time_index(direction: Direction, i, span: _Span):
    """The input position a direction reads at forward iteration `i`."""
    offset = span.count - 1 - i if direction.reverse else i
    return offset if _visits_all(span) else span.first + offset


def _visits_all(span: _Span) -> bool:
    return isinstance(span.first, int) and span.first == 0


def _at(sequence_tm: tf.Tensor, t, span: _Span) -> tf.Tensor:
    """Position `t` of a time-major sequence. When `t` depends on the mask
    (`_span`), a gather: XLA would take the strided slice read before the
    loop as needing a constant, turn the mask into one and compile the loop
    again for every new mask."""
    return sequence_tm[t] if _visits_all(span) else tf.gather(sequence_tm, t)


def _in_time_order(stacked_tm: tf.Tensor, direction: Direction, span: _Span, steps) -> tf.Tensor:
    """The outputs the forward loop wrote at its iterations `i` (`stacked_tm`,
    time-major), each moved to its input position (`_time_index`), zeros at
    the positions the loop skipped (`_span`).

    The loop writes its outputs at the iteration, not at the position:
    converters that turn the loop into an ONNX `Loop` (tf2onnx) make every
    TensorArray write a scan output, stacked in iteration order whatever
    the index written at, and only as long as the loop ran. Written at the
    position, a backward direction's outputs came out reversed in time, and
    a batch padded beyond its longest row came out that much shorter.
    Exact in TensorFlow: a reverse, or a gather and a select."""
    if _visits_all(span):
        return tf.reverse(stacked_tm, [0]) if direction.reverse else stacked_tm
    positions = tf.range(steps)
    iteration = span.first + span.count - 1 - positions if direction.reverse else positions - span.first
    visited = (iteration >= 0) & (iteration < span.count)
    # Clipped into the iterations run: a converted loop's stack has only those.
    gathered = tf.gather(stacked_tm, tf.clip_by_value(iteration, 0, span.count - 1))
    return tf.where(tf.reshape(visited, [-1, 1, 1]), gathered, tf.zeros_like(gathered))


def _backward_time_index(direction: Direction, i, span: _Span):
    """The input position BPTT visits at iteration `i`: the forward order reversed."""
    return _time_index(direction, span.count - 1 - i, span)


def _array(like, steps):
    return tf.TensorArray(like.dtype, size=steps, element_shape=like.shape)


def _time_loop(span: _Span, steps, read, body, state):
    """`tf.while_loop` over `i` in `[0, span.count)`; `body(i, current, state)`
    gets `current`, the step's slices. `read(i)` returns them as
    `(slice, in_step)` pairs: each is sliced inside the step or read one
    iteration ahead into a loop-carried tensor (`in_step` must not depend
    on `i`).

    In the step, XLA fuses each slice into the kernels that use it, and
    the loop carries nothing extra; read ahead, XLA materialises each slice
    with a copy and copies it again as a loop-carried value. Which loops do
    which was measured (benchmarks/README.md): training loops compiled by
    XLA slice in the step (textbook training steps 3-10% faster; the fused
    kernels checked were vectorised, per their LLVM IR), except kept memory
    a cell asks to have materialised (`_materialize_saved`: the one-tanh
    LSTM's kept gates, whose fused kernels were not). So do one-direction
    inference loops with small steps, which then have few enough kernels
    for XLA to run them in order on one thread (`_INLINE_STEP_LIMIT`).
    Other inference loops read ahead: in the step they measured no faster
    at the textbook shape and 1.18-1.24x slower at the large one. (An
    earlier version of these loops found slice-fused kernels unvectorised
    and 4-9 times slower, which is why reading ahead exists.) Loops not
    compiled by XLA read ahead, as before.

    `maximum_iterations` is the sequence's length `steps`, never the
    span's count: XLA needs it as a constant, and one computed from the
    mask would make XLA compile the loop again for every new mask.
    """
    first = read(0)
    flags = [now for _, now in first]

    def ahead(pairs):
        return [s for s, now in pairs if not now]

    def current(i, carried):
        if not any(flags):
            return carried
        carried = iter(carried)
        return [s if now else next(carried) for s, now in read(i)]

    def cond(i, *_):
        return i < span.count

    def loop_body(i, carried, state):
        state = body(i, current(i, carried), state)
        carried = ahead(read(tf.minimum(i + 1, span.count - 1))) if not all(flags) else []
        return i + 1, carried, state

    _, _, state = tf.while_loop(cond, loop_body, (tf.constant(0), ahead(first), state), maximum_iterations=steps)
    return state


def _in_xla() -> bool:
    """Whether a loop traced now is compiled by XLA (in-step reads were
    measured there only)."""
    return tf.__internal__.get_enclosing_xla_context() is not None


def _forward_loop(directions, mask, return_sequences, keep_for_bptt, read_in_step=False, xla_reads=False):
    """The loop itself. With `keep_for_bptt`, also returns per direction the
    time-major stacks of what the step maths saved and of the incoming states
    (what the backward step needs; the projected inputs are not kept).
    Slices are read in the step with `read_in_step` (the small-step
    inference loop) and, inside XLA, when keeping for BPTT (`_time_loop`)."""
    inputs_tm = [tf.transpose(d.inputs, [1, 0, 2]) for d in directions]
    steps = tf.shape(inputs_tm[0])[0]
    mask_tm = None if mask is None else tf.expand_dims(tf.transpose(mask), -1)
    span = _span(mask, steps)

    in_step = read_in_step or (keep_for_bptt and (xla_reads or _in_xla()))

    def read(i):
        current = []
        for k, d in enumerate(directions):
            t = _time_index(d, i, span)
            current.append((_at(inputs_tm[k], t, span), in_step))
            if mask_tm is not None:
                current.append((_at(mask_tm, t, span), in_step))
        return current

    def step(d, x_t, valid, states):
        projected = input_projection(x_t, d.kernel, d.input_bias)
        stepped, saved = d.math.forward(projected, states, d.recurrent_kernel, d.recurrent_bias, d.state_mask)
        emitted = stepped[0]
        if valid is not None:
            stepped = [tf.where(valid, s, old) for s, old in zip(stepped, states)]
            emitted = tf.where(valid, emitted, tf.zeros_like(emitted))
        return stepped, emitted, [saved] + list(states)

    def body(i, current, state):
        states, outputs, kept = state
        current = iter(current)
        new_states, new_outputs, new_kept = [], [], []
        for k, d in enumerate(directions):
            t = _time_index(d, i, span)
            x_t, valid = next(current), None if mask_tm is None else next(current)
            stepped, emitted, memory = step(d, x_t, valid, states[k])
            new_states.append(stepped)
            if outputs:
                # Written in iteration order, put in time order after the
                # loop (`_in_time_order`).
                new_outputs.append(outputs[k].write(i, emitted))
            if kept:
                new_kept.append([a.write(t, m) for a, m in zip(kept[k], memory)])
        return new_states, new_outputs, new_kept

    outputs = [_array(d.initial_states[0], steps) for d in directions] if return_sequences else []
    kept = [_memory_arrays(d, steps) for d in directions] if keep_for_bptt else []
    initial = ([list(d.initial_states) for d in directions], outputs, kept)
    final_states, outputs, kept = _time_loop(span, steps, read, body, initial)
    sequences = [None] * len(directions)
    if outputs:
        sequences = [tf.transpose(_in_time_order(o.stack(), d, span, steps), [1, 0, 2]) for o, d in zip(outputs, directions)]
    memory = [[a.stack() for a in arrays] for arrays in kept]
    return sequences, [list(s) for s in final_states], memory


def _memory_arrays(d: Direction, steps):
    batch = d.initial_states[0].shape[0]
    saved_shape = [batch, d.math.saved_width(d.recurrent_kernel.shape[0])]
    saved = tf.TensorArray(d.inputs.dtype, size=steps, element_shape=saved_shape)
    return [saved] + [_array(s, steps) for s in d.initial_states]


def _flatten_outputs(sequences, final_states, return_sequences):
    flat_out = []
    for seq, states in zip(sequences, final_states):
        flat_out.extend(([seq] if return_sequences else []) + list(states))
    return flat_out


def _unflatten_outputs(flat_out, directions, return_sequences):
    """Splits the flat outputs per direction and restores their static shapes
    (a compiled loop traced for several shapes only knows relaxed ones)."""
    results, pos = [], 0
    for d in directions:
        state_shape = d.initial_states[0].shape
        seq = None
        if return_sequences:
            seq, pos = flat_out[pos], pos + 1
            seq = _with_static_shape(seq, d.inputs.shape[:2].concatenate(state_shape[-1:]))
        n = len(d.initial_states)
        states = [_with_static_shape(s, i.shape) for s, i in zip(flat_out[pos : pos + n], d.initial_states)]
        results.append(DirectionResult(seq, states))
        pos += n
    return results


def _with_static_shape(tensor, shape):
    """`tensor` with what is statically known of its shape merged in (no op:
    `tf.ensure_shape` has no forward-mode derivative in graphs)."""
    if not tf.executing_eagerly():  # an eager tensor knows its whole shape
        tensor.set_shape(shape)
    return tensor


def _split_output_grads(directions, return_sequences, d_flat_out):
    per_direction, pos = [], 0
    for d in directions:
        d_seq = None
        if return_sequences:
            d_seq, pos = d_flat_out[pos], pos + 1
        n = len(d.initial_states)
        d_final = [
            tf.zeros_like(s) if g is None else g for g, s in zip(d_flat_out[pos : pos + n], d.initial_states)
        ]
        pos += n
        per_direction.append((d_seq, d_final))
    return per_direction


def _bulk_gradients(directions, memory, records, d_initial, mask) -> list:
    """After the BPTT loop (BRNN, BPTT and boundary states): every gradient that is a sum over time,
    as one large matmul over all the steps the loops visited (`_span`; the
    others' records are zeros, and their inputs' gradients are zeros)."""
    steps = tf.shape(directions[0].inputs)[1]
    # Inside an XLA-compiled caller a slice's size must be a constant: there
    # the sums run over every step, the skipped ones adding zeros.
    span = _span(None if _in_xla() else mask, steps)
    grads = []
    for d, kept, record, d_init in zip(directions, memory, records, d_initial):
        inputs_tm = _visited(tf.transpose(d.inputs, [1, 0, 2]), span)
        record = _visited(record, span)
        flat_record = tf.reshape(record, [-1, record.shape[-1]])
        flat_dp = d.math.input_gradient(flat_record)
        d_inputs = tf.reshape(tf.matmul(flat_dp, d.kernel, transpose_b=True), tf.shape(inputs_tm))
        grads.append(tf.transpose(_padded_to_all(d_inputs, span, steps), [1, 0, 2]))
        grads.append(_summed_matmul(tf.reshape(inputs_tm, [-1, d.kernel.shape[0]]), flat_dp, d.kernel.dtype))
        if d.input_bias is not None:
            accumulate = _accumulation_dtype(flat_dp.dtype)
            grads.append(tf.cast(column_sum(tf.cast(flat_dp, accumulate)), d.input_bias.dtype))
        grads.extend(_recurrent_gradients(d, _visited(kept[1], span), flat_record))
        grads.extend(d_init)
    return grads


def _visited(sequence_tm: tf.Tensor, span: _Span) -> tf.Tensor:
    """The time-major sequence at the positions the loops visited."""
    if _visits_all(span):
        return sequence_tm
    visited = tf.slice(sequence_tm, tf.stack([span.first, 0, 0]), tf.stack([span.count, -1, -1]))
    return _with_static_shape(visited, [None] + sequence_tm.shape[1:].as_list())


def _padded_to_all(sequence_tm: tf.Tensor, span: _Span, steps) -> tf.Tensor:
    """`_visited`'s inverse: zeros at the positions the loops skipped."""
    if _visits_all(span):
        return sequence_tm
    return tf.pad(sequence_tm, [[span.first, steps - span.first - span.count], [0, 0], [0, 0]])


def _summed_matmul(a, b, dtype):
    """`a^T b`, a sum over every step and row (`_accumulation_dtype`)."""
    accumulate = _accumulation_dtype(b.dtype)
    return tf.cast(tf.matmul(tf.cast(a, accumulate), tf.cast(b, accumulate), transpose_a=True), dtype)


def _recurrent_gradients(d: Direction, incoming_h, flat_record) -> list:
    """The recurrent kernel's (and bias's) gradient from the incoming states
    kept by the forward loop, summed over all steps in one matmul."""
    h_in = incoming_h if d.state_mask is None else incoming_h * d.state_mask
    accumulate = _accumulation_dtype(flat_record.dtype)
    h_in = tf.cast(tf.reshape(h_in, [-1, d.recurrent_kernel.shape[0]]), accumulate)
    d_kernel, d_bias = d.math.kernel_gradient(h_in, tf.cast(flat_record, accumulate))
    grads = [tf.cast(d_kernel, d.recurrent_kernel.dtype)]
    if d.recurrent_bias is not None:
        grads.append(tf.cast(d_bias, d.recurrent_bias.dtype))
    return grads


def _materialize_saved(d: Direction) -> bool:
    """Whether the cell asks for its saved memory to be materialised once per
    backward step (read one iteration ahead) rather than fused into the
    step's kernels: see `RecurrentCell.step_math`."""
    return bool(getattr(d.math, "materialize_saved", False))


def _backward_loop(directions, mask, return_sequences, memory, d_flat_out, xla_reads=False):
    """Each direction walks back over its own time order; returns per
    direction the time-major stack of the cell's per-step records (from
    which the bulk gradients are summed) and the initial states' gradients."""
    steps = tf.shape(directions[0].inputs)[1]
    mask_tm = None if mask is None else tf.expand_dims(tf.transpose(mask), -1)
    span = _span(mask, steps)
    output_grads = _split_output_grads(directions, return_sequences, d_flat_out)
    d_seq_tm = [None if g is None else tf.transpose(g, [1, 0, 2]) for g, _ in output_grads]
    # Transposed once, before the loop: with the transpose inside the
    # step's matmul, training steps measured 3-9% slower (LSTM at both
    # shapes, GRU at the large one; benchmarks/README.md).
    transposed_kernels = [tf.transpose(d.recurrent_kernel) for d in directions]

    in_xla = xla_reads or _in_xla()

    def read(i):
        current = []
        for k, d in enumerate(directions):
            t = _backward_time_index(d, i, span)
            saved, *incoming = memory[k]
            current.append((_at(saved, t, span), in_xla and not _materialize_saved(d)))
            current.extend((_at(m, t, span), in_xla) for m in incoming)
            if d_seq_tm[k] is not None:
                current.append((_at(d_seq_tm[k], t, span), in_xla))
            if mask_tm is not None:
                current.append((_at(mask_tm, t, span), in_xla))
        return current

    def step(d, transposed_kernel, kept, d_seq, valid, d_state):
        d_new = list(d_state)
        if d_seq is not None:
            d_new[0] = d_new[0] + d_seq
        if valid is not None:
            d_new = [tf.where(valid, g, tf.zeros_like(g)) for g in d_new]
        saved, *incoming = kept
        record, d_prev = d.math.backward(incoming, saved, transposed_kernel, d.state_mask, d_new)
        if valid is not None:
            # A masked step passed its state through: so does its gradient.
            d_prev = [tf.where(valid, g, old) for g, old in zip(d_prev, d_state)]
        return record, d_prev

    def body(i, current, state):
        d_states, records = state
        current = iter(current)
        new_states, new_records = [], []
        for k, d in enumerate(directions):
            t = _backward_time_index(d, i, span)
            kept = [next(current) for _ in memory[k]]
            d_seq = None if d_seq_tm[k] is None else next(current)
            valid = None if mask_tm is None else next(current)
            record, d_prev = step(d, transposed_kernels[k], kept, d_seq, valid, d_states[k])
            new_states.append(d_prev)
            new_records.append(records[k].write(t, record))
        return new_states, new_records

    records = [
        tf.TensorArray(
            d.inputs.dtype,
            size=steps,
            element_shape=[d.inputs.shape[0], d.math.record_width(d.recurrent_kernel.shape[0])],
        )
        for d in directions
    ]
    d_states, records = _time_loop(span, steps, read, body, ([final for _, final in output_grads], records))
    return [a.stack() for a in records], d_states
