"""keras_birnn: bidirectional recurrent layers for Keras 3 (TensorFlow backend)."""

import keras as _keras

if _keras.backend.backend() != "tensorflow":
    raise ImportError(
        "keras_birnn runs on the TensorFlow backend of Keras 3; KERAS_BACKEND is "
        f"{_keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow before importing keras."
    )

from keras_birnn.bidirectional import Bidirectional, DirectionalProjection
from keras_birnn.cells import GRUCell, LSTMCell, RecurrentCell, SimpleRNNCell
from keras_birnn.compile_policy import compilation
from keras_birnn.crf import CRF, CRFLoss
from keras_birnn.export import check_graph_ops, export_saved_model
from keras_birnn.litert import export_tflite, flatbuffer_ops
from keras_birnn.masking import lengths_to_mask, reverse_within_lengths
from keras_birnn.nested import NestedEncoder
from keras_birnn.recurrent import Recurrent
from keras_birnn.config import LoopConfig, configure_loops, for_export, fused_directions, loop_config, xla_disabled
from keras_birnn.recurrence import clear_loop_cache, loop_cache_info
from keras_birnn.pooling import AttentionPooling, FinalStatePooling, MaskedMaxPooling, MaskedMeanPooling
from keras_birnn.stacking import StackedBidirectional, stacked_bidirectional
# The diagnostics module keeps its public name kb.inspect (a module file named
# inspect.py shadowed the standard library for scripts run from the package).
from keras_birnn import diagnostics as inspect  # noqa: E402  (kb.inspect.direction_norms, ...)

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
    "check_graph_ops",
    "export_saved_model",
    "export_tflite",
    "flatbuffer_ops",
    "lengths_to_mask",
    "reverse_within_lengths",
    "LoopConfig",
    "clear_loop_cache",
    "configure_loops",
    "for_export",
    "fused_directions",
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
    "inspect",
]
