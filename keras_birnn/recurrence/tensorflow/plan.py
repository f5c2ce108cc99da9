"""The one place that decides how a call's loops are built: `plan`.

Every choice about a call (which path, which loop form, time buckets, the
zero-length case, the directions in lockstep in one loop or a loop per
direction, kept memory, rows left out) is made here, from the directions, the mask, the tracing context, the
tapes and the `LoopConfig` in force, and returned as a frozen `LoopPlan`.
The engine (`dispatch`, `compiled`, `loops`) executes a plan and never
looks at the context itself; `loop_report()` lists the plans that ran.

The questions only this module asks: traced or eager? inside an
XLA-compiled caller? under a forward-mode accumulator, or a tape that may
differentiate twice? writing a SavedModel? which settings are in force?
"""

import dataclasses
import enum
from typing import NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from keras_birnn.tf_internal import (
    carries_tangents,
    in_legacy_keras_saving_trace,
    in_save_context,
    in_xla_context,
    may_differentiate_twice,
    tape_may_record,
)
from keras_birnn.config import LoopConfig, loop_config


class Path(enum.Enum):
    """Why the loops are built the way they are (`loop_report()`'s label)."""

    FORWARD_MODE = "forward-mode"  # a ForwardAccumulator watches: plain ops, autodiff's tangents
    FORWARD_ONLY = "forward-only"  # `kb.for_export()` or a converter's trace: plain forward loops
    PLAIN = "plain"  # `kb.xla_disabled()`: plain loops under the custom gradient
    INSIDE_XLA = "inside-xla"  # part of an XLA-compiled caller
    HIGHER_ORDER = "higher-order"  # a tape may differentiate the gradient again
    COMPILED = "compiled"  # XLA-compiled outright: no layer count, or a SavedModel being written
    INFERENCE = "inference"  # inference traced for any length: plain loops, uncounted
    COUNTED = "counted"  # XLA or plain per shape, by the layer's count (`compile_policy`)


class Form(enum.Enum):
    """How the loop functions run (`compiled._loops`)."""

    OPS = "ops"  # plain ops in the caller's graph, differentiated by TensorFlow
    INLINE = "inline"  # plain ops in the caller's graph, under the custom gradient
    FUNCTION = "function"  # plain tf.functions, not inlined
    XLA = "xla"  # XLA-compiled tf.functions
    SHARED = "shared"  # the counted path's plain form, one traced leaf per role
    SHARED_XLA = "shared-xla"  # the counted path's XLA form around the same leaves
    CHOSEN = "chosen"  # either shared form, chosen per call in the graph by the count


class Runner(enum.Enum):
    """What calls the loop functions."""

    PLAIN_OPS = "plain-ops"  # `loops.plain_loop`: no custom gradient
    DIFFERENTIABLE = "differentiable"  # the custom gradient, in the caller's graph
    COMPILED_FUNCTION = "compiled-function"  # a cached tf.function around the custom gradient
    COUNTED_FUNCTION = "counted-function"  # the same, given the count's choice as a tensor


class Caller(enum.Enum):
    """Where the call is built."""

    EAGER = "eager"
    GRAPH = "graph"
    XLA = "xla"  # a graph XLA compiles as a whole


class Rows(enum.Enum):
    ALL = "all"
    VALID = "valid"  # rows without a valid step left out (`bucketing.valid_rows`)


class TimePadding(enum.Enum):
    NONE = "none"
    BUCKETS = "buckets"  # to a bucket length: XLA compiles a program per length (`bucketing`)
    ONE_STEP = "one-step"  # only an empty sequence, to one masked step: no zero-length branch


class EmptyCase(enum.Enum):
    STATIC = "static"  # the time size is known when traced
    BRANCH = "branch"  # a `tf.cond` on the time size
    NONE = "none"  # no branch: padded to a step, or traced for LiteRT (time 0 fails loudly)


class Lockstep(enum.Enum):
    """Whether the directions advance in lockstep, in one loop."""

    ONE_LOOP = "one-loop"  # every direction advances in the same iteration
    PER_DIRECTION = "per-direction"  # a loop per direction, run at the same time by the executor


class Memory(enum.Enum):
    NONE = "none"  # no hand-written BPTT: TensorFlow differentiates the loops
    KEEP = "keep"  # the forward loop keeps what the BPTT needs (training)
    RECOMPUTE = "recompute"  # kept nothing; a gradient asked anyway runs the forward loop again


class Build(NamedTuple):
    """What the loop functions are specialised on beyond the loop key (the
    loop cache keys on it), with the plan's tuning constants."""

    form: Form
    split: bool
    xla_caller: bool  # the caller is compiled by XLA
    inline_step_limit: int
    functional_step_limit: int
    functional_row_limit: int
    functional_training_rows: int

    @property
    def xla_body(self) -> bool:
        """Whether the loop bodies are compiled by XLA (the counted path's
        plain form too: it shares its traced loops with the XLA form)."""
        return self.form in (Form.XLA, Form.SHARED, Form.SHARED_XLA) or self.xla_caller

    @property
    def compiles(self) -> bool:
        """Whether the loop functions themselves are XLA-compiled."""
        return self.form in (Form.XLA, Form.SHARED_XLA)


@dataclasses.dataclass(frozen=True)
class LoopPlan:
    """Everything decided about one call's loops."""

    path: Path
    form: Form
    runner: Runner
    caller: Caller
    rows: Rows
    padding: TimePadding
    empty_case: EmptyCase
    lockstep: Lockstep
    memory: Memory
    config: LoopConfig = dataclasses.field(compare=False, repr=False)

    @property
    def split(self) -> bool:
        return self.lockstep is Lockstep.PER_DIRECTION

    @property
    def counted(self) -> bool:
        return self.path is Path.COUNTED

    def build(self, form: Optional[Form] = None) -> Build:
        c = self.config
        return Build(form or self.form, self.split, self.caller is Caller.XLA, c.inline_step_limit,
                     c.functional_step_limit, c.functional_row_limit, c.functional_training_rows)

    def describe(self) -> dict:
        """The plan as `loop_report()` shows it: each field's value."""
        return {f.name: getattr(self, f.name).value for f in dataclasses.fields(self) if f.name != "config"}


# The paths whose loops XLA compiles: on them a graph traced with an
# unknown time size would compile a program per length (`TimePadding.BUCKETS`).
_COMPILING_PATHS = (Path.COUNTED, Path.COMPILED, Path.HIGHER_ORDER)
_FORMS = {Path.FORWARD_MODE: Form.OPS, Path.FORWARD_ONLY: Form.OPS, Path.PLAIN: Form.INLINE,
          Path.INSIDE_XLA: Form.XLA, Path.HIGHER_ORDER: Form.XLA, Path.COMPILED: Form.XLA,
          Path.INFERENCE: Form.FUNCTION}


def plan(directions: Sequence, flat: Sequence[tf.Tensor], mask: Optional[tf.Tensor], *, return_sequences: bool,
         bptt: bool, counted: bool) -> LoopPlan:
    """Decides how a call's loops are built.

    Args:
        directions: The call's `Direction`s (their inputs' static shapes
            are read).
        flat: Their tensors flattened (`layout.flatten`): the tapes and
            accumulators watching them are read.
        mask: The call's mask, or None.
        return_sequences: Whether per-step outputs are collected.
        bptt: Training: the forward loop keeps what the BPTT needs.
        counted: The calling layer counts its shapes (`compile_policy`).

    Returns:
        The call's `LoopPlan`.
    """
    config = loop_config()
    caller = Caller.XLA if in_xla_context() else Caller.EAGER if tf.executing_eagerly() else Caller.GRAPH
    static_length = directions[0].inputs.shape[1] is not None
    twice = caller is not Caller.EAGER and may_differentiate_twice(flat)  # a tape may differentiate again
    path = choose_path(config, caller, flat, bptt=bptt, counted=counted, static_length=static_length, twice=twice)
    unknown_time = not static_length and caller is not Caller.EAGER
    padding = TimePadding.NONE
    if path in _COMPILING_PATHS and unknown_time:
        padding = TimePadding.BUCKETS
    elif path not in (Path.FORWARD_MODE, Path.FORWARD_ONLY) and config.empty_case and unknown_time and twice:
        # The zero-length `tf.cond` cannot hold a custom gradient that a
        # persistent or nested tape records ("Could not find external
        # tensor capture"): a zero-length sequence gets one masked step.
        padding = TimePadding.ONE_STEP
    return LoopPlan(
        path=path,
        form=Form.CHOSEN if path is Path.COUNTED else _FORMS[path],
        runner=_runner(path, caller),
        caller=caller,
        rows=_rows(config, caller, mask, return_sequences),
        padding=padding,
        empty_case=_empty_case(config, static_length, padding),
        lockstep=_lockstep(config, caller, len(directions)),
        memory=Memory.NONE if path in (Path.FORWARD_MODE, Path.FORWARD_ONLY) else
        Memory.KEEP if bptt else Memory.RECOMPUTE,
        config=config,
    )


def choose_path(config: LoopConfig, caller: Caller, flat: Sequence[tf.Tensor], *, bptt: bool, counted: bool,
                static_length: bool, twice: bool) -> Path:
    """The call's `Path`, the first choice `plan` makes (tests patch it to
    steer calls onto a path).

    Args:
        config: The `LoopConfig` in force.
        caller: Where the call is built.
        flat: The directions' tensors (the tapes and accumulators watching
            them are read).
        bptt: Training: the forward loop keeps what the BPTT needs.
        counted: The calling layer counts its shapes.
        static_length: The time size is known when traced.
        twice: A tape may differentiate the gradient again.

    Returns:
        The path.
    """
    if carries_tangents(flat):
        # TensorFlow pushes tangents through a plain loop's ops, but not
        # through a custom gradient (it would silently report no tangent).
        return Path.FORWARD_MODE
    if not config.custom_gradient or in_legacy_keras_saving_trace():
        # A converter tracing the model (tf2onnx's `from_keras`) gets what
        # `kb.for_export()` gives: the in-process inference loops hold ops
        # no converter reads (a bitcast transpose, a loop order given as a
        # tensor with outputs written at their positions).
        return Path.FORWARD_ONLY
    if not config.xla:
        return Path.PLAIN
    if caller is Caller.XLA:
        return Path.INSIDE_XLA
    if caller is Caller.GRAPH and twice:
        return Path.HIGHER_ORDER
    # A SavedModel cannot hold the layer's counts: exports trace fixed loops.
    # Static shapes are counted too: `model.fit` traces its first batch's
    # shape, which may never come again, before relaxing it.
    if not counted or in_save_context():
        return Path.COMPILED
    if caller is Caller.GRAPH and not bptt and not counts_inference(config, static_length):
        return Path.INFERENCE
    return Path.COUNTED


def counts_inference(config: LoopConfig, static_length: bool) -> bool:
    """Whether an inference call in a graph is counted (and compiled once
    its shape recurs): under an explicit `compile_after`, or when the graph
    was traced for one sequence length. An inference graph traced for any
    length runs plain loops, uncounted and without time buckets: compiled
    inference loops pay for their compilation only after hundreds of calls
    at one shape (benchmarks/README.md, "The counted path at inference"),
    which lengths spread over time buckets rarely reach."""
    return config.compile_after != "auto" or static_length


def _runner(path: Path, caller: Caller) -> Runner:
    if path in (Path.FORWARD_MODE, Path.FORWARD_ONLY):
        return Runner.PLAIN_OPS
    if path is Path.COUNTED and caller is Caller.GRAPH:
        return Runner.COUNTED_FUNCTION
    if path is Path.COMPILED:
        return Runner.COMPILED_FUNCTION
    # Eagerly the custom gradient goes on the tape directly: a gradient
    # taken through the cached tf.function after it had been traced in
    # another graph (model.fit) failed with "TensorList crossing the
    # XLA/TF boundary". So it does in graphs where a gradient may be
    # differentiated again: the second-order gradient must be built in the
    # caller's graph, which a function's gradient is not.
    return Runner.DIFFERENTIABLE


def _rows(config: LoopConfig, caller: Caller, mask, return_sequences: bool) -> Rows:
    """Rows without a valid step (padding words of a character encoder) are
    left out of sequence-level encoders' loops. Not for per-step outputs,
    whose rows are rarely empty (the gather and scatter would slow a
    tagger's training step), nor inside XLA (the count of rows left is
    dynamic), nor when tracing for LiteRT (`compact_rows`)."""
    if mask is not None and not return_sequences and config.compact_rows and caller is not Caller.XLA:
        return Rows.VALID
    return Rows.ALL


def _empty_case(config: LoopConfig, static_length: bool, padding: TimePadding) -> EmptyCase:
    """XLA cannot compile a loop body over a zero-length axis, so the empty
    case never reaches it. Traced for LiteRT (`empty_case` off) there is no
    branch: the converter then sees the weights as constants in the loop
    body and multiplies with FULLY_CONNECTED instead of BATCH_MATMUL."""
    if padding is not TimePadding.NONE:
        return EmptyCase.NONE  # padded: the loops always have a step
    if static_length:
        return EmptyCase.STATIC
    return EmptyCase.BRANCH if config.empty_case else EmptyCase.NONE


def _lockstep(config: LoopConfig, caller: Caller, n_directions: int) -> Lockstep:
    """In a graph TensorFlow's executor runs independent loops at the same
    time; eagerly each call blocks, and XLA serialises the loops of one
    computation, so there the directions share one loop and its per-step
    overhead."""
    if n_directions > 1 and config.concurrent_directions and caller is Caller.GRAPH:
        return Lockstep.PER_DIRECTION
    return Lockstep.ONE_LOOP


def counted_form(call_plan: LoopPlan, compiled: bool) -> LoopPlan:
    """An eager counted call's plan once its layer's count has chosen
    (`ShapeCounter.decide`): the XLA form or the plain one."""
    return dataclasses.replace(call_plan, form=Form.SHARED_XLA if compiled else Form.SHARED)


class Grouping(enum.Enum):
    """How `kb.NestedEncoder` encodes its valid items."""

    ONE_CALL = "one-call"
    GROUPS = "groups"  # by extent, in `length_groups` calls
    BY_ITEM_COUNT = "by-item-count"  # a `tf.cond`: groups from `grouped_from_items` items on


def plan_groups(length_groups: int, training: bool) -> Tuple[Grouping, int]:
    """`kb.NestedEncoder`'s choice, and the item count from which
    `BY_ITEM_COUNT` groups (`grouped_from_items`): groups when training or
    under a tape; at inference a branch on the item count; one call for a
    single group or when no branch may be traced (LiteRT). No branch under
    any tape (one watching only the weights too): a cond around the
    encoder's custom gradient fails to differentiate
    ("_resolve_grad_inputs")."""
    config = loop_config()
    if length_groups == 1 or not config.empty_case:
        return Grouping.ONE_CALL, config.grouped_from_items
    if training or tape_may_record():
        return Grouping.GROUPS, config.grouped_from_items
    return Grouping.BY_ITEM_COUNT, config.grouped_from_items
