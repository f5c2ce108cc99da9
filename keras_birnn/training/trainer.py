"""`train`: a config and a run folder to a model selected on dev, resumable.

    RUN/config.toml        the resolved settings (a resumed run must match)
    RUN/checkpoint/        the latest checkpoint (`keras_birnn.training.checkpoint`)
    RUN/best.keras         the model with the best dev score so far (one file)
    RUN/history.csv        one row per epoch: loss, dev scores, learning rate, seconds
    RUN/metrics.json       the best model's dev scores, its epoch, the run's length
    RUN/report.txt         the best model's dev scores per tag, span type or label
    RUN/export/<version>/  the best model for TF Serving (TensorFlow backend)

Each epoch trains on length-bucketed batches drawn from `(seed, epoch)`
alone (`keras_birnn.tagging.batching.epoch_batches`), scores dev (span F1
for a span scheme, else accuracy) and keeps the best model; training stops
after `train.epochs`, or after `train.patience` epochs without a better
dev score. Checkpoints are written at each epoch end and every
`train.checkpoint_minutes` (or `train.checkpoint_steps` batches) within
one; `train(..., resume=True)` continues from the latest and, with the
same settings, ends with the weights and dev score of a run that never
stopped: the batches, word dropout and dropout masks that follow a
checkpoint do not depend on when the process started.

Run on several processes (`keras_birnn.training.distributed`), every
process trains on its rows of the same global batches and scores dev;
process 0 alone writes the run folder and prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Tuple

import keras
from keras import ops

from keras_birnn import backend
from keras_birnn.tagging.batching import batch_rng, batches_dataset, epoch_batches
from keras_birnn.tagging.classifier import SentenceClassifier
from keras_birnn.tagging.encoder import TokenEncoder
from keras_birnn.tagging.tagger import Tagger
from keras_birnn.training import checkpoint, distributed
from keras_birnn.training.config import differences, dump, resolve
from keras_birnn.training.corpus import Examples, read_splits
from keras_birnn.training.report import format_epoch, per_type_report, write_history

OPTIMIZERS = {"nadam": keras.optimizers.Nadam, "adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
              "rmsprop": keras.optimizers.RMSprop}


class RunError(ValueError):
    """A run folder that cannot be used as asked (exists, or its settings differ)."""


def build_model(settings: Dict[str, Any], train: Examples, dev: Examples):
    """A new `Tagger` or `SentenceClassifier` for the settings: its
    vocabularies from `train`, its tags (labels) those of train and dev (a
    dev tag that training never shows is scored as missed, not refused)."""
    m = settings["model"]
    names = sorted({t for tags in train.y + dev.y for t in tags} if settings["task"] == "tagger"
                   else set(train.y) | set(dev.y))
    encoder = TokenEncoder(max_chars=m["max_chars"] if settings["task"] == "tagger" else 1,
                           lowercase=m["lowercase"], fold_digits=m["fold_digits"],
                           min_word_count=m["min_word_count"])
    if settings["task"] == "classifier":
        return SentenceClassifier.from_texts(train.x, train.y, label_names=names, encoder=encoder,
                                             embedding_dim=m["word_dim"],
                                             hidden=m["hidden"], cell=m["cell"], pooling=m["pooling"],
                                             dropout=m["dropout"])
    chars = None if m["char_encoder"] == "none" else m["char_encoder"]
    extra = {"feature_dim": m["feature_dim"]} if isinstance(train.x, dict) else {}
    scheme = None if settings["data"]["scheme"] == "none" else "auto"  # "none": token accuracy, no spans
    return Tagger.from_sentences(train.x, train.y, tags=names, scheme=scheme, encoder=encoder, head=m["head"],
                                 cell=m["cell"],
                                 hidden=m["hidden"], depth=m["depth"], embedding_dim=m["word_dim"],
                                 char_encoder=chars, char_dim=m["char_dim"], char_units=m["char_units"],
                                 dropout=m["dropout"], **extra)


def compile_model(model, settings: Dict[str, Any], steps_per_epoch: int, clip: bool = True) -> None:
    """The configured optimizer, learning-rate schedule and clipping (none
    with `clip=False`: the caller clips)."""
    t = settings["train"]
    rate = t["learning_rate"]
    if t["schedule"] == "cosine":
        rate = keras.optimizers.schedules.CosineDecay(rate, decay_steps=max(t["epochs"] * steps_per_epoch, 1),
                                                      alpha=t["min_learning_rate"])
    optimizer = OPTIMIZERS[t["optimizer"]](learning_rate=rate, clipnorm=(t["clipnorm"] or None) if clip else None)
    model.compile(optimizer=optimizer, metrics=None)
    optimizer.build(model.trainable_variables)  # its variables exist before a checkpoint restores them


def dev_score(model, dev: Examples) -> Dict[str, Any]:
    """The model's dev scores; `score` is span F1 with a span scheme, else accuracy."""
    scores = model.evaluate(dev.x, dev.y)
    scores["score"] = scores["f1"] if "f1" in scores else scores["accuracy"]
    return scores


class Loop(keras.callbacks.Callback):
    """Counts the epoch's batches and writes mid-epoch checkpoints."""

    def __init__(self, run: "Run"):
        super().__init__()
        self.run = run

    def on_train_batch_end(self, batch, logs=None):
        # JAX's fit holds the variables' values until told to sync them.
        self.run.after_batch(getattr(self.model, "jax_state_sync", None))


class Run:
    """One training run in a folder: its settings, data, model and state."""

    def __init__(self, settings: Dict[str, Any], folder: str, log: Callable[[str], None],
                 processes: distributed.Processes = distributed.Processes()):
        self.settings, self.folder, self.processes = settings, folder, processes
        self.log = log if processes.writes else (lambda line: None)
        self.seed = settings["seed"]
        self.t = settings["train"]
        self.state: Dict[str, Any] = {"number": 0, "epoch": 0, "batch": 0, "loss_total": 0.0, "loss_count": 0.0,
                                      "best_score": None, "best_epoch": None, "best_scores": None, "wait": 0,
                                      "history": [], "done": False, "seconds": 0.0}
        self.last_save = time.monotonic()
        self.step = None  # the traced step of a multi-worker run, and its epoch's loss sums
        self.live_loss = (0.0, 0.0)

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.folder, "checkpoint")

    def prepare(self) -> None:
        """Reads the data, builds and compiles the model, restores the latest checkpoint."""
        keras.utils.set_random_seed(self.seed)
        self.train, self.dev, what = read_splits(self.settings["task"], self.settings["data"])
        with self.processes.scope():
            self.model = build_model(self.settings, self.train, self.dev)
            self.encoded = self.model.encode(self.train.x, self.train.y)
            self.steps = len(epoch_batches(self.encoded.lengths, self.t["batch_size"], self.seed, 0))
            # A multi-worker step clips the all-reduced gradients itself.
            compile_model(self.model, self.settings, self.steps, clip=self.processes.strategy is None)
            found = checkpoint.latest(self.checkpoints)
            if found is not None:
                self.state, arrays = found
                checkpoint.restore(self.model, arrays, self.state.pop("variables"))
        self.log(f"train: {len(self.train)} examples, {self.steps} batches an epoch; dev: {len(self.dev)} "
                 f"({what}); {self.model.count_params():,} parameters; backend {keras.backend.backend()}")

    def checkpoint_due(self) -> bool:
        every = self.t["checkpoint_steps"]
        if every:
            return self.state["batch"] % every == 0
        # By the clock: every process must agree, as TensorFlow's workers
        # all read the values a checkpoint holds (a collective).
        return self.processes.agree(time.monotonic() - self.last_save >= 60.0 * self.t["checkpoint_minutes"] > 0)

    def after_batch(self, sync: Optional[Callable[[], None]] = None) -> None:
        """Counts a batch; writes a mid-epoch checkpoint when one is due
        (`sync` first brings the training state into the variables)."""
        self.state["batch"] += 1
        if self.checkpoint_due():
            if sync is not None:
                sync()
            self.save_checkpoint()

    def loss_sums(self) -> tuple:
        """The epoch's loss total and count: those carried over a resume plus
        fit's tracker (or the multi-worker steps' own sums)."""
        if self.processes.strategy is not None:
            total, count = self.live_loss
        else:
            tracker = next(m for m in self.model.metrics if m.name == "loss")
            total, count = (float(ops.convert_to_numpy(v)) for v in tracker.variables)
        return self.state["loss_total"] + total, self.state["loss_count"] + count

    def save_checkpoint(self, at_epoch_end: bool = False) -> None:
        state = dict(self.state, number=self.state["number"] + 1)
        if not at_epoch_end:
            state["loss_total"], state["loss_count"] = self.loss_sums()
        checkpoint.save(self.checkpoints, self.model, state, write=self.processes.writes)
        self.state["number"] = state["number"]
        self.last_save = time.monotonic()

    def epoch_data(self, epoch: int):
        """The epoch's batches from the one the state stands at."""
        groups = epoch_batches(self.encoded.lengths, self.t["batch_size"], self.seed, epoch)
        start, rate = self.state["batch"], self.t["word_dropout"]

        def make(encoded, indices, rng):  # the global batch, then this process's rows of it
            return distributed.local_rows(self.model.training_batch(encoded, indices, rng, rate), self.processes)

        def draw():
            for index in range(start, len(groups)):
                yield make(self.encoded, groups[index], batch_rng(self.seed, epoch, index))

        return batches_dataset(self.encoded, make, draw, len(groups) - start)

    def run_epoch(self, epoch: int) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Trains the rest of one epoch and scores dev; returns the history row."""
        began = time.monotonic()
        if self.state["batch"] < self.steps and self.processes.strategy is not None:
            self.fit_steps(epoch)
        elif self.state["batch"] < self.steps:
            self.model.fit(self.epoch_data(epoch), epochs=1, verbose=0, shuffle=False, callbacks=[Loop(self)])
        trained = time.monotonic() - began
        total, count = self.loss_sums()
        scores = dev_score(self.model, self.dev)
        rate = self.model.optimizer.learning_rate
        row = {"epoch": epoch + 1, "loss": total / max(count, 1e-12), "dev_score": scores["score"],
               "dev_accuracy": scores["accuracy"], "learning_rate": float(ops.convert_to_numpy(rate)),
               "train_seconds": trained, "seconds": time.monotonic() - began}
        return row, scores

    def fit_steps(self, epoch: int) -> None:
        """The epoch under TensorFlow's multi-worker strategy, where Keras's
        `fit` cannot run: `distributed.step_function` on each worker's rows
        (the model's compiled loss, clipping of the all-reduced gradients,
        the optimizer)."""
        strategy = self.processes.strategy
        data = strategy.distribute_datasets_from_function(lambda context: self.epoch_data(epoch))
        if self.step is None:  # traced once: every epoch's batches have the same spec
            self.step = distributed.step_function(strategy, self.model, data.element_spec, self.t["clipnorm"])
        for batch in data:
            loss = float(self.step(batch))
            # Weighed by the batch's rows, as fit's loss tracker weighs it.
            rows = len(keras.tree.flatten(strategy.experimental_local_results(batch)[0])[0]) * self.processes.count
            self.live_loss = (self.live_loss[0] + loss * rows, self.live_loss[1] + rows)
            self.after_batch()

    def end_epoch(self, epoch: int, row: Dict[str, Any], scores: Dict[str, Any]) -> None:
        """Keeps the best model, advances the state, checkpoints, writes the history."""
        s = self.state
        if s["best_score"] is None or row["dev_score"] > s["best_score"]:
            s["best_score"], s["best_epoch"], s["best_scores"], s["wait"] = row["dev_score"], epoch + 1, scores, 0
            save_model(self.model, os.path.join(self.folder, "best.keras"), self.processes.writes)
        else:
            s["wait"] += 1
        s["history"].append(row)
        s["seconds"] += row["seconds"]
        s.update(epoch=epoch + 1, batch=0, loss_total=0.0, loss_count=0.0)
        self.live_loss = (0.0, 0.0)
        s["done"] = bool(s["epoch"] >= self.t["epochs"] or (self.t["patience"] and s["wait"] >= self.t["patience"]))
        self.save_checkpoint(at_epoch_end=True)
        if self.processes.writes:
            write_history(os.path.join(self.folder, "history.csv"), s["history"])
        mean = s["seconds"] / len(s["history"])
        left = 0 if s["done"] else self.t["epochs"] - s["epoch"]
        self.log(format_epoch(row, self.t["epochs"], s["best_score"], s["best_epoch"], mean * left))

    def fit(self) -> None:
        while not self.state["done"]:
            epoch = self.state["epoch"]
            row, scores = self.run_epoch(epoch)
            self.end_epoch(epoch, row, scores)

    def finish(self) -> Dict[str, Any]:
        """Writes metrics.json and report.txt of the best model; exports it."""
        s = self.state
        best = os.path.join(self.folder, "best.keras")
        metrics = {"dev": s["best_scores"], "best_epoch": s["best_epoch"], "epochs": s["epoch"],
                   "stopped_early": s["epoch"] < self.t["epochs"], "seconds": s["seconds"],
                   "backend": keras.backend.backend(), "processes": self.processes.count}
        if not self.processes.writes:
            return metrics
        distributed.alone()  # the best model is scored and exported by this process alone
        model = keras.saving.load_model(best, safe_mode=True)
        report = per_type_report(s["best_scores"], self.dev, model)
        checkpoint.atomic_write(os.path.join(self.folder, "report.txt"), report.encode("utf-8"))
        if self.settings["export"]["enabled"]:
            export = os.path.join(self.folder, "export")
            metrics["export"] = (model.export(export) if backend.IS_TENSORFLOW
                                 else export_with_tensorflow(self.folder, export, self.log))
            if metrics["export"] is not None:
                self.log(f"exported {metrics['export']}")
        checkpoint.atomic_json(os.path.join(self.folder, "metrics.json"), metrics)
        self.log(f"best dev score {100 * s['best_score']:.2f} at epoch {s['best_epoch']}: {best}")
        return metrics


def export_with_tensorflow(folder: str, out: str, log: Callable[[str], None]) -> Optional[str]:
    """Exports a run's best model from a child process on the TensorFlow
    backend (`keras-birnn export`), so that a run on JAX or PyTorch ends
    with the export a TensorFlow run writes. Returns the version folder, or
    None after one line saying why (TensorFlow missing, the export failed)."""
    env = dict(distributed.single_process_environment(os.environ), KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, "-m", "keras_birnn.cli", "export", folder, out], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no message"])[-1]
        log(f"no export ({why}); export the run with `keras-birnn export {folder} OUT` on TensorFlow")
        return None
    return done.stdout.strip().splitlines()[-1]


def save_model(model, path: str, writes: bool = True) -> None:
    """`model.save(path)` through a temporary file renamed over `path`
    (atomic). A process that does not write (`writes=False`) saves to a
    file it deletes: saving a model distributed over processes places
    arrays on every process's devices, which each process must join."""
    if not writes:
        with tempfile.TemporaryDirectory() as folder:
            model.save(os.path.join(folder, "model.keras"))
        return
    temporary = f"{path[:-len('.keras')]}.tmp-{os.getpid()}.keras"
    model.save(temporary)
    os.replace(temporary, path)


def prepare_folder(settings: Dict[str, Any], folder: str, resume: bool) -> None:
    """Creates the run folder with its config.toml, or checks a resumed one's."""
    saved = os.path.join(folder, "config.toml")
    if resume:
        if not os.path.isfile(saved):
            raise RunError(f"{folder}: no run to resume (no config.toml); start it without --resume")
        changed = differences(resolve(saved), settings)
        if changed:
            raise RunError(f"{saved}: the run was started with other settings ({', '.join(changed)}); "
                           "resume with the same config and --set items, or start another --run")
        return
    if os.path.isdir(folder) and os.listdir(folder):
        raise RunError(f"{folder}: the folder holds files; pass --resume to continue its run, or another --run")
    os.makedirs(folder, exist_ok=True)
    checkpoint.atomic_write(saved, dump(settings).encode("utf-8"))


def train(settings: Dict[str, Any], folder: str, resume: bool = False,
          log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Trains the model of `settings` in the run folder `folder`.

    Args:
        settings: Resolved settings (`keras_birnn.training.config.resolve`).
        folder: The run folder (module docstring); new unless `resume`.
        resume: Continue the run in `folder` from its latest checkpoint
            (its config.toml must equal `settings`).
        log: Where the progress lines go.

    Returns:
        The metrics written to `folder/metrics.json`.
    """
    processes = distributed.join()
    if processes.writes:
        prepare_folder(settings, folder, resume)
    run = Run(settings, folder, log, processes)
    run.prepare()
    finished = os.path.join(folder, "metrics.json")
    if run.state["done"] and os.path.isfile(finished):  # resumed after the end: nothing to do
        run.log(f"{folder}: the run is complete (metrics.json)")
        with open(finished, encoding="utf-8") as handle:
            return json.load(handle)
    try:
        run.fit()
    except Exception as error:
        if processes.count > 1:  # a lost process fails the others' next collective
            distributed.stop_job(processes, error)
        raise
    return run.finish()
