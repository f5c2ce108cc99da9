"""What every cell shares: weights in Keras's layout, dropout masks, config.

A cell is one step of a recurrence and knows nothing of loops or directions.
A step is the input projection `x_t kernel + input_bias` followed by the
cell's pure step maths (`step_math()`, a `cells.step_math.StepMath`).
"""

from typing import Any, Optional, Sequence

import keras
from keras import activations, constraints, initializers, ops, regularizers

from keras_birnn.cells.step_math import StepMath
from keras_birnn.functions import serialize_activation


def check_rate(name: str, value: Any) -> float:
    """A dropout rate: a float in [0, 1) (TypeError for another type, ValueError out of range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a float in [0, 1), received {value!r}.")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), received {value!r}.")
    return float(value)


def derived_seed(seed: Optional[int], salt: int) -> Optional[int]:
    """A seed of its own for a copy of a cell seeded `seed` (None stays None:
    an unseeded cell draws its own). A copy with the same seed would draw
    the same dropout masks: a `Bidirectional`'s two directions would drop
    the same input features of the same rows at every step."""
    if seed is None:
        return None
    return (seed * 1_000_003 + 7_919 * salt) % 2_147_483_647


def check_units(units: Any) -> int:
    """A layer's `units`: a positive int."""
    if isinstance(units, bool) or not isinstance(units, int) or units <= 0:
        raise ValueError(f"`units` must be a positive integer, received {units!r}.")
    return units


def _serialize_argument(name: str, value):
    """The saved form of an object argument, by the kind its name says."""
    if name.endswith("activation"):
        return serialize_activation(value)
    kinds = (("_initializer", initializers), ("_regularizer", regularizers), ("_constraint", constraints))
    for suffix, module in kinds:
        if name.endswith(suffix):
            return module.serialize(value)
    raise ValueError(f"No saved form for the argument {name!r}.")


def _copy_argument(name: str, value, salt: int):
    """An object argument for a copy made in this process: the object itself,
    but an initializer remade from its config, its seed (if any) derived
    with `salt`. A Keras initializer without a seed draws one when made, and
    one with a seed draws the same values every time: shared, or remade
    with the same seed, it would start the copy from the same weights."""
    if not name.endswith("_initializer") or not hasattr(value, "get_config"):
        return value  # (a plain function initializer draws afresh at each call)
    try:
        config = value.get_config()
        if salt and isinstance(config.get("seed"), int):
            config = dict(config, seed=derived_seed(config["seed"], salt))
        return type(value).from_config(config)
    except (TypeError, ValueError, NotImplementedError):
        return value


class RecurrentCell(keras.layers.Layer):
    """Base class of the cells: `gate_count` blocks of `units` columns.

    Subclasses set `gate_count`, `state_count` and implement `step_math`
    (and `bias_shape` when the bias is not `[gates*units]`); they add their
    own constructor arguments to `_arguments_config` (objects also to
    `object_arguments`), from which `get_config` and `clone_config` both
    derive.

    Args:
        units: Positive integer, size of the state.
        activation: Activation of the candidate / state.
        use_bias: Whether the cell has a bias vector.
        kernel_initializer, recurrent_initializer, bias_initializer:
            Initializers of the three weights.
        kernel_regularizer, recurrent_regularizer, bias_regularizer:
            Optional regularizers.
        kernel_constraint, recurrent_constraint, bias_constraint:
            Optional constraints.
        dropout: Fraction of the input units to drop (one mask per sequence,
            shared by all steps and gates).
        recurrent_dropout: Fraction of the state units to drop in the
            recurrent matmul (one mask per sequence).
        seed: Seed of the dropout masks (a `Bidirectional`'s backward copy
            and a stack's other layers derive their own from it).
    """

    gate_count = 1
    state_count = 1
    # Constructor arguments that are objects: saved serialised, handed as
    # they are to copies (`clone_config`).
    object_arguments = (
        "activation",
        "kernel_initializer",
        "recurrent_initializer",
        "bias_initializer",
        "kernel_regularizer",
        "recurrent_regularizer",
        "bias_regularizer",
        "kernel_constraint",
        "recurrent_constraint",
        "bias_constraint",
    )

    def __init__(
        self,
        units: int,
        activation="tanh",
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        kernel_regularizer=None,
        recurrent_regularizer=None,
        bias_regularizer=None,
        kernel_constraint=None,
        recurrent_constraint=None,
        bias_constraint=None,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
        seed: Optional[int] = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.units = check_units(units)
        self.activation = activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = initializers.get(kernel_initializer)
        self.recurrent_initializer = initializers.get(recurrent_initializer)
        self.bias_initializer = initializers.get(bias_initializer)
        self.kernel_regularizer = regularizers.get(kernel_regularizer)
        self.recurrent_regularizer = regularizers.get(recurrent_regularizer)
        self.bias_regularizer = regularizers.get(bias_regularizer)
        self.kernel_constraint = constraints.get(kernel_constraint)
        self.recurrent_constraint = constraints.get(recurrent_constraint)
        self.bias_constraint = constraints.get(bias_constraint)
        self.dropout = check_rate("dropout", dropout)
        self.recurrent_dropout = check_rate("recurrent_dropout", recurrent_dropout)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.input_dim = None

    @property
    def state_size(self) -> list:
        return [self.units] * self.state_count

    @property
    def output_size(self) -> int:
        return self.units

    def bias_shape(self) -> tuple:
        return (self.gate_count * self.units,)

    def build_bias_initializer(self):
        return self.bias_initializer

    def build(self, input_shape: Sequence[Optional[int]]):
        input_dim = input_shape[-1]
        if input_dim is None or input_dim <= 0:
            raise ValueError(
                f"{type(self).__name__} needs a known, positive feature size "
                f"(last axis of the input); received input shape {tuple(input_shape)}."
            )
        self.input_dim = int(input_dim)
        width = self.gate_count * self.units
        self.kernel = self._weight("kernel", "kernel", (self.input_dim, width), self.kernel_initializer)
        self.recurrent_kernel = self._weight(
            "recurrent_kernel", "recurrent", (self.units, width), self.recurrent_initializer
        )
        self.bias = None
        if self.use_bias:
            self.bias = self._weight("bias", "bias", self.bias_shape(), self.build_bias_initializer())

    def _weight(self, name: str, kind: str, shape: tuple, initializer):
        """A weight with the cell's `<kind>_regularizer` and `<kind>_constraint`."""
        return self.add_weight(
            shape=shape,
            name=name,
            initializer=initializer,
            regularizer=getattr(self, f"{kind}_regularizer"),
            constraint=getattr(self, f"{kind}_constraint"),
        )

    # --- the pure pieces a loop runs -------------------------------------

    def input_bias(self, bias):
        """The part of the bias added to the input projection."""
        return bias

    def recurrent_bias(self, bias):
        """The part of the bias added inside the recurrent step (GRU only)."""
        return None

    def step_weights(self, dtype=None) -> dict:
        """The weights as tensors of the compute dtype, for the pure functions."""
        dtype = dtype or self.compute_dtype
        bias = None if self.bias is None else ops.cast(self.bias, dtype)
        return {
            "kernel": ops.cast(self.kernel, dtype),
            "recurrent_kernel": ops.cast(self.recurrent_kernel, dtype),
            "input_bias": None if bias is None else self.input_bias(bias),
            "recurrent_bias": None if bias is None else self.recurrent_bias(bias),
        }

    @staticmethod
    def input_projection(inputs, kernel, input_bias):
        """`inputs @ kernel + input_bias` for one step `[batch, features]`."""
        projected = ops.matmul(inputs, kernel)
        return projected if input_bias is None else projected + input_bias

    def step_math(self) -> StepMath:
        """The cell's pure step maths, which the loop runs forward and
        backward over time (the contract: `cells.step_math.StepMath`)."""
        raise NotImplementedError

    def recurrent_step(self, projected, states, recurrent_kernel, recurrent_bias, state_mask=None):
        """Returns the new states; the output is always `new_states[0]`.

        `state_mask` (recurrent dropout) scales the state only where it
        enters the recurrent matmul, as Keras does.
        """
        return self.step_math().forward(projected, states, recurrent_kernel, recurrent_bias, state_mask)[0]

    # --- dropout -----------------------------------------------------------

    def dropout_masks(self, batch_size, dtype, training) -> tuple:
        """One input mask `[B, input_dim]` and one state mask `[B, units]`
        (or None) for a whole sequence, so every step drops the same units."""
        input_mask = state_mask = None
        if training and self.dropout > 0:
            input_mask = keras.random.dropout(
                ops.ones([batch_size, self.input_dim], dtype),
                rate=self.dropout,
                seed=self.seed_generator,
            )
        if training and self.recurrent_dropout > 0:
            state_mask = keras.random.dropout(
                ops.ones([batch_size, self.units], dtype),
                rate=self.recurrent_dropout,
                seed=self.seed_generator,
            )
        return input_mask, state_mask

    # --- Keras cell protocol: one step -------------------------------------

    def call(self, inputs, states, training=False):
        """One step, so the cell also works inside `keras.layers.RNN`.

        Call arguments:
            inputs: `[batch, input_dim]`.
            states: list of `state_count` tensors `[batch, units]`.
            training: Whether dropout is active.
        """
        states = list(states) if isinstance(states, (list, tuple)) else [states]
        weights = self.step_weights()
        input_mask, state_mask = self.dropout_masks(ops.shape(inputs)[0], inputs.dtype, training)
        if input_mask is not None:
            inputs = inputs * input_mask
        projected = self.input_projection(inputs, weights["kernel"], weights["input_bias"])
        new_states = self.recurrent_step(
            projected,
            states,
            weights["recurrent_kernel"],
            weights["recurrent_bias"],
            state_mask,
        )
        return new_states[0], list(new_states)

    def get_initial_state(self, batch_size=None):
        return [ops.zeros([batch_size, self.units], self.compute_dtype) for _ in range(self.state_count)]

    def clone_config(self, salt: int = 0) -> dict:
        """`get_config()` for a copy made in this process (the other
        direction of a `Bidirectional`, the layers of a stack), with the
        `object_arguments` as the objects themselves: saved, a function is
        a name that loads as Keras's function of that name, and an object
        of a class not registered (or without `get_config`) loads not at
        all. Initializers are remade, so that the copy starts from weights
        of its own; a non-zero `salt` derives the copy's seeds (dropout,
        seeded initializers) from this cell's (`derived_seed`)."""
        config = self._arguments_config()
        for name in self.object_arguments:
            config[name] = _copy_argument(name, config[name], salt)
        if salt:
            config["seed"] = derived_seed(config["seed"], salt)
        return config

    def get_config(self) -> dict:
        config = self._arguments_config()
        for name in self.object_arguments:
            config[name] = _serialize_argument(name, config[name])
        return config

    def _arguments_config(self) -> dict:
        """The constructor's arguments, the `object_arguments` as the objects
        themselves: what `get_config` (which serialises them) and
        `clone_config` (which copies them) both start from. A subclass adds
        its own arguments here. (`get_config` itself cannot be the start:
        an object without a saved form makes it fail, and a copy in this
        process needs none.)"""
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "recurrent_dropout": self.recurrent_dropout,
                "seed": self.seed,
            }
        )
        config.update({name: getattr(self, name) for name in self.object_arguments})
        return config
