"""The trainer's data: a config's `data` settings to training and dev examples.

A tagger reads CoNLL column files (`data.columns`, default tokens in the
first column and tags in the last; any other named column is a feature
column, given to the `Tagger` by name) or CoNLL-U (`data.conllu_field`,
default UPOS); a classifier reads tab-separated text and label. Without
`data.dev`, a seeded `data.held_out` share of the training file is the
development set (the same split for every seed of the run). A path
`dataset:NAME/FILE` names a file of a registered data set
(`keras_birnn.data.downloads.DATASETS`), fetched and checked on first use.

A file's tags are read in `data.scheme` ("auto": IOB2-style tags, whose
IOB1 spans read the same, or BIOES; else no spans, e.g. UPOS) and trained
in `data.train_scheme` ("auto": the file's; IOB1 becomes IOB2, so that each
gold path obeys the CRF's transition constraints).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from keras_birnn.data import downloads
from keras_birnn.data.readers import read_conll, read_conllu_column, read_tsv, split_held_out
from keras_birnn.tagging.tagger import span_scheme

DATASET_PREFIX = "dataset:"  # data.train = "dataset:conll2002_spanish/esp.train": a registered data set's file
HELD_OUT_SEED = 0  # the dev split of a file without one; fixed, so runs with other seeds compare
TAGS, TOKENS = "tags", "tokens"


class Examples(NamedTuple):
    """One split: `x` (token lists, a dict of token and feature lists, or
    texts) and `y` (tag lists or labels), in the form the task model's
    `fit` and `evaluate` take."""

    x: Any
    y: list

    def __len__(self) -> int:
        return len(self.y)


def file_format(data: Dict[str, Any], path: str) -> str:
    """`data.format`, or from the extension: `.conllu` CoNLL-U, `.tsv` tsv, else CoNLL columns."""
    if data["format"] != "auto":
        return data["format"]
    return {".conllu": "conllu", ".tsv": "tsv"}.get(os.path.splitext(path)[1].lower(), "conll")


def read_tagged(path: str, data: Dict[str, Any], fmt: str) -> List[Dict[str, List[str]]]:
    """Sentences of a tagged file as `{column: strings}` dicts, tags converted
    to the training scheme (`tag_schemes`)."""
    if fmt == "conllu":
        return read_conllu_column(path, data["conllu_field"])
    if fmt != "conll":
        raise ValueError(f"data.format = {fmt!r}: a tagger reads conll or conllu files ({path})")
    columns = data["columns"] or {TOKENS: 0, TAGS: -1}
    if TAGS not in columns:
        return read_conll(path, columns)
    file_scheme, train_scheme = tag_schemes(path, data, columns)
    return read_conll(path, columns, scheme=file_scheme, to_scheme=train_scheme)


def tag_schemes(path: str, data: Dict[str, Any], columns: Dict[str, int]) -> Tuple[Optional[str], Optional[str]]:
    """`(the file's scheme, the training scheme)` for `read_conll`; (None, None) without spans."""
    scheme = data["scheme"]
    if scheme == "auto":
        scheme = span_scheme(sorted({t for s in read_conll(path, columns) for t in s[TAGS]}))
    if scheme in (None, "none"):
        return None, None
    target = data["train_scheme"]
    if target == "auto":
        target = "bioes" if scheme == "bioes" else "iob2"
    return scheme, target


def as_examples(sentences: Sequence[Dict[str, List[str]]]) -> Examples:
    """Sentences as (token lists, or a dict with feature columns; tags)."""
    tags = [s[TAGS] for s in sentences]
    names = [name for name in (sentences[0] if sentences else {}) if name not in (TOKENS, TAGS)]
    if not names:
        return Examples([s[TOKENS] for s in sentences], tags)
    return Examples({name: [s[name] for s in sentences] for name in [TOKENS] + names}, tags)


def read_texts(path: str, data: Dict[str, Any], fmt: str) -> Examples:
    """A classifier's tsv file: texts and labels."""
    if fmt != "tsv":
        raise ValueError(f"data.format = {fmt!r}: a classifier reads tsv files ({path})")
    columns = data["columns"] or {}
    texts, labels = read_tsv(path, columns.get("text", 0), columns.get("label", 1), header=data["header"])
    return Examples(texts, labels)


def subset(examples: Examples, indices: Sequence[int]) -> Examples:
    """The examples at `indices`, in that order."""
    pick = lambda items: [items[i] for i in indices]  # noqa: E731
    x = {k: pick(v) for k, v in examples.x.items()} if isinstance(examples.x, dict) else pick(examples.x)
    return Examples(x, pick(examples.y))


def local_path(path: str) -> str:
    """`path`, or for `dataset:NAME/FILE` the local copy of a registered data
    set's file (`keras_birnn.data.downloads.fetch_data`: the mirror in
    $KERAS_BIRNN_DATA, the cache, else downloaded once; checksums checked)."""
    if not path.startswith(DATASET_PREFIX):
        return path
    name, _, file = path[len(DATASET_PREFIX):].partition("/")
    try:
        return downloads.fetch_data(name, [file])[file]
    except (downloads.DataUnavailableError, downloads.ChecksumError) as error:
        raise FileNotFoundError(f"{path}: {error}") from None


def read_file(task: str, role: str, data: Dict[str, Any]) -> Examples:
    """The examples of the file `data[role]` ("train" or "dev") for `task` ("tagger" or "classifier")."""
    path = local_path(data[role])
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data.{role} = {data[role]!r}: no such file")
    fmt = file_format(data, path)
    return read_texts(path, data, fmt) if task == "classifier" else as_examples(read_tagged(path, data, fmt))


def untagged(data: Dict[str, Any], task: str = "tagger") -> Dict[str, Any]:
    """`data` settings for reading a file that may lack the tags or labels
    (prediction): the named columns but those, no scheme."""
    if task == "classifier":
        text = (data["columns"] or {}).get("text", 0)
        return dict(data, columns={"text": text, "label": text})
    columns = {k: v for k, v in (data["columns"] or {TOKENS: 0, TAGS: -1}).items() if k != TAGS}
    return dict(data, columns=columns, scheme="none")


def read_splits(task: str, data: Dict[str, Any]) -> Tuple[Examples, Examples, str]:
    """`(train, dev, what dev is)` from a config's `data` settings.

    Raises:
        FileNotFoundError: A file that does not exist.
        DataFormatError: A malformed file (its path and line).
    """
    train = read_file(task, "train", data)
    if data["dev"]:
        dev, what = read_file(task, "dev", data), data["dev"]
    else:
        kept, held = split_held_out(list(range(len(train))), data["held_out"], HELD_OUT_SEED)
        train, dev = subset(train, kept), subset(train, held)
        what = f"a held-out {data['held_out']:.0%} of {data['train']}"
    limit = lambda examples, n: subset(examples, range(min(n, len(examples)))) if n else examples  # noqa: E731
    return limit(train, data["max_train"]), limit(dev, data["max_dev"]), what
