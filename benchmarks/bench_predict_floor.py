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
could reach. Results and command: benchmarks/README.md.

    python -u benchmarks/bench_predict_floor.py --rounds 20
"""

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, Optional, Sequence

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
    from keras_birnn.datasets import read_polarity

    folder = os.path.join(DATA, "sentence_polarity")
    texts, labels = read_polarity(os.path.join(folder, "rt-polarity.pos"), os.path.join(folder, "rt-polarity.neg"))
    tokens = [sc.tokenize(t) for t in texts]
    train_idx, _, test_idx = sc.split_indices(len(tokens), 0)
    vocab = sc.Vocabulary([tokens[i] for i in train_idx])
    test = sc.Batches([vocab.encode(tokens[i], 64) for i in test_idx], np.asarray(labels)[test_idx], 32, 0, False)
    models = {peer: _classifier_model(peer, len(vocab)) for peer in PEERS}
    return {peer: (lambda m=m: sc.evaluate(m, test)) for peer, m in models.items()}


def timed(passes: Dict[str, Callable[[], Any]], rounds: int) -> Dict[str, float]:
    """Median seconds of a pass per peer."""
    for run in passes.values():
        run(), run()
    seconds = {peer: [] for peer in passes}
    for _, peer in alternating(PEERS, rounds):
        began = time.perf_counter()
        passes[peer]()
        seconds[peer].append(time.perf_counter() - began)
    return {peer: statistics.median(values) for peer, values in seconds.items()}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", default="demo,classifier", help="comma-separated: demo, classifier")
    parser.add_argument("--rounds", type=int, default=20, help="timed passes per peer (default 20)")
    args = parser.parse_args(argv)
    examples = {"demo": demo_passes, "classifier": classifier_passes}
    chosen = args.examples.split(",")
    if args.rounds < 1 or not chosen or any(name not in examples for name in chosen):
        parser.error(f"--rounds must be at least 1 and --examples among {sorted(examples)}, received "
                     f"{args.rounds} and {args.examples!r}")
    print(f"Prediction passes against their floor: {args.rounds} rounds, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    for name in chosen:
        ms = {peer: 1000 * s for peer, s in timed(examples[name](), args.rounds).items()}
        print(f"{name}: pass kb {ms['kb']:.1f} ms, keras {ms['keras']:.1f} ms, none {ms['none']:.1f} ms | "
              f"keras/kb x{ms['keras'] / ms['kb']:.2f}, at most keras/none x{ms['keras'] / ms['none']:.2f}")


if __name__ == "__main__":
    main()
