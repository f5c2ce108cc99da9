"""How much faster the examples' prediction passes could be at most.

Times the pass each example times as its `predict` throughput, three ways,
in one process, the peers interleaved pass by pass (the order reversed
every other round) after two warm-up passes:

- kb: the example's model;
- keras: its Keras twin (`--layers keras`);
- none: the same model with its recurrent layer replaced by a Dense of the
  same output width at each position, no recurrence (as
  `bench_recurrence_share` builds it for training).

The demo's pass is `model.predict` on its 1,000 held-out sequences of 24
bits at batch 256 (`demo.predict_timed`); "none" is `Dense(16, tanh)`, the
BiGRU's width, then the `Dense(2, softmax)` tags. The classifier's is
`sentence_classification.evaluate` over its held-out split (the polarity
data, seed 0: 1,066 sentences in batches of 32, one traced predictor for
any shape); "none" is `bench_recurrence_share`'s stand-in. Weights are
untrained: a pass costs the same.

"none" keeps everything else of the pass (the `predict` loop or the
example's evaluation loop, embeddings, heads), so keras/none bounds the
ratio over Keras's pass that any implementation of the recurrent layer
could reach.

`--exports` times the demo's exported models instead, at batch 1 and 64,
served by `bench_examples.py`'s latency script in a fresh process
(`--rounds` is its number of passes over 64 single rows; ten times as
many calls at batch 64):
kb (`serving_default`, with `lengths`), kb_unpadded (`serving_unpadded`),
keras (`model.export`), and three SavedModels written by hand with plain
`tf.while_loop`s, one per direction, around the same projection and
softmax, from the Keras twin's weights (`plain_modules`): plain_gru, the
same GRU step by step (it serves the twin's numbers); plain_tanh, a
simple tanh RNN of the same width (the GRU's candidate weights alone),
fewer ops per step than any GRU step; no_arithmetic, the loop that only
reads each step's projected input and writes it out. An export cannot
compile its loops with XLA (ONNX and LiteRT convert the graph as it is,
and TF Serving runs XLA only behind an experimental flag), so these
bound what a plain loop gives the demo's export. Results and command:
benchmarks/README.md.

    python -u benchmarks/bench_predict_floor.py --rounds 20
    python -u benchmarks/bench_predict_floor.py --exports --rounds 5
"""

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_recurrence_share import alternating  # noqa: E402

PEERS = ("kb", "keras", "none")


def demo_models() -> Dict[str, Any]:
    """Per peer, the demo's model (kb, keras) or its stand-in (none)."""
    import keras
    from keras_birnn import demo

    def model(peer):
        if peer != "none":
            return demo.build_bigru(8, peer)
        inputs = keras.Input((None, 1), name="bits")
        states = keras.layers.Dense(16, activation="tanh", name="bigru_stand_in")(inputs)
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="tags")(states))

    return {peer: model(peer) for peer in PEERS}


def demo_bits():
    """The demo's 1,000 held-out sequences of 24 bits (as `demo.make_data` shapes them)."""
    import numpy as np

    return np.random.default_rng(0).integers(0, 2, (1000, 24, 1)).astype("float32")


def demo_passes() -> Dict[str, Callable[[], Any]]:
    """Per peer, one `predict` pass as the demo times it."""
    bits = demo_bits()
    return {peer: (lambda m=m: m.predict(bits, batch_size=256, verbose=0)) for peer, m in demo_models().items()}


def classifier_passes() -> Dict[str, Callable[[], Any]]:
    """Per peer, one pass over the held-out split as the classifier times it."""
    import numpy as np
    import sentence_classification as sc
    from bench_recurrence_share import DATA, _classifier_model
    from keras_birnn.data.readers import read_polarity

    folder = os.path.join(DATA, "sentence_polarity")
    texts, labels = read_polarity(os.path.join(folder, "rt-polarity.pos"), os.path.join(folder, "rt-polarity.neg"))
    tokens = [sc.tokenize(t) for t in texts]
    train_idx, _, test_idx = sc.split_indices(len(tokens), 0)
    vocab = sc.Vocabulary([tokens[i] for i in train_idx])
    test = sc.Batches([vocab.encode(tokens[i], 64) for i in test_idx], np.asarray(labels)[test_idx], 32, 0, False)
    models = {peer: _classifier_model(peer, len(vocab)) for peer in PEERS}
    return {peer: (lambda m=m: sc.evaluate(m, test)) for peer, m in models.items()}


EXPORT_PEERS = ("kb", "kb_unpadded", "keras", "plain_gru", "plain_tanh", "no_arithmetic")
PLAIN_STEPS = EXPORT_PEERS[3:]


def _plain_direction(x_tm, weights, step: str, reverse: bool):
    """One direction of a hand-written export: a `tf.while_loop` over the
    time-major `x_tm` (reversed for the backward direction, its outputs put
    back in time order), the inputs projected before the loop. `weights`
    are a Keras GRU's (gates z, r, h; bias `[2, 3 * units]`)."""
    import tensorflow as tf

    kernel, recurrent_kernel, bias = weights
    units = recurrent_kernel.shape[0]
    input_bias, recurrent_bias = bias[0], bias[1]
    if step != "plain_gru":  # the candidate's columns, one bias
        kernel, recurrent_kernel = kernel[:, 2 * units:], recurrent_kernel[:, 2 * units:]
        input_bias = input_bias[2 * units:] + recurrent_bias[2 * units:]
    x_tm = tf.reverse(x_tm, [0]) if reverse else x_tm
    projected = tf.einsum("tbf,fg->tbg", x_tm, kernel) + input_bias
    steps = tf.shape(projected)[0]
    inputs = tf.TensorArray(projected.dtype, size=steps).unstack(projected)

    def gru(x, h):
        x_z, x_r, x_h = tf.split(x, 3, axis=-1)
        h_z, h_r, h_h = tf.split(tf.matmul(h, recurrent_kernel) + recurrent_bias, 3, axis=-1)
        z, r = tf.sigmoid(x_z + h_z), tf.sigmoid(x_r + h_r)
        return z * h + (1.0 - z) * tf.tanh(x_h + r * h_h)

    step_fn = {"plain_gru": gru, "plain_tanh": lambda x, h: tf.tanh(x + tf.matmul(h, recurrent_kernel)),
               "no_arithmetic": lambda x, h: x}[step]

    def body(i, h, outputs):
        h = step_fn(inputs.read(i), h)
        return i + 1, h, outputs.write(i, h)

    start = (0, tf.zeros([tf.shape(projected)[1], units]), tf.TensorArray(projected.dtype, size=steps))
    _, _, outputs = tf.while_loop(lambda i, *_: i < steps, body, start)
    return tf.reverse(outputs.stack(), [0]) if reverse else outputs.stack()


def plain_modules(twin) -> Dict[str, Any]:
    """Per hand-written peer, a `tf.Module` whose `serve(bits)` is the demo's
    Keras twin with its BiGRU written as plain loops (`_plain_direction`),
    from the twin's weights: transpose, one loop per direction, concatenated,
    the twin's `Dense` softmax."""
    import tensorflow as tf

    bigru = twin.get_layer("bigru")
    directions = [[tf.constant(w) for w in layer.get_weights()] for layer in (bigru.forward_layer, bigru.backward_layer)]
    tags_kernel, tags_bias = (tf.constant(w) for w in twin.get_layer("tags").get_weights())

    def module(step):
        def serve(bits):
            x_tm = tf.transpose(bits, [1, 0, 2])
            states = tf.concat([_plain_direction(x_tm, w, step, reverse)
                                for w, reverse in zip(directions, (False, True))], axis=-1)
            logits = tf.einsum("tbh,hk->tbk", states, tags_kernel) + tags_bias
            return {"tags": tf.transpose(tf.nn.softmax(logits), [1, 0, 2])}

        served = tf.Module()
        served.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, None, 1], tf.float32)])
        return served

    return {step: module(step) for step in PLAIN_STEPS}


def write_exports(folder: str) -> List[str]:
    """Every export peer's SavedModel written under `folder`, as the
    `label=path:signature` entries `bench_examples.LATENCY_CHILD` serves."""
    import tensorflow as tf
    import keras_birnn as kb
    from keras_birnn import demo

    twin = demo.build_bigru(8, "keras")
    twin.export(os.path.join(folder, "keras"), verbose=False)
    kb_path = kb.export_saved_model(demo.build_bigru(8), os.path.join(folder, "kb"))
    entries = [f"kb={kb_path}:serving_default", f"kb_unpadded={kb_path}:serving_unpadded",
               f"keras={os.path.join(folder, 'keras')}:serving_default"]
    for step, served in plain_modules(twin).items():
        tf.saved_model.save(served, os.path.join(folder, step), signatures={"serving_default": served.serve})
        entries.append(f"{step}={os.path.join(folder, step)}:serving_default")
    return entries


def exports_report(calls: int) -> None:
    """The demo's exports at batch 1 and 64 against the hand-written loops,
    served by `bench_examples.LATENCY_CHILD` in a fresh process (the peers
    called in turn; batch 1: `calls` passes over 64 single rows, batch 64:
    `10 * calls` calls)."""
    import json
    import subprocess
    import tempfile

    from bench_examples import LATENCY_CHILD

    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-c", LATENCY_CHILD, "unused", str(calls)] + write_exports(folder)
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    served = json.loads(done.stdout.strip().splitlines()[-1])
    for batch in (1, 64):
        ms = {peer: result[f"batch{batch}_ms"] for peer, result in served.items()}
        print(f"demo export, batch {batch}: " + ", ".join(
            f"{peer} {m:.3f} ms (keras/{peer} x{ms['keras'] / m:.2f})" for peer, m in ms.items()))


def timed(passes: Dict[str, Callable[[], Any]], rounds: int) -> Dict[str, float]:
    """Median seconds of a pass per peer (in `passes`' order, reversed every other round)."""
    for run in passes.values():
        run(), run()
    seconds = {peer: [] for peer in passes}
    for _, peer in alternating(list(passes), rounds):
        began = time.perf_counter()
        passes[peer]()
        seconds[peer].append(time.perf_counter() - began)
    return {peer: statistics.median(values) for peer, values in seconds.items()}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default="demo,classifier", help="comma-separated: demo, classifier")
    parser.add_argument("--rounds", type=int, default=20,
                        help="timed passes per peer (default 20); with --exports, passes over 64 single rows")
    parser.add_argument("--exports", action="store_true",
                        help="time the demo's exported models against hand-written plain loops instead")
    args = parser.parse_args(argv)
    examples = {"demo": demo_passes, "classifier": classifier_passes}
    chosen = args.examples.split(",")
    if args.rounds < 1 or not chosen or any(name not in examples for name in chosen):
        parser.error(f"--rounds must be at least 1 and --examples among {sorted(examples)}, received "
                     f"{args.rounds} and {args.examples!r}")
    print(f"Prediction passes against their floor: {args.rounds} rounds, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    if args.exports:
        exports_report(args.rounds)
        return
    for name in chosen:
        ms = {peer: 1000 * s for peer, s in timed(examples[name](), args.rounds).items()}
        print(f"{name}: pass kb {ms['kb']:.1f} ms, keras {ms['keras']:.1f} ms, none {ms['none']:.1f} ms | "
              f"keras/kb x{ms['keras'] / ms['kb']:.2f}, at most keras/none x{ms['keras'] / ms['none']:.2f}")


if __name__ == "__main__":
    main()
