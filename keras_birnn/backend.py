"""Which Keras backend runs the layers, and what only TensorFlow can do.

The one place that reads `keras.backend.backend()`. The layers, heads and
CRF are written in `keras.ops` and run on every backend; on TensorFlow
the loops run on the TensorFlow engine (XLA-compiled loops, a hand-written
BPTT, time buckets, export), elsewhere on the scan engine
(`recurrence.scan`: a masked scan differentiated by the backend's
autodiff). A module with TensorFlow-only code imports TensorFlow only when
`IS_TENSORFLOW`, so the package imports on a machine without TensorFlow.
"""

from typing import Callable

import keras

NAME: str = keras.backend.backend()
IS_TENSORFLOW: bool = NAME == "tensorflow"

# How a model trained elsewhere reaches what only TensorFlow can do.
WAY_ROUND = (
    "Train on {backend}, save a .keras file (model.save('model.keras')), then load it in a "
    "process with KERAS_BACKEND=tensorflow (keras.saving.load_model) and {action} there: "
    "the weights and the numbers are the same on every backend."
)


class TensorFlowOnlyError(NotImplementedError):
    """Raised on JAX or PyTorch for what needs the TensorFlow backend."""


def tensorflow_only_error(what: str, action: str) -> TensorFlowOnlyError:
    """The error for `what` (e.g. "kb.export_tflite") on another backend,
    naming the backend and the way round."""
    return TensorFlowOnlyError(
        f"{what} needs the TensorFlow backend of Keras; KERAS_BACKEND is {NAME!r}. "
        + WAY_ROUND.format(backend=NAME, action=action)
    )


def tensorflow_only(name: str, action: str) -> Callable:
    """A stand-in for the TensorFlow-only function `kb.<name>` on another
    backend: it raises `tensorflow_only_error` when called."""

    def refuse(*args, **kwargs):
        raise tensorflow_only_error(f"kb.{name}", action)

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"`kb.{name}` needs the TensorFlow backend ({action})."
    return refuse


def is_ragged(value) -> bool:
    """Whether `value` is a `tf.RaggedTensor` (without importing TensorFlow
    where the backend is another)."""
    return type(value).__name__ == "RaggedTensor" and type(value).__module__.startswith("tensorflow")
