"""Sentence-level sentiment with a (bi)directional GRU: which pooling head?

The textbook's exercise: "How would you use a bidirectional RNN for
sentence-level classification? You need a single output, not one per
position." Every variant embeds the words (no pretrained vectors), runs a
GRU over them, pools the per-position outputs into one vector and
classifies it with a sigmoid:

    heads        final      unidirectional: the state after the last word;
                            bidirectional: kb.FinalStatePooling = [h_f after the
                            last word, h_b after the first]
                 mean       kb.MaskedMeanPooling over positions
                 max        kb.MaskedMaxPooling over positions
                 attention  kb.AttentionPooling (additive attention, masked softmax)
    directions   uni        kb.Recurrent(kb.GRUCell(H))
                 bi         kb.Bidirectional(kb.GRUCell(H), merge_mode=None / "concat")

All heads read the mask propagated from Embedding(mask_zero=True), so the
padding of a batch changes nothing.

`--layers keras` builds each variant's twin from Keras's own recurrent
layers, same sizes, dropout and heads:

    uni          keras.layers.GRU(H)  (return_sequences=True below a head)
    bi           keras.layers.Bidirectional(keras.layers.GRU(H)), merge concat
    final        the layer's own final output (return_sequences=False):
                 [h_f after the last word, h_b after the first], what
                 kb.FinalStatePooling takes from the merge_mode=None pair
    mean         keras.layers.GlobalAveragePooling1D (mask-aware: a masked mean)
    max          kb.MaskedMaxPooling (Keras's GlobalMaxPooling1D ignores the
                 mask, so padding would enter the max)
    attention    kb.AttentionPooling (Keras has no additive attention pooling)

Same function and parameter count as the kb variant (a kb model takes the
Keras twin's weights, tests/tensorflow_only/test_examples_twins.py); what differs is the
recurrent code, its initial weights' random draws, and (`--layers kb`)
the zeros kb writes at padded positions, which no head reads.

Data: any two text files, one text per line (`--pos`, `--neg`); by
default Pang & Lee's sentence polarity v1.0 (`rt-polarity.pos` and
`rt-polarity.neg`, as NLTK's data distributes them), found by
`keras_birnn.data.downloads.fetch_data`: in a local copy laid out as
`DIR/sentence_polarity/rt-polarity.pos` (`--data-dir DIR`, else the
`KERAS_BIRNN_DATA` environment variable), else downloaded once into
Keras's cache (`--cache-dir`); every file is checked by its SHA-256. With
neither a copy nor a network the example stops (exit code 2) naming the
URL and the flags. A fixed
seeded 10% of the sentences is held out for the reported accuracy; 10% of
the rest is a validation split that picks the epoch (early stopping,
best weights restored), so the held-out set is never looked at during
training.

    python examples/sentence_classification.py
    python examples/sentence_classification.py --data-dir ../shared/data   # a local copy, no network
    python examples/sentence_classification.py --quick
    python examples/sentence_classification.py --pos my.pos --neg my.neg --variants bi-max,bi-attention
    python examples/sentence_classification.py --layers keras --variants bi-attention
    python examples/sentence_classification.py --variants bi-attention --out saved_models

With `--out`, the variant with the lowest validation loss is exported for
TF Serving (`kb.export_saved_model`; the Keras twin with Keras's own
`model.export`): word ids `[batch, words]` in (0 pads, 1 is an unknown
word; the vocabulary is written beside the versions), P(positive) out.
The reloaded export is checked against the model before the run ends.
"""

import argparse
import json
import os
import re
import sys
import time
import weakref
from collections import Counter
from typing import List, Optional, Sequence

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

try:
    import keras_birnn as kb
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import keras_birnn as kb  # noqa: E402
from keras_birnn.cli.arguments import (  # noqa: E402
    LAYERS, EpochTimer, add_data_arguments, check_layers, fetch_data_or_exit, finish_args, require_files,
    without_autotuning,
)
from keras_birnn.data.readers import read_polarity  # noqa: E402

DATASET = "sentence_polarity"  # its name in keras_birnn.data.downloads.DATASETS
HEADS = ("final", "mean", "max", "attention")
DIRECTIONS = ("uni", "bi")
VARIANTS = tuple(f"{d}-{h}" for d in DIRECTIONS for h in HEADS)


# --- data ------------------------------------------------------------------------------


def tokenize(text: str) -> List[str]:
    """Lower-cased words and punctuation marks (the polarity data is already
    space-tokenised; this also splits untokenised text)."""
    return re.findall(r"[\w'-]+|[^\w\s]", text.lower())


def split_indices(count: int, seed: int, held_out: float = 0.1, validation: float = 0.1):
    """(train, validation, held-out) index arrays: a seeded permutation; the
    held-out fraction first, then the validation fraction of the rest."""
    order = np.random.default_rng(seed).permutation(count)
    n_test = int(round(held_out * count))
    rest = order[n_test:]
    n_val = int(round(validation * len(rest)))
    return rest[n_val:], rest[:n_val], order[:n_test]


class Vocabulary:
    """Words of the training texts seen at least `min_count` times; 0 is
    padding, 1 the OOV bucket."""

    def __init__(self, texts: Sequence[List[str]], min_count: int = 2):
        counts = Counter(w for t in texts for w in t)
        self.words = ["", "[UNK]"] + sorted(w for w, n in counts.items() if n >= min_count)
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: List[str], max_len: int) -> np.ndarray:
        return np.array([self.index.get(w, 1) for w in tokens[:max_len]] or [1], np.int32)


class Batches:
    """Length-bucketed batches, re-drawn every epoch (jittered sort, shuffled
    batch order), padded to each batch's longest sentence.

    `model.fit` reads them through `dataset()`, a `tf.data` pipeline over a
    Python generator, rather than as a `keras.utils.PyDataset`: Keras
    prefetches a PyDataset, and at every epoch's start the main thread then
    waits seconds for the previous epoch's prefetching thread
    (benchmarks/README.md)."""

    def __init__(self, ids: List[np.ndarray], labels: np.ndarray, batch_size: int, seed: int, shuffle: bool = True):
        self.ids, self.labels, self.batch_size = ids, labels.astype("float32"), batch_size
        self.lengths = np.array([len(x) for x in ids])
        self.rng = np.random.default_rng(seed)
        self.shuffle = shuffle
        self.passes = 0
        self.on_epoch_end()

    def on_epoch_end(self):
        keys = self.lengths + (self.rng.uniform(0, 4, len(self.lengths)) if self.shuffle else 0)
        order = np.argsort(keys, kind="stable")
        self.groups = [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        if self.shuffle:
            self.rng.shuffle(self.groups)

    def __len__(self):
        return len(self.groups)

    def __getitem__(self, k):
        idx = self.groups[k]
        width = max(int(self.lengths[i]) for i in idx)
        x = np.zeros((len(idx), width), np.int32)
        for row, i in enumerate(idx):
            x[row, : self.lengths[i]] = self.ids[i]
        return x, self.labels[idx]

    def _pass(self):
        """One epoch's batches; every pass after the first draws new ones."""
        if self.passes and self.shuffle:
            self.on_epoch_end()
        self.passes += 1
        for k in range(len(self)):
            yield self[k]

    def dataset(self) -> tf.data.Dataset:
        spec = (tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.float32))
        data = tf.data.Dataset.from_generator(self._pass, output_signature=spec)
        return without_autotuning(data.apply(tf.data.experimental.assert_cardinality(len(self))))


# --- the models ------------------------------------------------------------------------------


def build_classifier(variant: str, vocab_size: int, embed_dim: int = 128, hidden: int = 64,
                     dropout: float = 0.5, attention_units: int = 64, layers: str = "kb") -> keras.Model:
    """words `[B, T]` -> P(positive) `[B, 1]`.

    `layers="keras"` builds the twin from Keras's GRU and Bidirectional
    (see the module docstring); the layers keep the kb variant's names."""
    direction, head = variant.split("-")
    if direction not in DIRECTIONS or head not in HEADS:
        raise ValueError(f"variant must be one of {VARIANTS}, received {variant!r}")
    check_layers(layers)
    words = keras.Input((None,), dtype="int32", name="words")
    x = keras.layers.Embedding(vocab_size, embed_dim, mask_zero=True, name="embedding")(words)
    x = keras.layers.Dropout(dropout)(x)
    if layers == "keras":
        pooled, x = _keras_recurrence(direction, head, hidden, x)
    elif direction == "uni":
        if head == "final":
            pooled = kb.Recurrent(kb.GRUCell(hidden), name="gru")(x)  # state after the last valid word
        else:
            x = kb.Recurrent(kb.GRUCell(hidden), return_sequences=True, name="gru")(x)
    else:
        if head == "final":
            pair = kb.Bidirectional(kb.GRUCell(hidden), merge_mode=None, return_sequences=True, name="bigru")(x)
            pooled = kb.FinalStatePooling(name="final_states")(pair)
        else:
            x = kb.Bidirectional(kb.GRUCell(hidden), return_sequences=True, name="bigru")(x)
    if head == "mean":
        if layers == "keras":
            pooled = keras.layers.GlobalAveragePooling1D(name="mean")(x)  # masked mean
        else:
            pooled = kb.MaskedMeanPooling(name="mean")(x)
    elif head == "max":
        pooled = kb.MaskedMaxPooling(name="max")(x)
    elif head == "attention":
        pooled = kb.AttentionPooling(attention_units, name="attention")(x)
    pooled = keras.layers.Dropout(dropout)(pooled)
    prob = keras.layers.Dense(1, activation="sigmoid", name="positive")(pooled)
    return keras.Model(words, prob, name=variant.replace("-", "_"))


def _keras_recurrence(direction: str, head: str, hidden: int, x):
    """The Keras twin's recurrent layer: (the pooled vector for the final
    head or None, the per-position outputs or None)."""
    sequences = head != "final"
    if direction == "uni":
        y = keras.layers.GRU(hidden, return_sequences=sequences, name="gru")(x)
    else:
        y = keras.layers.Bidirectional(keras.layers.GRU(hidden, return_sequences=sequences), name="bigru")(x)
    return (None, y) if sequences else (y, None)


# One traced predictor per model, dropped with the model; kept out of the
# model's own attributes, so nothing the model tracks or saves changes.
_PREDICTORS = weakref.WeakKeyDictionary()


def predictor(model):
    """`model` in inference mode as one graph for any batch and length."""
    if model not in _PREDICTORS:
        model_ref = weakref.ref(model)  # the entry must not keep its key alive
        _PREDICTORS[model] = tf.function(lambda words: model_ref()(words, training=False),
                                         input_signature=[tf.TensorSpec([None, None], tf.int32)])
    return _PREDICTORS[model]


def evaluate(model, data: Batches):
    """(accuracy, mean binary cross-entropy) without dropout."""
    hits, loss, count = 0, 0.0, 0
    for k in range(len(data)):
        x, y = data[k]
        p = predictor(model)(x).numpy()[:, 0]
        hits += int(((p > 0.5) == (y > 0.5)).sum())
        p = np.clip(p, 1e-7, 1 - 1e-7)
        loss += float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).sum())
        count += len(y)
    return hits / max(count, 1), loss / max(count, 1)


# --- the run ------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python examples/sentence_classification.py",
        description="Sentence polarity with a GRU / BiGRU and four pooling heads.",
    )
    parser.add_argument("--pos", default=None,
                        help="positive texts, one per line, with --neg (default: rt-polarity.pos of Pang & "
                        "Lee's sentence polarity v1.0, from --data-dir or downloaded)")
    parser.add_argument("--neg", default=None,
                        help="negative texts, one per line, with --pos (default: rt-polarity.neg, as --pos)")
    add_data_arguments(parser)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)")
    parser.add_argument("--epochs", type=int, default=None, help="maximum epochs (default 8; --quick 2)")
    parser.add_argument("--patience", type=int, default=2,
                        help="early-stopping patience on validation loss, in epochs (default 2)")
    parser.add_argument("--max-sentences", type=int, default=None,
                        help="use a seeded random subset of N sentences (default all; --quick 1000)")
    parser.add_argument("--max-len", type=int, default=64, help="words kept per sentence (default 64)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--embed-dim", type=int, default=None, help="default 128; --quick 32")
    parser.add_argument("--hidden", type=int, default=None, help="GRU units per direction (default 64; --quick 16)")
    parser.add_argument("--dropout", type=float, default=0.5,
                        help="dropout rate after the embedding and after the head (default 0.5)")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and of the weights (default 0)")
    parser.add_argument("--layers", choices=LAYERS, default="kb",
                        help="kb: keras_birnn's layers (default); keras: the same models from "
                        "keras.layers.GRU / Bidirectional (final head: the layer's own final states; mean: "
                        "GlobalAveragePooling1D; max and attention keep kb's masked pooling heads, which "
                        "Keras lacks); same sizes, dropout and parameter counts")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="export the variant with the lowest validation loss for TF Serving to "
                        "DIR/sentence_classifier/1/ (--layers keras: DIR/sentence_classifier_keras/1/, "
                        "Keras's model.export), with DIR/sentence_classifier*/vocabulary.txt (line k: word id k); "
                        "default: no export")
    parser.add_argument("--report-json", metavar="PATH",
                        help="also write per-variant timings and accuracy to PATH as JSON: epoch_seconds "
                        "(each epoch with its validation pass), fit_seconds, predict_sentences_per_second "
                        "(a second, warm pass over the held-out set), accuracy (default: no report)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    args = parser.parse_args(argv)
    finish_args(
        parser, args,
        quick=dict(epochs=(2, 8), max_sentences=(1000, None), embed_dim=(32, 128), hidden=(16, 64)),
        choices=("variants", VARIANTS),
        positive=("epochs", "batch_size", "embed_dim", "hidden", "max_len"),
    )
    if (args.pos is None) != (args.neg is None):
        parser.error("--pos and --neg go together: pass both files, or neither for the default data")
    if args.pos is None:
        paths = fetch_data_or_exit(parser, args, DATASET)
        args.pos, args.neg = paths["rt-polarity.pos"], paths["rt-polarity.neg"]
    require_files(parser, {"--pos": args.pos, "--neg": args.neg}, "pass --pos FILE --neg FILE, one text per line")
    return args


def run(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    texts, labels = read_polarity(args.pos, args.neg)
    labels = np.array(labels)
    if args.max_sentences is not None and args.max_sentences < len(texts):
        keep = np.sort(np.random.default_rng(args.seed + 1).permutation(len(texts))[: args.max_sentences])
        texts, labels = [texts[i] for i in keep], labels[keep]
    tokens = [tokenize(t) for t in texts]
    train_idx, val_idx, test_idx = split_indices(len(tokens), args.seed)
    vocab = Vocabulary([tokens[i] for i in train_idx])
    ids = [vocab.encode(t, args.max_len) for t in tokens]

    def subset(idx, shuffle):
        return Batches([ids[i] for i in idx], labels[idx], args.batch_size, args.seed, shuffle)

    train, val, test = subset(train_idx, True), subset(val_idx, False), subset(test_idx, False)
    print(f"{len(tokens)} sentences ({int(labels.sum())} positive): train {len(train_idx)}, validation "
          f"{len(val_idx)} (picks the epoch), held out {len(test_idx)} (seed {args.seed}); vocabulary "
          f"{len(vocab)} words (count >= 2 in train, with padding and OOV).")
    print(f"Load at start: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} CPUs.")

    rows, models = [], {}
    for variant in args.variants:
        keras.utils.set_random_seed(args.seed)
        model = build_classifier(variant, len(vocab), args.embed_dim, args.hidden, args.dropout,
                                 layers=args.layers)
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate, clipnorm=5.0),
                      loss="binary_crossentropy", metrics=["accuracy"])
        _, loss_before = evaluate(model, train)
        began = time.perf_counter()
        stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=args.patience,
                                             restore_best_weights=True)
        timer = EpochTimer()
        history = model.fit(train.dataset(), validation_data=val.dataset(), epochs=args.epochs, callbacks=[stop, timer],
                            verbose=0 if args.quiet else 2, shuffle=False)  # reshuffled by Batches
        seconds = time.perf_counter() - began
        predict_began = time.perf_counter()
        accuracy, _ = evaluate(model, test)
        predict_first = time.perf_counter() - predict_began
        _, loss_after = evaluate(model, train)
        val_losses = history.history["val_loss"]
        row = {
            "variant": variant, "params": model.count_params(), "accuracy": accuracy, "val_loss": min(val_losses),
            "best_epoch": int(np.argmin(val_losses)) + 1, "epochs_run": len(val_losses),
            "seconds": seconds, "loss_before": loss_before, "loss_after": loss_after,
            "epoch_seconds": [t + v for t, v in zip(timer.seconds, timer.validation_seconds)],  # as fit runs them
            "predict_first_seconds": predict_first,
        }
        if args.report_json:
            predict_began = time.perf_counter()
            evaluate(model, test)  # warm: the predictor is traced, the shapes seen
            row["predict_sentences_per_second"] = len(test_idx) / (time.perf_counter() - predict_began)
        rows.append(row)
        models[variant] = model
        print(f"{variant}: held-out accuracy {100 * accuracy:.2f}% (epoch {row['best_epoch']} of "
              f"{row['epochs_run']}, {seconds:.0f} s)")
    twin = ", Keras's GRU layers (--layers keras)" if args.layers == "keras" else ""
    print(f"\nHeld-out accuracy ({len(test_idx)} sentences){twin}:")
    print(format_table(rows))
    export_path = None
    if args.out:
        best = min(rows, key=lambda r: r["val_loss"])["variant"]
        export_path = export_classifier(models[best], args.layers, args.out, vocab, test[0][0][:8])
        print(f"Exported {best} for TF Serving to {export_path} (word ids in; its vocabulary beside it).")
    total = time.perf_counter() - start
    print(f"Done in {total:.0f} s; load now {os.getloadavg()[0]:.2f}.")
    if args.report_json:
        write_report(args.report_json, args, rows, len(test_idx), total, export_path)
    return {"rows": rows, "models": models, "vocab": vocab, "test": test, "seconds": total,
            "export_path": export_path}


def export_classifier(model, layers: str, out: str, vocab: Vocabulary, probe: np.ndarray) -> str:
    """Exports `model` as version 1 under `out` and returns that folder:
    `kb.export_saved_model` (signatures `serving_default`, word ids
    `inputs` and `lengths`, and `serving_unpadded`, word ids alone, 0
    masked as the model's Embedding masks it), or for the Keras twin
    Keras's `model.export` (word ids `words`). The vocabulary goes beside
    the versions. The reloaded export must serve the model's
    probabilities for `probe` (padded word ids)."""
    if layers == "keras":
        path = os.path.join(out, "sentence_classifier_keras", "1")
        model.export(path, verbose=False)
        feed = {"words": tf.constant(probe)}
    else:
        path = kb.export_saved_model(model, os.path.join(out, "sentence_classifier"), version=1, overwrite=True)
        feed = {"inputs": tf.constant(probe), "lengths": tf.constant((probe != 0).sum(axis=1), tf.int32)}
    with open(os.path.join(os.path.dirname(path), "vocabulary.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab.words) + "\n")
    (served,) = tf.saved_model.load(path).signatures["serving_default"](**feed).values()
    expected = predictor(model)(probe).numpy()
    if not np.allclose(served.numpy(), expected, atol=1e-5):
        raise RuntimeError(f"the export at {path} serves {served.numpy()[:, 0]}, the model {expected[:, 0]}")
    return path


def write_report(path: str, args, rows, held_out: int, total: float, export_path: Optional[str] = None) -> None:
    """--report-json: one entry per variant; with a single variant its
    numbers are also at the top level."""
    entries = [
        {"variant": r["variant"], "params": r["params"], "epoch_seconds": r["epoch_seconds"],
         "fit_seconds": r["seconds"], "predict_first_seconds": r["predict_first_seconds"],
         "predict_sentences_per_second": r["predict_sentences_per_second"], "accuracy": r["accuracy"],
         "best_epoch": r["best_epoch"], "epochs_run": r["epochs_run"]}
        for r in rows
    ]
    report = {"example": "sentence_classification", "layers": args.layers,
              "held_out_sentences": held_out, "seconds": total, "variants": entries, "export_path": export_path}
    if len(entries) == 1:
        report.update({k: v for k, v in entries[0].items() if k != "variant"}, variant=entries[0]["variant"])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def format_table(rows) -> str:
    lines = [f"{'variant':14}  {'params':>8}  {'accuracy':>8}  {'epoch':>5}  {'time':>6}"]
    for r in rows:
        lines.append(f"{r['variant']:14}  {r['params']:>8,}  {100 * r['accuracy']:7.2f}%  "
                     f"{r['best_epoch']:>2}/{r['epochs_run']:<2}  {r['seconds']:5.0f}s")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
