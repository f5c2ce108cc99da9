"""Direction diagnostics (the textbook, figure 17-5): how much each direction carries.

The two directions of a bidirectional layer see different parts of the
sequence, and rarely contribute equally at a position. These functions run a
`kb.Bidirectional`'s two recurrences (the method its `call` uses,
`Bidirectional.run_directions`: no second copy of the maths) and
report, per position:

- `direction_norms`: the L2 norm of the forward and of the backward state
  (the figure's two extra columns);
- `direction_contributions`: for a `"projection"` merge, V_f h_f and V_b h_b
  separately, so one can see which direction drove each decision;
- `plot_direction_norms`: the norms drawn to a PNG (needs matplotlib:
  `pip install keras-birnn[plot]`).

Each accepts a `kb.Bidirectional`, a `kb.StackedBidirectional` or a Keras
model containing them (the inputs are then the model's, and the layer's own
input and mask are computed by the layers below it). Written in `keras.ops`:
they run on every Keras backend.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import keras
import numpy as np
from keras import ops

from keras_birnn.tf_internal import functional_node_keys, inbound_nodes, keras_mask
from keras_birnn.layers.bidirectional import Bidirectional
from keras_birnn.masking import sequence_input, validate_mask
from keras_birnn.layers.stacking import StackedBidirectional

__all__ = [
    "DirectionContributions",
    "DirectionNorms",
    "direction_contributions",
    "direction_norms",
    "direction_states",
    "plot_direction_norms",
]

PLOT_INSTALL_HINT = (
    "plot_direction_norms needs matplotlib, an optional dependency of keras_birnn: "
    "pip install keras-birnn[plot]  (or: pip install matplotlib)"
)


class DirectionNorms(NamedTuple):
    """Per-position L2 norms of each direction's state.

    Attributes:
        forward: `[batch, time]` norms of the forward state h_f,t.
        backward: `[batch, time]` norms of the backward state h_b,t.
        mask: `[batch, time]` bool, False at padded positions, whose norms
            are 0 (never NaN).
    """

    forward: np.ndarray
    backward: np.ndarray
    mask: np.ndarray


class DirectionContributions(NamedTuple):
    """What each direction adds to a `"projection"` merge, per position.

    `forward + backward + bias` is the pre-activation of
    y_t = activation(V_f h_f,t + V_b h_b,t + c) at valid positions.

    Attributes:
        forward: `[batch, time, units]` V_f h_f,t (zeros where padded).
        backward: `[batch, time, units]` V_b h_b,t (zeros where padded).
        bias: `[units]` c.
        mask: `[batch, time]` bool, False at padded positions.
    """

    forward: np.ndarray
    backward: np.ndarray
    bias: np.ndarray
    mask: np.ndarray


def _bidirectional_layers(container):
    found = []
    for layer in container.layers if hasattr(container, "layers") else []:
        if isinstance(layer, Bidirectional):
            found.append((layer.name, layer, None))
        elif isinstance(layer, StackedBidirectional):
            for k, bi in enumerate(layer.bidirectionals):
                found.append((f"{layer.name}/{bi.name}", bi, (layer, k)))
    return found


def _pick(candidates, layer, what):
    names = [name for name, _, _ in candidates]
    if not candidates:
        raise ValueError(f"{what} contains no kb.Bidirectional layer.")
    if layer is None:
        if len(candidates) > 1:
            raise ValueError(
                f"{what} contains {len(candidates)} bidirectional layers {names}; choose one "
                "with `layer=` (its name or its index in this list)."
            )
        return candidates[0]
    if isinstance(layer, int) and not isinstance(layer, bool):
        if not -len(candidates) <= layer < len(candidates):
            raise ValueError(f"`layer={layer}` is out of range for the bidirectional layers {names}.")
        return candidates[layer]
    for candidate in candidates:
        if layer in (candidate[0], candidate[0].rsplit("/", 1)[-1]) or layer is candidate[1]:
            return candidate
    raise ValueError(f"`layer={layer!r}` is none of the bidirectional layers {names}.")


def _node_input(model, target):
    """The input tensor and mask (symbolic) that `target` receives in `model`."""
    nodes = inbound_nodes(target)
    if not nodes:
        raise ValueError(
            f"Layer {target.name!r} has not been called inside the model, so its input is unknown."
        )
    # The node of this model (a layer shared by several models has several).
    keys = functional_node_keys(model)
    node = next((n for i, n in enumerate(nodes) if f"{target.name}_ib-{i}" in keys), nodes[0])
    arguments = node.arguments
    tensor = arguments.args[0]
    mask = arguments.kwargs.get("mask")
    if mask is None:
        mask = keras_mask(tensor)
    return tensor, mask


def _eager_mask(tensor):
    """The Keras mask a model's call attached to `tensor` (see `_node_input`)."""
    return keras_mask(tensor)


def _resolve(layer_or_model, inputs, mask, layer):
    """Returns (kb.Bidirectional, its input tensor, its mask) for `inputs`."""
    if isinstance(layer_or_model, Bidirectional):
        if layer is not None:
            raise ValueError("`layer=` selects inside a model or a stack; a kb.Bidirectional was given.")
        bi = layer_or_model
        x, mask = sequence_input(inputs, mask, bi.name)
        if not bi.built:
            bi.build(tuple(x.shape))
        return bi, x, mask
    if isinstance(layer_or_model, StackedBidirectional):
        stack = layer_or_model
        candidates = [(bi.name, bi, (stack, k)) for k, bi in enumerate(stack.bidirectionals)]
        _, bi, (_, index) = _pick(candidates, layer, f"Layer {stack.name!r}")
        x, mask = sequence_input(inputs, mask, stack.name)
        return bi, stack.layer_input(x, index, mask=mask, training=False), mask
    if isinstance(layer_or_model, keras.Model):
        model = layer_or_model
        if mask is not None:
            raise ValueError(
                "`mask=` is for a layer; a model computes its layers' masks from its own inputs "
                "(e.g. an Embedding with mask_zero=True)."
            )
        _, bi, in_stack = _pick(_bidirectional_layers(model), layer, f"Model {model.name!r}")
        outer = bi if in_stack is None else in_stack[0]
        tensor, mask_tensor = _node_input(model, outer)
        outputs = [tensor] if mask_tensor is None else [tensor, mask_tensor]
        model_inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
        values = keras.Model(model_inputs, outputs)(inputs, training=False)
        values = values if isinstance(values, (list, tuple)) else [values]
        x = values[0]
        layer_mask = values[1] if mask_tensor is not None else _eager_mask(x)
        if in_stack is not None:
            stack, index = in_stack
            x = stack.layer_input(x, index, mask=layer_mask, training=False)
        return bi, x, layer_mask
    raise TypeError(
        "Expected a kb.Bidirectional, a kb.StackedBidirectional or a keras.Model containing one, "
        f"received {layer_or_model!r}."
    )


def direction_states(layer_or_model, inputs, mask=None, layer=None):
    """The forward and backward output sequences `[batch, time, units]` of a
    bidirectional layer (before the merge) and its bool mask `[batch, time]`.

    Runs the layer's two recurrences exactly as its `call` does, in
    inference mode. Padded positions hold zeros.

    Args:
        layer_or_model: A `kb.Bidirectional`, a `kb.StackedBidirectional`
            or a Keras model containing them.
        inputs: The inputs of `layer_or_model`.
        mask: Optional bool `[batch, time]`, for a layer or a stack (a model
            computes its own).
        layer: In a model or a stack with several bidirectional layers, which
            one: its name (`"stack/bidirectional_1"` inside a stack of a model,
            or the bare name) or its index in the order they appear.

    Returns:
        `(forward, backward, mask)` as tensors; `mask` is all True when the
        layer sees no mask.
    """
    bi, x, mask = _resolve(layer_or_model, inputs, mask, layer)
    x = ops.convert_to_tensor(x)
    mask = validate_mask(mask, x)
    forward, backward = bi.run_directions(x, mask, training=False, return_sequences=True, counted=False)
    if mask is None:
        mask = ops.ones(ops.shape(x)[:2], "bool")
    return forward.outputs, backward.outputs, mask


def direction_norms(layer_or_model, inputs, mask=None, layer=None) -> DirectionNorms:
    """Per-position L2 norms of the forward and backward states (figure 17-5).

    Args: as for `direction_states`.

    Returns:
        `DirectionNorms(forward [B, T], backward [B, T], mask [B, T])` as
        NumPy arrays; padded positions have norm 0 and mask False.

    Example:

    >>> bi = kb.Bidirectional(kb.GRUCell(8), return_sequences=True)
    >>> x = np.random.default_rng(0).normal(size=(2, 6, 3)).astype("float32")
    >>> mask = np.array([[True] * 6, [True] * 3 + [False] * 3])
    >>> norms = kb.diagnostics.direction_norms(bi, x, mask=mask)
    >>> norms.forward.shape
    (2, 6)
    >>> norms.forward[1, 3:], norms.backward[1, 3:]    # padded: norm 0
    (array([0., 0., 0.], dtype=float32), array([0., 0., 0.], dtype=float32))
    >>> uneven = norms.forward[0, 3] / norms.backward[0, 3]     # how uneven at t=3
    """
    forward, backward, mask = direction_states(layer_or_model, inputs, mask, layer)

    def norm(states):
        # sqrt of a sum of squares with a gradient-safe zero (not used for
        # gradients here, but a padded position must never read NaN).
        squared = ops.sum(ops.square(ops.cast(states, "float32")), axis=-1)
        return ops.convert_to_numpy(ops.where(mask, ops.sqrt(squared), ops.zeros_like(squared)))

    return DirectionNorms(norm(forward), norm(backward), ops.convert_to_numpy(mask))


def direction_contributions(layer_or_model, inputs, mask=None, layer=None) -> DirectionContributions:
    """V_f h_f and V_b h_b per position for a `merge_mode="projection"` layer.

    Args: as for `direction_states`.

    Returns:
        `DirectionContributions(forward, backward, bias, mask)` as NumPy
        arrays; `forward + backward + bias` is the pre-activation at valid
        positions, and both contributions are zeros at padded ones.

    Raises:
        ValueError: if the layer's merge is not `"projection"`.
    """
    bi = _resolve_layer_only(layer_or_model, layer)
    if bi.merge_mode != "projection":
        raise ValueError(
            f"direction_contributions needs a merge_mode='projection' layer; {bi.name!r} has "
            f"merge_mode={bi.merge_mode!r} (use direction_norms or direction_states instead)."
        )
    forward, backward, mask = direction_states(layer_or_model, inputs, mask, layer)
    projection = bi.projection
    dtype = forward.dtype
    valid = ops.expand_dims(mask, -1)

    def contribution(states, kernel):
        product = ops.einsum("btu,up->btp", states, ops.cast(kernel, dtype))
        return ops.convert_to_numpy(ops.where(valid, product, ops.zeros_like(product)))

    return DirectionContributions(
        contribution(forward, projection.forward_kernel),
        contribution(backward, projection.backward_kernel),
        ops.convert_to_numpy(ops.cast(projection.bias, dtype)),
        ops.convert_to_numpy(mask),
    )


def _resolve_layer_only(layer_or_model, layer):
    if isinstance(layer_or_model, Bidirectional):
        return layer_or_model
    if isinstance(layer_or_model, StackedBidirectional):
        candidates = [(bi.name, bi, None) for bi in layer_or_model.bidirectionals]
        return _pick(candidates, layer, f"Layer {layer_or_model.name!r}")[1]
    if isinstance(layer_or_model, keras.Model):
        return _pick(_bidirectional_layers(layer_or_model), layer, f"Model {layer_or_model.name!r}")[1]
    raise TypeError(
        "Expected a kb.Bidirectional, a kb.StackedBidirectional or a keras.Model containing one, "
        f"received {layer_or_model!r}."
    )


def plot_direction_norms(
    layer_or_model,
    inputs,
    path: str,
    mask=None,
    layer=None,
    rows: Union[int, Sequence[int]] = 0,
    title: Optional[str] = None,
) -> str:
    """Draws the per-position norms of both directions to a PNG file.

    One panel per selected row: the forward and backward norms against the
    position; padded positions are shaded and carry no point.

    Args:
        layer_or_model, inputs, mask, layer: as for `direction_norms`.
        path: Where to write the PNG.
        rows: Which batch rows to draw (an index or a list of them).
        title: Optional figure title.

    Returns:
        `path`.

    Raises:
        ImportError: if matplotlib is missing (`pip install keras-birnn[plot]`).
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(PLOT_INSTALL_HINT) from error

    norms = direction_norms(layer_or_model, inputs, mask=mask, layer=layer)
    rows = [rows] if isinstance(rows, int) else list(rows)
    batch, steps = norms.mask.shape
    for r in rows:
        if not 0 <= r < batch:
            raise ValueError(f"`rows` must be indices in [0, {batch}), received {r}.")
    figure, axes = plt.subplots(len(rows), 1, figsize=(max(4.0, 0.5 * steps + 2), 2.6 * len(rows)), squeeze=False)
    positions = np.arange(steps)
    for axis, r in zip(axes[:, 0], rows):
        valid = norms.mask[r]
        directions = ((norms.forward[r], "forward |h_f|", "o"), (norms.backward[r], "backward |h_b|", "s"))
        for values, label, marker in directions:
            axis.plot(positions, np.where(valid, values, np.nan), marker=marker, label=label)
        for t in positions[~valid]:
            axis.axvspan(t - 0.5, t + 0.5, color="0.9", zorder=0)
        axis.set_xlim(-0.5, steps - 0.5)
        axis.set_xticks(positions)
        axis.set_ylabel(f"row {r}: L2 norm")
        axis.legend(loc="best", fontsize="small")
    axes[-1, 0].set_xlabel("position t (shaded: padding)")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)
    return path
