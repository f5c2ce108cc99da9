"""`keras-birnn`: the command line for data files and task models.

    keras-birnn train examples/configs/conll2002_ner.toml --run runs/ner
    keras-birnn train my.toml --run runs/a --set data.train=my.conll --set train.epochs=10
    keras-birnn train my.toml --run runs/a --resume
    keras-birnn data train.conll --dev dev.conll --scheme iob2
    keras-birnn evaluate ner.keras test.conll
    keras-birnn predict ner.keras test.conll --output-format jsonl
    keras-birnn export ner.keras saved_models/ner --version 3

- `train CONFIG --run DIR [--set key=value ...] [--resume]`: trains the
  config's model (`keras_birnn.training`) into the run folder DIR: its
  config.toml, checkpoint/, best.keras, history.csv, metrics.json,
  report.txt and export/<version>/; one line per epoch.
- `data FILE [--dev FILE]`: `keras_birnn.data.summary.format_summary` of
  the corpus (counts, labels, scheme violations, dev OOV rates, lengths).
MODEL below is a run folder (its best.keras) or a `.keras` file.
- `evaluate MODEL FILE`: a saved `Tagger` or `SentenceClassifier` scored on
  FILE; the metrics as JSON (sorted keys) on stdout.
- `predict MODEL FILE`: a tagger's tags, CoNLL (token, tag, confidence,
  tab-separated, a blank line between sentences) or JSON lines
  (`{"tokens", "tags", "confidence"}`); a classifier's JSON lines
  (`{"text", "label", "probability"}`).
- `export MODEL OUT`: the model's `export(OUT, version, overwrite)` for TF
  Serving; prints the version folder.

Files are read as `--format` says (default from the extension: `.conllu`
is CoNLL-U, `.tsv` tab-separated, anything else CoNLL columns; a
classifier's default is tsv). `--columns` names the columns: CoNLL
`tokens=0,tags=-1` (the default), tsv `text=0,label=1`. Models load with
`keras.saving.load_model(..., safe_mode=True)`.

Every user error (an unreadable or malformed file, a model file that holds
no task model, a tag the model does not know, an export version that
exists) ends with exit code 2 and one line on stderr, `keras-birnn: error:
...`, naming the file and line where there is one; a bad flag gets
argparse's usage line as well.
"""

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import keras

from keras_birnn import training
from keras_birnn.training import corpus as training_corpus
from keras_birnn.data.readers import (DataFormatError, read_conll, read_conllu_column, read_text, read_tsv,
                                      split_fields, split_lines)
from keras_birnn.data.summary import format_summary, summarize
from keras_birnn.tagging.classifier import SentenceClassifier
from keras_birnn.tagging.tagger import Tagger

PROG = "keras-birnn"
FORMATS = ("conll", "conllu", "tsv")
SCHEMES = ("iob1", "iob2", "bioes")
TSV_COLUMNS = ("text", "label")
EXTENSIONS = {".conllu": "conllu", ".tsv": "tsv"}
MODEL_HELP = "a run folder (its best.keras) or a .keras file of a Tagger or SentenceClassifier"


class UserError(Exception):
    """A problem with the command's input, not the program: its message is
    printed as one line and the command exits with code 2."""


class Corpus:
    """A file's examples as read for one command.

    Attributes:
        path: The file.
        sentences: Tagging formats: one `{"tokens", "tags", ...}` dict per sentence.
        texts, labels: tsv: the texts and their labels.
        lines: The 1-based line of each token (tagging) or text (tsv), in order.
    """

    def __init__(self, path: str, sentences: Optional[List[Dict[str, List[str]]]] = None,
                 texts: Optional[List[str]] = None, labels: Optional[List[str]] = None,
                 lines: Sequence[int] = ()):
        self.path, self.sentences, self.texts, self.labels, self.lines = path, sentences, texts, labels, list(lines)

    @property
    def is_texts(self) -> bool:
        return self.texts is not None


# --- the command line ------------------------------------------------------


def parse_columns_flag(value: str) -> Dict[str, int]:
    """`--columns`' `name=index,...` as a dict; argparse reports a ValueError
    as a bad value of the flag."""
    columns: Dict[str, int] = {}
    for item in value.split(","):
        name, sign, index = item.strip().partition("=")
        try:
            columns[name.strip()] = int(index)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not name=index (e.g. tokens=0,tags=-1)") from None
        if not sign or not name.strip():
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not name=index (e.g. tokens=0,tags=-1)")
    return columns


def positive_int(value: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return number


def add_format_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say how a data file is read."""
    group = parser.add_argument_group("data format")
    group.add_argument("--format", choices=FORMATS, default=None,
                       help="the file's format (default: from its extension: .conllu is conllu, .tsv is "
                       "tsv, others conll; tsv for a classifier)")
    group.add_argument("--columns", type=parse_columns_flag, default=None, metavar="NAME=I,...",
                       help="column indices, negative from the end: conll tokens=0,tags=-1 (the default); "
                       "tsv text=0,label=1 (the default)")
    group.add_argument("--conllu-column", default=None, metavar="FIELD",
                       help="conllu: the field read as tags: upos (default), xpos, deprel, feats:<Name>, ...")
    group.add_argument("--scheme", choices=SCHEMES, default=None,
                       help="the tags' span scheme: data counts its violations; evaluate checks a conll file's "
                       "tags on reading and converts them to the model's scheme")
    group.add_argument("--header", action="store_true", help="tsv: the first line names the columns")


def build_parser() -> argparse.ArgumentParser:
    """The `keras-birnn` parser and its subcommands."""
    parser = argparse.ArgumentParser(prog=PROG, description="Summarize tagging data and use saved "
                                     "keras_birnn task models (Tagger, SentenceClassifier).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser("train", help="train a model from a TOML config into a run folder")
    train.add_argument("config", metavar="CONFIG", help="a TOML config (every setting has a default; "
                       "keras_birnn.training.config)")
    train.add_argument("--run", required=True, metavar="DIR", help="the run folder (new, or with --resume its own)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                       help="override a setting, e.g. --set train.epochs=10 --set data.train=my.conll")
    train.add_argument("--resume", action="store_true", help="continue the run in DIR from its latest checkpoint")
    data = commands.add_parser("data", help="summarize a corpus: counts, labels, scheme violations, dev OOV rates")
    data.add_argument("file", metavar="FILE", help="the training file")
    data.add_argument("--dev", metavar="FILE", default=None, help="a development file (OOV rates, unseen labels)")
    evaluate = commands.add_parser("evaluate", help="score a saved model on a file; metrics as JSON")
    predict = commands.add_parser("predict", help="tag (or classify) a file with a saved model")
    for sub in (evaluate, predict):
        sub.add_argument("model", metavar="MODEL", help=MODEL_HELP)
        sub.add_argument("file", metavar="FILE", help="the data file")
    predict.add_argument("--output-format", choices=("conll", "jsonl"), default="conll",
                         help="tagger: conll (default) or jsonl; a classifier writes jsonl")
    for sub in (data, evaluate, predict):
        add_format_arguments(sub)
    export = commands.add_parser("export", help="export a saved model as a SavedModel for TF Serving")
    export.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    export.add_argument("out", metavar="OUT", help="the model's base folder; the export goes to OUT/<version>/")
    export.add_argument("--version", type=positive_int, default=None, help="default: the next free integer")
    export.add_argument("--overwrite", action="store_true", help="replace an existing version folder")
    for sub in (train, data, evaluate, predict, export):
        sub.set_defaults(parser=sub)  # a command's own errors show its usage line
    return parser


def check_format_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, fmt: str,
                           needs_tags: bool) -> None:
    """Stops through `parser.error` when the format flags do not fit `fmt`."""
    columns = args.columns
    if fmt == "conllu" and columns is not None:
        parser.error("--columns applies to conll and tsv files; conllu takes --conllu-column")
    if fmt == "tsv" and columns is not None and set(columns) - set(TSV_COLUMNS):
        parser.error(f"--columns: a tsv file has the columns {','.join(TSV_COLUMNS)}, received {','.join(columns)}")
    if fmt == "conll" and columns is not None:
        wanted = ("tokens", "tags") if needs_tags else ("tokens",)
        missing = [name for name in wanted if name not in columns]
        if missing:
            parser.error(f"--columns must name {' and '.join(missing)}, received {','.join(columns)}")
    if args.scheme is not None and fmt == "tsv":
        parser.error("--scheme applies to tagged files (conll, conllu), not tsv")


def file_format(args: argparse.Namespace, path: str, default: Optional[str] = None) -> str:
    """`--format`, else `default`, else the format of `path`'s extension."""
    if args.format is not None:
        return args.format
    return default or EXTENSIONS.get(os.path.splitext(path)[1].lower(), "conll")


# --- reading ---------------------------------------------------------------


def read_corpus(path: str, fmt: str, args: argparse.Namespace, needs_tags: bool = True,
                scheme: Optional[str] = None, to_scheme: Optional[str] = None) -> Corpus:
    """The file read as `fmt` with the format flags; a UserError for a file
    that is missing, unreadable or malformed (the reader's file:line).
    A conll file's tags are checked against `scheme` and converted to
    `to_scheme` when given (`read_conll`)."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    try:
        if fmt == "tsv":
            columns = dict(args.columns or {})
            text_column = columns.get("text", 0)
            label_column = columns.get("label", 1 if needs_tags else text_column)
            texts, labels = read_tsv(path, text_column, label_column, header=args.header)
            return Corpus(path, texts=texts, labels=labels, lines=token_lines(path, fmt, args.header))
        if fmt == "conllu":
            sentences = read_conllu_column(path, args.conllu_column or "upos")
        else:
            columns = args.columns or ({"tokens": 0, "tags": -1} if needs_tags else {"tokens": 0})
            if "tags" not in columns:
                scheme = to_scheme = None
            sentences = read_conll(path, columns, scheme=scheme, to_scheme=to_scheme if scheme else None)
    except (DataFormatError, OSError) as error:
        raise UserError(describe(path, error)) from None
    except ValueError as error:  # an argument the reader rejects, e.g. an unknown CoNLL-U field
        raise UserError(f"{path}: {error}") from None
    return Corpus(path, sentences=sentences, lines=token_lines(path, fmt, args.header))


def describe(path: str, error: Exception) -> str:
    """One line for a reading error: DataFormatError's `path:line: message`,
    an OSError's reason after the path."""
    if isinstance(error, DataFormatError):
        return str(error)
    return f"{path}: {getattr(error, 'strerror', None) or error}"


def token_lines(path: str, fmt: str, header: bool = False) -> List[int]:
    """The line number of each token (conll, conllu) or text (tsv) the
    readers read from `path`, in order: where an unknown tag is reported."""
    numbered = list(enumerate(split_lines(read_text(path, "utf-8")), start=1))
    if fmt == "conll":
        return [n for n, line in numbered if split_fields(line) and split_fields(line)[0] != "-DOCSTART-"]
    if fmt == "conllu":
        # Word lines only: comments, multiword ranges ("1-2") and empty nodes ("8.1") give no token.
        return [n for n, line in numbered if line.strip() and not line.startswith("#")
                and not any(mark in line.split("\t")[0] for mark in "-.")]
    lines = [n for n, line in numbered if line.strip()]
    return lines[1:] if header else lines


def first_unknown(corpus: Corpus, known: Sequence[str]) -> Optional[Tuple[int, str]]:
    """`(line, tag)` of the first gold tag (or label) not in `known`, or None."""
    known_set = set(known)
    gold = corpus.labels if corpus.is_texts else [t for s in corpus.sentences for t in s["tags"]]
    for line, tag in zip(corpus.lines, gold):
        if tag not in known_set:
            return line, tag
    return None


# --- models ----------------------------------------------------------------


def load_task_model(path: str):
    """The `Tagger` or `SentenceClassifier` saved at `path`, or a run folder's
    best.keras (safe mode); a UserError for a missing file, one Keras cannot
    load, or another model."""
    if os.path.isdir(path):
        path = os.path.join(path, "best.keras")
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    try:
        model = keras.saving.load_model(path, safe_mode=True)
    except Exception as error:  # Keras raises many kinds for a file that is no model it can load
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{path}: not a loadable .keras model ({type(error).__name__}: {first})") from None
    if not isinstance(model, (Tagger, SentenceClassifier)):
        raise UserError(f"{path}: holds a {type(model).__name__}, not a keras_birnn Tagger or SentenceClassifier")
    return model


def run_settings(args: argparse.Namespace) -> Optional[dict]:
    """A run folder's data settings, when MODEL is one and no format flag is given:
    FILE is then read as the run read its training file."""
    flags = (args.format, args.columns, args.conllu_column, args.scheme)
    saved = os.path.join(args.model, "config.toml")
    if not os.path.isdir(args.model) or not os.path.isfile(saved) or any(f is not None for f in flags):
        return None
    try:
        return training.resolve(saved)
    except training.ConfigError as error:
        raise UserError(str(error)) from None


def run_corpus(settings: dict, path: str, needs_tags: bool) -> Corpus:
    """FILE read with a run's data settings (`keras_birnn.training.corpus`)."""
    data = settings["data"] if needs_tags else training_corpus.untagged(settings["data"], settings["task"])
    fmt = training_corpus.file_format(data, path)
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    try:
        if settings["task"] == "classifier":
            found = training_corpus.read_texts(path, data, fmt)
            return Corpus(path, texts=found.x, labels=found.y, lines=token_lines(path, fmt, data["header"]))
        return Corpus(path, sentences=training_corpus.read_tagged(path, data, fmt), lines=token_lines(path, fmt))
    except (DataFormatError, OSError) as error:
        raise UserError(describe(path, error)) from None
    except ValueError as error:
        raise UserError(f"{path}: {error}") from None


def tagger_inputs(model: Tagger, found: Corpus):
    """The tagger's `x` for the file's sentences: token lists, or with feature
    columns the dict form; a UserError when the file lacks a feature column."""
    tokens = [s["tokens"] for s in found.sentences]
    names = model.feature_names
    if not names:
        return tokens
    missing = [name for name in names if found.sentences and name not in found.sentences[0]]
    if missing:
        raise UserError(f"{found.path}: the model reads the feature column(s) {', '.join(missing)}: name them "
                        f"with --columns, e.g. tokens=0,{missing[0]}=1,tags=-1")
    return dict({"tokens": tokens}, **{name: [s[name] for s in found.sentences] for name in names})


def model_corpus(parser: argparse.ArgumentParser, args: argparse.Namespace, model,
                 needs_tags: bool) -> Corpus:
    """FILE read in the format that `model` takes (a tagger: conll or
    conllu; a classifier: tsv)."""
    settings = run_settings(args)
    if settings is not None:
        return run_corpus(settings, args.file, needs_tags)
    is_classifier = isinstance(model, SentenceClassifier)
    fmt = file_format(args, args.file, "tsv" if is_classifier else None)
    if is_classifier != (fmt == "tsv"):
        parser.error(f"--format {fmt}: a {type(model).__name__} reads "
                     + ("tsv files" if is_classifier else "conll or conllu files"))
    check_format_arguments(parser, args, fmt, needs_tags)
    if not needs_tags or is_classifier:
        return read_corpus(args.file, fmt, args, needs_tags)
    # The gold tags in the model's span scheme, so that evaluate scores spans alike.
    return read_corpus(args.file, fmt, args, needs_tags, args.scheme, model.scheme)


# --- the subcommands -------------------------------------------------------


def run_data(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Prints the corpus summary of FILE (and --dev)."""
    splits = []
    for path in [args.file] + ([args.dev] if args.dev else []):
        fmt = file_format(args, path)
        check_format_arguments(parser, args, fmt, needs_tags=True)
        corpus = read_corpus(path, fmt, args)
        # A text's label is counted once, as the one tag of its tokens.
        splits.append(corpus.sentences if not corpus.is_texts else
                      [{"tokens": text.split(), "tags": [label]} for text, label in zip(corpus.texts, corpus.labels)])
    print(format_summary(summarize(splits[0], splits[1] if len(splits) > 1 else None, scheme=args.scheme)))


def run_evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Prints the model's metrics on FILE as JSON."""
    model = load_task_model(args.model)
    corpus = model_corpus(parser, args, model, needs_tags=True)
    known = model.labels if corpus.is_texts else model.tags
    unknown = first_unknown(corpus, known)
    if unknown is not None:
        raise UserError(f"{corpus.path}:{unknown[0]}: {'label' if corpus.is_texts else 'tag'} {unknown[1]!r} "
                        f"is not one of the model's ({', '.join(known)})")
    if corpus.is_texts:
        metrics = model.evaluate(corpus.texts, corpus.labels)
    else:
        metrics = model.evaluate(tagger_inputs(model, corpus), [s["tags"] for s in corpus.sentences])
    print(json.dumps(metrics, sort_keys=True, default=plain))


def plain(value):
    """JSON's fallback: NumPy scalars and arrays as Python numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def run_predict(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Prints the model's predictions on FILE."""
    model = load_task_model(args.model)
    corpus = model_corpus(parser, args, model, needs_tags=False)
    if corpus.is_texts:
        for text, found in zip(corpus.texts, model.predict(corpus.texts)):
            print(json.dumps({"text": text, "label": found.label, "probability": found.probability}))
        return
    tokens = [s["tokens"] for s in corpus.sentences]
    for words, found in zip(tokens, model.predict(tagger_inputs(model, corpus))):
        if args.output_format == "jsonl":
            print(json.dumps({"tokens": words, "tags": found.tags, "confidence": found.confidence}))
        else:
            print("\n".join(f"{w}\t{t}\t{c:.6f}" for w, t, c in zip(words, found.tags, found.confidence)) + "\n")


def run_export(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exports the model and prints the version folder."""
    model = load_task_model(args.model)
    try:
        folder = model.export(args.out, version=args.version, overwrite=args.overwrite)
    except FileExistsError as error:
        raise UserError(str(error)) from None
    print(folder)


def run_train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Trains the config's model into the run folder."""
    try:
        settings = training.resolve(args.config, args.overrides)
        training.train(settings, args.run, resume=args.resume, log=lambda line: print(line, flush=True))
    except (training.ConfigError, training.RunError, training.ClusterError) as error:
        raise UserError(str(error)) from None
    except DataFormatError as error:
        raise UserError(str(error)) from None
    except (FileNotFoundError, ValueError) as error:  # a data file named by the config, a setting the model refuses
        raise UserError(f"{args.config}: {error}") from None


COMMANDS = {"train": run_train, "data": run_data, "evaluate": run_evaluate, "predict": run_predict, "export": run_export}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs `keras-birnn` with `argv` (default: the process's arguments).

    Args:
        argv: The arguments after the program name.

    Returns:
        The exit code: 0, or 2 for a user error (its message on stderr).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        COMMANDS[args.command](args.parser, args)
    except SystemExit as stop:  # argparse: --help (0) or a bad flag (2, usage printed)
        return stop.code if isinstance(stop.code, int) else 2
    except UserError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    return 0
