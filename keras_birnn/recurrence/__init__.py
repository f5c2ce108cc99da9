"""The loop: runs cells' step maths over time, one or several directions at once.

Two engines: on TensorFlow, the TensorFlow engine described below; on JAX
and PyTorch, the portable one (`portable`). `engine.run` picks.

The only package that iterates over time. It knows nothing of Keras layers:
a direction is a cell's pure step maths, its weights as tensors, its
per-step inputs and its initial states.

How directions run: inside a graph (`tf.function`, `model.fit`), each
direction is its own compiled loop, and TensorFlow's executor runs the two
loops of a bidirectional layer at the same time, neither waiting for the
other. Eagerly, and inside an XLA-compiled function (where XLA would run two
loops one after the other), all directions advance in the same loop
iteration and pay the per-step overhead once. `fused_directions()` asks for
the fused loop in graphs too: slower, but a GRU's training step then peaks
lower in memory.

XLA compiles a program per input shape, so in a graph traced with an
unknown sequence length the loops run on inputs padded to a few bucket
lengths (`bucketing`), the padding masked and skipped; a layer's loops run
XLA-compiled only for the shapes it meets often, and as plain TensorFlow
otherwise (`compile_policy`, the "counted" path of `plan.plan`;
inference traced for any length runs plain, the "inference" path);
sequence-level encoders leave rows without a valid step out
(`bucketing.valid_rows`).

Training uses `run(..., bptt=True)`: the gradient is the hand-written BPTT
of the BRNN text (BRNN, BPTT and boundary states) instead of autodiff
through `tf.while_loop`; under a `tf.autodiff.ForwardAccumulator` the plain
loop runs instead, as TensorFlow carries no tangent through a custom
gradient. benchmarks/README.md holds the measurements behind these choices.

Modules, one concept each (imports go down this list only):

- `direction`: `Direction` and `DirectionResult`, what every engine runs;
- `engine`: `run`, which picks the engine for the Keras backend;
- `portable`: the portable engine, a masked `keras.ops.scan` for JAX and
  PyTorch (and any backend);
- `plan`: `plan`, the one place that decides how a call's loops are built
  (from the context, the tapes and `keras_birnn.config`), as a `LoopPlan`;
- `cache`: the one bounded, thread-safe cache of loop functions and runners;
- `layout`: `Direction`, and the flat-list layout of directions, outputs,
  kept memory and gradients, with the loop key (`LoopKey`);
- `timeloop`: the positions a loop visits, per-step reads, the `tf.while_loop`;
- `loops`: the forward and backward (BPTT) loops;
- `gradients`: the bulk gradients summed over time, and the BPTT's gradient;
- `compiled`: the loops as cached plain or XLA-compiled functions;
- `dispatch`: `run`, which executes a call's plan, and the custom gradient.

The names below are re-exported for callers outside the package, which
read them here (so patching `recurrence.run` or `recurrence._rows_kept`
reaches them). Code inside the package reads its submodules' names: a test
that patches a function the package calls patches it where it is read
(`recurrence.tensorflow.dispatch.plan`, for instance).
"""

from keras_birnn import backend
from keras_birnn.config import _no_empty_case, _rows_kept, for_export, fused_directions, xla_disabled
from keras_birnn.recurrence.cache import clear_loop_cache, loop_cache_info
from keras_birnn.recurrence.direction import Direction, DirectionResult
from keras_birnn.recurrence.engine import run

if backend.IS_TENSORFLOW:  # the TensorFlow engine's names
    from keras_birnn.recurrence.tensorflow import dispatch  # noqa: F401  (read as recurrence.tensorflow.dispatch)
    from keras_birnn.recurrence.tensorflow.compiled import _by_batch_size
    from keras_birnn.recurrence.tensorflow.plan import LoopPlan

__all__ = ["Direction", "DirectionResult", "clear_loop_cache", "for_export", "fused_directions",
           "loop_cache_info", "run", "xla_disabled"]
