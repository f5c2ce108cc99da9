"""The textbook's exercise: where is a run of 1s? A GRU against a BiGRU.

Each position of a random 0/1 sequence is labelled 1 when it lies inside a
run of 1s (two or more consecutive 1s), else 0. At the first 1 of a block of
1s the label depends on the *next* bit, which a left-to-right GRU has not
read yet; a BiGRU's backward direction has. The demo trains both with the
same hidden size, prints their accuracy overall and at run boundaries on a
held-out set, exports the BiGRU as a TF Serving SavedModel and serves one
prediction from it with plain TensorFlow.

    python -m keras_birnn.demo            # or: keras-birnn-demo
    python -m keras_birnn.demo --quiet --epochs 5 --out /tmp/models
    python -m keras_birnn.demo --layers keras    # the same models from keras.layers
"""

import argparse
import json
import os
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_birnn as kb  # noqa: E402
from keras_birnn.cli.arguments import LAYERS, EpochTimer, check_layers, finish_args  # noqa: E402

BOUNDARY_DEFINITION = (
    "boundary    = the first and the last 1 of every block of consecutive 1s (a lone 1 is\n"
    "              a block of one: its label is 0 only because no second 1 follows it),\n"
    "              plus the 0 just before and the 0 just after each block\n"
    "block start = the first 1 of every block: its label depends on the next bit, which a\n"
    "              left-to-right GRU has not read yet (best possible there: about 50%)"
)
TABLE_HEADER = ("model", "hidden", "params", "overall", "boundary", "block start")
MODEL_NAMES = ("GRU", "BiGRU")


# --- the task ---------------------------------------------------------------------


def _neighbours(bits: np.ndarray):
    """The bit to the left and to the right of every position (0 beyond the ends)."""
    bits = np.asarray(bits).astype(bool)
    left = np.zeros_like(bits)
    right = np.zeros_like(bits)
    left[..., 1:] = bits[..., :-1]
    right[..., :-1] = bits[..., 1:]
    return bits, left, right


def run_labels(bits: np.ndarray) -> np.ndarray:
    """1 where the position is a 1 with a 1 beside it (inside a run of >= 2), else 0."""
    bits, left, right = _neighbours(bits)
    return (bits & (left | right)).astype(np.int32)


def block_starts(bits: np.ndarray) -> np.ndarray:
    """True at the first 1 of every block of consecutive 1s (lone 1s included)."""
    bits, left, _ = _neighbours(bits)
    return bits & ~left


def block_ends(bits: np.ndarray) -> np.ndarray:
    """True at the last 1 of every block of consecutive 1s (lone 1s included)."""
    bits, _, right = _neighbours(bits)
    return bits & ~right


def boundary_positions(bits: np.ndarray) -> np.ndarray:
    """First and last 1 of every block, and the 0s right next to a block."""
    bits, left, right = _neighbours(bits)
    next_to_block = ~bits & (left | right)
    return block_starts(bits) | block_ends(bits) | next_to_block


def make_data(count: int, length: int, rng: np.random.Generator):
    """`count` random fair-coin bit sequences: (bits float [N, T, 1], labels int [N, T])."""
    bits = rng.integers(0, 2, size=(count, length))
    return bits[..., None].astype("float32"), run_labels(bits)


# --- the models --------------------------------------------------------------------


def build_gru(hidden: int, layers: str = "kb") -> keras.Model:
    """Left to right: a GRU over the bits, a softmax over {outside, inside} per position.

    `layers="keras"` builds the same model from `keras.layers.GRU`."""
    bits = keras.Input((None, 1), name="bits")
    if check_layers(layers) == "keras":
        states = keras.layers.GRU(hidden, return_sequences=True, name="gru")(bits)
    else:
        states = kb.Recurrent(kb.GRUCell(hidden), return_sequences=True, name="gru")(bits)
    probs = keras.layers.Dense(2, activation="softmax", name="tags")(states)
    return keras.Model(bits, probs, name="gru_tagger")


def build_bigru(hidden: int, layers: str = "kb") -> keras.Model:
    """Both ways: y_t = softmax(V_f h_f,t + V_b h_b,t + c).

    `layers="keras"` builds the same function from Keras's layers:
    `Bidirectional(GRU)` concatenates [h_f,t, h_b,t] and a `Dense` softmax
    multiplies it by [V_f; V_b], which is the projection merge."""
    bits = keras.Input((None, 1), name="bits")
    if check_layers(layers) == "keras":
        states = keras.layers.Bidirectional(keras.layers.GRU(hidden, return_sequences=True), name="bigru")(bits)
        probs = keras.layers.Dense(2, activation="softmax", name="tags")(states)
        return keras.Model(bits, probs, name="bigru_tagger")
    probs = kb.Bidirectional(
        kb.GRUCell(hidden),
        merge_mode="projection",
        projection_units=2,
        projection_activation="softmax",
        return_sequences=True,
        name="bigru",
    )(bits)
    return keras.Model(bits, probs, name="bigru_tagger")


def accuracies(probs: np.ndarray, bits: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
    """Accuracy of argmax(probs) overall, at boundaries and at block starts."""
    bits = np.asarray(bits).reshape(labels.shape)
    correct = np.argmax(probs, axis=-1) == labels
    return {
        "overall": float(correct.mean()),
        "boundary": float(correct[boundary_positions(bits)].mean()),
        "block start": float(correct[block_starts(bits)].mean()),
    }


def format_table(rows: Sequence[dict]) -> str:
    """One line per model; accuracies in percent."""
    widths = (6, 6, 7, 8, 9, 12)
    line = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    out = [line(TABLE_HEADER)]
    for row in rows:
        out.append(
            line(
                [row["model"], row["hidden"], row["params"]]
                + [f"{100 * row[key]:.2f}%" for key in TABLE_HEADER[3:]]
            )
        )
    return "\n".join(out)


def format_bits(values) -> str:
    return " ".join(str(int(v)) for v in np.asarray(values).ravel())


# --- the run -------------------------------------------------------------------------


class DemoResult(NamedTuple):
    models: Dict[str, keras.Model]
    rows: List[dict]
    x_test: np.ndarray  # [N, T, 1] held-out bits
    y_test: np.ndarray  # [N, T] their labels
    export_path: str
    example_bits: np.ndarray  # [T]
    served_probs: np.ndarray  # [T, 2], from the reloaded SavedModel
    seconds: float


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m keras_birnn.demo",
        description="The textbook's exercise: label runs of 1s with a GRU and a BiGRU, compare "
        "their accuracy at run boundaries, export the BiGRU for TF Serving.",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of data and weights (default 0)")
    parser.add_argument("--hidden", type=int, default=8, help="hidden size of both GRUs (default 8)")
    parser.add_argument("--length", type=int, default=24, help="sequence length (default 24)")
    parser.add_argument("--train-size", type=int, default=2000, help="training sequences (default 2000)")
    parser.add_argument("--test-size", type=int, default=1000, help="held-out sequences (default 1000)")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs (default 12)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    parser.add_argument(
        "--out", default="saved_models",
        help="SavedModel base folder; the BiGRU goes to <out>/run_of_ones/1/ (default saved_models)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument(
        "--layers", choices=LAYERS, default="kb",
        help="kb: keras_birnn's layers (default); keras: the same models from keras.layers.GRU and "
        "Bidirectional, exported with model.export to <out>/run_of_ones_keras/1/ (an end-to-end benchmark)",
    )
    parser.add_argument(
        "--report-json", metavar="PATH",
        help="also write each model's epoch seconds, fit seconds, predict throughput and accuracy to PATH",
    )
    args = parser.parse_args(argv)
    return finish_args(parser, args, positive=("hidden", "length", "train_size", "test_size", "epochs", "batch_size"))


def run(argv: Optional[Sequence[str]] = None) -> DemoResult:
    """Trains, evaluates, exports and serves; prints as it goes."""
    args = parse_args(argv)
    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x_train, y_train = make_data(args.train_size, args.length, rng)
    x_test, y_test = make_data(args.test_size, args.length, rng)
    print(
        f"Task: label each bit as inside a run of 1s (>= 2 in a row). Train {args.train_size}, "
        f"held out {args.test_size} sequences of {args.length} fair-coin bits; seed {args.seed}."
    )
    models, rows = {}, []
    for name, build in zip(MODEL_NAMES, (build_gru, build_bigru)):
        models[name], row = train_one(name, build(args.hidden, args.layers), args, (x_train, y_train))
        probs = predict_timed(models[name], x_test, row)
        rows.append({**row, **accuracies(probs, x_test[..., 0], y_test)})
    twin = ", Keras's GRU layers (--layers keras)" if args.layers == "keras" else ""
    print(f"\nHeld-out accuracy ({args.test_size} x {args.length} positions){twin}:")
    print(format_table(rows))
    print(BOUNDARY_DEFINITION)

    path, served_probs = export_and_serve(models["BiGRU"], args, x_test[:1])
    keras_probs = np.asarray(models["BiGRU"](x_test[:1], training=False))[0]
    print(f"\nExported the BiGRU to {path}; reloaded with tf.saved_model.load (serving_default):")
    print(f"  input bits       : {format_bits(x_test[0, :, 0])}")
    print(f"  true labels      : {format_bits(y_test[0])}")
    print(f"  predicted labels : {format_bits(np.argmax(served_probs, axis=-1))}")
    print(f"  max |SavedModel - Keras| probability difference: {np.max(np.abs(served_probs - keras_probs)):.1e}")
    seconds = time.perf_counter() - start
    print(f"Done in {seconds:.1f} s.")
    if args.report_json:
        write_report(args.report_json, args, rows, path, seconds)
    return DemoResult(models, rows, x_test, y_test, path, x_test[0, :, 0], served_probs, seconds)


def train_one(name: str, model: keras.Model, args: argparse.Namespace, train) -> Tuple[keras.Model, dict]:
    """Compiles and fits one model; its row: name, sizes and timings."""
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    print(f"\nTraining the {name} (hidden {args.hidden}, {model.count_params()} parameters)")
    timer = EpochTimer()
    model.fit(*train, batch_size=args.batch_size, epochs=args.epochs, verbose=0 if args.quiet else 1,
              shuffle=True, callbacks=[timer])
    return model, {"model": name, "hidden": args.hidden, "params": model.count_params(),
                   "epoch_seconds": timer.seconds, "fit_seconds": sum(timer.seconds)}


def predict_timed(model: keras.Model, x: np.ndarray, row: dict) -> np.ndarray:
    """`model.predict` twice (the first traces); the times go into `row`."""
    began = time.perf_counter()
    model.predict(x, batch_size=256, verbose=0)
    row["predict_first_seconds"] = time.perf_counter() - began
    began = time.perf_counter()
    probs = model.predict(x, batch_size=256, verbose=0)
    row["predict_sentences_per_second"] = len(x) / (time.perf_counter() - began)
    return probs


def export_and_serve(model: keras.Model, args: argparse.Namespace, bits: np.ndarray) -> Tuple[str, np.ndarray]:
    """Exports `model` as a SavedModel version 1 and serves `bits` from the
    reloaded file: `kb.export_saved_model` (inputs and lengths), or for the
    Keras twin Keras's own `model.export` (its input by name)."""
    if args.layers == "keras":
        path = os.path.join(args.out, "run_of_ones_keras", "1")
        model.export(path, verbose=False)
        served = tf.saved_model.load(path).signatures["serving_default"]
        outputs = served(bits=tf.constant(bits))
    else:
        path = kb.export_saved_model(model, os.path.join(args.out, "run_of_ones"), version=1, overwrite=True)
        served = tf.saved_model.load(path).signatures["serving_default"]
        outputs = served(inputs=tf.constant(bits), lengths=tf.constant([bits.shape[1]], tf.int32))
    (probs,) = outputs.values()
    return path, probs.numpy()[0]


def write_report(path: str, args: argparse.Namespace, rows: Sequence[dict], export_path: str,
                 seconds: float) -> None:
    """--report-json: every model's row; the BiGRU's also at the top level
    (what `benchmarks/bench_examples.py` reads)."""
    entries = [{**row, "variant": row["model"], "accuracy": row["overall"]} for row in rows]
    report = {"example": "demo", "layers": args.layers, "seconds": seconds, "export_path": export_path,
              "variants": entries, **entries[-1]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point (`keras-birnn-demo`)."""
    run(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
