"""Stacked bidirectional layers: the textbook's "stack two BiGRU layers" exercise.

`kb.stacked_bidirectional(...)` builds a `kb.StackedBidirectional`: a single
serializable Keras layer holding one `kb.Bidirectional` per entry of
`units`. Each layer reads the merged per-position output of the one below;
the mask flows through every layer, so padding stays exact all the way up.
Written in `keras.ops`: the stack runs on every Keras backend.
"""

from __future__ import annotations

import functools
import inspect
from typing import List, Optional, Sequence, Union

import keras
import ml_dtypes
from keras import ops

from keras_birnn.api_export import keras_birnn_export
from keras_birnn.layers.bidirectional import Bidirectional
from keras_birnn.cells import GRUCell, LSTMCell, RecurrentCell, SimpleRNNCell
from keras_birnn.cells.base import check_rate, check_units
from keras_birnn.masking import ragged_mask, sequence_input, zero_empty_rows, zero_padding
from keras_birnn.serialization import attributes, deserialized, refuse_config

CELL_TYPES = {"gru": GRUCell, "lstm": LSTMCell, "simple": SimpleRNNCell}
STACK_MERGE_MODES = ("concat", "sum", "mul", "ave")


def _check_units(units) -> List[int]:
    """One positive int per layer (a single int: one layer)."""
    if isinstance(units, int) and not isinstance(units, bool):
        units = (units,)
    try:
        units = list(units)
    except TypeError:
        units = None
    if not units:
        raise ValueError(
            "`units` must be a positive integer or a non-empty sequence of them (one per "
            f"layer), received {units!r}."
        )
    return [check_units(u) for u in units]


def _template_cell(cell, units: int, cell_kwargs: dict) -> RecurrentCell:
    """The cell every layer copies: a name from CELL_TYPES or a cell."""
    if isinstance(cell, str):
        key = cell.lower()
        if key not in CELL_TYPES:
            raise ValueError(f"`cell` must be one of {sorted(CELL_TYPES)} or a cell, received {cell!r}.")
        return CELL_TYPES[key](units, **cell_kwargs)
    refuse_config(cell, "cell", "kb.StackedBidirectional")
    if not isinstance(cell, RecurrentCell):
        raise TypeError(
            '`cell` must be "gru", "lstm", "simple" or a keras_birnn cell (e.g. '
            f"kb.GRUCell(64, reset_after=False)), received {cell!r}."
        )
    if not cell_kwargs:
        return cell
    config = cell.clone_config()
    config.update(cell_kwargs)
    return type(cell).from_config(config)


class SummaryTable(list):
    """Rows of `StackedBidirectional.summary_table()`, one dict per layer.

    Keys: `layer` (name), `input_width`, `output_width`, `params` (the
    bidirectional layer plus its layer normalization, if any),
    `bidirectional_params`, `residual`, `layer_norm`. `str(table)` prints it.
    """

    @property
    def total_params(self) -> int:
        return sum(row["params"] for row in self)

    def __str__(self) -> str:
        header = ("layer", "input", "output", "params", "residual", "layer_norm")
        lines = [
            (
                row["layer"],
                str(row["input_width"]),
                str(row["output_width"]),
                f"{row['params']:,}",
                "yes" if row["residual"] else "no",
                "yes" if row["layer_norm"] else "no",
            )
            for row in self
        ]
        lines.append(("total", "", "", f"{self.total_params:,}", "", ""))
        widths = [max(len(r[k]) for r in [header] + lines) for k in range(len(header))]
        fmt = lambda r: "  ".join(  # noqa: E731
            c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths))
        )
        table = [fmt(header), fmt(tuple("-" * w for w in widths))] + [fmt(r) for r in lines]
        return "\n".join(line.rstrip() for line in table)


class _LayerNormalization(keras.layers.LayerNormalization):
    """Keras's LayerNormalization as the stack makes it (last axis, centre
    and scale; same weights, same numbers) with derivatives right to every
    order. On TensorFlow, Keras takes the variance from `tf.nn.moments`,
    which stops the gradient of the mean inside it: exact for first
    derivatives (that term is zero there), but a gradient penalty through
    it (a second derivative) was wrong for every layer below
    (docs/design.md, "Gradients"). Written in `keras.ops`, the same
    formula runs on every backend."""

    def call(self, inputs):
        dtype = keras.backend.standardize_dtype(self.compute_dtype)
        if ml_dtypes.finfo(dtype).bits < 32:
            dtype = "float32"  # statistics in float32 at least
        x = ops.cast(inputs, dtype)
        mean = ops.mean(x, axis=-1, keepdims=True)
        variance = ops.mean(ops.square(x - mean), axis=-1, keepdims=True)
        scale = ops.rsqrt(variance + self.epsilon) * ops.cast(self.gamma, dtype)
        return ops.cast(x * scale + (ops.cast(self.beta, dtype) - mean * scale), self.compute_dtype)


@keras_birnn_export("keras_birnn.StackedBidirectional")
class StackedBidirectional(keras.layers.Layer):
    """`kb.Bidirectional` layers stacked, as one serializable layer.

    Layer k reads the merged per-position output of layer k-1 (the first
    reads the inputs). Within each block, in order: inter-layer dropout (not
    before the first layer), the bidirectional layer, the residual
    connection (where allowed), layer normalization, and zeroing of padded
    positions (so padding stays zeros whatever the residual or the
    normalization's bias would put there).

    Args:
        cell: `"gru"`, `"lstm"`, `"simple"`, or a keras_birnn cell used as a
            template: its configuration (not its weights) is copied into
            every layer, with `units` taken from `units`. A cell's own input
            dropout (`dropout=` on the cell) is kept.
        units: One width per layer, e.g. `(64, 64)`.
        merge_mode: `"concat"`, `"sum"`, `"mul"` or `"ave"`, used by every
            layer (`None` and `"projection"` are not stackable).
        dropout: Rate of a `keras.layers.Dropout` between consecutive
            layers; active only in training.
        recurrent_dropout: When non-zero, set on every cell (variational
            recurrent dropout, active only in training).
        residual: `True`: add each layer's input to its output wherever the
            two widths are equal (and the layer outputs per position);
            layers whose widths differ get no skip connection, which
            `summary_table()` reports; at least one layer must qualify or
            `build` raises `ValueError`. A sequence of booleans, one per
            layer, asks for exactly those, and `build` raises `ValueError`
            for a requested layer whose widths differ.
        layer_norm: A layer normalization after each layer (Keras's
            `LayerNormalization`, with second derivatives that are right:
            `_LayerNormalization`).
        return_sequences: Whether the last layer returns every position
            (`[batch, time, width]`, mask propagated) or the sentence
            vector (`[batch, width]`; zeros for a row with no valid step).
        cell_kwargs: Extra arguments of the cells (e.g.
            `{"reset_after": False}`).

    Example:

    >>> stack = kb.stacked_bidirectional("gru", units=(64, 64), reset_after=False)
    >>> stack.build((None, None, 32))
    >>> print(stack.summary_table())
    layer            input  output   params  residual  layer_norm
    ---------------  -----  ------  -------  --------  ----------
    bidirectional_0     32     128   37,248        no          no
    bidirectional_1    128     128   74,112        no          no
    total                           111,360
    """

    def __init__(
        self,
        cell: Union[str, RecurrentCell] = "gru",
        units: Union[int, Sequence[int]] = (64, 64),
        merge_mode: str = "concat",
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        residual: Union[bool, Sequence[bool]] = False,
        layer_norm: bool = False,
        return_sequences: bool = True,
        cell_kwargs: Optional[dict] = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = _check_units(units)
        if merge_mode not in STACK_MERGE_MODES:
            raise ValueError(
                f"`merge_mode` of a stack must be one of {STACK_MERGE_MODES}, received "
                f"{merge_mode!r} (None and 'projection' do not give one tensor to stack on; "
                "put a kb.Bidirectional with that merge on top of the stack instead)."
            )
        self.merge_mode = merge_mode
        self.dropout = check_rate("dropout", dropout)
        self.recurrent_dropout = check_rate("recurrent_dropout", recurrent_dropout)
        if isinstance(residual, (list, tuple)):
            if len(residual) != len(self.units) or not all(isinstance(r, bool) for r in residual):
                raise ValueError(
                    f"`residual` must be a bool or {len(self.units)} bools (one per layer), "
                    f"received {residual!r}."
                )
            residual = list(residual)
        elif not isinstance(residual, bool):
            raise ValueError(f"`residual` must be a bool or a list of bools, received {residual!r}.")
        self.residual = residual
        self.layer_norm = bool(layer_norm)
        self.return_sequences = bool(return_sequences)
        template_cell = _template_cell(cell, self.units[0], dict(cell_kwargs or {}))
        # Kept out of Keras's layer tracking (the template holds no weights)
        # and serialised only when a config is asked for: a cell with an
        # object that cannot be saved still makes a stack that runs.
        self._serialized_template = functools.partial(keras.saving.serialize_keras_object, template_cell)
        cell_type = type(template_cell)
        self.bidirectionals = []
        for k, width in enumerate(self.units):
            # Layers after the first derive their seeds (salt k + 1; a
            # layer's backward direction uses salt 1 of its own cell).
            config = dict(template_cell.clone_config(salt=k + 1 if k else 0), units=width, name=f"cell_{k}")
            if self.recurrent_dropout:
                config["recurrent_dropout"] = self.recurrent_dropout
            self.bidirectionals.append(
                Bidirectional(
                    cell_type.from_config(config),
                    merge_mode=merge_mode,
                    return_sequences=self.return_sequences or k < len(self.units) - 1,
                    name=f"bidirectional_{k}",
                    dtype=self.dtype_policy,  # the stack's dtype reaches every layer
                )
            )
        self.dropouts = []
        if self.dropout:
            self.dropouts = [
                keras.layers.Dropout(self.dropout, name=f"dropout_{k}", dtype=self.dtype_policy)
                for k in range(1, len(self.units))
            ]
        self.norms = []
        if self.layer_norm:
            self.norms = [
                _LayerNormalization(name=f"layer_norm_{k}", dtype=self.dtype_policy)
                for k in range(len(self.units))
            ]
        self.residual_used = None
        self.widths = None
        self.supports_masking = True

    # --- building -----------------------------------------------------------

    def _output_width(self, k: int, input_width: int) -> int:
        return self.bidirectionals[k].compute_output_shape((None, None, input_width))[-1]

    def _residual_flags(self, widths) -> List[bool]:
        n = len(self.units)
        allowed = [
            widths[k] == widths[k + 1] and (self.return_sequences or k < n - 1) for k in range(n)
        ]
        if isinstance(self.residual, list):
            for k, (asked, ok) in enumerate(zip(self.residual, allowed)):
                if asked and not ok:
                    why = (
                        f"its input width is {widths[k]} and its output width {widths[k + 1]}"
                        if widths[k] != widths[k + 1]
                        else "it returns a sentence vector (return_sequences=False), not positions"
                    )
                    raise ValueError(
                        f"residual[{k}] is True but layer {k} cannot have a residual connection: "
                        f"{why}. A residual adds the layer's input to its output, so both must "
                        "have the same shape."
                    )
            return list(self.residual)
        if not self.residual:
            return [False] * n
        if not any(allowed):
            raise ValueError(
                "residual=True but no layer has equal input and output widths (widths from the "
                f"input up: {widths}, merge_mode={self.merge_mode!r}). A residual adds a layer's "
                "input to its output; make them equal (e.g. a first layer's input of width "
                "2 * units with merge_mode='concat') or set residual=False."
            )
        return allowed

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                f"Layer {self.name!r} expects inputs [batch, time, features] with a known feature "
                f"size, received shape {tuple(input_shape)}."
            )
        widths = [int(input_shape[-1])]
        for k in range(len(self.units)):
            widths.append(self._output_width(k, widths[-1]))
        self.widths = widths
        self.residual_used = self._residual_flags(widths)
        for k, bi in enumerate(self.bidirectionals):
            bi.build((input_shape[0], input_shape[1], widths[k]))
            if self.norms:
                self.norms[k].build((input_shape[0], None, widths[k + 1]))
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: widths[0]})

    # --- running ------------------------------------------------------------

    def _block(self, k, x, mask, training):
        if k > 0 and self.dropouts:
            x = self.dropouts[k - 1](x, training=training)
        y = self.bidirectionals[k](x, mask=mask, training=training)
        if self.residual_used[k]:
            y = y + x
        if self.norms:
            y = self.norms[k](y)
        if mask is None:
            return y
        if len(y.shape) == 3:
            return zero_padding(y, mask)
        return zero_empty_rows(y, mask, x)  # the sentence vector of an empty row

    def call(self, inputs, mask=None, training=None):
        x, mask = sequence_input(inputs, mask, self.name)
        for k in range(len(self.bidirectionals)):
            x = self._block(k, x, mask, training)
        return x

    def layer_input(self, inputs, index: int, mask=None, training=None):
        """What the `index`-th bidirectional layer reads for these inputs
        (after the blocks below it and the dropout before it)."""
        if not 0 <= index < len(self.bidirectionals):
            raise ValueError(f"`index` must be in [0, {len(self.bidirectionals)}), received {index}.")
        x, mask = sequence_input(inputs, mask, self.name)
        if not self.built:
            self.build(tuple(x.shape))
        for k in range(index):
            x = self._block(k, x, mask, training)
        if index > 0 and self.dropouts:
            x = self.dropouts[index - 1](x, training=training)
        return x

    def compute_mask(self, inputs, mask=None):
        return ragged_mask(inputs, mask) if self.return_sequences else None

    def compute_output_shape(self, input_shape):
        width = input_shape[-1]
        for k in range(len(self.units)):
            width = self._output_width(k, width)
        if self.return_sequences:
            return (input_shape[0], input_shape[1], width)
        return (input_shape[0], width)

    # --- reporting ------------------------------------------------------------

    def summary_table(self, input_width: Optional[int] = None) -> SummaryTable:
        """Per-layer input width, output width and parameter count.

        Builds the stack for `input_width` features if it is not built yet.
        """
        if not self.built:
            if input_width is None:
                raise ValueError(
                    f"Layer {self.name!r} is not built yet: call it once, or pass `input_width` "
                    "(the number of input features) to summary_table()."
                )
            self.build((None, None, input_width))
        elif input_width is not None and input_width != self.widths[0]:
            raise ValueError(f"Layer {self.name!r} was built for {self.widths[0]} features, not {input_width}.")
        rows = SummaryTable()
        for k, bi in enumerate(self.bidirectionals):
            bi_params = bi.count_params()
            norm_params = self.norms[k].count_params() if self.norms else 0
            rows.append(
                {
                    "layer": bi.name,
                    "input_width": self.widths[k],
                    "output_width": self.widths[k + 1],
                    "params": bi_params + norm_params,
                    "bidirectional_params": bi_params,
                    "residual": bool(self.residual_used[k]),
                    "layer_norm": self.layer_norm,
                }
            )
        return rows

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "cell": self._serialized_template(),
                "units": list(self.units),
                "residual": list(self.residual) if isinstance(self.residual, list) else self.residual,
                **attributes(self, "merge_mode", "dropout", "recurrent_dropout", "layer_norm", "return_sequences"),
            }
        )
        return config

    @classmethod
    def from_config(cls, config: dict) -> "StackedBidirectional":
        return super().from_config(deserialized(config, "cell"))


def stacked_bidirectional(
    cell: Union[str, RecurrentCell] = "gru", units: Union[int, Sequence[int]] = (64, 64), **kwargs
) -> StackedBidirectional:
    """Builds a `kb.StackedBidirectional` (see it for every argument).

    The class's arguments and the base layer's (`name`, `dtype`: a dtype or
    policy such as `"mixed_bfloat16"`, which reaches every layer in the
    stack; `trainable`) are taken by keyword; every other keyword goes to
    every layer's cell (e.g. `reset_after=False`, `activation="relu"`),
    overriding a template cell's configuration: what the class takes as
    `cell_kwargs`.

    Example (the textbook's exercise: two stacked BiGRUs, input 32, hidden 64):

    >>> stack = kb.stacked_bidirectional("gru", units=(64, 64), reset_after=False)
    >>> stack.build((None, None, 32))
    >>> [row["params"] for row in stack.summary_table()]
    [37248, 74112]
    """
    own = {k: kwargs.pop(k) for k in list(kwargs) if k in _STACK_KEYWORDS}
    return StackedBidirectional(cell, units, cell_kwargs=kwargs, **own)


# The keywords `stacked_bidirectional` hands to the class; the rest are the cells'.
_STACK_KEYWORDS = frozenset(inspect.signature(StackedBidirectional.__init__).parameters) - {
    "self", "cell", "units", "cell_kwargs", "kwargs"
} | {"name", "dtype", "trainable"}
