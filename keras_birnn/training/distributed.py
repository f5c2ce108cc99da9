"""The trainer on several processes: which process this is, and its shard.

`keras-birnn train` runs data-parallel when the environment says so:
- JAX: Keras's variables `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the
  coordinator's `host:port`, or every process's, comma-separated),
  `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`.
  `join` calls `keras.distribution.initialize()` (which reads them) and
  sets `keras.distribution.DataParallel` over every process's devices; on
  CPUs the collectives are gloo's.

Every process draws the same global batches as a 1-process run (they
depend on the seed and the epoch alone), pads a batch whose rows do not
split evenly with empty rows (no valid position: the losses skip them),
and feeds its own slice of rows (`local_rows`); JAX runs one program over
the global batch, so the step is the 1-process step. Process 0 writes
the run folder; the others write nothing.

A process that dies fails the others' next collective step; each of them
then asks the coordinator which processes it lost, says so in one line
and exits with status 1 (`stop_job`), within a heartbeat
(`HEARTBEAT_SECONDS`). `--resume` on every process continues the job.
"""

from __future__ import annotations

import os
import sys
from typing import Any, List, NamedTuple, NoReturn

import keras
import numpy as np

from keras_birnn import tf_internal

JAX_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID")


HEARTBEAT_SECONDS = 20  # a process unheard of this long is lost


class ClusterError(ValueError):
    """The environment describes a job this backend cannot join."""


class Processes(NamedTuple):
    """This process's place in the job: `index` of `count` (0 of 1 alone)."""

    index: int = 0
    count: int = 1

    @property
    def writes(self) -> bool:
        """Whether this process writes the run folder (process 0 does)."""
        return self.index == 0


def _integer(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ClusterError(f"{name} must be an integer, received {value!r}") from None


def join() -> Processes:
    """Joins the job the environment describes, or stands alone."""
    given = [name for name in JAX_VARIABLES if os.environ.get(name)]
    if not given:
        return Processes()
    if keras.backend.backend() != "jax":
        raise ClusterError(f"{', '.join(given)} set: Keras's multi-process distribution needs "
                           f"KERAS_BACKEND=jax (the backend is {keras.backend.backend()})")
    missing = [name for name in JAX_VARIABLES if name not in given]
    if missing:
        raise ClusterError(f"{', '.join(given)} set without {', '.join(missing)}: a process needs all three")
    count, index = _integer(JAX_VARIABLES[1]), _integer(JAX_VARIABLES[2])
    if count < 1 or not 0 <= index < count:
        raise ClusterError(f"{JAX_VARIABLES[2]}={index} is not a process of "
                           f"{JAX_VARIABLES[1]}={count}")
    if count == 1:
        return Processes()
    import jax

    # CPUs have no collectives of their own; gloo's run over TCP (set before
    # the backend starts; accelerators keep theirs).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Keras's `initialize` reads the same variables but keeps JAX's 100 s
    # heartbeat: a lost process is declared lost after HEARTBEAT_SECONDS.
    coordinator = os.environ[JAX_VARIABLES[0]].split(",")[0]
    jax.distributed.initialize(coordinator, count, index, heartbeat_timeout_seconds=HEARTBEAT_SECONDS)
    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    return Processes(jax.process_index(), jax.process_count())


def lost_processes(processes: Processes) -> List[int]:
    """The processes the job's coordinator no longer hears from (it waits
    up to a heartbeat for each); all but this one if it cannot be asked."""
    try:
        alive = tf_internal.live_jax_processes(processes.count)
    except Exception:  # the coordinator (process 0) is gone
        alive = [processes.index]
    return sorted(set(range(processes.count)) - set(alive))


def stop_job(processes: Processes, error: BaseException) -> NoReturn:
    """Ends this process after a failed step of a multi-process job: one
    line naming the lost processes, exit status 1. The exit skips JAX's
    shutdown, which would wait for the lost processes and abort."""
    lost = lost_processes(processes)
    cause = (str(error).strip().splitlines() or [""])[-1].split("Error dispatching computation: ")[-1][-300:]
    who = (f"process {', '.join(map(str, lost))} of {processes.count} was lost" if lost
           else "the step failed")
    sys.stderr.write(f"keras-birnn train: {who}; process {processes.index} stops ({type(error).__name__}: "
                     f"{cause}). Start every process again with --resume to continue from the last "
                     "checkpoint.\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def alone() -> None:
    """Ends data parallelism in this process: what it builds or loads next
    (the best model, to score and export) lives on its own devices."""
    if keras.backend.backend() == "jax":
        keras.distribution.set_distribution(None)


def local_rows(batch: Any, processes: Processes) -> Any:
    """This process's rows of a global batch (nested arrays, rows first):
    the batch padded with zero rows to a multiple of the process count,
    then the `index`-th of `count` equal slices. Zero rows are padding:
    word id 0, tag 0, weight 0."""
    if processes.count == 1:
        return batch
    rows = len(keras.tree.flatten(batch)[0])
    per = -(-rows // processes.count)
    start = processes.index * per

    def take(array):
        array = np.asarray(array)
        padded = np.zeros((per * processes.count,) + array.shape[1:], array.dtype)
        padded[:rows] = array
        return padded[start:start + per]

    return keras.tree.map_structure(take, batch)
