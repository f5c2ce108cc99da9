"""Shared test cases: every cell and merge mode, random weights set on a
`kb.Bidirectional` and the same weights fed to the NumPy oracle.

Weights are drawn in float64, rounded to float32 and handed to both sides,
so the layer (float32) and the oracle (float64) see identical numbers.
"""

import dataclasses
from typing import Any, Optional

import keras
import numpy as np

import keras_birnn as kb
import reference as ref
from helpers import f32

B, T, F, U, P = 4, 6, 3, 4, 5

# name -> (oracle cell, oracle cell kwargs, factory of the kb cell)
CELLS = {
    "simple_tanh": ("simple", {"activation": "tanh"}, lambda u: kb.SimpleRNNCell(u, activation="tanh")),
    "simple_relu": ("simple", {"activation": "relu"}, lambda u: kb.SimpleRNNCell(u, activation="relu")),
    "gru_reset_after": ("gru", {"reset_after": True}, lambda u: kb.GRUCell(u, reset_after=True)),
    "gru_reset_before": ("gru", {"reset_after": False}, lambda u: kb.GRUCell(u, reset_after=False)),
    "lstm": ("lstm", {}, lambda u: kb.LSTMCell(u)),
}
N_STATES = {"simple": 1, "gru": 1, "lstm": 2}

MERGES = ref.MERGES  # name -> (merge_mode, projection_activation)



@dataclasses.dataclass
class Case:
    """One bidirectional configuration: the layer, its weights and inputs."""

    cell_name: str
    merge_name: str
    cell: str
    cell_kwargs: dict
    merge_mode: Optional[str]
    projection_activation: Optional[str]
    fw: dict
    bw: dict
    projection: Optional[dict]
    x: np.ndarray
    layer: Any
    return_sequences: bool
    return_state: bool
    rng: np.random.Generator

    @property
    def n_states(self) -> int:
        return N_STATES[self.cell]

    def oracle(self, mask=None, fw_initial=None, bw_initial=None, x=None):
        """The NumPy oracle's answer in the layer's output structure.

        For `return_sequences=False` a row without any valid step outputs
        zeros (issue 2: fully masked rows give zeros); the oracle merges the
        boundary states there, so those rows are zeroed here.
        """
        x = self.x if x is None else x
        y, fin_f, fin_b = ref.bidirectional(
            self.cell, self.fw, self.bw, x, mask, self.merge_mode, self.projection,
            self.projection_activation, self.return_sequences, fw_initial, bw_initial,
            **self.cell_kwargs,
        )
        if not self.return_sequences and mask is not None:
            empty = ~np.asarray(mask, bool).any(axis=1)[:, None]
            y = keras.tree.map_structure(lambda v: np.where(empty, 0.0, v), y)
        if not self.return_state:
            return y
        outputs = list(y) if self.merge_mode is None else [y]
        return outputs + list(fin_f) + list(fin_b)

    def oracle_grads(self, d_output, mask=None, fw_initial=None, bw_initial=None):
        """`ref.bidirectional_grads` of L = sum(output * d_output).

        Rows without valid steps output constant zeros for
        `return_sequences=False`, so their `d_output` is inert: zeroed here.
        """
        if not self.return_sequences and mask is not None:
            empty = ~np.asarray(mask, bool).any(axis=1)[:, None]
            d_output = keras.tree.map_structure(lambda v: np.where(empty, 0.0, v), d_output)
        return ref.bidirectional_grads(
            self.cell, self.fw, self.bw, self.x, d_output, mask, self.merge_mode,
            self.projection, self.projection_activation, self.return_sequences,
            fw_initial, bw_initial, **self.cell_kwargs,
        )

    def random_d_output(self):
        """A random cotangent shaped like the (merged) output."""
        width = {"concat": 2 * U, "projection": P}.get(self.merge_mode, U)
        lead = (B, T) if self.return_sequences else (B,)
        if self.merge_mode is None:
            return [self.rng.normal(size=lead + (U,)) for _ in range(2)]
        return self.rng.normal(size=lead + (width,))

    def tf_grads(self, d_output, mask=None, initial_state=None, extra_variables=(), graph=False,
                 training=None):
        """TF gradients of sum(output * d_output), keyed like the oracle's:
        `fw`/`bw` weights, `projection`, `x`, `initial_state` (per tensor of a
        call-time list) and `extra` (for `extra_variables`).

        `training=True` is the path `model.fit` takes; an inference call
        (`training=None`) must give the same exact gradients.
        `graph=True` runs the tape inside a `tf.function` with unknown batch
        and time sizes.
        """
        bi = self.layer
        names, variables = [], []
        for side, rec in (("fw", bi.forward_layer), ("bw", bi.backward_layer)):
            for k in ("kernel", "recurrent_kernel", "bias"):
                names.append((side, k))
                variables.append(getattr(rec.cell, k))
        if bi.projection is not None:
            proj = bi.projection
            for k, var in (("V_f", proj.forward_kernel), ("V_b", proj.backward_kernel), ("c", proj.bias)):
                names.append(("projection", k))
                variables.append(var)
        variables += list(extra_variables)
        dtype = bi.compute_dtype  # float32, or float64 under a float64 policy
        import tensorflow as tf  # here: the cases serve the tests of every backend (tests/backend_harness.py)

        d_output = keras.tree.map_structure(lambda v: tf.constant(v, dtype), d_output)

        def compute(x, mask, initial_state):
            with tf.GradientTape() as tape:
                tape.watch(x)
                if initial_state is not None:
                    tape.watch(initial_state)
                y = bi(x, mask=mask, initial_state=initial_state, training=training)
                if self.return_state:
                    y = y[:2] if self.merge_mode is None else y[0]
                total = tf.add_n(
                    [tf.reduce_sum(a * b) for a, b in zip(keras.tree.flatten(y), keras.tree.flatten(d_output))]
                )
            sources = [variables, x] + ([initial_state] if initial_state is not None else [])
            return tape.gradient(total, sources)

        x = tf.constant(self.x, dtype)
        mask_t = None if mask is None else tf.constant(np.asarray(mask, bool))
        init = None if initial_state is None else [tf.constant(s, dtype) for s in initial_state]
        args = [x] + ([mask_t] if mask_t is not None else []) + ([init] if init is not None else [])

        def call(*args):
            rest = list(args[1:])
            m = rest.pop(0) if mask_t is not None else None
            i = rest.pop(0) if init is not None else None
            return compute(args[0], m, i)

        if graph:
            spec = [tf.TensorSpec([None, None, F], dtype)]
            if mask_t is not None:
                spec.append(tf.TensorSpec([None, None], tf.bool))
            if init is not None:
                spec.append([tf.TensorSpec([None, s.shape[-1]], dtype) for s in init])
            call = tf.function(call, input_signature=spec)
        grads = call(*args)
        out = {"fw": {}, "bw": {}, "projection": {}}
        var_grads = [np.asarray(g) for g in grads[0]]
        for (group, key), g in zip(names, var_grads):
            out[group][key] = g
        out["extra"] = var_grads[len(names):]
        out["x"] = np.asarray(grads[1])
        if init is not None:
            out["initial_state"] = [np.asarray(g) for g in grads[2]]
        return out

    def assert_grads_match(self, actual, expected, atol=1e-4, rtol=1e-4):
        """Weights of both directions, projection and inputs against the oracle."""
        for side in ("fw", "bw"):
            for k in ("kernel", "recurrent_kernel", "bias"):
                np.testing.assert_allclose(
                    actual[side][k], expected[side][k], atol=atol, rtol=rtol, err_msg=f"{side}.{k}"
                )
        if self.projection is not None:
            for k in ("V_f", "V_b", "c"):
                np.testing.assert_allclose(
                    actual["projection"][k], expected["projection"][k], atol=atol, rtol=rtol,
                    err_msg=f"projection.{k}",
                )
        np.testing.assert_allclose(actual["x"], expected["x"], atol=atol, rtol=rtol, err_msg="x")


# Gradients are taken in both call modes: training=True (what model.fit does:
# the loop keeps what the BPTT needs) and an inference call (training=None).
TRAINING_MODES = (True, None)


def make_case(
    cell_name: str,
    merge_name: str = "concat",
    seed: int = 0,
    return_sequences: bool = True,
    return_state: bool = False,
    initial_state="zeros",
    units: int = U,
    set_weights: bool = True,
    cell_spec: Optional[tuple] = None,
) -> Case:
    """Builds a `kb.Bidirectional` with random weights and its oracle twin;
    `cell_spec` is a `CELLS`-style entry for a cell not in `CELLS`."""
    cell, cell_kwargs, factory = cell_spec or CELLS[cell_name]
    merge_mode, projection_activation = MERGES[merge_name]
    rng = np.random.default_rng(seed)
    reset_after = cell_kwargs.get("reset_after", True)
    fw = f32(ref.random_params(cell, F, units, rng, reset_after=reset_after))
    bw = f32(ref.random_params(cell, F, units, rng, reset_after=reset_after))
    projection = None
    if merge_mode == "projection":
        projection = f32(ref.random_projection(units, P, rng))
    x = rng.normal(size=(B, T, F)).astype(np.float32)
    layer = kb.Bidirectional(
        factory(units),
        merge_mode=merge_mode,
        projection_units=P if merge_mode == "projection" else None,
        projection_activation=projection_activation,
        return_sequences=return_sequences,
        return_state=return_state,
        initial_state=initial_state,
    )
    layer.build((None, None, F))
    if set_weights:
        if initial_state == "learned":
            for rec, params in ((layer.forward_layer, fw), (layer.backward_layer, bw)):
                for k in ("kernel", "recurrent_kernel", "bias"):
                    getattr(rec.cell, k).assign(params[k])
            if projection is not None:
                layer.projection.set_weights([projection["V_f"], projection["V_b"], projection["c"]])
        else:
            weights = ref.keras_bidirectional_weights(fw, bw)
            if projection is not None:
                weights += [projection["V_f"], projection["V_b"], projection["c"]]
            layer.set_weights(weights)
    return Case(
        cell_name, merge_name, cell, cell_kwargs, merge_mode, projection_activation, fw, bw,
        projection, x, layer, return_sequences, return_state, rng,
    )
