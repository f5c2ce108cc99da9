"""The loop: runs cells' step maths over time, one or several directions at once.

The only package that iterates over time. It knows nothing of Keras
layers: a direction is a cell's pure step maths, its weights as tensors,
its per-step inputs and its initial states.

Modules:

- `direction`: the engines' contract: `Direction` and `DirectionResult`,
  a `Call` (the directions of one call and how to run them), the `Engine`
  and `Plan` protocols every engine and its plans implement;
- `engine`: `run`, the one place that picks an engine for a call, per
  backend (`engine.ENGINES`), recording why a vendor engine did not run it;
- `scan`: the scan engine, a masked `keras.ops.scan` for every backend
  (what JAX and PyTorch run where no vendor engine does);
- `vendor/`: engines on kernels a backend ships: `torch_kernels`
  (PyTorch's GRU/LSTM/RNN kernels), `jax_kernels` (cuDNN's LSTM on a GPU),
  and what they share, written once: `common` (eligibility, the run
  around one kernel call) and `packing` (a masked batch packed for a
  kernel that runs each row over its length);
- `tensorflow/`: the TensorFlow engine: the loop plan (`plan`), compiled
  loops (`compiled`), time buckets (`bucketing`), the hand-written BPTT
  (`gradients`), run by `dispatch.run`; imported on TensorFlow only;
- `cache`: the one bounded, thread-safe cache of loop functions and runners;
- `compile_policy`: which loop shapes a layer runs XLA-compiled, and the
  plans each layer records for `loop_report()`.

Settings (`kb.configure_loops`, `kb.xla_disabled`, ...) live in
`keras_birnn.config`; the shorthands re-exported here are the same
functions.
"""

from keras_birnn import backend
from keras_birnn.config import for_export, lockstep_directions, xla_disabled
from keras_birnn.recurrence.cache import clear_loop_cache, loop_cache_info
from keras_birnn.recurrence.direction import Direction, DirectionResult
from keras_birnn.recurrence.engine import run

if backend.IS_TENSORFLOW:  # loads the TensorFlow engine's modules, read as `recurrence.tensorflow.<module>`
    from keras_birnn.recurrence.tensorflow import dispatch  # noqa: F401

__all__ = ["Direction", "DirectionResult", "clear_loop_cache", "for_export", "lockstep_directions",
           "loop_cache_info", "run", "xla_disabled"]
