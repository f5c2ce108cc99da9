"""A character-aware POS tagger written the usual way, with keras_birnn and with Keras's layers.

The model, per sentence: word ids `[batch, words]` and char ids `[batch,
words, chars]` (at most 16 characters per word, padded per batch). The
char ids are reshaped to `[batch * words, chars]` with `keras.ops.reshape`
(-1), embedded (`Embedding(n_chars, 32, mask_zero=True)`) and read by the
char encoder, `kb.Bidirectional(kb.GRUCell(32))` or
`keras.layers.Bidirectional(keras.layers.GRU(32))` (final states, concat:
64 per word), reshaped back to `[batch, words, 64]`, concatenated with a
word `Embedding(n_words, 64, mask_zero=True)`, then
`kb.Bidirectional(kb.LSTMCell(64), return_sequences=True)` or
`keras.layers.Bidirectional(keras.layers.LSTM(64, return_sequences=True))`,
then `Dense(n_tags, softmax)`. The loss is the sparse categorical
cross-entropy masked by the word mask (Keras applies the mask that reaches
the output); Adam; `model.fit` on a `tf.data` pipeline of the first N UD
English EWT training sentences, reshuffled every epoch, in batches of 32
padded to their longest sentence and longest word; dev accuracy (UPOS) at
the end on the first 500 dev sentences, predicted with `predict_on_batch`
batch by batch (`model.predict` cannot concatenate batches of different
lengths); the predict time is shown for that first pass (tracing and
compiling included) and for a second, warm pass.

Printed per peer and round: the first epoch's seconds, the mean of the later
epochs', the whole `fit` (its set-up included), both predict passes, dev
accuracy, the last epoch's loss and the machine's load before and after.

The reshape back returns the word mask: Keras's Concatenate ORs its
inputs' masks, so an input without one (the char states) would make every
position valid and the BiLSTM and the loss would read the padding.

`--tf-data-autotune off` turns tf.data's autotuning off in both peers'
pipelines. With it on (the default, as in a user's pipeline), TensorFlow
2.21 stalls `fit` for seconds when an epoch's iterator is torn down
(waiting on the tuning thread), in either peer, at the end of an epoch or
of `fit` (benchmarks/README.md has both tables).

Peers, each in a fresh process (XLA's compiled programs and TensorFlow's
traces are per process), alternating round by round:
- keras: Keras's layers (Keras's own choice of compilation: none on CPU).
- kb: keras_birnn with its default settings, no context manager.
- kb_plain: keras_birnn with building, fitting and predicting under
  `keras_birnn.recurrence.xla_disabled()` (the loops as plain TensorFlow).

    python benchmarks/bench_char_tagger.py
    python benchmarks/bench_char_tagger.py --sentences 200 --epochs 1      # a smoke run
    python benchmarks/bench_char_tagger.py --peers keras kb --rounds 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EWT = os.path.join(REPO, "..", "shared", "data", "ud_english_ewt")

CHILD = r"""
import contextlib, json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
from collections import Counter
import numpy as np, tensorflow as tf, keras
import keras_birnn as kb
from keras_birnn.data.readers import read_conllu
from keras_birnn import xla_disabled
from keras_birnn.cli.arguments import without_autotuning

peer, train_path, dev_path, sentences, dev_sentences, epochs, batch, autotune = sys.argv[1:9]
sentences, dev_sentences, epochs, batch = int(sentences), int(dev_sentences), int(epochs), int(batch)
MAX_CHARS = 16
load_start = os.getloadavg()[0]
train = read_conllu(train_path)[:sentences]
dev = read_conllu(dev_path)[:dev_sentences]

# Vocabularies from the training slice: 0 = padding, 1 = unknown.
word_counts = Counter(t.lower() for tokens, _, _ in train for t in tokens)
word_index = {w: i + 2 for i, w in enumerate(sorted(w for w, n in word_counts.items() if n >= 2))}
char_index = {c: i + 2 for i, c in enumerate(sorted({c for tokens, _, _ in train for t in tokens for c in t}))}
tags = sorted({tag for _, upos, _ in train for tag in upos})
tag_index = {t: i for i, t in enumerate(tags)}

def encode(data):
    out = []
    for tokens, upos, _ in data:
        words = np.array([word_index.get(t.lower(), 1) for t in tokens], np.int32)
        width = max(min(len(t), MAX_CHARS) for t in tokens)
        chars = np.zeros((len(tokens), width), np.int32)
        for k, t in enumerate(tokens):
            ids = [char_index.get(c, 1) for c in t[:MAX_CHARS]]
            chars[k, : len(ids)] = ids
        labels = np.array([tag_index.get(t, 0) for t in upos], np.int32)
        out.append(((words, chars), labels))
    return out

spec = ((tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, None], tf.int32)), tf.TensorSpec([None], tf.int32))
def pipeline(encoded, shuffle):
    data = tf.data.Dataset.from_generator(lambda: iter(encoded), output_signature=spec).cache()
    if shuffle:
        data = data.shuffle(len(encoded), seed=0, reshuffle_each_iteration=True)
    data = data.padded_batch(batch).prefetch(2)
    return without_autotuning(data) if autotune == "off" else data

train_data = pipeline(encode(train), shuffle=True)
dev_batches = list(pipeline(encode(dev), shuffle=False))  # also fills the dev cache
for _ in train_data:  # fills the training cache before the clock runs
    pass

class WordsToRows(keras.layers.Layer):
    # chars [B, W, C] -> [B * W, C]: one row per word.
    def call(self, chars):
        return keras.ops.reshape(chars, (-1, keras.ops.shape(chars)[2]))
    def compute_output_shape(self, shape):
        return (None, shape[2])

class RowsToWords(keras.layers.Layer):
    # [B * W, D] -> [B, W, D], with the word mask (words != 0) as its mask.
    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        self.width = width
    def call(self, inputs):
        states, words = inputs
        shape = keras.ops.shape(words)
        return keras.ops.reshape(states, (shape[0], shape[1], self.width))
    def compute_mask(self, inputs, mask=None):
        return keras.ops.not_equal(inputs[1], 0)
    def compute_output_shape(self, shapes):
        return (shapes[1][0], shapes[1][1], self.width)

def build():
    words = keras.Input((None,), dtype="int32", name="words")
    chars = keras.Input((None, None), dtype="int32", name="chars")
    embedded_chars = keras.layers.Embedding(len(char_index) + 2, 32, mask_zero=True)(WordsToRows()(chars))
    if peer == "keras":
        char_encoder = keras.layers.Bidirectional(keras.layers.GRU(32))
        sentence_layer = keras.layers.Bidirectional(keras.layers.LSTM(64, return_sequences=True))
    else:
        char_encoder = kb.Bidirectional(kb.GRUCell(32))
        sentence_layer = kb.Bidirectional(kb.LSTMCell(64), return_sequences=True)
    spelled = RowsToWords(64)([char_encoder(embedded_chars), words])
    embedded_words = keras.layers.Embedding(len(word_index) + 2, 64, mask_zero=True)(words)
    x = keras.layers.Concatenate()([embedded_words, spelled])
    probs = keras.layers.Dense(len(tags), activation="softmax")(sentence_layer(x))
    model = keras.Model([words, chars], probs)
    model.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy")
    return model

class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []
    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()
    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.began)

context = xla_disabled() if peer == "kb_plain" else contextlib.nullcontext()
with context:
    keras.utils.set_random_seed(0)
    model = build()
    timer = EpochTimer()
    began = time.perf_counter()
    history = model.fit(train_data, epochs=epochs, callbacks=[timer], verbose=0)
    fit_seconds = time.perf_counter() - began
    began = time.perf_counter()
    predicted = [np.asarray(model.predict_on_batch(x)) for x, _ in dev_batches]
    predict_seconds = time.perf_counter() - began
    began = time.perf_counter()  # again, warm: traced and compiled for these shapes
    for x, _ in dev_batches:
        model.predict_on_batch(x)
    predict_warm_seconds = time.perf_counter() - began
hits = words = 0
for ((w, _), y), p in zip(dev_batches, predicted):
    valid = w.numpy() != 0
    hits += int((p.argmax(-1) == y.numpy())[valid].sum())
    words += int(valid.sum())
print(json.dumps({
    "epoch_seconds": timer.seconds, "fit_seconds": fit_seconds, "predict_seconds": predict_seconds,
    "predict_warm_seconds": predict_warm_seconds,
    "accuracy": hits / max(words, 1), "loss": history.history["loss"], "params": model.count_params(),
    "train_sentences": len(train), "dev_sentences": len(dev), "dev_words": words, "tags": len(tags),
    "load": [load_start, os.getloadavg()[0]],
}))
"""

PEERS = ["keras", "kb", "kb_plain"]


def measure(peer, args):
    command = [sys.executable, "-c", CHILD, peer, args.train, args.dev, str(args.sentences),
               str(args.dev_sentences), str(args.epochs), str(args.batch), args.tf_data_autotune]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no stderr)"]
        return None, lines[-1][:200]
    return json.loads(done.stdout.strip().splitlines()[-1]), None


def describe(result) -> str:
    epochs = result["epoch_seconds"]
    later = f"{statistics.mean(epochs[1:]):6.1f}" if len(epochs) > 1 else "     -"
    return (f"epoch 1 {epochs[0]:6.1f} s, later {later} s | fit {result['fit_seconds']:6.1f} s | "
            f"predict {result['predict_seconds']:5.2f} s, again {result['predict_warm_seconds']:5.2f} s "
            f"({result['dev_sentences'] / result['predict_warm_seconds']:4.0f} sentences/s) | "
            f"dev UPOS {100 * result['accuracy']:5.2f}% | final loss {result['loss'][-1]:.4f} | "
            f"load {result['load'][0]:.1f}->{result['load'][1]:.1f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", default=os.path.join(EWT, "en_ewt-ud-train.conllu"), help="CoNLL-U training file")
    parser.add_argument("--dev", default=os.path.join(EWT, "en_ewt-ud-dev.conllu"), help="CoNLL-U dev file")
    parser.add_argument("--sentences", type=int, default=3000, help="first N training sentences (default 3000)")
    parser.add_argument("--dev-sentences", type=int, default=500, help="first N dev sentences (default 500)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--peers", nargs="+", default=PEERS, choices=PEERS)
    parser.add_argument("--rounds", type=int, default=1, help="rounds; the peers alternate within each round")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per child process")
    parser.add_argument("--tf-data-autotune", choices=("on", "off"), default="on",
                        help="tf.data's autotuning in both peers' pipelines (default on, as a user's pipeline has "
                        "it); off removes TensorFlow's stall at iterator teardown from the times")
    args = parser.parse_args(argv)
    if min(args.sentences, args.dev_sentences, args.epochs, args.batch, args.rounds) < 1:
        parser.error("--sentences, --dev-sentences, --epochs, --batch and --rounds must be at least 1")
    print(f"Char-aware tagger, model.fit: first {args.sentences} sentences of {os.path.basename(args.train)}, "
          f"batch {args.batch}, {args.epochs} epochs, tf.data autotuning {args.tf_data_autotune}; "
          f"dev: first {args.dev_sentences} of "
          f"{os.path.basename(args.dev)}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    results = {peer: [] for peer in args.peers}
    for round_ in range(args.rounds):
        # Alternate: round k starts with the k-th peer, so no peer always runs first.
        order = args.peers[round_ % len(args.peers):] + args.peers[: round_ % len(args.peers)]
        for peer in order:
            result, error = measure(peer, args)
            if result is None:
                print(f"round {round_ + 1} {peer:9s} failed: {error}", flush=True)
                continue
            results[peer].append(result)
            print(f"round {round_ + 1} {peer:9s} {describe(result)}", flush=True)
    keras_runs = results.get("keras") or []
    if keras_runs:
        keras_fit = statistics.median(r["fit_seconds"] for r in keras_runs)
        keras_first = statistics.median(r["epoch_seconds"][0] for r in keras_runs)
        keras_predict = statistics.median(r["predict_warm_seconds"] for r in keras_runs)
        for peer, runs in results.items():
            if peer == "keras" or not runs:
                continue
            fit = statistics.median(r["fit_seconds"] for r in runs)
            first = statistics.median(r["epoch_seconds"][0] for r in runs)
            predict = statistics.median(r["predict_warm_seconds"] for r in runs)
            line = f"keras/{peer}: fit x{keras_fit / fit:.2f}, first epoch x{keras_first / first:.2f}"
            if args.epochs > 1:
                later = statistics.median(statistics.mean(r["epoch_seconds"][1:]) for r in runs)
                keras_later = statistics.median(statistics.mean(r["epoch_seconds"][1:]) for r in keras_runs)
                line += f", later epochs x{keras_later / later:.2f}"
            print(line + f", warm predict x{keras_predict / predict:.2f} (medians over {len(runs)} rounds; "
                  "above 1: keras_birnn faster)")


if __name__ == "__main__":
    main()
