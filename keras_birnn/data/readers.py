"""Readers for tagging and classification data: CoNLL-U treebanks, CoNLL
column files (CoNLL-2000 chunking, CoNLL-2002/2003 named entities), one
sentence a line with its tags, tab-separated texts with labels, and
sentence polarity files.

Plain Python (no TensorFlow): they return lists that a trainer turns into
tensors, on every Keras backend.

Two generations of readers live here. `read_conllu`, `read_columns`,
`read_lines` and `read_polarity` return tuples and read UTF-8, else
Latin-1 (`encoding=None`). `read_conll`, `read_conllu_column`,
`read_tagged_lines` and `read_tsv` return a dict of equal-length string
lists per sentence (or `(texts, labels)`), read UTF-8 unless told
otherwise, and reject what they cannot read: every reader raises
`DataFormatError` (a ValueError) naming the file and the line.

    >>> from keras_birnn.data.readers import (
    ...     parse_columns, read_columns, read_conllu, read_polarity, split_held_out)

The readers take the corpora's files, which the examples download (the
doctests have no such files, so these lines are skipped there):

    >>> sentences = read_conllu("en_ewt-ud-dev.conllu")  # doctest: +SKIP
    >>> tokens, upos, xpos = sentences[0]  # doctest: +SKIP
    >>> chunks = read_columns("train.txt")  # doctest: +SKIP
    >>> texts, labels = read_polarity("rt-polarity.pos", "rt-polarity.neg")  # doctest: +SKIP
    >>> ner = read_conll("eng.train", scheme="iob1", to_scheme="iob2")  # doctest: +SKIP

`read_columns` parses a file's text with `parse_columns` (word POS chunk:
the last column is the tag), and each `read_*` has such a `parse_*`:

    >>> chunks = parse_columns("He PRP B-NP\\nran VBD B-VP\\n\\nGo VB B-VP\\n")
    >>> tokens, tags = chunks[0]
    >>> tokens, tags
    (['He', 'ran'], ['B-NP', 'B-VP'])
    >>> train, held_out = split_held_out(chunks * 5, fraction=0.1, seed=0)
    >>> len(train), len(held_out)
    (9, 1)
"""

import os
import random
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from keras_birnn.crf.schemes import check_scheme
from keras_birnn.tagging.spans import convert_tags, tag_parts

Sentence = Tuple[List[str], List[str], List[str]]
Tagged = Tuple[List[str], List[str]]
# One sentence of the dict readers: column name -> one string per token.
Columns = Dict[str, List[str]]
PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")

_ID, _FORM, _UPOS, _XPOS = 0, 1, 3, 4
CONLLU_FIELDS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
DEFAULT_COLUMNS: Mapping[str, int] = {"tokens": 0, "tags": -1}
ASCII_BLANKS = re.compile(r"[ \t]+")


class DataFormatError(ValueError):
    """A data file the readers cannot read, with where: `path:line: message`.

    Attributes:
        path: The file (or the `source` name given to a `parse_*` function).
        line: The 1-based line number the problem is on.
        message: What is wrong there.

    Example:

    >>> from keras_birnn.data.readers import DataFormatError
    >>> error = DataFormatError("train.conll", 17, "expected 3 columns, found 2")
    >>> str(error), error.line, isinstance(error, ValueError)
    ('train.conll:17: expected 3 columns, found 2', 17, True)
    """

    def __init__(self, path: PathLike, line: int, message: str):
        self.path = os.fspath(path)
        self.line = line
        self.message = message
        super().__init__(f"{self.path}:{line}: {message}")

    def __reduce__(self):
        # Rebuilds from the three fields (the default would pass the one
        # formatted string back to __init__), so the error pickles.
        return type(self), (self.path, self.line, self.message)


def read_text(path: PathLike, encoding: Optional[str] = None) -> str:
    """A file's text, without a leading byte order mark.

    Args:
        path: The file.
        encoding: A codec name, e.g. `"utf-8"`: bytes it cannot decode raise a
            `DataFormatError` naming the first line that has them. None:
            UTF-8, else ISO-8859-1 for files that are not (the original Pang
            & Lee and CoNLL-2002 releases are Latin-1).

    Returns:
        The decoded text.

    Example:

    >>> from keras_birnn.data.readers import read_text
    >>> read_text("notes.txt", encoding="utf-8")  # doctest: +SKIP
    """
    source = os.fspath(path)
    with open(source, "rb") as f:
        data = f.read()
    if encoding is None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("latin-1")
        return text.lstrip("\ufeff")
    try:
        return data.decode(encoding).lstrip("\ufeff")
    except UnicodeDecodeError as error:
        line = data[: error.start].decode(encoding, errors="replace").count("\n") + 1
        bad = data[error.start : error.end]
        raise DataFormatError(source, line, f"bytes {bad!r} are not valid {encoding} ({error.reason})") from None


def split_lines(text: str) -> List[str]:
    """`text`'s lines at "\\n" only, each without a trailing "\\r".

    Unlike `str.splitlines`, characters such as U+0085 or U+2028 inside a
    token neither split it nor shift the line numbers of the errors.
    """
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def split_fields(line: str) -> List[str]:
    """A column line's fields, separated by runs of spaces and tabs.

    Only those: `str.split()` would also split at a no-break space or
    U+2028 inside a token (French "1\\u00a0000").
    """
    line = line.strip(" \t")
    return ASCII_BLANKS.split(line) if line else []


def no_sentence(source: str, text: str) -> DataFormatError:
    """The error for a file with no sentence, at its last line (1 when empty)."""
    what = "the file is empty" if not text.strip() else "only blank lines, comments or -DOCSTART- lines"
    return DataFormatError(source, max(1, len(split_lines(text))), f"no sentence: {what}")


def parse_conllu(text: str, source: str = "<string>") -> List[Sentence]:
    """Sentences of CoNLL-U `text` as `(tokens, upos, xpos)` lists.

    Only syntactic words are kept: comment lines (`# ...`), multiword-token
    ranges (ID `1-2`, the surface form that the following words split) and
    empty nodes (ID `8.1`, enhanced-graph words with no surface form) are
    skipped. Sentences end at a blank line (a missing final blank line is
    tolerated). An XPOS of `_` stays `"_"`.

    Raises:
        DataFormatError: a word line with fewer than 10 tab-separated columns
            or a non-integer ID, naming `source` and the line number.
    """
    sentences: List[Sentence] = []
    tokens: List[str] = []
    upos: List[str] = []
    xpos: List[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            if tokens:
                sentences.append((tokens, upos, xpos))
                tokens, upos, xpos = [], [], []
            continue
        if line.startswith("#"):
            continue
        columns = line.split("\t")
        if len(columns) < 10:
            raise DataFormatError(
                source, number,
                f"a CoNLL-U word line needs 10 tab-separated columns, found {len(columns)}: {line[:80]!r}",
            )
        if not is_word_id(columns[_ID], source, number):
            continue  # multiword-token range or empty node
        tokens.append(columns[_FORM])
        upos.append(columns[_UPOS])
        xpos.append(columns[_XPOS])
    if tokens:
        sentences.append((tokens, upos, xpos))
    return sentences


def is_word_id(word_id: str, source: str, number: int) -> bool:
    """Whether a CoNLL-U ID is a syntactic word's (`3`), not a multiword
    range (`1-2`) or an empty node (`8.1`); a DataFormatError for anything else."""
    if "-" in word_id or "." in word_id:
        return False
    if not word_id.isdigit():
        raise DataFormatError(source, number, f"invalid word ID {word_id!r}")
    return True


def read_conllu(path: PathLike, encoding: Optional[str] = None) -> List[Sentence]:
    """Reads a CoNLL-U file: a list of `(tokens, upos, xpos)`, one per sentence.

    See `parse_conllu` for what is skipped (comments, blank lines,
    multiword-token ranges like `1-2`, empty nodes like `8.1`).

    Args:
        path: The file.
        encoding: As in `read_text` (None: UTF-8, else Latin-1).
    """
    return parse_conllu(read_text(path, encoding), source=os.fspath(path))


def parse_columns(text: str, source: str = "<string>", token_column: int = 0, tag_column: int = -1) -> List[Tagged]:
    """Sentences of a CoNLL column file as `(tokens, tags)` lists.

    One token a line, columns separated by spaces or tabs, a blank line
    between sentences (several blank lines, a missing final one and CRLF
    line ends are tolerated). `-DOCSTART-` lines (document breaks in
    CoNLL-2002 Dutch and CoNLL-2003) are skipped. Which column holds what:
    CoNLL-2000 chunking is `word POS chunk`, CoNLL-2002 `word tag` in the
    original release and `word POS tag` as distributed with NLTK; the
    defaults (first and last column) read all of them. An empty text gives
    no sentence (`parse_conll` raises instead).

    Args:
        text: The file's contents.
        source: A name for error messages (the path).
        token_column: Index of the token column (negative counts from the end).
        tag_column: Index of the tag column (negative counts from the end).

    Raises:
        DataFormatError: a line with too few columns, naming `source` and the line number.
    """
    sentences: List[Tagged] = []
    tokens: List[str] = []
    tags: List[str] = []
    # Columns a line needs: a token and a tag, and the indices must exist.
    needed = max(2, columns_needed((token_column, tag_column)))
    for number, line in enumerate(text.splitlines(), start=1):
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if tokens:
                sentences.append((tokens, tags))
                tokens, tags = [], []
            continue
        if len(columns) < needed:
            raise DataFormatError(
                source, number,
                f"a token line needs at least {needed} columns (token column {token_column}, "
                f"tag column {tag_column}), found {len(columns)}: {line[:80]!r}",
            )
        tokens.append(columns[token_column])
        tags.append(columns[tag_column])
    if tokens:
        sentences.append((tokens, tags))
    return sentences


def columns_needed(indices) -> int:
    """How many columns a line needs for every index in `indices` to exist
    (`2` needs 3, `-1` needs 1)."""
    return max((c + 1 if c >= 0 else -c for c in indices), default=0)


def read_columns(path: PathLike, token_column: int = 0, tag_column: int = -1,
                 encoding: Optional[str] = None) -> List[Tagged]:
    """Reads a CoNLL column file: a list of `(tokens, tags)`, one per sentence.

    See `parse_columns` for the format and the column indices.

    Args:
        path: The file.
        token_column: Index of the token column.
        tag_column: Index of the tag column.
        encoding: As in `read_text` (None: UTF-8, else Latin-1: the original
            CoNLL-2002 files are Latin-1).
    """
    return parse_columns(read_text(path, encoding), os.fspath(path), token_column, tag_column)


def check_width(fields: Sequence[str], width: Optional[Tuple[int, int]], needed: int,
                source: str, number: int) -> Tuple[int, int]:
    """`(columns, line)` of the file's first data line, checking line `number`.

    The first data line must have `needed` columns or more, and every later
    one as many as it: a DataFormatError names the line where that fails.
    """
    if width is None:
        if len(fields) < needed:
            raise DataFormatError(source, number, f"expected at least {needed} columns, found {len(fields)}")
        return len(fields), number
    if len(fields) != width[0]:
        raise DataFormatError(
            source, number, f"expected {width[0]} columns, found {len(fields)} (line {width[1]} has {width[0]})"
        )
    return width


def checked_schemes(columns: Mapping[str, int], scheme: Optional[str],
                    to_scheme: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    """`(scheme, to_scheme)` lower-cased, or a ValueError for an unknown one,
    a `to_scheme` without its `scheme`, or either without a "tags" column."""
    if to_scheme is not None and scheme is None:
        raise ValueError("`to_scheme` needs `scheme`: the scheme the file's tags are written in.")
    if scheme is not None and "tags" not in columns:
        raise ValueError(f"`scheme` applies to a 'tags' column, and `columns` has none: {dict(columns)}.")
    scheme = None if scheme is None else check_scheme(scheme)
    return scheme, None if to_scheme is None else check_scheme(to_scheme, "to_scheme")


def sentence_columns(rows: Sequence[Tuple[int, List[str]]], columns: Mapping[str, int], source: str,
                     scheme: Optional[str], to_scheme: Optional[str]) -> Columns:
    """One sentence's dict from its `(line number, fields)` rows; with
    `scheme` its tags are checked against it (a DataFormatError names the
    line of a tag that does not fit) and, with `to_scheme`, converted."""
    sentence = {name: [fields[index] for _, fields in rows] for name, index in columns.items()}
    if scheme is None:
        return sentence
    for (number, _), tag in zip(rows, sentence["tags"]):
        try:
            tag_parts(tag, scheme)
        except ValueError:
            raise DataFormatError(source, number, f"tag {tag!r} does not fit the {scheme.upper()} scheme") from None
    if to_scheme is not None:
        sentence["tags"] = convert_tags(sentence["tags"], scheme, to_scheme)
    return sentence


def parse_conll(text: str, columns: Optional[Mapping[str, int]] = None, source: str = "<string>",
                scheme: Optional[str] = None, to_scheme: Optional[str] = None) -> List[Columns]:
    """Sentences of a CoNLL column file, each a dict of columns by name.

    One token a line, columns separated by spaces or tabs, a blank line
    between sentences (several blank lines, a missing final one and CRLF
    line ends are tolerated); `-DOCSTART-` lines are skipped (and end a
    sentence). Every token line must have as many columns as the first.

    Args:
        text: The file's contents.
        columns: Name -> column index (negative counts from the end); default
            `{"tokens": 0, "tags": -1}`. Add features, e.g. `"pos": 1`.
        source: A name for error messages (the path).
        scheme: `"iob1"`, `"iob2"` or `"bioes"`: the scheme of the "tags"
            column, whose tags are checked against it.
        to_scheme: Convert the tags to this scheme (`convert_tags`: same spans).

    Returns:
        A list of `{name: [one string per token]}`, one per sentence.

    Raises:
        DataFormatError: too few columns, a different column count than the
            first token line, a tag that does not fit `scheme`, or no sentence.

    Example:

    >>> from keras_birnn.data.readers import parse_conll
    >>> text = "-DOCSTART- -X- O\\n\\nEU NNP I-ORG\\nrejects VBZ O\\n\\nPeter NNP I-PER\\n"
    >>> parse_conll(text, {"tokens": 0, "pos": 1, "tags": 2}, scheme="iob1", to_scheme="bioes")[0]
    {'tokens': ['EU', 'rejects'], 'pos': ['NNP', 'VBZ'], 'tags': ['S-ORG', 'O']}
    """
    columns = dict(DEFAULT_COLUMNS if columns is None else columns)
    if not columns:
        raise ValueError("`columns` must name at least one column, e.g. {'tokens': 0}.")
    scheme, to_scheme = checked_schemes(columns, scheme, to_scheme)
    needed, width = columns_needed(columns.values()), None
    sentences: List[Columns] = []
    rows: List[Tuple[int, List[str]]] = []
    for number, line in enumerate(split_lines(text) + [""], start=1):
        fields = split_fields(line)
        if fields and fields[0] != "-DOCSTART-":
            width = check_width(fields, width, needed, source, number)
            rows.append((number, fields))
        elif rows:
            sentences.append(sentence_columns(rows, columns, source, scheme, to_scheme))
            rows = []
    if not sentences:
        raise no_sentence(source, text)
    return sentences


def read_conll(path: PathLike, columns: Optional[Mapping[str, int]] = None, encoding: str = "utf-8",
               scheme: Optional[str] = None, to_scheme: Optional[str] = None) -> List[Columns]:
    """Reads a CoNLL column file (CoNLL-2000, CoNLL-2002, CoNLL-2003 and the like).

    See `parse_conll` for the format and the arguments.

    Args:
        path: The file.
        columns: Name -> column index; default `{"tokens": 0, "tags": -1}`.
        encoding: The file's encoding (bytes it cannot decode: DataFormatError).
        scheme: The tags' scheme (`"iob1"`, `"iob2"`, `"bioes"`), checked.
        to_scheme: Convert the tags to this scheme.

    Returns:
        A list of `{name: [one string per token]}`, one per sentence.

    Example:

    >>> from keras_birnn.data.readers import read_conll
    >>> sentences = read_conll("eng.train", {"tokens": 0, "pos": 1, "tags": 3},
    ...                        scheme="iob1", to_scheme="iob2")  # doctest: +SKIP
    """
    return parse_conll(read_text(path, encoding), columns, os.fspath(path), scheme, to_scheme)


def conllu_picker(column: str) -> Callable[[Sequence[str]], str]:
    """A function from a CoNLL-U line's 10 fields to the value of `column`:
    a field name (`"upos"`, `"xpos"`, `"deprel"`, ...) or `"feats:<Name>"`
    / `"misc:<Name>"` (the attribute's value, `"_"` where absent)."""
    field, _, name = column.partition(":")
    if field not in CONLLU_FIELDS or (name and field not in ("feats", "misc")) or (_ and not name):
        raise ValueError(
            f"`column` must be one of {CONLLU_FIELDS} or 'feats:<Name>' / 'misc:<Name>', received {column!r}."
        )
    index = CONLLU_FIELDS.index(field)
    if not name:
        return lambda fields: fields[index]

    def attribute(fields: Sequence[str]) -> str:
        for pair in fields[index].split("|"):
            key, _, value = pair.partition("=")
            if key == name:
                return value
        return "_"

    return attribute


def parse_conllu_column(text: str, column: str = "upos", source: str = "<string>") -> List[Columns]:
    """Sentences of CoNLL-U `text` as `{"tokens": forms, "tags": column values}`.

    Comments, multiword-token ranges (`1-2`) and empty nodes (`8.1`) are
    skipped as in `parse_conllu`; blank lines end sentences.

    Args:
        text: The file's contents.
        column: `"upos"`, `"xpos"`, `"deprel"`, `"lemma"` (any field name), or
            `"feats:<Name>"`: that feature's value, `"_"` on a word without it.
        source: A name for error messages (the path).

    Returns:
        A list of `{"tokens": [...], "tags": [...]}`, one per sentence.

    Raises:
        DataFormatError: a line with other than 10 tab-separated fields, a
            non-integer ID, or no sentence.

    Example:

    >>> from keras_birnn.data.readers import parse_conllu_column
    >>> text = ("1\\tDogs\\tdog\\tNOUN\\tNNS\\tNumber=Plur\\t2\\tnsubj\\t_\\t_\\n"
    ...         "2\\tbark\\tbark\\tVERB\\tVBP\\t_\\t0\\troot\\t_\\t_\\n")
    >>> parse_conllu_column(text, "feats:Number")
    [{'tokens': ['Dogs', 'bark'], 'tags': ['Plur', '_']}]
    """
    pick = conllu_picker(column)
    sentences: List[Columns] = []
    tokens: List[str] = []
    tags: List[str] = []
    for number, line in enumerate(split_lines(text) + [""], start=1):
        if not line.strip():
            if tokens:
                sentences.append({"tokens": tokens, "tags": tags})
                tokens, tags = [], []
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise DataFormatError(source, number, f"expected 10 tab-separated fields, found {len(fields)}")
        if is_word_id(fields[_ID], source, number):
            tokens.append(fields[_FORM])
            tags.append(pick(fields))
    if not sentences:
        raise no_sentence(source, text)
    return sentences


def read_conllu_column(path: PathLike, column: str = "upos", encoding: str = "utf-8") -> List[Columns]:
    """Reads one column of a CoNLL-U file as tags (see `parse_conllu_column`).

    Args:
        path: The file.
        column: `"upos"`, `"xpos"`, `"deprel"`, ... or `"feats:<Name>"`.
        encoding: The file's encoding (bytes it cannot decode: DataFormatError).

    Returns:
        A list of `{"tokens": [...], "tags": [...]}`, one per sentence.

    Example:

    >>> from keras_birnn.data.readers import read_conllu_column
    >>> cases = read_conllu_column("de_gsd-ud-train.conllu", "feats:Case")  # doctest: +SKIP
    """
    return parse_conllu_column(read_text(path, encoding), column, os.fspath(path))


def parse_tagged_lines(text: str, source: str = "<string>", delimiter: str = "\t") -> List[Columns]:
    """Sentences written one a line: tokens, `delimiter`, then as many tags
    (each side separated by whitespace), e.g. `"Dogs bark\\tNOUN VERB"`.
    Blank lines are skipped.

    Args:
        text: The file's contents.
        source: A name for error messages (the path).
        delimiter: What separates the tokens from the tags.

    Returns:
        A list of `{"tokens": [...], "tags": [...]}`, one per sentence.

    Raises:
        DataFormatError: a line without exactly one `delimiter`, a line with
            more or fewer tags than tokens, or no sentence.

    Example:

    >>> from keras_birnn.data.readers import parse_tagged_lines
    >>> parse_tagged_lines("Dogs bark\\tNOUN VERB\\n")
    [{'tokens': ['Dogs', 'bark'], 'tags': ['NOUN', 'VERB']}]
    """
    sentences: List[Columns] = []
    for number, line in enumerate(split_lines(text), start=1):
        if not line.strip():
            continue
        parts = line.split(delimiter)
        if len(parts) != 2:
            raise DataFormatError(source, number, f"expected tokens {delimiter!r} tags, found {len(parts)} parts")
        tokens, tags = parts[0].split(), parts[1].split()
        if len(tokens) != len(tags) or not tokens:
            raise DataFormatError(source, number, f"{len(tokens)} tokens but {len(tags)} tags")
        sentences.append({"tokens": tokens, "tags": tags})
    if not sentences:
        raise no_sentence(source, text)
    return sentences


def read_tagged_lines(path: PathLike, delimiter: str = "\t", encoding: str = "utf-8") -> List[Columns]:
    """`parse_tagged_lines` on the file at `path`, decoded with `encoding`
    (bytes it cannot decode: DataFormatError), `delimiter` between the
    tokens and the tags; a list of `{"tokens": [...], "tags": [...]}`.

    Example:

    >>> from keras_birnn.data.readers import read_tagged_lines
    >>> sentences = read_tagged_lines("train.tagged")  # doctest: +SKIP
    """
    return parse_tagged_lines(read_text(path, encoding), os.fspath(path), delimiter)


def parse_tsv(text: str, text_column: int = 0, label_column: int = 1, header: bool = False,
              source: str = "<string>") -> Tuple[List[str], List[str]]:
    """Texts and labels of tab-separated lines, one example a line.

    Fields are split at every tab (no quoting); blank lines are skipped;
    every line must have as many fields as the first.

    Args:
        text: The file's contents.
        text_column: Index of the text field (negative counts from the end).
        label_column: Index of the label field.
        header: Whether the first non-blank line names the columns (skipped).
        source: A name for error messages (the path).

    Returns:
        `(texts, labels)`, two lists of strings in the file's order.

    Raises:
        DataFormatError: too few fields, a different field count than the
            first line, or no example.

    Example:

    >>> from keras_birnn.data.readers import parse_tsv
    >>> parse_tsv("sentence\\tlabel\\nA fine film.\\tpos\\nDull.\\tneg\\n", header=True)
    (['A fine film.', 'Dull.'], ['pos', 'neg'])
    """
    texts: List[str] = []
    labels: List[str] = []
    needed, width = columns_needed((text_column, label_column)), None
    for number, line in enumerate(split_lines(text), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        width = check_width(fields, width, needed, source, number)
        if header and width[1] == number:
            continue
        texts.append(fields[text_column])
        labels.append(fields[label_column])
    if not texts:
        raise no_sentence(source, text)
    return texts, labels


def read_tsv(path: PathLike, text_column: int = 0, label_column: int = 1, header: bool = False,
             encoding: str = "utf-8") -> Tuple[List[str], List[str]]:
    """Reads a classification file of tab-separated lines (`parse_tsv`).

    Args:
        path: The file.
        text_column: Index of the text field.
        label_column: Index of the label field.
        header: Whether the first non-blank line names the columns.
        encoding: The file's encoding (bytes it cannot decode: DataFormatError).

    Returns:
        `(texts, labels)`, two lists of strings.

    Example:

    >>> from keras_birnn.data.readers import read_tsv
    >>> texts, labels = read_tsv("SST-2/train.tsv", header=True)  # doctest: +SKIP
    """
    return parse_tsv(read_text(path, encoding), text_column, label_column, header, os.fspath(path))


def split_held_out(items: Sequence[T], fraction: float = 0.1, seed: int = 0) -> Tuple[List[T], List[T]]:
    """A fixed, seeded split into `(kept, held_out)`, both in their original order.

    `round(fraction * len(items))` items are held out: those with the
    smallest of `len(items)` draws of `random.Random(seed).random()`, a
    sequence Python guarantees across versions, so the split is the same
    everywhere for the same seed and length.

    Args:
        items: The sentences (any sequence).
        fraction: Share held out, in [0, 1].
        seed: Seed of the draws.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"`fraction` must be in [0, 1], received {fraction!r}.")
    draws = random.Random(seed)
    keys = [draws.random() for _ in range(len(items))]
    held = set(sorted(range(len(items)), key=keys.__getitem__)[: round(fraction * len(items))])
    kept = [item for i, item in enumerate(items) if i not in held]
    return kept, [item for i, item in enumerate(items) if i in held]


def read_lines(path: PathLike, encoding: Optional[str] = None) -> List[str]:
    """Non-empty lines of a text file, stripped.

    Args:
        path: The file.
        encoding: As in `read_text` (None: UTF-8, else Latin-1).
    """
    return [line.strip() for line in read_text(path, encoding).splitlines() if line.strip()]


def read_polarity(pos_path: PathLike, neg_path: PathLike,
                  encoding: Optional[str] = None) -> Tuple[List[str], List[int]]:
    """Two files, one text per line: `(texts, labels)` with 1 for every line
    of `pos_path` followed by 0 for every line of `neg_path`. Blank lines
    are skipped.

    Args:
        pos_path: The positive texts.
        neg_path: The negative texts.
        encoding: As in `read_text` (None: UTF-8, else Latin-1).
    """
    positive, negative = read_lines(pos_path, encoding), read_lines(neg_path, encoding)
    return positive + negative, [1] * len(positive) + [0] * len(negative)
