"""The trainer on several processes: which process this is, and its shard.

`keras-birnn train` runs data-parallel when the environment says so:
- JAX: Keras's variables `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the
  coordinator's `host:port`, or every process's, comma-separated),
  `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`.
  `join` starts JAX's distributed runtime from them (as
  `keras.distribution.initialize()` does, with a shorter heartbeat) and
  sets `keras.distribution.DataParallel` over every process's devices; on
  CPUs the collectives are gloo's.
- TensorFlow: `TF_CONFIG` naming several workers (one replica each):
  `join` creates a `tf.distribute.MultiWorkerMirroredStrategy`, the model
  is built in its scope, and the trainer runs `step_function` per batch
  (Keras's `fit` cannot run under this strategy).

Every process draws the same global batches as a 1-process run (they
depend on the seed and the epoch alone), pads a batch whose rows do not
split evenly with empty rows (no valid position: the losses skip them),
and feeds its own slice of rows (`local_rows`); JAX runs one program over
the global batch, and TensorFlow's losses divide by counts summed over
the workers (`keras_birnn.losses`), so the step is the 1-process step.
Process 0 writes the run folder; the others write nothing.

A process that dies fails the others' next collective step; each of them
says in one line which processes were lost (JAX's coordinator answers
within a heartbeat, `HEARTBEAT_SECONDS`; TensorFlow's error names them)
and exits with status 1 (`stop_job`). `--resume` on every process
continues the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import Any, Callable, ContextManager, Dict, List, NamedTuple, NoReturn

import keras
import numpy as np

from keras_birnn import tf_internal

JAX_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID")


HEARTBEAT_SECONDS = 20  # a process unheard of this long is lost


AGREEMENTS: Dict[Any, Callable] = {}  # a strategy's traced "any process" reduction


class ClusterError(ValueError):
    """The environment describes a job this backend cannot join."""


class Processes(NamedTuple):
    """This process's place in the job: `index` of `count` (0 of 1 alone);
    on TensorFlow, the `MultiWorkerMirroredStrategy` that runs the steps."""

    index: int = 0
    count: int = 1
    strategy: Any = None

    @property
    def writes(self) -> bool:
        """Whether this process writes the run folder (process 0 does)."""
        return self.index == 0

    def agree(self, flag: bool) -> bool:
        """`flag` if any process's is true: one decision for every worker of
        a TensorFlow job (a collective); JAX's processes need none."""
        if self.strategy is None:
            return flag
        import tensorflow as tf

        if self.strategy not in AGREEMENTS:  # traced once (run eagerly, the strategy is slow)
            strategy = self.strategy
            AGREEMENTS[strategy] = tf.function(
                lambda value: strategy.reduce("SUM", strategy.run(tf.identity, args=(value,)), axis=None))
        return bool(AGREEMENTS[self.strategy](tf.constant(float(flag))) > 0)

    def scope(self) -> ContextManager:
        """Where the model and its optimizer are built: the strategy's scope."""
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()


def _integer(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ClusterError(f"{name} must be an integer, received {value!r}") from None


def join() -> Processes:
    """Joins the job the environment describes, or stands alone."""
    given = [name for name in JAX_VARIABLES if os.environ.get(name)]
    if given:
        return join_jax(given)
    workers = tf_config_workers()
    if workers > 1:
        return join_tensorflow(workers)
    return Processes()


def join_jax(given: List[str]) -> Processes:
    """A process of a JAX job (Keras's variables)."""
    if keras.backend.backend() != "jax":
        raise ClusterError(f"{', '.join(given)} set: Keras's multi-process distribution needs "
                           f"KERAS_BACKEND=jax (the backend is {keras.backend.backend()}); "
                           "TensorFlow's workers read TF_CONFIG")
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


def join_tensorflow(workers: int) -> Processes:
    """A worker of a TensorFlow job (TF_CONFIG): `MultiWorkerMirroredStrategy`,
    created before TensorFlow runs an op, as it must be."""
    if keras.backend.backend() != "tensorflow":
        raise ClusterError(f"TF_CONFIG names {workers} workers: TensorFlow's multi-worker strategy needs "
                           f"KERAS_BACKEND=tensorflow (the backend is {keras.backend.backend()}); JAX's "
                           f"processes read {', '.join(JAX_VARIABLES)}")
    import tensorflow as tf

    config = json.loads(os.environ["TF_CONFIG"])
    task = config.get("task", {})
    # A chief, when the cluster names one, is process 0 and the workers follow.
    after_chief = bool(config.get("cluster", {}).get("chief")) and task.get("type") == "worker"
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if strategy.num_replicas_in_sync != workers:
        raise ClusterError(f"TF_CONFIG names {workers} workers and the strategy has "
                           f"{strategy.num_replicas_in_sync} replicas: the trainer runs one device a worker "
                           "(CUDA_VISIBLE_DEVICES may pick it)")
    return Processes(int(task.get("index", 0)) + after_chief, workers, strategy)


def tf_config_workers() -> int:
    """How many workers (chief included) TF_CONFIG's cluster names; 0 without one."""
    text = os.environ.get("TF_CONFIG", "")
    if not text.strip():
        return 0
    try:
        cluster = json.loads(text).get("cluster", {})
    except (ValueError, AttributeError):
        raise ClusterError(f"TF_CONFIG is not a JSON object: {text[:80]!r}") from None
    return sum(len(cluster.get(role, [])) for role in ("chief", "worker"))


def lost_processes(processes: Processes, error: BaseException) -> List[int]:
    """The processes a failed step lost. JAX: those its coordinator no
    longer hears from (it waits up to a heartbeat for each; all but this
    one if the coordinator is gone). TensorFlow: the tasks its error
    reports unhealthy (none when the error came before its heartbeat
    check)."""
    if processes.strategy is not None:
        return unhealthy_tasks(str(error))
    try:
        alive = tf_internal.live_jax_processes(processes.count)
    except Exception:  # the coordinator (process 0) is gone
        alive = [processes.index]
    return sorted(set(range(processes.count)) - set(alive))


def unhealthy_tasks(message: str) -> List[int]:
    """The process indices of the tasks a TensorFlow error reports
    unhealthy: "... unhealthy (stopped sending heartbeats): /job:worker/
    replica:0/task:1"; a cluster with a chief counts it as process 0."""
    if "unhealthy" not in message:
        return []
    after_chief = bool(json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("chief"))
    tasks = re.findall(r"/job:(chief|worker)/replica:\d+/task:(\d+)", message.split("unhealthy", 1)[1])
    return sorted({0 if role == "chief" else int(task) + after_chief for role, task in tasks})


def stop_job(processes: Processes, error: BaseException) -> NoReturn:
    """Ends this process after a failed step of a multi-process job: one
    line naming the lost processes, exit status 1. The exit skips JAX's
    shutdown, which would wait for the lost processes and abort."""
    lost = lost_processes(processes, error)
    cause = (str(error).strip().splitlines() or [""])[-1].split("Error dispatching computation: ")[-1][-300:]
    who = (f"process {', '.join(map(str, lost))} of {processes.count} was lost" if lost
           else "the step failed")
    sys.stderr.write(f"keras-birnn train: {who}; process {processes.index} stops ({type(error).__name__}: "
                     f"{cause}). Start every process again with --resume to continue from the last "
                     "checkpoint.\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def step_function(strategy, model, spec, clipnorm: float) -> Callable:
    """One training step of `model` on each replica's batch of `spec` under
    `strategy`, traced once; returns the batch's loss (summed shares).

    Keras's optimizer clips each replica's gradient before it sums them, so
    under a strategy `clipnorm` would clip the parts, not the whole. The
    step gives the optimizer no clipping and scales each replica's part by
    the factor one device's clipping applies to the sum (`clip_factors`);
    the optimizer then sums the parts as usual."""
    import tensorflow as tf

    def on_replica(data):
        x, y, weights = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=weights, training=True)
        variables = model.trainable_variables
        gradients = tape.gradient(loss, variables)
        if clipnorm:
            gradients = [scaled(g, f) for g, f in zip(gradients, clip_factors(gradients, clipnorm))]
        model.optimizer.apply(gradients, variables)
        return loss

    @tf.function(input_signature=[spec])
    def step(batch):
        return strategy.reduce("SUM", strategy.run(on_replica, args=(batch,)), axis=None)

    return step


def clip_factors(gradients: List[Any], clipnorm: float) -> List[Any]:
    """Per variable, `clipnorm / max(norm, clipnorm)` of the gradient summed
    over the replicas: `tf.clip_by_norm`'s factor on one device. An
    embedding's IndexedSlices are measured by their rows (as
    `tf.clip_by_norm` measures them): the squares summed over replicas."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    sparse = [isinstance(g, tf.IndexedSlices) for g in gradients]
    squares = context.all_reduce("sum", [tf.reduce_sum(tf.square(g.values)) for g, s in zip(gradients, sparse) if s])
    dense = context.all_reduce("sum", [g for g, s in zip(gradients, sparse) if not s])
    squares, dense = iter(squares), iter(dense)
    norms = [tf.sqrt(next(squares)) if s else tf.norm(next(dense)) for s in sparse]
    return [clipnorm / tf.maximum(n, clipnorm) for n in norms]


def scaled(gradient, factor):
    """`gradient * factor`, IndexedSlices kept sparse."""
    import tensorflow as tf

    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values * factor, gradient.indices, gradient.dense_shape)
    return gradient * factor


def alone() -> None:
    """Ends data parallelism in this process: what it builds or loads next
    (the best model, to score and export) lives on its own devices."""
    if keras.backend.backend() == "jax":
        keras.distribution.set_distribution(None)


def single_process_environment(environ: Dict[str, str]) -> Dict[str, str]:
    """`environ` without the variables that make a process join a job
    (`JAX_VARIABLES`, `TF_CONFIG`): for a child process that works alone."""
    return {k: v for k, v in environ.items() if k not in JAX_VARIABLES and k != "TF_CONFIG"}


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
