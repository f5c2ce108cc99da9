"""`keras-birnn train` against `examples/conll_tagging.py`: the same tagger, the same data, per-epoch time.

Both train the example's default CRF tagger (a character BiLSTM of 32
units over 32-dimensional characters, 100-dimensional words, a BiLSTM of
128 units, dropout 0.33, Adam at 3e-3 with cosine decay to 5% and clipnorm
5, batches of 32, words seen fewer than 2 times are OOV, word dropout 0.05)
on CoNLL-2002 Spanish (esp.train, dev esp.testa) for `--epochs` epochs, each
contender in a fresh process, alternating round by round:

- example: `python examples/conll_tagging.py --data conll2002 --head crf
  --no-export --quiet --report-json ...`: each epoch's `fit` seconds
  (`epoch_seconds`);
- command: `keras-birnn train` with a config of those settings
  (`--set`), no export, patience 0: each epoch's `fit` seconds
  (history.csv's `train_seconds`; its `seconds` add the dev pass and the
  checkpoint, which the example does not do each epoch with --quiet).

It prints, per contender, the median over rounds of the first epoch
(tracing and compiling included), of the mean of the later epochs, and of
the process's wall time, then the ratios example/command (above 1: the
command is faster).

    python benchmarks/bench_train_command.py --data-dir ../shared/data --rounds 2 --epochs 3
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = ["model.head=crf", "model.char_encoder=lstm", "model.char_dim=32", "model.char_units=32",
            "model.word_dim=100", "model.hidden=128", "model.dropout=0.33", "model.min_word_count=2",
            "train.optimizer=adam", "train.learning_rate=0.003", "train.min_learning_rate=0.05",
            "train.clipnorm=5.0", "train.batch_size=32", "train.word_dropout=0.05", "train.patience=0",
            "export.enabled=false", "data.train=dataset:conll2002_spanish/esp.train",
            "data.dev=dataset:conll2002_spanish/esp.testa", "data.columns={tokens = 0, tags = -1}"]


def run(command, env, timeout=3600):
    """`(seconds, stdout)` of a command; raises with its last lines when it fails."""
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed: {done.stderr.strip().splitlines()[-3:]}")
    return time.perf_counter() - began, done.stdout


def example(args, env, folder):
    report = os.path.join(folder, "example.json")
    seconds, _ = run([sys.executable, "examples/conll_tagging.py", "--data", "conll2002", "--head", "crf",
                      "--epochs", str(args.epochs), "--no-export", "--quiet", "--report-json", report], env)
    with open(report) as handle:
        row = json.load(handle)["heads"][0]
    return {"epochs": row["epoch_seconds"], "wall": seconds, "dev": row["score"]}


def command(args, env, folder):
    run_dir, config = os.path.join(folder, "run"), os.path.join(folder, "empty.toml")
    open(config, "w").close()  # every setting from its default or --set
    seconds, _ = run([sys.executable, "-m", "keras_birnn.cli", "train", config, "--run", run_dir]
                     + [item for s in SETTINGS + [f"train.epochs={args.epochs}"] for item in ("--set", s)], env)
    with open(os.path.join(run_dir, "history.csv")) as handle:
        rows = list(csv.DictReader(handle))
    with open(os.path.join(run_dir, "metrics.json")) as handle:
        best = json.load(handle)
    return {"epochs": [float(r["train_seconds"]) for r in rows], "wall": seconds, "dev": float(rows[-1]["dev_score"]),
            "best": best["dev"]["score"]}


def summary(results):
    first = statistics.median(r["epochs"][0] for r in results)
    later = statistics.median(statistics.mean(r["epochs"][1:]) for r in results) if len(results[0]["epochs"]) > 1 \
        else float("nan")
    return first, later, statistics.median(r["wall"] for r in results)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_BIRNN_DATA"),
                        help="a local copy of the registered data (default $KERAS_BIRNN_DATA; else downloaded)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each running both (default 2)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each run (default 3)")
    args = parser.parse_args(argv)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    if args.data_dir:
        env["KERAS_BIRNN_DATA"] = os.path.abspath(args.data_dir)
    found = {"example": [], "command": []}
    for round_ in range(args.rounds):
        for name, runner in (("example", example), ("command", command))[:: 1 if round_ % 2 == 0 else -1]:
            with tempfile.TemporaryDirectory() as folder:
                found[name].append(runner(args, env, folder))
            print(f"round {round_ + 1} {name}: epochs {[round(s, 1) for s in found[name][-1]['epochs']]} s, "
                  f"wall {found[name][-1]['wall']:.0f} s, dev {100 * found[name][-1]['dev']:.2f}", flush=True)
    (e1, el, ew), (c1, cl, cw) = summary(found["example"]), summary(found["command"])
    print(f"\n| contender | epoch 1 (s) | later epochs (s) | process (s) |\n|---|---|---|---|\n"
          f"| example | {e1:.1f} | {el:.1f} | {ew:.0f} |\n| command | {c1:.1f} | {cl:.1f} | {cw:.0f} |\n"
          f"| example / command | {e1 / c1:.2f} | {el / cl:.2f} | {ew / cw:.2f} |")


if __name__ == "__main__":
    main()
