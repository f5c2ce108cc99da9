"""What a CRF head costs in training against a softmax head, on the Spanish NER tagger.

The model is `examples/conll_tagging.py`'s tagger at its default sizes
(word embedding 100, character BiLSTM 2 x 32, sentence BiLSTM 2 x 128,
dropout 0.33), once with a softmax head and once with `kb.CRF` (IOB2
constraints, `kb.CRFLoss`). Both train in one process on the same
length-bucketed batches of the first N sentences of CoNLL-2002 Spanish
`esp.train` (word dropout off, so both see identical batches), one epoch at
a time, alternating which head goes first each epoch so that a change of
load on the machine falls on both.

Printed per epoch and head: wall seconds and this process's CPU seconds
(all threads; less sensitive to other jobs than the wall clock), then the
CRF/softmax ratios of the first epoch (tracing included) and of the mean of
the later epochs. The issue's bar is a CRF epoch at most 15% longer.

    python benchmarks/bench_crf.py
    python benchmarks/bench_crf.py --sentences 300 --epochs 2      # a smoke run
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import conll_tagging as ct  # noqa: E402
import pos_tagging as pos  # noqa: E402

HEADS = ("softmax", "crf")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=ct.SHARED_DATA, help="folder holding conll2002_spanish/")
    parser.add_argument("--sentences", type=int, default=2000, help="training sentences (default 2000)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per head (default 4)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def training_batches(args: argparse.Namespace):
    """The tagger's ids for the first --sentences of esp.train, and its tag names."""
    _, train_path, _ = ct.DATA["conll2002"]
    path = os.path.join(args.data_dir, train_path)
    if not os.path.exists(path):
        sys.exit(f"bench_crf.py: no file {path}; pass --data-dir (the folder holding conll2002_spanish/)")
    train, _ = ct.training_tags_in_iob2(ct.read_columns(path, 0, -1)[: args.sentences])
    words, chars, tags = ct.build_vocabularies(train)
    encoder = ct.WordEncoder(words, chars)
    return ct.encode(train, encoder, tags), encoder, tags


def main(argv=None) -> int:
    args = parse_args(argv)
    train_set, encoder, tags = training_batches(args)
    steps = args.epochs * int(np.ceil(len(train_set) / args.batch_size))
    models = {}
    for head in HEADS:
        keras.utils.set_random_seed(args.seed)
        models[head] = ct.build_tagger(encoder.word_count, encoder.char_count, tags, head, "lstm")
        ct.compile_tagger(models[head], head, 3e-3, steps)
    print(f"{len(train_set)} sentences of esp.train, {len(tags)} tags, batch {args.batch_size}, "
          f"{args.epochs} epochs per head; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    rng = np.random.default_rng(args.seed)
    times = {head: [] for head in HEADS}
    for epoch in range(args.epochs):
        batches = train_set.batches(args.batch_size, rng)
        for head in (HEADS if epoch % 2 == 0 else HEADS[::-1]):
            began, cpu_began = time.perf_counter(), time.process_time()
            models[head].fit(pos.dataset(batches), epochs=1, verbose=0, shuffle=False)
            times[head].append((time.perf_counter() - began, time.process_time() - cpu_began))
            wall, cpu = times[head][-1]
            print(f"  epoch {epoch + 1} {head:8} {wall:7.1f} s wall {cpu:7.1f} s CPU  "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    report(times)
    return 0


def report(times) -> None:
    """CRF / softmax ratios: first epoch, and the mean of the later ones."""
    soft, crf = np.array(times["softmax"]), np.array(times["crf"])
    print("\n| epochs | softmax wall | CRF wall | CRF / softmax wall | softmax CPU | CRF CPU | CRF / softmax CPU |")
    print("|---|---|---|---|---|---|---|")
    rows = [("first", soft[:1], crf[:1])]
    if len(soft) > 1:
        rows.append((f"2-{len(soft)} (mean)", soft[1:], crf[1:]))
    for name, s, c in rows:
        s, c = s.mean(axis=0), c.mean(axis=0)
        print(f"| {name} | {s[0]:.1f} s | {c[0]:.1f} s | {c[0] / s[0]:.3f} | {s[1]:.1f} s | {c[1]:.1f} s | "
              f"{c[1] / s[1]:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
