"""Data parallelism on paper: gradient bytes all-reduced per step against compute per step.

For each shipped config (examples/configs/*.toml) it builds the model the
way `keras-birnn train` does (`keras_birnn.training.trainer.build_model`
on `read_splits`' data), counts its trainable parameters and the batches
of an epoch (`epoch_batches`, seed 0, epoch 0), and prints:

- the bytes a ring all-reduce of float32 gradients sends per process and
  step, 2 (P - 1) / P x 4 bytes x parameters, for P = 2 and P = 8 (Keras's
  JAX `DataParallel` all-reduces dense gradients, the embeddings' too): one
  all-reduce after the loops, as TensorFlow's workers make; JAX's SPMD
  partitioner also all-reduces the recurrent weights' gradients at every
  time step inside the loops, not counted here (docs/scaling.md, "The
  trainer on several processes");
- that transfer's time at 10 and 100 Gb/s (bandwidth only, no latency);
- the measured seconds per step on 2 CPU cores, 1 process: minutes /
  epochs / batches an epoch, from benchmarks/README.md, "The train
  command" (`MEASURED` below; the minutes include the dev passes).

With `--rows CONFIG` it also times one process's training step on the
rows a process of P = 1, 2, 4, 8 holds (32, 16, 8, 4 of one batch of 32
sentences of that config, the batch repeated: medians of `REPEATS` steps
after a compiling one), on the backend Keras runs.

    KERAS_BIRNN_DATA=../shared/data python benchmarks/allreduce_model.py
    KERAS_BACKEND=jax KERAS_BIRNN_DATA=../shared/data python benchmarks/allreduce_model.py --rows ewt_upos
"""

import argparse
import glob
import os
import statistics
import sys
import time
from typing import Dict, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from keras_birnn.tagging.batching import batch_rng, epoch_batches  # noqa: E402
from keras_birnn.training.config import resolve  # noqa: E402
from keras_birnn.training.corpus import read_splits  # noqa: E402
from keras_birnn.training.trainer import build_model, compile_model  # noqa: E402

REPEATS = 10

# (minutes, epochs run) of each shipped config: benchmarks/README.md, "The train command".
MEASURED: Dict[str, Tuple[float, int]] = {
    "ewt_upos": (11.5, 30),
    "conll2002_ner": (4.7, 12),
    "conll2000_chunking": (7.9, 25),
}


def ring_bytes(parameters: int, processes: int) -> float:
    """Bytes one process sends in a ring all-reduce of float32 gradients.

    Args:
        parameters: The number of gradient values.
        processes: The processes in the ring.

    Returns:
        2 (P - 1) / P x 4 x parameters.
    """
    return 2.0 * (processes - 1) / processes * 4.0 * parameters


def describe(path: str) -> Dict[str, int]:
    """The model of one config: trainable parameters, the largest variable's, batches an epoch.

    Args:
        path: A config file.

    Returns:
        `parameters`, `largest` (its largest variable's size: the word
        embedding's), `steps`, `sentences`.
    """
    settings = resolve(path)
    train, dev, _ = read_splits(settings["task"], settings["data"])
    model = build_model(settings, train, dev)
    sizes = {v.path: int(v.numpy().size) for v in model.trainable_variables}
    largest = max(sizes, key=sizes.get)
    lengths = model.encode(train.x, train.y).lengths
    steps = len(epoch_batches(lengths, settings["train"]["batch_size"], settings["seed"], 0))
    return {"parameters": sum(sizes.values()), "largest": sizes[largest], "steps": steps,
            "sentences": len(train)}


def row(name: str, found: Dict[str, int]) -> str:
    """One markdown table row for a config (`found`: `describe`'s answer)."""
    minutes, epochs = MEASURED[name]
    step = 60.0 * minutes / epochs / found["steps"]
    sent = {p: ring_bytes(found["parameters"], p) for p in (2, 8)}
    ms = {(p, g): 1e3 * 8 * sent[p] / (g * 1e9) for p in (2, 8) for g in (10, 100)}
    return (f"| `{name}` | {found['parameters']:,} ({found['largest'] / found['parameters']:.0%}) "
            f"| {sent[2] / 1e6:.1f} / {sent[8] / 1e6:.1f} | {ms[2, 10]:.1f} / {ms[8, 10]:.1f} "
            f"| {ms[2, 100]:.2f} / {ms[8, 100]:.2f} | {found['sentences']} / {found['steps']} | {1e3 * step:.0f} |")


def time_rows(path: str) -> Dict[int, float]:
    """Milliseconds of one training step on the first 32, 16, 8 and 4 rows of a batch.

    Args:
        path: A config file.

    Returns:
        Rows to the median milliseconds of `REPEATS` steps.
    """
    settings = resolve(path)
    train, dev, _ = read_splits(settings["task"], settings["data"])
    model = build_model(settings, train, dev)
    encoded = model.encode(train.x, train.y)
    groups = epoch_batches(encoded.lengths, settings["train"]["batch_size"], settings["seed"], 0)
    compile_model(model, settings, len(groups))
    group = next(g for g in groups if len(g) == 32)
    times = {}
    for rows in (32, 16, 8, 4):
        batch = model.training_batch(encoded, group[:rows], batch_rng(0, 0, 0), settings["train"]["word_dropout"])
        model.train_on_batch(*batch)  # traces and compiles this shape
        steps = []
        for _ in range(REPEATS):
            began = time.perf_counter()
            model.train_on_batch(*batch)
            steps.append(time.perf_counter() - began)
        times[rows] = 1e3 * statistics.median(steps)
    return times


def table() -> None:
    """Prints the bandwidth model's table, one row per shipped config."""
    print("| config | trainable parameters (word embedding's share) | MB sent per step, P = 2 / 8 "
          "| ms at 10 Gb/s, P = 2 / 8 | ms at 100 Gb/s, P = 2 / 8 | train sentences / batches an epoch "
          "| ms per step, 1 process |")
    print("|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(REPO, "examples", "configs", "*.toml"))):
        name = os.path.splitext(os.path.basename(path))[0]
        print(row(name, describe(path)))


def main() -> None:
    """The table, or with `--rows CONFIG` the step times on fewer rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", metavar="CONFIG", help="time a step on 32/16/8/4 rows of this shipped config")
    args = parser.parse_args()
    if not args.rows:
        table()
        return
    import keras

    path = os.path.join(REPO, "examples", "configs", f"{args.rows}.toml")
    times = time_rows(path)
    print(f"{args.rows}, {keras.backend.backend()}: ms per step on 32/16/8/4 rows:",
          " / ".join(f"{times[r]:.1f}" for r in (32, 16, 8, 4)))


if __name__ == "__main__":
    main()
