"""keras_birnn: bidirectional recurrent layers for Keras 3.

The layers, heads and CRF run on every Keras backend (TensorFlow, JAX,
PyTorch); export (SavedModel, LiteRT, ONNX) needs TensorFlow
(`keras_birnn.backend`).
"""

from keras_birnn import backend
from keras_birnn.layers.bidirectional import Bidirectional, DirectionalProjection
from keras_birnn.cells import GRUCell, LSTMCell, RecurrentCell, SimpleRNNCell
from keras_birnn.recurrence.compile_policy import compilation
from keras_birnn.crf import CRF, CRFLoss
from keras_birnn.losses import TokenCrossentropy
from keras_birnn.masking import lengths_to_mask, reverse_within_lengths
from keras_birnn.layers.nested import NestedEncoder
from keras_birnn.layers.recurrent import Recurrent
from keras_birnn.layers.convert import from_keras_bidirectional, to_keras_bidirectional
from keras_birnn.config import (
    LoopConfig,
    configure_loops,
    for_export,
    fused_directions,
    lockstep_directions,
    loop_config,
    xla_disabled,
)
from keras_birnn.recurrence import clear_loop_cache, loop_cache_info
from keras_birnn.layers.pooling import AttentionPooling, FinalStatePooling, MaskedMaxPooling, MaskedMeanPooling
from keras_birnn.layers.stacking import StackedBidirectional, stacked_bidirectional
from keras_birnn import diagnostics  # noqa: E402  (kb.diagnostics.direction_norms, ...)
from keras_birnn import tagging  # noqa: E402  (kb.tagging.build_tagger, ...)

if backend.IS_TENSORFLOW:
    from keras_birnn.export.saved_model import check_graph_ops, export_saved_model
    from keras_birnn.export.litert import export_tflite, flatbuffer_ops
else:  # the same names, raising an error that names the backend and the way round
    _EXPORT = "export with kb.export_saved_model / kb.export_tflite"
    check_graph_ops = backend.tensorflow_only("check_graph_ops", "check the exported graph's ops")
    export_saved_model = backend.tensorflow_only("export_saved_model", _EXPORT)
    export_tflite = backend.tensorflow_only("export_tflite", _EXPORT)
    flatbuffer_ops = backend.tensorflow_only("flatbuffer_ops", "read the LiteRT flatbuffer's ops")

__version__ = "0.1.0"

__all__ = [
    "Bidirectional",
    "DirectionalProjection",
    "GRUCell",
    "LSTMCell",
    "RecurrentCell",
    "Recurrent",
    "SimpleRNNCell",
    "compilation",
    "CRF",
    "CRFLoss",
    "TokenCrossentropy",
    "check_graph_ops",
    "export_saved_model",
    "export_tflite",
    "flatbuffer_ops",
    "from_keras_bidirectional",
    "to_keras_bidirectional",
    "lengths_to_mask",
    "reverse_within_lengths",
    "LoopConfig",
    "clear_loop_cache",
    "configure_loops",
    "for_export",
    "fused_directions",
    "lockstep_directions",
    "loop_cache_info",
    "loop_config",
    "xla_disabled",
    "AttentionPooling",
    "FinalStatePooling",
    "MaskedMaxPooling",
    "MaskedMeanPooling",
    "NestedEncoder",
    "StackedBidirectional",
    "stacked_bidirectional",
    "diagnostics",
    "tagging",
]

# Old public names, kept for one release: each warns and names its successor.
_DEPRECATED = {"inspect": ("diagnostics", lambda: diagnostics)}


def __getattr__(name: str):
    if name in _DEPRECATED:
        import warnings

        new, value = _DEPRECATED[name]
        warnings.warn(f"kb.{name} is deprecated and will be removed after this release; use kb.{new}.",
                      DeprecationWarning, stacklevel=2)
        return value()
    raise AttributeError(f"module 'keras_birnn' has no attribute {name!r}")
