"""How much of an example's training epoch its recurrent layers take.

Trains the POS tagger (`--variants bigru`, `pos_tagging.build_variant`:
character BiGRU 48, sentence BiGRU 128, Dropout, Dense softmax; full EWT
train) and the sentence
classifier (`bi-attention`: BiGRU 64, attention pooling, the polarity
training split) with `model.fit` for two epochs, three ways, each in a
fresh process, alternating round by round:

- kb: the example's model (`--layers kb`);
- keras: its Keras twin (`--layers keras`);
- none: the same model with every recurrent layer replaced by a Dense of
  the same output width at each position, no recurrence: the character
  encoder by the mean of each word's character embeddings and a Dense to
  2 x 48; the sentence BiGRU by a Dense to the width the BiGRU gave (the
  tagger's 2 x 128 per word, the classifier's 2 x 64).

With `--bound`, a fourth peer, kb_compiled: kb with every loop shape
XLA-compiled when first met (`kb.compilation(compile_after=1)`), whose
later epochs are the fastest these loops train that model. The script then
prints a bound on what any compile policy could give: kb's own epochs,
each made faster by what compiled loops save in a later epoch, compiling
free.

With `--xla-cache DIR` as well, kb_compiled keeps its XLA programs in
TensorFlow's persistent compilation cache in DIR: run twice, the second
run's kb_compiled compiles nothing (what a user re-running the same
training script would get from such a cache).

With `--floor`, for the classifier, a fifth peer, minimal: its BiGRU
replaced by the leanest plain-loop BiGRU we know
(`bench_plain_floor.MinimalBiGRU`: hand-written loops and BPTT, right
padding and zero boundary states only, no compile policy, no time
buckets), the same model otherwise. keras/minimal is what plain
TensorFlow loops give that model end to end, tracing included; kb runs
plain loops there (its shapes never recur often enough to compile).

"none" keeps everything else of a training step: embeddings, dropout, the
character reshapes, the loss, the optimizer over (almost) the same
embedding tables, the pipeline and `fit`. Its epoch is a floor under any
implementation of the recurrent layers (the Dense stand-ins cost a little,
so the true floor is a little lower); keras/none bounds the speed-up over
Keras that any recurrent layer could give in that model, and
(keras - none) / (kb - none) is how much faster our recurrent layers are
than Keras's inside it.

The data, batches, optimizer and seeds are the examples' own
(`pos_tagging.Encoded` batches through `pos_tagging.dataset`,
`sentence_classification.Batches`); no validation pass. The files come
from `keras_birnn.data.downloads.fetch_data`: $KERAS_BIRNN_DATA, else
../shared/data beside the repository, else the download cache. Results and command: benchmarks/README.md.

    python -u benchmarks/bench_recurrence_share.py --rounds 2
    python -u benchmarks/bench_recurrence_share.py --examples classifier --rounds 2 --bound
    python -u benchmarks/bench_recurrence_share.py --examples classifier --rounds 4 --floor
    python -u benchmarks/bench_recurrence_share.py --examples classifier --rounds 3 --bound --xla-cache /tmp/xla
    python -u benchmarks/bench_recurrence_share.py --examples pos --quick   # a smoke run
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("KERAS_BIRNN_DATA") or os.path.join(REPO, "..", "shared", "data")  # see _data_file
PEERS = ("kb", "keras", "none")
EXAMPLES = ("pos", "classifier")


def _timer():
    from keras_birnn.cli.arguments import EpochTimer
    return EpochTimer()


def _data_file(name: str, file: str) -> str:
    """A registered data file (`keras_birnn.data.downloads.fetch_data`, SHA-256 checked): from
    $KERAS_BIRNN_DATA, else ../shared/data beside the repository, else the download cache."""
    from keras_birnn.data.downloads import fetch_data
    return fetch_data(name, [file], data_dir=DATA if os.path.isdir(DATA) else None)[file]


def _stand_in(width: int, over_chars: bool, name: str):
    """A Dense(width, tanh) at each position, in a recurrent layer's place and taking its
    `mask` argument (the cloned graph passes it). `over_chars`: `kb.NestedEncoder`'s stand-in,
    embedded chars `[B, T, C, D]` -> `[B, T, width]` from the mean of each word's valid
    character vectors, with the word mask; no recurrence either way."""
    import keras
    from keras import ops

    class StandIn(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense, self.supports_masking = keras.layers.Dense(width, activation="tanh", name="dense"), True

        def call(self, x, mask=None):
            if over_chars:
                valid = ops.ones(ops.shape(x)[:3], x.dtype) if mask is None else ops.cast(mask, x.dtype)
                valid = ops.expand_dims(valid, -1)
                x = ops.sum(x * valid, axis=2) / ops.maximum(ops.sum(valid, axis=2), 1.0)
            return self.dense(x)

        def compute_mask(self, x, mask=None):
            return None if mask is None or not over_chars else ops.any(mask, axis=-1)

    return StandIn(name=name)


def _pos_model(peer: str, words: int, chars: int, tags):
    """The tagger's bigru variant (`pos.build_variant`); "none": the same model, its character BiGRU
    and sentence BiGRU swapped for `_stand_in`s of their widths (2 x 48, 2 x 128)."""
    import keras
    import keras_birnn as kb
    import pos_tagging as pos
    model = pos.build_variant("bigru", words, chars, tags, 100, 48, 128, 0.33, layers="kb" if peer == "none" else peer)
    if peer != "none":
        return model

    def swap(layer):
        if isinstance(layer, kb.NestedEncoder):
            return _stand_in(2 * 48, True, "char_stand_in")
        if isinstance(layer, kb.StackedBidirectional):
            return _stand_in(2 * 128, False, "bigru_stand_in")
        return layer
    return keras.models.clone_model(model, clone_function=swap)


def pos_setup(peer: str, epochs: int, sentences: int) -> Tuple[Any, Any]:
    """The POS tagger's model (compiled, its learning-rate schedule over
    `epochs`) and its training pipeline, for `peer`: the example's own
    (`fit_variant`: `pos.Encoded` batches re-drawn every epoch)."""
    import keras
    import numpy as np
    import pos_tagging as pos
    from keras_birnn.data.readers import read_conllu
    from keras_birnn.tagging import TokenEncoder
    path = _data_file("ud_english_ewt", "en_ewt-ud-train.conllu")
    train = [(tokens, upos) for tokens, upos, _ in read_conllu(path)[:sentences]]
    tags = sorted({t for _, upos in train for t in upos})
    encoder = TokenEncoder(16, min_word_count=2)
    encoder.adapt([tokens for tokens, _ in train])
    train_set = pos.Encoded(train, encoder, tags)
    keras.utils.set_random_seed(0)
    model = _pos_model(peer, encoder.word_count, encoder.char_count, tags)
    count = -(-len(train_set) // 32)
    pos.compile_tagger(model, keras.optimizers.schedules.CosineDecay(3e-3, decay_steps=epochs * count, alpha=0.05))
    rng = np.random.default_rng(0)
    return model, pos.dataset(lambda: train_set.batches(32, rng), train_set.batch([0]), count)


def _fit(model, data, epochs: int, compile_all: bool) -> dict:
    import contextlib
    import keras_birnn as kb
    timer = _timer()
    with kb.compilation(compile_after=1) if compile_all else contextlib.nullcontext():
        history = model.fit(data, epochs=epochs, callbacks=[timer], verbose=0, shuffle=False)
    return dict(epochs=timer.seconds, loss=history.history["loss"][-1], params=model.count_params())


def _classifier_model(peer: str, vocab: int):
    import keras
    import keras_birnn as kb
    import sentence_classification as sc
    if peer not in ("none", "minimal"):
        return sc.build_classifier("bi-attention", vocab, 128, 64, 0.5, layers=peer)
    word_ids = keras.Input((None,), dtype="int32", name="words")
    x = keras.layers.Embedding(vocab, 128, mask_zero=True, name="embedding")(word_ids)
    x = keras.layers.Dropout(0.5)(x)
    if peer == "minimal":
        from bench_plain_floor import MinimalBiGRU
        x = MinimalBiGRU(64, name="bigru")(x)
    else:
        x = keras.layers.Dense(128, activation="tanh", name="bigru_stand_in")(x)  # the BiGRU's concat width
    pooled = keras.layers.Dropout(0.5)(kb.AttentionPooling(64, name="attention")(x))
    return keras.Model(word_ids, keras.layers.Dense(1, activation="sigmoid", name="positive")(pooled))


def classifier_setup(peer: str, sentences: int) -> Tuple[Any, Any]:
    """The classifier's model (compiled) and its training pipeline, for `peer`."""
    import keras
    import numpy as np
    import sentence_classification as sc
    from keras_birnn.data.readers import read_polarity
    texts, labels = read_polarity(*(_data_file("sentence_polarity", f) for f in ("rt-polarity.pos", "rt-polarity.neg")))
    tokens = [sc.tokenize(t) for t in texts]
    train_idx = sc.split_indices(len(tokens), 0)[0][:sentences]
    vocab = sc.Vocabulary([tokens[i] for i in train_idx])
    train = sc.Batches([vocab.encode(tokens[i], 64) for i in train_idx], np.array(labels)[train_idx], 32, 0, True)
    keras.utils.set_random_seed(0)
    model = _classifier_model(peer, len(vocab))
    model.compile(optimizer=keras.optimizers.Adam(1e-3, clipnorm=5.0), loss="binary_crossentropy")
    return model, train.dataset()


def setup(example: str, peer: str, epochs: int, sentences: int) -> Tuple[Any, Any]:
    """`example`'s model for `peer` (kb_compiled builds kb's) and its
    training pipeline, with the examples folder on the path."""
    sys.path.insert(0, os.path.join(REPO, "examples"))
    peer = "kb" if peer == "kb_compiled" else peer
    if example == "pos":
        return pos_setup(peer, epochs, sentences)
    return classifier_setup(peer, sentences)


def child(example: str, peer: str, epochs: int, sentences: int) -> None:
    model, data = setup(example, peer, epochs, sentences)
    result = _fit(model, data, epochs, compile_all=peer == "kb_compiled")
    print("RESULT " + json.dumps(dict(result, load=os.getloadavg()[0])))


def run_child(script: str, arguments: Sequence[str], **env: str) -> Tuple[dict, str]:
    """`script --child arguments...` in a fresh process (this checkout
    first on the path, `env` added to the environment): its last `RESULT`
    line as a dict, and its standard error."""
    command = [sys.executable, os.path.abspath(script), "--child", *arguments]
    env = dict(os.environ, **{"TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow", **env},
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(arguments)} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):]), done.stderr


def alternating(peers: Sequence[str], rounds: int) -> Iterator[Tuple[int, str]]:
    """(round, peer) for every run, the peers' order reversed every other round."""
    for round_ in range(rounds):
        for peer in peers if round_ % 2 == 0 else peers[::-1]:
            yield round_, peer


def measure(example: str, peer: str, args: argparse.Namespace) -> dict:
    env = {}
    if args.xla_cache and peer == "kb_compiled":
        env["TF_XLA_FLAGS"] = f"--tf_xla_persistent_cache_directory={os.path.abspath(args.xla_cache)}"
    arguments = [example, peer, "--epochs", str(args.epochs), "--sentences", str(args.sentences)]
    return run_child(__file__, arguments, **env)[0]


def summary(example: str, runs: Dict[str, List[dict]]) -> str:
    """Medians over rounds of each round's ratios of the later epochs' mean and of all epochs."""
    def ratios(part):
        pick = (lambda r: statistics.mean(r["epochs"][1:])) if part == "later" else (lambda r: sum(r["epochs"]))
        rows = list(zip(*(runs[p] for p in PEERS)))
        kb_, keras_, none = (statistics.median(pick(r[i]) / pick(r[j]) for r in rows) for i, j in
                             ((1, 0), (1, 2), (0, 2)))
        share = statistics.median((pick(r[1]) - pick(r[2])) / max(pick(r[0]) - pick(r[2]), 1e-9) for r in rows)
        return (f"keras/kb x{kb_:.2f}, keras/none x{keras_:.2f}, kb/none x{none:.2f}, "
                f"recurrent part keras/kb x{share:.2f}")
    text = (f"{example}: all epochs: {ratios('all')}\n{example}: later epochs: {ratios('later')} "
            f"(medians over {len(runs['kb'])} rounds)")
    if runs.get("kb_compiled"):
        text += "\n" + _bound(example, runs)
    if runs.get("minimal"):
        text += "\n" + _floor(example, runs)
    return text


def _floor(example: str, runs: Dict[str, List[dict]]) -> str:
    """keras/minimal and minimal/kb, over all epochs and the later ones
    (medians of the rounds' ratios)."""
    def ratio(top, bottom, pick):
        return statistics.median(pick(a) / pick(b) for a, b in zip(runs[top], runs[bottom]))

    parts = []
    picks = (("all epochs", lambda r: sum(r["epochs"])), ("later epochs", lambda r: statistics.mean(r["epochs"][1:])))
    for name, pick in picks:
        parts.append(f"{name} keras/minimal x{ratio('keras', 'minimal', pick):.2f}, "
                     f"minimal/kb x{ratio('minimal', 'kb', pick):.2f}")
    return f"{example}: the leanest plain loop (minimal): " + "; ".join(parts)


def _bound(example: str, runs: Dict[str, List[dict]]) -> str:
    """keras/kb if each of kb's epochs were shortened by what compiled loops
    save in a later epoch (kb's later epochs less kb_compiled's; the first
    keeps its tracing), compiling free. kb's later epochs are taken to run
    plain loops, as the classifier's do within two epochs; a policy may
    always leave loops plain, so the saving is never taken below zero."""
    def later(r):
        return statistics.mean(r["epochs"][1:])

    bounds, compiled = [], []
    for kb_, keras_, best in zip(runs["kb"], runs["keras"], runs["kb_compiled"]):
        saved = max(later(kb_) - later(best), 0.0)
        bounds.append(sum(keras_["epochs"]) / (sum(kb_["epochs"]) - len(kb_["epochs"]) * saved))
        compiled.append(later(keras_) / later(best))
    return (f"{example}: every loop compiled: later epochs keras/kb_compiled x{statistics.median(compiled):.2f}; "
            f"all epochs at that speed, compiling free: keras/kb at most x{statistics.median(bounds):.2f}")


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", nargs="+", default=EXAMPLES, choices=EXAMPLES)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=1_000_000, help="training sentences kept (default all)")
    parser.add_argument("--quick", action="store_true", help="600 sentences: a smoke run")
    parser.add_argument("--bound", action="store_true", help="also kb_compiled, every loop shape compiled when first met")
    parser.add_argument("--xla-cache", metavar="DIR", default=None,
                        help="with --bound: kb_compiled reads and fills XLA's persistent compilation cache in DIR "
                        "(TF_XLA_FLAGS=--tf_xla_persistent_cache_directory); a run after one that filled it "
                        "measures a warm cache")
    parser.add_argument("--floor", action="store_true",
                        help="also minimal (the classifier only): the leanest plain-loop BiGRU we know in kb's place")
    parser.add_argument("--child", nargs=2, metavar=("EXAMPLE", "PEER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sentences = min(args.sentences, 600)
    if args.child:
        return child(args.child[0], args.child[1], args.epochs, args.sentences)
    if min(args.rounds, args.epochs, args.sentences) < 1 or args.epochs < 2:
        parser.error("--rounds and --sentences must be at least 1, --epochs at least 2")
    if args.xla_cache and not args.bound:
        parser.error("--xla-cache applies to kb_compiled: pass --bound too")
    peers = PEERS + (("kb_compiled",) if args.bound else ())
    print(f"model.fit, {args.epochs} epochs, peers {', '.join(peers)}"
          f"{', minimal (the classifier)' if args.floor else ''} (none: no recurrence); "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    for example in args.examples:
        floor = ("minimal",) if args.floor and example == "classifier" else ()
        runs = {peer: [] for peer in peers + floor}
        for round_, peer in alternating(peers + floor, args.rounds):
            began = time.perf_counter()
            result = measure(example, peer, args)
            runs[peer].append(result)
            epochs = " ".join(f"{s:5.1f}" for s in result["epochs"])
            print(f"{example:10s} round {round_ + 1} {peer:11s} epochs {epochs} s | "
                  f"final loss {result['loss']:.4f} | "
                  f"{result['params']:,} params | process {time.perf_counter() - began:.0f} s | "
                  f"load {result['load']:.1f}", flush=True)
        print(summary(example, runs), flush=True)


if __name__ == "__main__":
    main()
