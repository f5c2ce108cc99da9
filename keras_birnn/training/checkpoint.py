"""A run's checkpoints: every variable and the loop's state, written atomically.

A checkpoint is two files in `RUN/checkpoint/`: `state-<n>.npz` (the
values of the model's variables, its dropout seeds included, and the
optimizer's, in their fixed order) and `state-<n>.json` (where the loop
stands: epoch, batch, best score, patience, history). `latest.json`
names the newest complete one. Each file is written under a temporary
name, flushed to disk and renamed over its target (`os.replace` is atomic
on POSIX and Windows), and `latest.json` is replaced last: a process
killed at any moment, in the middle of a write included, leaves the
previous checkpoint whole and named. Older checkpoints are deleted after
the new one is named.

Keras's `.keras` files keep weights and optimizer state but not the
dropout layers' seed state, which an exact resume needs: hence the
variables are saved here as they are.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from keras import ops

POINTER = "latest.json"


def atomic_write(path: str, data: bytes) -> None:
    """Writes `data` to `path` so that `path` is either the old file or the
    whole new one, whenever the process stops."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def atomic_json(path: str, value: Any) -> None:
    """`value` as JSON (sorted keys, indented), written atomically."""
    atomic_write(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def all_variables(model) -> List:
    """The model's variables (weights, seed states, metric totals) and its
    optimizer's, in an order fixed by the model's structure."""
    optimizer = getattr(model, "optimizer", None)
    return list(model.variables) + (list(optimizer.variables) if optimizer is not None else [])


def save(folder: str, model, state: Dict[str, Any], write: bool = True) -> str:
    """Writes checkpoint `state["number"]` of `model` into `folder` and names
    it the latest; deletes the older ones. Returns the `.npz` path. With
    `write=False` it reads the values and writes nothing: a worker of a
    TensorFlow job joins the reads of the worker that writes (the metrics'
    totals are summed over the workers when read)."""
    values = [ops.convert_to_numpy(v) for v in all_variables(model)]
    number = int(state["number"])
    if not write:
        return ""
    os.makedirs(folder, exist_ok=True)
    arrays = os.path.join(folder, f"state-{number}.npz")
    buffer = io.BytesIO()
    np.savez(buffer, *values)
    atomic_write(arrays, buffer.getvalue())
    atomic_json(os.path.join(folder, f"state-{number}.json"), dict(state, variables=len(values)))
    atomic_json(os.path.join(folder, POINTER), {"number": number})
    remove_older(folder, number)
    return arrays


def remove_older(folder: str, number: int) -> None:
    """Deletes checkpoints before `number` and stray temporary files."""
    for name in os.listdir(folder):
        stem = name.split(".")[0]
        if ".tmp-" in name or (stem.startswith("state-") and stem[6:].isdigit() and int(stem[6:]) < number):
            try:
                os.remove(os.path.join(folder, name))
            except FileNotFoundError:
                pass


def latest(folder: str) -> Optional[Tuple[Dict[str, Any], str]]:
    """`(state, npz path)` of the newest complete checkpoint, or None."""
    pointer = os.path.join(folder, POINTER)
    if not os.path.isfile(pointer):
        return None
    with open(pointer, encoding="utf-8") as handle:
        number = json.load(handle)["number"]
    with open(os.path.join(folder, f"state-{number}.json"), encoding="utf-8") as handle:
        state = json.load(handle)
    return state, os.path.join(folder, f"state-{number}.npz")


def restore(model, arrays: str, expected: int) -> None:
    """Assigns a checkpoint's values to `model`'s (built) variables and its
    optimizer's; a ValueError when the counts or shapes differ (another model)."""
    variables = all_variables(model)
    with np.load(arrays) as stored:
        values = [stored[f"arr_{i}"] for i in range(len(stored.files))]
    if len(values) != len(variables) or len(values) != expected:
        raise ValueError(f"{arrays} holds {len(values)} values for a model of {len(variables)} variables: "
                         "the run's settings or data changed.")
    for variable, value in zip(variables, values):
        if tuple(variable.shape) != value.shape:
            raise ValueError(f"{arrays}: variable {variable.path} has shape {tuple(variable.shape)}, "
                             f"the checkpoint {value.shape}: the run's settings or data changed.")
        variable.assign(value)
