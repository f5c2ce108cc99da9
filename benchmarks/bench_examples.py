"""The training examples and the demo with keras_birnn's layers and with their Keras twins (`--layers kb|keras`).

Runs examples/pos_tagging.py (one variant, the BiGRU then Dropout and a
softmax Dense, `--variants bigru`; full UD English EWT train and dev by default),
examples/sentence_classification.py (one variant, `bi-attention` by
default; the sentence polarity data) and `python -m keras_birnn.demo` (its
defaults: 12 epochs; the BiGRU's numbers), each with `--layers kb` and
`--layers keras`, each run in a fresh process, alternating round by round,
and reads the numbers each writes with `--report-json`:

- epoch 1: the first epoch's seconds (tracing and compiling included);
- later: the mean of the later epochs' seconds (the steady state);
- fit: all epochs (the tagger and the demo: the training part of each
  epoch, the dev pass apart; the classifier: each epoch with its
  validation pass, as Keras's fit runs it);
- predict: sentences per second of a second, warm pass of the example's own
  predictor over its evaluation set (the tagger: dev; the classifier: its
  held-out 10%; the demo: its 1,000 held-out sequences); the first pass
  (tracing, compiling) is shown apart;
- accuracy: dev UPOS for the tagger, held-out accuracy for the classifier
  and the demo.

Then the latency of the exported SavedModels (the tagger: both export
through `keras_birnn.tagging.export_tagger`, the same serving signature,
string tokens in, tags out; the classifier, word ids in, and the demo:
`kb.export_saved_model` against Keras's `model.export`): after each round,
the round's exports are loaded in one fresh process with
`tf.saved_model.load` and called in turn, input by input, at batch 1 (each
of 64 inputs, median) and batch 64 (median of the calls): the tagger's
first 64 dev sentences (batch 64 padded to the longest), the classifier's
64 rows of random word ids (from its vocabulary, written beside the
export), 7 to 38 words long (the polarity sentences'
5th to 95th percentile; batch 64 padded with 0, the Embedding's mask), the
demo's 64 random bit sequences of 24 steps. The classifier's and the
demo's kb exports are timed through both their signatures:
`serving_default` (inputs and `lengths`, from which it builds the mask)
and `serving_unpadded` (inputs alone: the classifier's masked by its
Embedding, the demo's every step valid), which computes what Keras's
export computes.

    python benchmarks/bench_examples.py                      # full EWT, 2 epochs: long
    python benchmarks/bench_examples.py --quick              # a smoke run: small slices and sizes
    python benchmarks/bench_examples.py --examples pos --rounds 2
    python benchmarks/bench_examples.py --baseline /tmp/base   # also kb at another checkout ("base")

With `--baseline DIR` (a checkout of earlier code, `git worktree add DIR
REF`), a third contender, `base`, runs the same kb examples with DIR's
`keras_birnn` first on the path, in the same rounds: a change's speed
measured against another checkout's, in one run, with kb/base ratios.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")
EWT = os.path.join(SHARED_DATA, "ud_english_ewt")
EXAMPLES = ("pos", "classifier", "demo")
LAYERS = ("kb", "keras", "base")  # base: kb at `--baseline DIR`

LATENCY_CHILD = r"""
import json, os, statistics, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf  # and nothing else: serving needs no keras_birnn (nor Keras)
dev_path, calls, entries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]  # entries: label=path:signature

def tagger_sentences():  # the words of the first 64 dev sentences (CoNLL-U lines with an integer ID)
    sentences, tokens = [], []
    for line in open(dev_path, encoding="utf-8"):
        columns = line.rstrip("\n").split("\t")
        if len(columns) >= 10 and columns[0].isdigit():
            tokens.append(columns[1])
        elif not line.strip() and tokens:
            sentences.append(tokens)
            tokens = []
        if len(sentences) == 64:
            return sentences

def padded(name, batch):  # the tagger: string tokens in `name`, "" padding
    width = max(len(s) for s in batch)
    return {name: tf.constant([list(s) + [""] * (width - len(s)) for s in batch])}

def word_ids(specs, name, rows):  # the classifier: rows of word ids in `name`, 0-padded to the longest
    batch = np.zeros((len(rows), max(len(r) for r in rows)), specs[name].dtype.as_numpy_dtype)
    for k, row in enumerate(rows):
        batch[k, :len(row)] = row
    inputs = {name: tf.constant(batch)}
    if "lengths" in specs:
        inputs["lengths"] = tf.constant([len(r) for r in rows], specs["lengths"].dtype)
    return inputs

def bits(specs, batch):  # the demo: 64 random bit sequences of its default length (24)
    inputs = {name: tf.constant(batch, spec.dtype) for name, spec in specs.items() if spec.dtype.is_floating}
    if "lengths" in specs:
        inputs["lengths"] = tf.fill([len(batch)], tf.constant(batch.shape[1], specs["lengths"].dtype))
    return inputs

served = {}
for entry in entries:
    label, rest = entry.split("=", 1)
    path, signature = rest.rsplit(":", 1)
    began = time.perf_counter()
    serve = tf.saved_model.load(path).signatures[signature]
    load_seconds = time.perf_counter() - began
    specs = serve.structured_input_signature[1]
    name = next(n for n in specs if n != "lengths")  # the model's own input
    if specs[name].dtype == tf.string:
        sentences = tagger_sentences()
        singles, full = [padded(name, [s]) for s in sentences], padded(name, sentences)
        words = sum(len(s) for s in sentences)
    elif specs[name].dtype.is_integer:
        with open(os.path.join(os.path.dirname(path), "vocabulary.txt"), encoding="utf-8") as f:
            vocabulary = len(f.read().split("\n")) - 1  # the export's, one word a line, ids from 0
        rng = np.random.default_rng(0)
        rows = [rng.integers(2, vocabulary, size=n) for n in rng.integers(7, 39, size=64)]
        singles, full = [word_ids(specs, name, [r]) for r in rows], word_ids(specs, name, rows)
        words = sum(map(len, rows))
    else:
        rows = np.random.default_rng(0).integers(0, 2, size=(64, 24, 1)).astype("float32")
        singles, full, words = [bits(specs, rows[i:i + 1]) for i in range(64)], bits(specs, rows), 64 * 24
    for x in singles[:3] + [full]:  # warm-up
        [t.numpy() for t in serve(**x).values()]
    served[label] = dict(serve=serve, singles=singles, full=full, words=words, load=load_seconds, one=[], many=[])

def timed(serve, x):
    began = time.perf_counter()
    [t.numpy() for t in serve(**x).values()]
    return time.perf_counter() - began

for _ in range(calls):  # the peers called in turn, input by input
    for k in range(64):
        for peer in served.values():
            peer["one"].append(timed(peer["serve"], peer["singles"][k]))
for _ in range(max(calls * 10, 10)):
    for peer in served.values():
        peer["many"].append(timed(peer["serve"], peer["full"]))
print(json.dumps({label: {"load_seconds": p["load"], "batch1_ms": 1000 * statistics.median(p["one"]),
                          "batch64_ms": 1000 * statistics.median(p["many"]), "batch64_words": p["words"],
                          "sentences": len(p["singles"])} for label, p in served.items()}))
"""


def example_command(example, layers, args, report, out, code=REPO):
    """The example's command line; `code` is the checkout whose examples run
    (the baseline runs its own, which import its own package)."""
    if example == "pos":
        command = [os.path.join(code, "examples", "pos_tagging.py"), "--train", args.train, "--dev", args.dev,
                   "--variants", args.pos_variant, "--out", out]
        if args.max_train_sentences:
            command += ["--max-train-sentences", str(args.max_train_sentences)]
        if args.max_dev_sentences:
            command += ["--max-dev-sentences", str(args.max_dev_sentences)]
        if args.no_latency:
            command.append("--no-export")
    elif example == "demo":
        command = ["-m", "keras_birnn.demo", "--out", out]
        if args.quick:
            command += ["--train-size", "200", "--test-size", "100", "--epochs", "2"]
        if args.demo_epochs:
            command += ["--epochs", str(args.demo_epochs)]
        return [sys.executable] + command + ["--layers", _library(layers), "--report-json", report, "--quiet"]
    else:
        command = [os.path.join(code, "examples", "sentence_classification.py"),
                   "--variants", args.classifier_variant, "--patience", str(args.epochs + 1)]
        if args.max_sentences:
            command += ["--max-sentences", str(args.max_sentences)]
        if getattr(args, "data_dir", None):  # its default data, sentence_polarity (keras_birnn.data.downloads)
            command += ["--data-dir", args.data_dir]
        if not args.no_latency:
            command += ["--out", out]
    command += ["--epochs", str(args.epochs), "--layers", _library(layers), "--report-json", report, "--quiet"]
    if args.quick:
        command.append("--quick")
    return [sys.executable] + command


def _library(layers: str) -> str:
    """The example's `--layers` value: the baseline runs kb's layers."""
    return "kb" if layers == "base" else layers


def run_child(command, timeout, code=REPO):
    """`command` in a fresh process with `code`'s keras_birnn first on the path
    (run from there too: `python -m` puts the working folder first)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow",
               PYTHONPATH=os.pathsep.join(p for p in (code, os.environ.get("PYTHONPATH")) if p))
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=code)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip()).splitlines() or ["(no output)"]
        return None, lines[-1][:200], seconds
    return done.stdout, None, seconds


def measure(example, layers, args, workdir):
    """One example run in a fresh process; its export stays for `latencies`."""
    tag = f"{example}_{layers}_{len(os.listdir(workdir))}"
    report, out = os.path.join(workdir, f"{tag}.json"), os.path.join(workdir, tag)
    code = args.baseline if layers == "base" else REPO
    _, error, seconds = run_child(example_command(example, layers, args, report, out, code), args.timeout, code)
    if error is not None:
        return None, error
    with open(report, encoding="utf-8") as f:
        result = json.load(f)
    result["process_seconds"] = seconds
    result["out"] = out
    return result, None


def latency_entries(example, layers, result):
    """`label=path:signature` for LATENCY_CHILD. The classifier's and the
    demo's kb exports are timed through both signatures: `serving_default`
    (inputs and lengths, which computes the mask) and `serving_unpadded`
    (inputs alone, as Keras's `model.export` takes them)."""
    path = result.get("export_path")
    if not path:
        return []
    if example in ("classifier", "demo") and layers in ("kb", "base"):
        return [f"{layers}={path}:serving_default", f"{layers}_unpadded={path}:serving_unpadded"]
    return [f"{layers}={path}:serving_default"]


def latencies(example, runs, args):
    """The round's exported models loaded in one process and called in turn."""
    entries = [e for layers, result in runs for e in latency_entries(example, layers, result)]
    if entries and not args.no_latency:
        command = [sys.executable, "-c", LATENCY_CHILD, args.dev, str(args.latency_calls)] + entries
        stdout, error, _ = run_child(command, args.timeout)
        timed = json.loads(stdout.strip().splitlines()[-1]) if stdout else {}
        for layers, result in runs:
            result["latency"] = {label: timed.get(label, {"error": error}) for label in timed or [layers]
                                 if label.split("_")[0] == layers}
    for _, result in runs:
        shutil.rmtree(result.pop("out"), ignore_errors=True)


def ratio(numerator, denominator, key) -> float:
    """Median of `key` over the runs `numerator` over its median over `denominator`."""
    return statistics.median(key(r) for r in numerator) / statistics.median(key(r) for r in denominator)


def describe(example, layers, result) -> str:
    epochs = result["epoch_seconds"]
    later = f"{statistics.mean(epochs[1:]):6.1f}" if len(epochs) > 1 else "     -"
    what = {"pos": "dev UPOS", "classifier": "held-out", "demo": "held-out (BiGRU)"}[example]
    line = (f"{example:10s} {layers:5s} {result['variant']:12s} epoch 1 {epochs[0]:6.1f} s, later {later} s | "
            f"fit {result['fit_seconds']:6.1f} s | predict {result['predict_sentences_per_second']:6.0f} "
            f"sentences/s (first pass {result['predict_first_seconds']:5.1f} s) | {what} "
            f"{100 * result['accuracy']:5.2f}% | {result['params']:,} params | "
            f"process {result['process_seconds']:.0f} s")
    for label, latency in sorted(result.get("latency", {}).items()):
        if "error" in latency:
            line += f"\n{'':17s}{label}: SavedModel latency failed: {latency['error']}"
            continue
        line += (f"\n{'':17s}{label:12s} SavedModel: batch 1 {latency['batch1_ms']:6.2f} ms (median over "
                 f"{latency['sentences']} inputs), batch {latency['sentences']} {latency['batch64_ms']:6.2f} ms "
                 f"({latency['batch64_words']} words), load {latency['load_seconds']:.1f} s")
    return line


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=EXAMPLES)
    parser.add_argument("--layers", nargs="+", default=None, choices=LAYERS,
                        help="contenders (default: kb keras, and base with --baseline)")
    parser.add_argument("--baseline", default=None,
                        help="a checkout of earlier code: its kb runs as the contender 'base'")
    parser.add_argument("--rounds", type=int, default=1, help="rounds; kb and keras alternate which runs first")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each run (default 2)")
    parser.add_argument("--train", default=os.path.join(EWT, "en_ewt-ud-train.conllu"), help="tagger: CoNLL-U train")
    parser.add_argument("--dev", default=os.path.join(EWT, "en_ewt-ud-dev.conllu"), help="tagger: CoNLL-U dev")
    parser.add_argument("--pos-variant", default="bigru", help="the tagger's --variants (default bigru)")
    parser.add_argument("--classifier-variant", default="bi-attention",
                        help="the classifier's --variants (default bi-attention)")
    parser.add_argument("--demo-epochs", type=int, default=None,
                        help="the demo's --epochs (default: its own, 12; --epochs is for the examples)")
    parser.add_argument("--max-train-sentences", type=int, default=None, help="tagger: first N training sentences")
    parser.add_argument("--max-dev-sentences", type=int, default=None, help="tagger: first N dev sentences")
    parser.add_argument("--max-sentences", type=int, default=None, help="classifier: a seeded subset of N sentences")
    parser.add_argument("--data-dir", default=os.environ.get("KERAS_BIRNN_DATA", SHARED_DATA),
                        help="classifier: its --data-dir, a local copy of the registered data (default "
                        "$KERAS_BIRNN_DATA, else ../shared/data beside the repository)")
    parser.add_argument("--quick", action="store_true",
                        help="pass --quick to the examples (small slices and sizes; --epochs still applies)")
    parser.add_argument("--no-latency", action="store_true",
                        help="skip the exports' latency (and the tagger's and the classifier's exports)")
    parser.add_argument("--latency-calls", type=int, default=3,
                        help="passes over the 64 batch-1 sentences (and 5x as many batch-64 calls); default 3")
    parser.add_argument("--timeout", type=int, default=7200, help="seconds per child process")
    args = parser.parse_args(argv)
    if min(args.rounds, args.epochs, args.latency_calls) < 1:
        parser.error("--rounds, --epochs and --latency-calls must be at least 1")
    if args.layers is None:
        args.layers = ["kb", "keras"] + (["base"] if args.baseline else [])
    if "base" in args.layers and not args.baseline:
        parser.error("--layers base needs --baseline DIR")
    if args.baseline:
        args.baseline = os.path.abspath(args.baseline)
        if not os.path.isdir(os.path.join(args.baseline, "keras_birnn")):
            parser.error(f"--baseline must be a checkout holding keras_birnn/, received {args.baseline!r}")
    print(f"Examples, keras_birnn against the Keras twins: {args.epochs} epochs, {args.rounds} round(s), "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}" + (" (--quick sizes)" if args.quick else ""),
          flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_examples_") as workdir:
        for round_ in range(args.rounds):
            for example in args.examples:
                shift = round_ % len(args.layers)
                runs = []
                for layers in args.layers[shift:] + args.layers[:shift]:
                    result, error = measure(example, layers, args, workdir)
                    if result is None:
                        print(f"{example:10s} {layers:5s} failed: {error}", flush=True)
                        continue
                    results.setdefault((example, layers), []).append(result)
                    runs.append((layers, result))
                latencies(example, runs, args)
                for layers, result in runs:
                    print(describe(example, layers, result), flush=True)
    for example in args.examples:
        ours, twin = results.get((example, "kb")), results.get((example, "keras"))
        if not ours or not twin:
            continue
        line = (f"{example}: keras/kb fit x{ratio(twin, ours, lambda r: r['fit_seconds']):.2f}, "
                f"first epoch x{ratio(twin, ours, lambda r: r['epoch_seconds'][0]):.2f}")
        if args.epochs > 1:
            line += f", later epochs x{ratio(twin, ours, lambda r: statistics.mean(r['epoch_seconds'][1:])):.2f}"
        line += f", predict throughput kb/keras x{ratio(ours, twin, lambda r: r['predict_sentences_per_second']):.2f}"
        for label in sorted({k for r in ours for k in r.get("latency", {})}):
            pairs = [(r["latency"][label], t["latency"]["keras"]) for r, t in zip(ours, twin)
                     if "batch1_ms" in r.get("latency", {}).get(label, {})
                     and "batch1_ms" in t.get("latency", {}).get("keras", {})]
            for size in ("batch1_ms", "batch64_ms") if pairs else ():
                theirs, mine = (statistics.median(p[side][size] for p in pairs) for side in (1, 0))
                line += f", {label} SavedModel {size.split('_')[0]} latency keras/kb x{theirs / mine:.2f}"
        print(line + f" (medians over {min(len(ours), len(twin))} round(s); above 1: keras_birnn faster)")
    for example in args.examples:
        ours, base = results.get((example, "kb")), results.get((example, "base"))
        if ours and base:
            line = (f"{example}: base/kb fit x{ratio(base, ours, lambda r: r['fit_seconds']):.2f}, first epoch "
                    f"x{ratio(base, ours, lambda r: r['epoch_seconds'][0]):.2f}, predict throughput kb/base "
                    f"x{ratio(ours, base, lambda r: r['predict_sentences_per_second']):.2f}")
            for label in sorted({k for r in ours for k in r.get("latency", {})}):
                theirs = label.replace("kb", "base", 1)
                pairs = [(r["latency"][label], b["latency"][theirs]) for r, b in zip(ours, base)
                         if "batch1_ms" in r.get("latency", {}).get(label, {})
                         and "batch1_ms" in b.get("latency", {}).get(theirs, {})]
                for size in ("batch1_ms", "batch64_ms") if pairs else ():
                    old, new = (statistics.median(p[side][size] for p in pairs) for side in (1, 0))
                    line += f", {label} SavedModel {size.split('_')[0]} base/kb x{old / new:.2f}"
            print(line + " (above 1: this checkout faster than --baseline)")


if __name__ == "__main__":
    main()
