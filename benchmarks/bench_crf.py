"""What a CRF head costs in training against a softmax head, on the Spanish NER tagger.

The model is `examples/conll_tagging.py`'s tagger at its default sizes
(its `build_model`, i.e. `keras_birnn.tagging.build_tagger`: word embedding
100, character BiLSTM 2 x 32, sentence BiLSTM 2 x 128, dropout 0.33), once
with a softmax head and once with `kb.CRF` (IOB2 constraints,
`kb.CRFLoss`), the example's optimizer (Adam, cosine decay from 3e-3,
clipnorm 5); the example's SpanF1 training metric only with --span-f1.
Both train in one process on the same length-bucketed batches
(`pos_tagging.Encoded`, ids from the example's `TokenEncoder` settings) of
the first N sentences of CoNLL-2002 Spanish `esp.train` (word dropout off,
so both see identical batches), one epoch at a time, alternating which head
goes first each epoch so that a change of load on the machine falls on both.

Data: `keras_birnn.data.downloads.fetch_data("conll2002_spanish")`, from
`--data-dir DIR` (DIR/conll2002_spanish/esp.train), else $KERAS_BIRNN_DATA,
else ../shared/data beside the repository if there, else the download cache.

Printed per epoch and head: wall seconds and this process's CPU seconds
(all threads; less sensitive to other jobs than the wall clock), then the
CRF/softmax ratios of the first epoch (tracing included) and of the mean of
the later epochs (a CRF head is meant to cost at most 15% more per epoch).

    python benchmarks/bench_crf.py --data-dir /path/to/data
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
import keras_birnn as kb  # noqa: E402
from keras_birnn.cli.arguments import add_data_arguments, fetch_data_or_exit  # noqa: E402
from keras_birnn.data.readers import read_columns  # noqa: E402
from keras_birnn.data.downloads import DATA_ENV  # noqa: E402
from keras_birnn.tagging import TokenEncoder  # noqa: E402

HEADS = ("softmax", "crf")
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")  # the default when neither --data-dir nor $KERAS_BIRNN_DATA


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_arguments(parser)  # --data-dir DIR: DIR/conll2002_spanish/esp.train; --cache-dir, --data-url
    parser.add_argument("--sentences", type=int, default=2000, help="training sentences (default 2000)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per head (default 4)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--span-f1", action="store_true", help="also compute the example's SpanF1 metric in "
                        "training (default off: the loss only, as the figures in benchmarks/README.md)")
    args = parser.parse_args(argv)
    if args.data_dir is None and not os.environ.get(DATA_ENV) and os.path.isdir(SHARED_DATA):
        args.data_dir = SHARED_DATA
    name, train_file, _, _ = ct.DATA["conll2002"]
    args.train = fetch_data_or_exit(parser, args, name, [train_file])[train_file]
    # The example's own settings (sizes, encoder options) for that file: its defaults.
    args.example = ct.parse_args(["--train", args.train, "--batch-size", str(args.batch_size)])
    return args


def training_batches(args: argparse.Namespace):
    """The tagger's ids for the first --sentences of esp.train (`pos.Encoded`), the encoder, the tag names."""
    train, _ = ct.training_tags_in_iob2(read_columns(args.train, 0, -1)[: args.sentences])
    options = args.example
    encoder = TokenEncoder(options.max_chars, lowercase=not options.keep_case, fold_digits=not options.keep_digits,
                           min_word_count=options.min_word_count)
    encoder.adapt([tokens for tokens, _ in train])
    tags = sorted({tag for _, labels in train for tag in labels})
    return pos.Encoded(train, encoder, tags), encoder, tags


def compile_head(model: keras.Model, head: str, tags, args: argparse.Namespace, steps: int) -> None:
    """The example's optimizer and loss (`ct.compile_tagger`); without --span-f1 its SpanF1 metric left out."""
    if args.span_f1:
        return ct.compile_tagger(model, head, tags, args.example.learning_rate, steps)
    schedule = keras.optimizers.schedules.CosineDecay(args.example.learning_rate, decay_steps=max(steps, 1),
                                                      alpha=0.05)
    model.compile(optimizer=keras.optimizers.Adam(schedule, clipnorm=5.0),
                  loss=kb.CRFLoss() if head == "crf" else "sparse_categorical_crossentropy")


def main(argv=None) -> int:
    args = parse_args(argv)
    train_set, encoder, tags = training_batches(args)
    steps = args.epochs * int(np.ceil(len(train_set) / args.batch_size))
    models = {}
    for head in HEADS:
        keras.utils.set_random_seed(args.seed)
        models[head] = ct.build_model(args.example, encoder, tags, head, {})
        compile_head(models[head], head, tags, args, steps)
    print(f"{len(train_set)} sentences of esp.train, {len(tags)} tags, batch {args.batch_size}, "
          f"{args.epochs} epochs per head; load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
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
