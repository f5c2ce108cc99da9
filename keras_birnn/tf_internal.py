"""The one place keras_birnn touches TensorFlow's, Keras's and JAX's private internals.

Every other module goes through these functions, so that a TensorFlow or
Keras upgrade that moves an internal breaks here, in one file, and
`tests/tensorflow_only/test_tf_internal.py` keeps it that way. Each function says why
the public API does not suffice.
"""

from __future__ import annotations

import sys
from typing import Any, List, Sequence, Set

from keras_birnn import backend

if backend.IS_TENSORFLOW:  # the Keras accessors below serve every backend
    import tensorflow as tf

    # Why private: no public TensorFlow API answers these questions; see each function.
    from tensorflow.python.eager import forwardprop_util
    from tensorflow.python.eager import record
    from tensorflow.python.framework import op_def_registry
    from tensorflow.python.ops import control_flow_util_v2
    from tensorflow.python.ops import gradients_util
    from tensorflow.python.saved_model import save_context


def in_xla_context() -> bool:
    """Whether ops built now are compiled by XLA (inside a `jit_compile=True`
    function). Public TensorFlow has no way to ask; `tf.__internal__` is the
    exported-but-internal door to the XLA control-flow context."""
    return tf.__internal__.get_enclosing_xla_context() is not None


def in_save_context() -> bool:
    """Whether functions are being traced for a SavedModel. `tf.saved_model`
    exposes no such predicate; the save machinery sets this context."""
    return save_context.in_save_context()


def in_legacy_keras_saving_trace() -> bool:
    """Whether TensorFlow's legacy Keras (`tensorflow.python.keras`, still
    shipped inside TensorFlow) is tracing a model to save or convert it:
    converters such as `tf2onnx.convert.from_keras` trace through its
    `saving_utils.trace_model_call`, which enters its call context with
    `saving=True`. No public API tells such a trace from a `predict`; only
    that context does. Read without importing the legacy package: if no
    one imported it, no such trace is under way."""
    legacy = sys.modules.get("tensorflow.python.keras.engine.base_layer_utils")
    if legacy is None:
        return False
    try:
        return bool(legacy.call_context().saving)
    except Exception:  # noqa: BLE001 - a moved internal: take it as no such trace
        return False


def tape_may_record() -> bool:
    """Whether any `tf.GradientTape` is recording now (ops built now may be
    differentiated, through their inputs or their variables). The public
    API has no such query."""
    return record.could_possibly_record()


def may_differentiate_twice(tensors: Sequence[tf.Tensor]) -> bool:
    """Whether a gradient of `tensors` may itself be differentiated (two
    tapes, or a persistent one, watch them). `tf.GradientTape` has no public
    query for the tapes watching a tensor."""
    kind = gradients_util.PossibleTapeGradientTypes(tensors)
    return kind == gradients_util.POSSIBLE_GRADIENT_TYPES_HIGHER_ORDER


def set_while_lowering(loop_output: tf.Tensor, lowered: bool) -> None:
    """Whether TensorFlow's executor runs the `tf.while_loop` that produced
    `loop_output` (in a graph) lowered to dataflow frames or as a
    functional `While` op (docs/design.md, "The loop"). `tf.while_loop`
    decides by itself and has no argument for it; its own helper sets the
    op's attribute."""
    op = loop_output.op
    if op.type == "Identity":  # graphs outside functions wrap the outputs
        op = op.inputs[0].op
    if op.type not in ("While", "StatelessWhile"):
        raise TypeError(f"Expected the output of a while loop, received one of a {op.type!r} op.")
    control_flow_util_v2.maybe_set_lowering_attr(op, lower_using_switch_merge=lowered)


def carries_tangents(tensors: Sequence[tf.Tensor]) -> bool:
    """Whether a `tf.autodiff.ForwardAccumulator` carries tangents of
    `tensors`. The accumulator's public API only answers for tensors it
    already knows (`jvp`), not whether any accumulator is watching."""
    return bool(forwardprop_util.pack_tangents(tensors).tangents)


def is_registered_op(op_type: str) -> bool:
    """Whether core TensorFlow (this process's op registry) defines an op.
    `tf.raw_ops` lists only ops with Python wrappers, not the registry."""
    return op_def_registry.get(op_type) is not None


def inbound_nodes(layer: Any) -> List[Any]:
    """The Keras nodes at which `layer` was called. Keras 3 keeps the
    functional graph's nodes private; no public accessor lists a layer's
    call sites (`layer.input` raises for a layer called more than once)."""
    return list(getattr(layer, "_inbound_nodes", None) or [])


def functional_node_keys(model: Any) -> Set[str]:
    """The keys (`"<layer name>_ib-<index>"`) of the nodes belonging to a
    functional model, to tell a shared layer's call sites apart. Private in
    Keras 3, like `inbound_nodes`."""
    graph = getattr(model, "_functional", None) or model
    return getattr(graph, "_nodes", None) or set()


def flatten_layers(model: Any) -> List[Any]:
    """Every layer nested in `model` (not the model itself), at any depth.
    Keras 3 keeps this walk private (`Layer._flatten_layers`); the public
    `model.layers` lists only the direct children."""
    return list(model._flatten_layers(include_self=False))


def force_jit_compile(model: Any, value: bool) -> None:
    """Sets a compiled model's `jit_compile`. Keras's setter refuses True
    when any tracked layer has `supports_jit = False`, even one its train
    step never calls (a task model's string encoder); it keeps the value in
    the private `_jit_compile`."""
    model._jit_compile = bool(value)


def set_tensor_attribute(tensor: Any, name: str, value: Any) -> None:
    """Attaches `value` to `tensor` as Keras attaches masks: an attribute,
    or, for a tensor that takes none (JAX's tracers), Keras's store by
    tensor id, whose entry goes with the tensor
    (`keras.src.backend.common.tensor_attributes`; no public API)."""
    from keras.src.backend.common.tensor_attributes import set_tensor_attr

    set_tensor_attr(tensor, name, value)


def tensor_attribute(tensor: Any, name: str) -> Any:
    """What `set_tensor_attribute` attached to `tensor` under `name`, or None."""
    from keras.src.backend.common.tensor_attributes import get_tensor_attr

    return get_tensor_attr(tensor, name)


def keras_mask(tensor: Any) -> Any:
    """The Keras mask attached to a symbolic or eager tensor, or None. Keras 3
    attaches it as a private attribute, or, where a tensor takes no
    attribute (JAX arrays), keeps it by the tensor's id
    (`keras.src.backend.common.masking`); it exports no getter."""
    mask = getattr(tensor, "_keras_mask", None)
    if mask is None:
        try:
            from keras.src.backend.common.masking import get_keras_mask
        except ImportError:  # a Keras that moved it: the attribute alone
            return None
        mask = get_keras_mask(tensor)
    return mask


def in_symbolic_scope() -> bool:
    """Whether Keras runs the caller for output shapes and dtypes only
    (its symbolic scope: on JAX and PyTorch, `fit` and `evaluate` build the
    compiled loss on placeholders for the model's outputs). Keras exports
    no predicate for it; a Keras that moves it answers False."""
    try:
        from keras.src.backend.common.symbolic_scope import in_symbolic_scope as in_scope
    except ImportError:
        return False
    return in_scope()


def live_jax_processes(count: int) -> List[int]:
    """The processes of a multi-process JAX job that its coordination
    service still hears from. JAX's public API has no liveness query; its
    distributed client's `get_live_nodes` answers within a heartbeat."""
    import jax._src.distributed as jax_distributed

    return sorted(jax_distributed.global_state.client.get_live_nodes(list(range(count))))
