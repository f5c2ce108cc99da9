"""What a direction is, and how directions travel as flat tensor lists.

`tf.custom_gradient` and `tf.function` take and return flat lists of
tensors, so every loop function sees directions flattened: per direction,
its present differentiable fields (`_DIFFERENTIABLE` order), its initial
states, then its state mask if it has one. Outputs are flattened per
direction as the output sequence (when returned) then the final states, and
the forward loop's kept memory as what the step maths saved then the
incoming states. This module is the one home of those layouts; the loop
key (`LoopKey`) is what a compiled loop is specialised on.
"""

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from keras_birnn.cells.step_math import StepMath
from keras_birnn.recurrence.direction import Direction, DirectionResult  # noqa: F401  (the layouts' subject)

# The float types whose `Transpose` TensorFlow's CPU build hands to oneDNN,
# and how many of their elements fill one float64 (`swap_batch_and_time`).
_PER_FLOAT64 = {tf.float32: 2, tf.bfloat16: 4}


def swap_batch_and_time(x: tf.Tensor, bitcast: bool = True) -> tf.Tensor:
    """`[A, B, width]` -> `[B, A, width]`, as `tf.transpose(x, [1, 0, 2])`.

    With `bitcast` (wherever TensorFlow does not differentiate it: not in
    `loops.plain_loop`; a bitcast has no gradient), a float32 or bfloat16
    tensor whose width holds a whole number of float64s is moved as
    float64s. On CPU, TensorFlow rewrites every float32 and bfloat16
    `Transpose` to oneDNN's, which for the small tensors of a loop's call
    is slower than Eigen's (benchmarks/README.md, "The
    plain-loop floor"). oneDNN takes no float64, and TensorFlow logs
    nothing about it; it logs an error line for every integer type ("oneDNN
    supports DT_INT32 only on platforms with AVX-512"). Exact: the reshapes
    and bitcasts copy nothing and change no bit."""
    group, width = _PER_FLOAT64.get(x.dtype), x.shape[-1]
    if group is None or width is None or width % group or not bitcast:
        return tf.transpose(x, [1, 0, 2])
    grouped = tf.reshape(x, tf.concat([tf.shape(x)[:-1], [width // group, group]], 0))
    moved = tf.transpose(tf.bitcast(grouped, tf.float64), [1, 0, 2])
    swapped = tf.reshape(tf.bitcast(moved, x.dtype), tf.concat([tf.shape(moved)[:-1], [width]], 0))
    swapped.set_shape([x.shape[1], x.shape[0], width])
    return swapped


_DIFFERENTIABLE = ("inputs", "kernel", "input_bias", "recurrent_kernel", "recurrent_bias")

class DirectionSpec(NamedTuple):
    """One direction's part of a loop key: everything but tensor values and
    the batch and time sizes. The weights' shapes are part of it, so a
    function traced for several batch/time sizes relaxes only those."""

    math: StepMath
    reverse: bool
    n_states: int
    present: Tuple[bool, ...]  # per `_DIFFERENTIABLE` field, then the state mask
    shapes: Tuple[tuple, tuple]  # the kernel's, the recurrent kernel's
    dtype: str
    # The loop runs either order, told by a bool tensor after the
    # direction's other tensors in the flat list (`with_order`): the two
    # directions of a bidirectional layer then share one traced loop and
    # one XLA program per shape (`compiled._split_loops`).
    runtime_order: bool = False

    @property
    def has_state_mask(self) -> bool:
        return self.present[-1]

    @property
    def flat_size(self) -> int:
        """How many tensors `flatten` lays out for this direction (a
        run-time order, appended by `with_order` for one direction's
        loops, is not counted: only `runtime_orders` reads it)."""
        return sum(self.present) + self.n_states


class LoopKey(NamedTuple):
    """What a compiled loop is specialised on (hashable: loop caches key on it)."""

    specs: Tuple[DirectionSpec, ...]
    has_mask: bool
    return_sequences: bool
    keep: bool  # the forward loop keeps what BPTT needs (training)


def _direction_spec(d: Direction) -> DirectionSpec:
    present = tuple(getattr(d, name) is not None for name in _DIFFERENTIABLE + ("state_mask",))
    shapes = (tuple(d.kernel.shape.as_list()), tuple(d.recurrent_kernel.shape.as_list()))
    return DirectionSpec(d.math, d.reverse, len(d.initial_states), present, shapes, d.inputs.dtype.name)


def loop_key(directions: Sequence[Direction], *, has_mask: bool, return_sequences: bool, keep: bool) -> LoopKey:
    return LoopKey(tuple(_direction_spec(d) for d in directions), has_mask, return_sequences, keep)


def flatten(directions: Sequence[Direction]) -> list:
    flat = []
    for d in directions:
        flat.extend(getattr(d, name) for name in _DIFFERENTIABLE if getattr(d, name) is not None)
        flat.extend(d.initial_states)
        if d.state_mask is not None:
            flat.append(d.state_mask)
    return flat


def unflatten(flat: Sequence[tf.Tensor], specs: Sequence[DirectionSpec]) -> List[Direction]:
    rebuilt, pos = [], 0
    for spec in specs:
        fields = {}
        for name, there in zip(_DIFFERENTIABLE, spec.present):
            fields[name] = flat[pos] if there else None
            pos += int(there)
        states = list(flat[pos : pos + spec.n_states])
        pos += spec.n_states
        state_mask = None
        if spec.has_state_mask:
            state_mask, pos = flat[pos], pos + 1
        pos += int(spec.runtime_order)  # the order: `runtime_orders` reads it
        rebuilt.append(Direction(spec.math, initial_states=states, reverse=spec.reverse, state_mask=state_mask,
                                 **fields))
    return rebuilt


def runtime_orders(flat: Sequence[tf.Tensor], specs: Sequence[DirectionSpec]) -> List[Optional[tf.Tensor]]:
    """Per direction, the order a loop built for either order was told (a
    bool tensor, True: reverse; `with_order`), or None for a fixed order."""
    orders, pos = [], 0
    for spec in specs:
        pos += spec.flat_size
        orders.append(flat[pos] if spec.runtime_order else None)
        pos += int(spec.runtime_order)
    return orders


def in_runtime_order(spec: DirectionSpec) -> DirectionSpec:
    """`spec` for loops that take the direction's order as a tensor."""
    return spec._replace(reverse=False, runtime_order=True)


def with_order(flat_part: Sequence[tf.Tensor], spec: DirectionSpec) -> list:
    """One direction's flat part for the loops of `in_runtime_order(spec)`:
    its order appended as a bool tensor, made here, in the caller's graph,
    and read back by `unflatten`."""
    return list(flat_part) + [tf.constant(spec.reverse)]


def state_mask_positions(specs: Sequence[DirectionSpec]) -> set:
    """Where the state masks (constants to the gradient) sit in the flat list."""
    positions, end = set(), 0
    for spec in specs:
        end += spec.flat_size
        if spec.has_state_mask:  # a direction's state mask is its last tensor
            positions.add(end - 1)
    return positions


def _splitter(sizes: Sequence[int]) -> Callable[[Sequence[Any]], List[list]]:
    """A function cutting a flat list into consecutive pieces of `sizes`."""

    def split(flat):
        pieces, pos = [], 0
        for size in sizes:
            pieces.append(list(flat[pos : pos + size]))
            pos += size
        return pieces

    return split


def input_splitter(specs: Sequence[DirectionSpec]) -> Callable:
    """Cuts `flatten`'s list per direction."""
    return _splitter([spec.flat_size for spec in specs])


def memory_splitter(specs: Sequence[DirectionSpec]) -> Callable:
    """Cuts the flat kept memory per direction: what the step maths saved,
    then the incoming states."""
    return _splitter([1 + spec.n_states for spec in specs])


def output_splitter(specs: Sequence[DirectionSpec], return_sequences: bool) -> Callable:
    """Cuts `flatten_outputs`' list (or its gradients) per direction."""
    return _splitter([int(return_sequences) + spec.n_states for spec in specs])


def group_memory(directions: Sequence[Direction], memory: Sequence[tf.Tensor]) -> list:
    return _splitter([1 + len(d.initial_states) for d in directions])(memory)


def flatten_outputs(sequences, final_states, return_sequences: bool) -> list:
    flat_out = []
    for seq, states in zip(sequences, final_states):
        flat_out.extend(([seq] if return_sequences else []) + list(states))
    return flat_out


def unflatten_outputs(flat_out, directions: Sequence[Direction], return_sequences: bool) -> List[DirectionResult]:
    """Splits the flat outputs per direction and restores their static shapes
    (a compiled loop traced for several shapes only knows relaxed ones)."""
    results, pos = [], 0
    for d in directions:
        state_shape = d.initial_states[0].shape
        seq = None
        if return_sequences:
            seq, pos = flat_out[pos], pos + 1
            seq = with_static_shape(seq, d.inputs.shape[:2].concatenate(state_shape[-1:]))
        n = len(d.initial_states)
        states = [with_static_shape(s, i.shape) for s, i in zip(flat_out[pos : pos + n], d.initial_states)]
        results.append(DirectionResult(seq, states))
        pos += n
    return results


def split_output_grads(directions: Sequence[Direction], return_sequences: bool, d_flat_out) -> list:
    """The output gradients per direction, `(d_sequence or None, d_finals)`,
    a missing final state's gradient as zeros."""
    per_direction, pos = [], 0
    for d in directions:
        d_seq = None
        if return_sequences:
            d_seq, pos = d_flat_out[pos], pos + 1
        n = len(d.initial_states)
        d_final = [
            tf.zeros_like(s) if g is None else g for g, s in zip(d_flat_out[pos : pos + n], d.initial_states)
        ]
        pos += n
        per_direction.append((d_seq, d_final))
    return per_direction


def with_static_shape(tensor: tf.Tensor, shape) -> tf.Tensor:
    """`tensor` with what is statically known of its shape merged in (no op:
    `tf.ensure_shape` has no forward-mode derivative in graphs)."""
    if tf.is_symbolic_tensor(tensor):  # an eager tensor knows its whole shape
        tensor.set_shape(shape)
    return tensor
