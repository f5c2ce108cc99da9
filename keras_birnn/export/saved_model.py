"""SavedModel export for TF Serving, with a `lengths` input for padded batches.

`export_saved_model(model, "saved_models/tagger")` writes
`saved_models/tagger/<version>/saved_model.pb + variables/`, the layout
`tensorflow_model_server --model_base_path=.../saved_models/tagger` serves.
The reloaded graph needs neither Keras nor keras_birnn: plain
`tf.saved_model.load(path).signatures["serving_default"]` runs it.
"""

import os
import shutil
import tempfile
from typing import Optional, Set

import keras
import numpy as np
import tensorflow as tf

from keras_birnn import recurrence
from keras_birnn.export.signatures import (
    INPUTS_KEY,
    LENGTHS_KEY,
    OUTPUTS_KEY,  # noqa: F401  (re-exported: the signature keys are this module's API too)
    call_with_lengths,
    check_sequence_spec,
    model_input_spec,
    named_outputs,
    padding_marker,
    probe_lengths,
    quiet_model_mask_warning,
)
from keras_birnn.tf_internal import is_registered_op

SIGNATURE_DEFAULT = "serving_default"
SIGNATURE_UNPADDED = "serving_unpadded"

# Python callbacks cannot be served; cuDNN kernels exist only on GPUs, so a
# graph that holds them (a Keras LSTM traced on a GPU) cannot serve on CPU.
FORBIDDEN_OPS = frozenset(
    {
        "PyFunc",
        "PyFuncStateless",
        "EagerPyFunc",
        "CudnnRNN",
        "CudnnRNNV2",
        "CudnnRNNV3",
        "CudnnRNNBackprop",
        "CudnnRNNBackpropV2",
        "CudnnRNNBackpropV3",
        "CudnnRNNCanonicalToParams",
        "CudnnRNNCanonicalToParamsV2",
        "CudnnRNNParamsSize",
        "CudnnRNNParamsToCanonical",
        "CudnnRNNParamsToCanonicalV2",
    }
)

def export_saved_model(
    model: keras.Model,
    export_dir: str,
    version: Optional[int] = None,
    lengths_input: bool = True,
    input_spec: Optional[tf.TensorSpec] = None,
    overwrite: bool = False,
    verbose: bool = False,
) -> str:
    """Exports `model` for TF Serving as `export_dir/<version>/`.

    Signatures (the names below are stable API):

    - `"serving_default"`: inputs `inputs` (the model's input, batch and
      time sizes dynamic) and, with `lengths_input=True`, `lengths` (int32
      `[batch]`, the number of valid steps of each right-padded row; values
      are clipped to `[0, time]`; a size other than the batch's is an
      InvalidArgumentError).
    - `"serving_unpadded"` (only with `lengths_input=True`): input `inputs`
      alone, every step valid (or, for a model whose first layer is
      `Embedding(mask_zero=True)` / `Masking`, masked by the model itself as
      in Keras). A TF signature cannot have optional inputs, so "lengths is
      optional" means: choose the signature.
    - Outputs: `outputs` for a single-output model, `outputs_0`,
      `outputs_1`, ... for a list of outputs, the dict's keys for a dict.
      Per-position outputs at padded positions are whatever the model
      computes there (zeros for keras_birnn layers with per-position output,
      e.g. a projection tagger); clients should ignore them.

    How `lengths` reaches the model (exact, never "zeros as padding"): the
    signature builds `mask = tf.sequence_mask(lengths, time)` and

    - if the layers reading the model input derive their mask from the
      values, the padded positions are set to the model's own padding
      marker: token id 0 for `Embedding(mask_zero=True)`, `mask_value` for
      `Masking`. The model then masks them exactly as Keras does for a
      padded batch (a valid position holding the marker is masked too, as
      in Keras);
    - otherwise (e.g. float inputs straight into a `kb.Bidirectional`), the
      mask is passed as `model(inputs, mask=mask)` and follows Keras mask
      propagation to the layers that take `mask`.

    Before writing, a probe checks that this works for `model`: a right
    padded row must give what the same row gives unpadded (valid positions
    of per-position outputs, whole sentence-level outputs). If a layer
    drops the mask on the way, export raises instead of shipping a
    signature that silently ignores `lengths`.

    The written graph is checked: ops in `FORBIDDEN_OPS` (Python callbacks,
    cuDNN-only kernels), ops unknown to core TensorFlow, or functions that
    must be XLA-compiled make the export fail. The recurrences trace as plain
    `While` loops, forward pass only (`kb.for_export()`), so serving needs
    no XLA JIT.
    The version folder appears atomically (written under a temporary name,
    then renamed), so a watching model server never sees half of it.

    Args:
        model: A built Keras model with one input. Models with an `Input`
            (functional, Sequential) know their input; for others pass
            `input_spec`.
        export_dir: The model's base path (TF Serving's `--model_base_path`).
        version: Positive integer version folder; default: one more than the
            highest existing integer folder, or 1.
        lengths_input: Add the `lengths` input (needs a float `[B, T, F]`
            or integer `[B, T]` sequence input). Pass False for other
            models (e.g. string inputs); `serving_default` then takes
            `inputs` only and there is no `serving_unpadded`.
        input_spec: Optional `tf.TensorSpec` of the input; its batch and time
            sizes are made dynamic.
        overwrite: Replace an existing version folder instead of raising.
        verbose: Print where the export went and its signatures.

    Returns:
        The path of the written version folder.

    Raises:
        ValueError: the model cannot take `lengths`, the probe shows the mask
            does not reach the recurrence, or the graph holds forbidden ops.
        FileExistsError: the version folder exists and `overwrite` is False.
    """
    spec = model_input_spec(model, input_spec)
    if lengths_input:
        check_sequence_spec(spec)
    version = next_version(export_dir) if version is None else _check_version(version)
    target = os.path.join(os.fspath(export_dir), str(version))
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(
            f"{target} exists; TF Serving versions are immutable. Pass another `version`, "
            "version=None for the next one, or overwrite=True."
        )

    archive = keras.export.ExportArchive()
    archive.track(model)
    inputs_spec = tf.TensorSpec(spec.shape, spec.dtype, name=INPUTS_KEY)
    # The loops trace as plain TF graphs, not XLA clusters: serving needs no JIT.
    with quiet_model_mask_warning(model), recurrence.for_export():
        if lengths_input:
            marker = padding_marker(model)
            lengths_spec = tf.TensorSpec([None], tf.int32, name=LENGTHS_KEY)

            def serve_padded(inputs, lengths):
                return named_outputs(call_with_lengths(model, inputs, lengths, marker))

            def serve_unpadded(inputs):
                return named_outputs(model(inputs, training=False))

            padded = archive.add_endpoint(
                SIGNATURE_DEFAULT, serve_padded, input_signature=[inputs_spec, lengths_spec]
            )
            unpadded = archive.add_endpoint(
                SIGNATURE_UNPADDED, serve_unpadded, input_signature=[inputs_spec]
            )
            probe_lengths(model, spec, padded, unpadded)
        else:

            def serve(inputs):
                return named_outputs(model(inputs, training=False))

            archive.add_endpoint(SIGNATURE_DEFAULT, serve, input_signature=[inputs_spec])

        write_version(archive, export_dir, version)
    if verbose:
        inputs = f"{INPUTS_KEY}, {LENGTHS_KEY}" if lengths_input else INPUTS_KEY
        extra = f", {SIGNATURE_UNPADDED}({INPUTS_KEY})" if lengths_input else ""
        print(f"Exported SavedModel to {target}: {SIGNATURE_DEFAULT}({inputs}){extra}")
    return target


def write_version(archive, export_dir, version: int) -> str:
    """Writes `archive` (a `keras.export.ExportArchive`) as version folder
    `export_dir/version`, replacing an existing one, all or nothing: it is
    written and checked (`check_graph_ops`) in a staging folder, then renamed.

    Returns:
        The path of the version folder.
    """
    target = os.path.join(os.fspath(export_dir), str(version))
    os.makedirs(os.fspath(export_dir), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=os.fspath(export_dir))
    try:
        archive.write_out(staging, verbose=False)
        check_graph_ops(staging)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(staging, target)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging)
    return target


def next_version(export_dir) -> int:
    """One more than the highest integer subfolder of `export_dir`, or 1."""
    export_dir = os.fspath(export_dir)
    if not os.path.isdir(export_dir):
        return 1
    versions = [
        int(name)
        for name in os.listdir(export_dir)
        if name.isdigit() and os.path.isdir(os.path.join(export_dir, name))
    ]
    return max(versions, default=0) + 1


def _read_saved_model(saved_model_dir):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(os.fspath(saved_model_dir), "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def saved_model_op_types(saved_model_dir) -> Set[str]:
    """Every op type in a SavedModel: its graphs and their function libraries."""
    ops = set()
    for meta_graph in _read_saved_model(saved_model_dir).meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    return ops


def saved_model_xla_functions(saved_model_dir) -> Set[str]:
    """Functions (or calls) of a SavedModel marked `_XlaMustCompile`: they need XLA's JIT."""
    names = set()
    for meta_graph in _read_saved_model(saved_model_dir).meta_graphs:
        nodes = [("graph", node) for node in meta_graph.graph_def.node]
        for function in meta_graph.graph_def.library.function:
            if function.attr["_XlaMustCompile"].b:
                names.add(function.signature.name)
            nodes += [(function.signature.name, node) for node in function.node_def]
        names.update(f"{where}/{node.name}" for where, node in nodes if node.attr["_XlaMustCompile"].b)
    return names


def check_graph_ops(saved_model_dir) -> Set[str]:
    """Raises ValueError for forbidden, non-core or XLA-compiled ops; returns the op types."""
    ops = saved_model_op_types(saved_model_dir)
    forbidden = sorted(ops & FORBIDDEN_OPS)
    if forbidden:
        raise ValueError(
            f"The exported graph holds ops that cannot be served everywhere: {forbidden}. "
            "Python callbacks and cuDNN-only kernels are not allowed (trace on CPU, or use "
            "keras_birnn layers instead of layers that pick cuDNN on a GPU)."
        )
    unknown = sorted(op for op in ops if not is_registered_op(op))
    if unknown:
        raise ValueError(f"The exported graph holds ops unknown to core TensorFlow: {unknown}.")
    compiled = sorted(saved_model_xla_functions(saved_model_dir))
    if compiled:
        raise ValueError(
            f"The exported graph holds XLA-compiled functions {compiled[:5]}; serving them "
            "needs XLA's JIT. Export inside `with kb.for_export():` (or kb.export_saved_model)."
        )
    return ops


# --- pieces ------------------------------------------------------------------


def _check_version(version) -> int:
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 1:
        raise ValueError(f"`version` must be a positive integer, received {version!r}.")
    return int(version)
