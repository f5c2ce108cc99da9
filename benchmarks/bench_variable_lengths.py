"""Training on variable-length batches (model.fit over padded tf.data batches), ours vs Keras.

A tagger-shaped model (Embedding with mask_zero -> Bidirectional(GRU/LSTM,
return_sequences) -> Dense softmax) trained with `model.fit` on a
`tf.data` pipeline of shuffled batches padded to their longest row, so the
traced graph has an unknown time size and nearly every batch brings a new
length; or (`--pad-to N`) every batch padded to one length, as
`pad_sequences(maxlen=N)` or `TextVectorization(output_sequence_length=N)`
pipelines do. Sentence lengths are drawn from a CoNLL-U file's sentences (UD
English EWT by default: the path is read, the data never copied), token
and tag ids are random (the timing does not depend on them).

Each peer runs in a fresh process (XLA's compiled programs are cached per
process), epoch by epoch: the first epoch pays for tracing and compiling,
the later ones show the steady state.

Peers:
- keras: `keras.layers.Bidirectional` (no XLA: Keras's own choice for LSTM/GRU).
- keras_birnn: the default: loops on time buckets (`keras_birnn.recurrence.tensorflow.bucketing`), plain
  until a shape has run enough steps, then XLA-compiled (`keras_birnn.recurrence.compile_policy`).
- keras_birnn_plain: the loops as plain TensorFlow (`recurrence.xla_disabled()`).
- keras_birnn_never / keras_birnn_all: the default's counted path with no
  shape ever compiled / every shape compiled when first met
  (`kb.compilation(compile_after=...)`): what compiling saves in this model.
- keras_birnn_per_length: XLA without buckets, one compilation per length
  (what the default did before buckets; switched by a private hook).

    python benchmarks/bench_variable_lengths.py --conllu ../shared/data/ud_english_ewt/en_ewt-ud-train.conllu
    python benchmarks/bench_variable_lengths.py --pad-to 128
"""

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import contextlib, json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf, keras
import keras_birnn as kb
from keras_birnn import recurrence
from keras_birnn.cli.arguments import without_autotuning
peer, cell, path, sentences, epochs, batch, units, pad_to, autotune = sys.argv[1:10]
sentences, epochs, batch, units, pad_to = int(sentences), int(epochs), int(batch), int(units), int(pad_to)
lengths, n = [], 0
for line in open(path, encoding="utf-8"):
    if line.startswith("#"):
        continue
    if not line.strip():
        if n:
            lengths.append(n)
        n = 0
    elif line.split("\t")[0].isdigit():
        n += 1
rng = np.random.RandomState(0)
lengths = rng.choice(lengths, sentences)
tokens = [rng.randint(1, 5000, k) for k in lengths]
tags = [rng.randint(0, 17, k) for k in lengths]
spec = (tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32))
data = tf.data.Dataset.from_generator(lambda: zip(tokens, tags), output_signature=spec)
if pad_to:  # every batch padded to one length (longer sentences cut): a static time size
    data = data.map(lambda w, t: (w[:pad_to], t[:pad_to]))
shapes = ([pad_to], [pad_to]) if pad_to else None
data = data.shuffle(sentences, seed=0).padded_batch(batch, padded_shapes=shapes).cache().prefetch(2)
if autotune == "off":
    data = without_autotuning(data)
padded_lengths = {int(words.shape[1]) for words, _ in data}  # also fills the cache before the clock runs
keras.utils.set_random_seed(0)
inputs = keras.Input((None,), dtype="int32")
embedded = keras.layers.Embedding(5000, 64, mask_zero=True)(inputs)
if peer == "keras":
    rnn = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[cell](units, return_sequences=True)
    layer = keras.layers.Bidirectional(rnn)
else:
    layer = kb.Bidirectional({"gru": kb.GRUCell, "lstm": kb.LSTMCell}[cell](units), return_sequences=True)
model = keras.Model(inputs, keras.layers.Dense(17, activation="softmax")(layer(embedded)))
model.compile("adam", "sparse_categorical_crossentropy")
if peer == "keras_birnn_per_length":
    # No time buckets: the planner pads to buckets only on these paths.
    recurrence.tensorflow.plan._COMPILING_PATHS = ()
tracing = {
    "keras_birnn_plain": recurrence.xla_disabled,
    "keras_birnn_never": lambda: kb.compilation(compile_after=10**9),
    "keras_birnn_all": lambda: kb.compilation(compile_after=1),
}.get(peer, contextlib.nullcontext)()
times, compiled = [], []
with tracing:
    for _ in range(epochs):
        start = time.perf_counter()
        loss = model.fit(data, epochs=1, verbose=0).history["loss"][-1]
        times.append(time.perf_counter() - start)
        if hasattr(layer, "loop_report"):  # shapes compiled by the end of each epoch
            compiled.append(sum(s["compiled"] for s in layer.loop_report()["shapes"]))
print(json.dumps({"times": times, "loss": loss, "batches": -(-sentences // batch), "lengths": len(padded_lengths),
                  "compiled": compiled}))
"""

PEERS = ["keras", "keras_birnn", "keras_birnn_plain", "keras_birnn_per_length", "keras_birnn_never", "keras_birnn_all"]


def measure(peer, cell, args):
    command = [sys.executable, "-c", CHILD, peer, cell, args.conllu, str(args.sentences), str(args.epochs),
               str(args.batch), str(args.units), str(args.pad_to), args.tf_data_autotune]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1][:160]
    return json.loads(done.stdout.strip().splitlines()[-1]), None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conllu", default=os.path.join(
        os.path.dirname(__file__), "..", "..", "shared", "data", "ud_english_ewt", "en_ewt-ud-train.conllu"))
    parser.add_argument("--cells", nargs="+", default=["gru", "lstm"])
    parser.add_argument("--sentences", type=int, default=12544)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--peers", nargs="+", default=PEERS[:4], choices=PEERS)
    parser.add_argument("--pad-to", type=int, default=0,
                        help="pad every batch to this length (a static time size) instead of its longest row")
    parser.add_argument("--tf-data-autotune", choices=("on", "off"), default="on",
                        help="tf.data's autotuning in the pipeline (default on, as in a user's pipeline); off "
                        "removes TensorFlow's stall at iterator teardown (bench_char_tagger.py) from the times")
    args = parser.parse_args(argv)
    padding = f"padded to {args.pad_to}" if args.pad_to else "padded to their longest row"
    print(f"model.fit on batches {padding}: {args.sentences} sentences (lengths from {os.path.basename(args.conllu)}), "
          f"batch {args.batch}, tf.data autotuning {args.tf_data_autotune}, "
          f"Embedding 64 -> Bidirectional({args.units} units) -> Dense 17; seconds per epoch")
    for cell in args.cells:
        results = {}
        for peer in args.peers:
            result, error = measure(peer, cell, args)
            results[peer] = result
            if result is None:
                print(f"{cell:5s} {peer:23s} failed: {error}", flush=True)
                continue
            epochs = " ".join(f"{t:6.1f}" for t in result["times"])
            print(f"{cell:5s} {peer:23s} epochs {epochs} | total {sum(result['times']):6.1f} s | "
                  f"final loss {result['loss']:.4f} | {result['batches']} batches, "
                  f"{result['lengths']} distinct padded lengths"
                  + (f", shapes compiled after each epoch {result['compiled']}" if result["compiled"] else ""), flush=True)
        keras_result = results.get("keras")
        for peer, result in results.items():
            if peer == "keras" or result is None or keras_result is None:
                continue
            first = keras_result["times"][0] / result["times"][0]
            later = sum(keras_result["times"][1:]) / max(sum(result["times"][1:]), 1e-9)
            print(f"{cell:5s} keras/{peer}: first epoch x{first:.2f}, later epochs x{later:.2f}")


if __name__ == "__main__":
    main()
