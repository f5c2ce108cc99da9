"""Named entities, chunking and UPOS: a BiLSTM tagger with a softmax or a CRF head.

Built on `keras_birnn.tagging`: `TokenEncoder` (string tokens -> word ids,
lower-cased and digits -> 0 unless --keep-case/--keep-digits, words seen
fewer than --min-word-count times are OOV; and character ids),
`build_tagger` (the BiLSTM-CRF of Lample et al. 2016, or the character CNN
of Ma and Hovy 2016 with --char-encoder cnn; --depth stacked BiLSTMs;
--feature-columns as extra embedded inputs; --embeddings: pretrained
vectors through `load_vectors`), `SpanF1` (training logs conlleval's span
F1 for IOB2 tag sets), `span_scores` (the dev score) and `export_tagger`.
What stays here is the data: reading the files, feeding word dropout
(each known word's id becomes the OOV id with probability --word-dropout
in training) and length-bucketed batches (`keras_birnn.tagging.batching`)
to `fit`, and the Keras twin (--layers keras: the same
model, its recurrent layers converted to keras.layers by
`kb.to_keras_bidirectional`, same weights; Keras has no CRF nor masked
max pooling, so kb.CRF and the CNN encoder stay).

Training: `model.fit` one epoch at a time, Adam with cosine decay and
gradient clipping, a fixed number of epochs (no selection on dev). Dev:
conlleval's span F1 for IOB2 tag sets, else tag accuracy (UPOS).

Data (`--data NAME`, from `keras_birnn.data.downloads`, found in --data-dir or
$KERAS_BIRNN_DATA, else downloaded and cached), or any files with --train/--dev:

    conll2002  CoNLL-2002 Spanish NER, esp.train / esp.testa (dev)
    conll2000  CoNLL-2000 chunking, train.txt: a seeded 10% held out as dev
               (`split_held_out`); its POS column is a feature by default
    ewt        UD English EWT r2.16, train / dev, UPOS (CoNLL-U)

    python examples/conll_tagging.py --data conll2002 --head crf
    python examples/conll_tagging.py --data conll2000 --head softmax,crf --char-encoder cnn
    python examples/conll_tagging.py --data ewt --embeddings glove.6B.100d.txt --freeze-embeddings
    python examples/conll_tagging.py --train my.train --dev my.dev --tag-column 1
    python examples/conll_tagging.py --data conll2000 --layers keras   # the twin from Keras's layers

Each tagger without feature columns is exported (`export_tagger`) to
`<out>/<data>_<head>_tagger/1/`: `serving_default(inputs: string [batch,
time], "" = padding) -> tags, tag_ids, confidence`. `export_tagger` takes
tokens only, so taggers with --feature-columns are not exported.
"""

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

EXAMPLES = os.path.dirname(os.path.abspath(__file__))
try:
    import keras_birnn as kb
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(EXAMPLES))
    import keras_birnn as kb  # noqa: E402
sys.path.insert(0, EXAMPLES)
import pos_tagging as pos  # noqa: E402  (Encoded, dataset, keras_twin, predict_ids: shared with the UPOS example)
from keras_birnn.cli.arguments import (  # noqa: E402
    LAYERS, add_data_arguments, check_layers, fetch_data_or_exit, finish_args, require_files,
)
from keras_birnn.data.readers import read_columns, read_conllu, read_lines, split_held_out  # noqa: E402
from keras_birnn.tagging import (  # noqa: E402
    SpanF1, TokenEncoder, build_tagger, convert_tags, export_tagger, load_vectors, span_scores,
)
from keras_birnn.tagging.builder import is_iob2  # noqa: E402

DATA = {  # name: (keras_birnn.data.downloads data set, train file, dev file or None: held out of train, format)
    "conll2002": ("conll2002_spanish", "esp.train", "esp.testa", "columns"),
    "conll2000": ("conll2000_chunking", "train.txt", None, "columns"),
    "ewt": ("ud_english_ewt", "en_ewt-ud-train.conllu", "en_ewt-ud-dev.conllu", "conllu"),
}
DATA_FEATURE_COLUMNS = {"conll2000": [1]}  # CoNLL-2000's POS tags: its shared task's input
HEADS, CHAR_ENCODERS = ("softmax", "crf"), ("gru", "lstm", "cnn")
Tagged = Tuple[List[str], List[str]]


# --- data: the files, the tags, the feature columns -------------------------------------------


def read_sentences(path: str, fmt: str, args) -> Tuple[List[Tagged], list]:
    """A file's sentences and their --feature-columns' values (`[token][column]` per sentence, or [])."""
    if fmt == "conllu":
        return [(t, upos) for t, upos, _ in read_conllu(path)], []
    sentences = read_columns(path, args.token_column, args.tag_column)
    check_feature_columns(path, args)
    columns = [read_columns(path, args.token_column, c) for c in args.feature_columns]
    return sentences, [[list(r) for r in zip(*(c[i][1] for c in columns))] for i in range(len(sentences))] \
        if columns else []


def check_feature_columns(path: str, args) -> None:
    """Each feature column must exist and be neither the token nor the tag column (that would be the answer)."""
    count = len(read_lines(path)[0].split()) if args.feature_columns else 0
    for k in args.feature_columns:
        if not -count <= k < count:
            raise ValueError(f"--feature-columns {k}: {path} has {count} columns (0 to {count - 1}).")
        for name, column in (("token", args.token_column), ("tag", args.tag_column)):
            if column % count == k % count:
                raise ValueError(f"--feature-columns {k} is the {name} column (--{name}-column {column}).")


def load_data(args):
    """(train, dev, what dev is, train features, dev features); no dev file: a seeded --held-out share of train."""
    train, train_features = read_sentences(args.train, args.format, args)
    if args.dev:
        (dev, dev_features), what = read_sentences(args.dev, args.format, args), os.path.basename(args.dev)
    else:
        kept, held = split_held_out(range(len(train)), args.held_out, args.split_seed)
        pick = lambda items, idx: [items[i] for i in idx] if items else []  # noqa: E731
        dev, dev_features, train, train_features = (pick(train, held), pick(train_features, held),
                                                    pick(train, kept), pick(train_features, kept))
        what = f"held-out {args.held_out:.0%} of {os.path.basename(args.train)}, split seed {args.split_seed}"
    n, m = args.max_train_sentences, args.max_dev_sentences
    return train[:n], dev[:m], what, train_features[:n], dev_features[:m]


def training_tags_in_iob2(train: Sequence[Tagged]) -> Tuple[List[Tagged], int]:
    """IOB training tags rewritten in IOB2 (`convert_tags`: same spans, each
    starting with B-), so every gold path obeys the CRF's "iob2" constraints;
    other tag sets unchanged. Returns the sentences and how many tags changed."""
    if not is_iob2([t for _, tags in train for t in tags]):
        return list(train), 0
    fixed = [(tokens, convert_tags(tags, "iob2", "iob2")) for tokens, tags in train]
    return fixed, sum(a != b for (_, old), (_, new) in zip(train, fixed) for a, b in zip(old, new))


def feature_lookups(values: list) -> List[keras.layers.StringLookup]:
    """One StringLookup per feature column over its training values (0 padding, 1 unseen)."""
    columns = len(values[0][0]) if values and values[0] else 0
    return [keras.layers.StringLookup(vocabulary=sorted({row[k] for s in values for row in s} - {""}),
                                      mask_token="", num_oov_indices=1) for k in range(columns)]


def build_model(args, encoder: TokenEncoder, tags: Sequence[str], head: str, features: Dict[str, int],
                embeddings: Optional[np.ndarray] = None) -> keras.Model:
    """`build_tagger` with the command line's sizes; with --layers keras, its `keras_twin`."""
    model = build_tagger(
        encoder.word_count, tags, embedding_dim=None if embeddings is not None else args.word_dim,
        embeddings=embeddings, trainable_embeddings=not args.freeze_embeddings, char_encoder=args.char_encoder,
        num_chars=encoder.char_count, char_dim=args.char_dim, char_units=args.char_units, features=features or None,
        feature_dim=args.feature_dim, hidden=args.hidden, depth=args.depth, dropout=args.dropout, head=head,
        name=f"{args.char_encoder}_bilstm_{head}_tagger")
    return pos.keras_twin(model) if check_layers(args.layers) == "keras" else model


def compile_tagger(model: keras.Model, head: str, tags: Sequence[str], learning_rate: float, steps: int) -> None:
    """Adam, cosine decay over `steps`, clipnorm 5; the CRF's NLL or masked cross-entropy; SpanF1 for IOB2 tags."""
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=max(steps, 1), alpha=0.05)
    model.compile(optimizer=keras.optimizers.Adam(schedule, clipnorm=5.0),
                  loss=kb.CRFLoss() if head == "crf" else "sparse_categorical_crossentropy",
                  metrics=[SpanF1(tags)] if is_iob2(tags) else [])


def evaluate(model: keras.Model, encoded: pos.Encoded, gold, tags: Sequence[str]) -> Dict:
    """conlleval's span scores (`span_scores`) for IOB2 tag sets, else accuracy; `score` is either."""
    predicted = [[tags[k] for k in ids] for ids in pos.predict_ids(model, encoded)]
    if is_iob2(tags):
        scores = span_scores(gold, predicted).as_dict()
        scores["score"] = scores["f1"]
    else:
        hits = sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs))
        scores = {"accuracy": hits / max(sum(map(len, gold)), 1)}
        scores["score"] = scores["accuracy"]
    return dict(scores, predicted_tags=predicted)


# --- the run -------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, checked: bad flags stop through `parser.error` (exit code 2)."""
    parser = argparse.ArgumentParser(prog="python examples/conll_tagging.py", description="BiLSTM tagger with a "
                                     "softmax or CRF head on CoNLL column files (NER, chunking) or CoNLL-U (UPOS).")
    data = parser.add_argument_group("data")
    add_data_arguments(data)
    add = data.add_argument
    add("--data", choices=sorted(DATA), help="a registered data set (default none: give --train)")
    add("--train", help="training file instead of --data (default none)")
    add("--dev", help="dev file (default: --held-out of --train)")
    add("--format", choices=("columns", "conllu"), help="default: conllu for *.conllu, else columns")
    add("--token-column", type=int, default=0, help="column files: token column (default 0)")
    add("--tag-column", type=int, default=-1, help="column files: tag column (default -1, the last)")
    add("--held-out", type=float, default=0.1, help="share of train held out as dev without a dev file (default 0.1)")
    add("--split-seed", type=int, default=0, help="seed of the held-out split (default 0)")
    add("--max-train-sentences", type=int, help="first N training sentences (default all; --quick 600)")
    add("--max-dev-sentences", type=int, help="first N dev sentences (default all; --quick 300)")
    add = parser.add_argument_group("model").add_argument
    add("--head", default="crf", help="softmax, crf, or both comma-separated (default crf)")
    add("--char-encoder", choices=CHAR_ENCODERS, default="lstm", help="default lstm")
    add("--layers", choices=LAYERS, default="kb", help="kb (default), or keras: the twin, its recurrent layers "
        "from keras.layers (kb.CRF and the CNN's pooling stay), an end-to-end benchmark")
    add("--hidden", type=int, help="BiLSTM units per direction (default 128; --quick 32)")
    add("--depth", type=int, default=1, help="stacked BiLSTMs (default 1)")
    add("--word-dim", type=int, help="word embedding size (default 100; --quick 32; with --embeddings the file's)")
    add("--embeddings", metavar="PATH", help="pretrained word vectors, word2vec/GloVe/fastText (default none)")
    add("--freeze-embeddings", action="store_true", help="keep --embeddings fixed (default: fine-tuned)")
    add("--char-dim", type=int, help="character embedding size (default 32; --quick 16)")
    add("--char-units", type=int, help="character encoder units per direction (default 32; --quick 16)")
    add("--max-chars", type=int, default=16, help="characters kept per word (default 16)")
    add("--min-word-count", type=int, default=2, help="training count for a word vector (default 2)")
    add("--keep-digits", action="store_true", help="keep digits in word keys (default: mapped to 0)")
    add("--keep-case", action="store_true", help="keep the case of word keys (default: lower-cased)")
    add("--feature-columns", type=int, nargs="*", metavar="K", help="columns embedded as word features (default: "
        "1, the POS tags, for --data conll2000, else none; no K: none)")
    add("--feature-dim", type=int, default=16, help="embedding size per feature column (default 16)")
    add = parser.add_argument_group("training").add_argument
    add("--epochs", type=int, help="training epochs (default 8; --quick 3)")
    add("--batch-size", type=int, help="default 32; --quick 16")
    add("--learning-rate", type=float, help="Adam's initial rate, cosine-decayed to 5%% (default 3e-3; --quick 1e-2)")
    add("--dropout", type=float, default=0.33, help="dropout rate (default 0.33)")
    add("--word-dropout", type=float, default=0.05, help="known word -> OOV probability in training (default 0.05)")
    add("--seed", type=int, default=0, help="random seed (default 0)")
    add = parser.add_argument_group("output").add_argument
    add("--out", default="saved_models", help="export base folder (default saved_models)")
    add("--no-export", action="store_true", help="skip the SavedModel export (default: export)")
    add("--report-json", metavar="PATH", help="also write the results to PATH as JSON (default none)")
    add("--quick", action="store_true", help="small sizes: a smoke run (default off)")
    add("--quiet", action="store_true", help="no per-epoch lines (default off)")
    return check_args(parser, parser.parse_args(argv))


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Completes the arguments; finds the files (--data: `fetch_data_or_exit`)."""
    if bool(args.data) == bool(args.train) or (args.dev and not args.train):
        parser.error("give either --data or --train (--dev needs --train)")
    if not 0 < args.held_out < 1 or not 0 <= args.word_dropout < 1:
        parser.error("--held-out must be in (0, 1) and --word-dropout in [0, 1)")
    if args.feature_columns is None:
        args.feature_columns = DATA_FEATURE_COLUMNS.get(args.data, [])
    args.format = DATA[args.data][3] if args.data else args.format or (
        "conllu" if args.train.endswith(".conllu") else "columns")
    if args.feature_columns and args.format == "conllu":
        parser.error(f"--feature-columns reads column files, received CoNLL-U ({args.data or args.train})")
    args.heads = args.head
    finish_args(parser, args, choices=("heads", HEADS), positive=(
                "epochs", "batch_size", "hidden", "word_dim", "char_dim", "char_units", "max_chars", "min_word_count",
                "feature_dim", "depth"), quick=dict(
                epochs=(3, 8), max_train_sentences=(600, None), max_dev_sentences=(300, None), hidden=(32, 128),
                word_dim=(32, 100), char_dim=(16, 32), char_units=(16, 32), batch_size=(16, 32),
                learning_rate=(1e-2, 3e-3)))
    args.name = args.data or os.path.splitext(os.path.basename(args.train))[0]
    require_files(parser, {"--train": args.train, "--dev": args.dev, "--embeddings": args.embeddings},
                  "pass existing files")
    if args.data:
        name, train, dev, _ = DATA[args.data]
        paths = fetch_data_or_exit(parser, args, name, [f for f in (train, dev) if f])
        args.train, args.dev = paths[train], dev and paths[dev]
    return args


def fit_head(head: str, args, train_set: pos.Encoded, dev_set: pos.Encoded, dev_gold, tags, encoder, features,
             embeddings) -> Tuple[keras.Model, Dict]:
    """Trains one head a fixed number of epochs; returns the model and its row of results (loss on 8
    fixed training batches before and after, each epoch's wall and CPU seconds, the dev scores)."""
    keras.utils.set_random_seed(args.seed)
    model = build_model(args, encoder, tags, head, features, embeddings)
    compile_tagger(model, head, tags, args.learning_rate, args.epochs * -(-len(train_set) // args.batch_size))
    probe = pos.dataset(train_set.batches(args.batch_size, np.random.default_rng(args.seed + 1))[:8])
    probe_loss = lambda: float(model.evaluate(probe, verbose=0, return_dict=True)["loss"])  # noqa: E731
    row = dict(head=head, params=model.count_params(), loss_before=probe_loss(), epoch_losses=[], epoch_seconds=[],
               epoch_cpu_seconds=[], train_span_f1=[], dev_curve=[])
    print(f"\n{head} head: {row['params']:,} parameters")
    rng, metric = np.random.default_rng(args.seed), "span F1" if is_iob2(tags) else "accuracy"
    for epoch in range(args.epochs):
        batches = pos.dataset(train_set.batches(args.batch_size, rng, args.word_dropout))
        began, cpu = time.perf_counter(), time.process_time()
        logs = model.fit(batches, epochs=1, verbose=0, shuffle=False).history
        row["epoch_seconds"].append(time.perf_counter() - began)
        row["epoch_cpu_seconds"].append(time.process_time() - cpu)
        row["epoch_losses"].append(float(logs["loss"][-1]))
        row["train_span_f1"] += [float(v) for v in logs.get("span_f1", [])]
        if not args.quiet:
            row["dev_curve"].append(evaluate(model, dev_set, dev_gold, tags)["score"])
            train_f1 = f", train span F1 {100 * row['train_span_f1'][-1]:.2f}" if row["train_span_f1"] else ""
            print(f"  epoch {epoch + 1}/{args.epochs}: loss {row['epoch_losses'][-1]:.4f}{train_f1}, "
                  f"{row['epoch_seconds'][-1]:.1f} s, dev {metric} {100 * row['dev_curve'][-1]:.2f}")
    began = time.perf_counter()
    row.update(evaluate(model, dev_set, dev_gold, tags), evaluate_seconds=time.perf_counter() - began)
    row.update(loss_after=probe_loss(), load=os.getloadavg()[0])
    print(f"  {head}: dev {metric} {100 * row['score']:.2f} after {sum(row['epoch_seconds']):.0f} s of fit (CPU "
          f"{np.mean(row['epoch_cpu_seconds']):.1f} s per epoch)" + ("; per type F1: " + ", ".join(
              f"{k} {100 * v['f1']:.2f}" for k, v in row["types"].items()) if "types" in row else ""))
    return model, row


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Trains each head, exports each tagger, prints the scores; returns the results."""
    args, start = parse_args(argv), time.perf_counter()
    train, dev, dev_name, train_features, dev_features = load_data(args)
    train, repaired = training_tags_in_iob2(train)
    tags = sorted({tag for _, labels in train for tag in labels})
    encoder = TokenEncoder(args.max_chars, lowercase=not args.keep_case, fold_digits=not args.keep_digits,
                           min_word_count=args.min_word_count)
    encoder.adapt([tokens for tokens, _ in train])
    embeddings = None
    if args.embeddings:
        embeddings, stats = load_vectors(args.embeddings, encoder.get_word_vocabulary(), seed=args.seed)
        print(f"Word vectors from {args.embeddings}: {stats}")
    lookups = feature_lookups(train_features) if args.feature_columns else []
    features = {f"column_{k}": lookup.vocabulary_size() for k, lookup in zip(args.feature_columns, lookups)}
    train_set = pos.Encoded(train, encoder, tags, train_features, lookups)
    dev_set = pos.Encoded(dev, encoder, tags, dev_features, lookups)
    print(f"Train {len(train)} sentences / {int(train_set.lengths.sum())} tokens, dev ({dev_name}) {len(dev)} / "
          f"{int(dev_set.lengths.sum())}; vocabulary {encoder.word_count} words, {encoder.char_count} characters, "
          f"{len(tags)} tags." + (f" {repaired} training tags rewritten in IOB2." if repaired else ""))
    rows, models, exports = [], {}, {}
    for head in args.heads:
        models[head], row = fit_head(head, args, train_set, dev_set, [t for _, t in dev], tags, encoder, features,
                                     embeddings)
        rows.append(row)
        if not args.no_export and not features:  # export_tagger takes tokens, not feature columns
            exports[head] = export_tagger(models[head], encoder, os.path.join(args.out, f"{args.name}_{head}_tagger"),
                                          tags, version=1, overwrite=True)
            print(f"  exported to {exports[head]} (string tokens in, tags out)")
        elif not args.no_export:
            print("  not exported: export_tagger takes string tokens, not --feature-columns")
    total = time.perf_counter() - start
    print(f"Done in {total:.0f} s ({args.epochs} epochs); load now {os.getloadavg()[0]:.2f}.")
    if args.report_json:
        settings = {k: v for k, v in vars(args).items() if k not in ("report_json", "head")}
        with open(args.report_json, "w", encoding="utf-8") as f:
            json.dump({"example": "conll_tagging", "dev": dev_name, "settings": settings, "exports": exports,
                       "seconds": total, "heads": [{k: v for k, v in r.items() if k != "predicted_tags"}
                                                   for r in rows]}, f, indent=1)
    return {"rows": rows, "models": models, "encoder": encoder, "tags": tags, "train": train, "dev": dev,
            "dev_features": dev_features, "feature_lookups": lookups, "dev_set": dev_set, "exports": exports,
            "seconds": total}


if __name__ == "__main__":
    run()
