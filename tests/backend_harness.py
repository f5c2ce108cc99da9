"""Test helpers that run on every Keras backend (TensorFlow, JAX, PyTorch).

The `test_portable_*.py` files use only these, NumPy and `keras`: they are
the files `tests/conftest.py` collects when `KERAS_BACKEND` is `jax` or
`torch` (CI runs them on all three backends). One helper per backend
concern:

- `BACKEND`, `ALL_BACKENDS`;
- `traced(layer, *args, **kwargs)`: the layer's call traced the way the
  backend traces it (`tf.function` with unknown batch and time, `jax.jit`;
  PyTorch runs eagerly);
- `value_and_gradients(layer, loss_of_outputs, *args)`: the loss and its
  gradients with respect to the first argument and the layer's trainable
  weights, by the backend's autodiff;
- `to_numpy`.
"""

from typing import Callable, List, Tuple

import keras
import numpy as np

BACKEND = keras.backend.backend()
ALL_BACKENDS = ("tensorflow", "jax", "torch")


def _full_float32_precision() -> None:
    """On a GPU, TF32 matmuls (10-bit mantissas) would loosen the 1e-5
    oracle tests: every backend's full float32 mode is set here, for all
    the portable tests (a no-op on a CPU)."""
    if BACKEND == "torch":
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif BACKEND == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")


_full_float32_precision()


def to_numpy(structure):
    """Nested tensors of any backend as NumPy arrays."""
    return keras.tree.map_structure(lambda t: keras.ops.convert_to_numpy(t), structure)


def traced(layer, inputs, mask=None, **call_kwargs):
    """`layer(inputs, mask=mask, ...)` traced: in a `tf.function` whose
    batch and time sizes are unknown (TensorFlow), under `jax.jit` (JAX),
    eagerly (PyTorch). Returns NumPy arrays."""
    inputs = np.asarray(inputs)
    mask = None if mask is None else np.asarray(mask, bool)
    if BACKEND == "tensorflow":
        from helpers import in_graph

        return to_numpy(in_graph(layer, inputs, mask, **call_kwargs))
    if BACKEND == "jax":
        import jax

        def run(trainable, non_trainable, x, m):
            out, _ = layer.stateless_call(trainable, non_trainable, x, mask=m, **call_kwargs)
            return out

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]
        return to_numpy(jax.jit(run)(trainable, non_trainable, inputs, mask))
    return to_numpy(layer(inputs, mask=mask, **call_kwargs))


def value_and_gradients(layer, loss: Callable, inputs, mask=None, **call_kwargs) -> Tuple[float, List[np.ndarray]]:
    """`loss(layer(inputs, mask=mask, ...))` and its gradients, as NumPy:
    `[d inputs] + [d w for w in layer.trainable_weights]`, by the
    backend's autodiff (TensorFlow's tape, `jax.grad`, `torch.autograd`).
    `loss` is written in `keras.ops`."""
    inputs = np.asarray(inputs)
    mask = None if mask is None else np.asarray(mask, bool)
    grads = {"tensorflow": _tf_gradients, "jax": _jax_gradients, "torch": _torch_gradients}[BACKEND]
    value, gradients = grads(layer, loss, inputs, mask, call_kwargs)
    return float(keras.ops.convert_to_numpy(value)), [np.asarray(keras.ops.convert_to_numpy(g)) for g in gradients]


def _tf_gradients(layer, loss, inputs, mask, call_kwargs):
    import tensorflow as tf

    x = tf.constant(inputs)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(layer(x, mask=mask, **call_kwargs))
    weights = layer.trainable_weights
    return value, tape.gradient(value, [x] + [w.value for w in weights])


def _jax_gradients(layer, loss, inputs, mask, call_kwargs):
    import jax

    non_trainable = [v.value for v in layer.non_trainable_variables]

    def objective(x, trainable):
        out, _ = layer.stateless_call(trainable, non_trainable, x, mask=mask, **call_kwargs)
        return loss(out)

    trainable = [v.value for v in layer.trainable_variables]
    value, (d_x, d_w) = jax.jit(jax.value_and_grad(objective, argnums=(0, 1)))(inputs, trainable)
    return value, [d_x] + list(d_w)


def _torch_gradients(layer, loss, inputs, mask, call_kwargs):
    import torch

    x = torch.tensor(inputs, requires_grad=True)
    value = loss(layer(x, mask=None if mask is None else torch.tensor(mask), **call_kwargs))
    weights = [w.value for w in layer.trainable_weights]
    gradients = torch.autograd.grad(value, [x] + weights, allow_unused=True)
    return value, [torch.zeros_like(t) if g is None else g for g, t in zip(gradients, [x] + weights)]
