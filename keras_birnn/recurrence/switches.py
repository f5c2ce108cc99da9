"""The switches that decide how loops are built, and the state they set.

Each switch is read when functions are traced, so it decides how the loops
traced inside its `with` block are built; loops already traced keep theirs.
"""

import contextlib
from typing import Iterator, Type

import tensorflow as tf

from keras_birnn._tf_internal import in_xla_context


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


class _BitTranspose:
    enabled = True


@contextlib.contextmanager
def _switched_off(setting: Type) -> Iterator[None]:
    """Sets `setting.enabled` to False for the `with` block."""
    previous, setting.enabled = setting.enabled, False
    try:
        yield
    finally:
        setting.enabled = previous


def xla_disabled():
    """Runs loops as plain TensorFlow graphs instead of XLA clusters (part of
    `for_export`, which exports use, so that serving needs no XLA JIT)."""
    return _switched_off(_XLA)


@contextlib.contextmanager
def for_export() -> Iterator[None]:
    """Builds the loops traced inside the block for an exported serving graph.

    Plain TensorFlow `While` loops (no XLA cluster, as `xla_disabled`), and
    the forward pass alone, without the training path's custom gradient
    and hand-written BPTT: a model server needs no XLA JIT, reloading
    prints no "unsaved custom gradients" warning, and a gradient asked of
    the reloaded graph comes from TensorFlow's autodiff through the loops.
    `kb.export_saved_model` traces this way; use it around Keras's own
    `model.export` or `keras.export.ExportArchive.add_endpoint`. Read when
    functions are traced, like `xla_disabled`.

    Example:

    ```python
    with kb.for_export():
        model.export("saved_models/tagger/1")
    ```
    """
    with xla_disabled(), _forward_only():
        yield


def _rows_kept():
    """Sequence-level encoders run every row instead of leaving rows without
    a valid step out (`bucketing.valid_rows`). For `litert.export_tflite`:
    the row compaction's DynamicPartition / ScatterNd are no LiteRT builtin
    ops, and a batch of dynamic size would make the loops' TensorLists
    dynamic. Exact either way: a fully masked row changes nothing. Read when
    functions are traced, like `xla_disabled`."""
    return _switched_off(_CompactRows)


def _no_empty_case():
    """Loops traced inside have no branch for a zero-length time axis, and
    no layer puts them under a `tf.cond` (`_loops_may_branch`), for
    `litert.export_tflite`: a branch hides the weights from the
    converter, which then multiplies with slow BATCH_MATMULs, not
    FULLY_CONNECTED. Such a graph needs at least one time step (with none
    it fails, it is not silently wrong). Read when functions are traced."""
    return _switched_off(_EmptyCase)


def _loops_may_branch() -> bool:
    """Whether loops traced now may sit under a `tf.cond`: the zero-length
    case of `dispatch`, `kb.NestedEncoder`'s choice of length groups. Not
    inside `_no_empty_case`."""
    return _EmptyCase.enabled


def _autodiff_loops():
    """Loops traced inside are differentiated by TensorFlow's autodiff
    (`loops._plain_loop`: forward-mode derivatives, second-order gradients,
    exported graphs), so they swap batch and time with `tf.transpose`: a
    bitcast (`layout._swap_batch_and_time`) has no gradient. Read when
    functions are traced."""
    return _switched_off(_BitTranspose)


def _bit_transposes() -> bool:
    """Whether a swap of batch and time traced now may move a tensor's bits
    as float64s (`layout._swap_batch_and_time`): not under TensorFlow's
    autodiff (`_autodiff_loops`). Inside XLA too: the counted path's plain
    and XLA forms share one traced loop (`compiled._shared_leaf`)."""
    return _BitTranspose.enabled


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
    for a GRU a training step's peak memory is lower (for an LSTM it is not;
    benchmarks/README.md has the numbers), for very long sequences. Read when
    functions are traced, like `xla_disabled`."""
    return _switched_off(_Concurrent)


def _in_xla() -> bool:
    """Whether a loop traced now is compiled by XLA (the one XLA-context
    check of the loops: XLA wants constant slice sizes, serialises the loops
    of one computation, and is where in-step reads pay off)."""
    return in_xla_context()


def _runs_concurrently() -> bool:
    """Whether independent loops built now would run at the same time: in a
    graph TensorFlow's executor starts both at once; eagerly each call
    blocks, and XLA serialises the loops of one computation."""
    if not _Concurrent.enabled or tf.executing_eagerly():
        return False
    return not _in_xla()
