"""Readers for the example data sets: CoNLL-U treebanks, CoNLL column files
(CoNLL-2000 chunking, CoNLL-2002 named entities) and sentence polarity files.

Plain Python (no TensorFlow): they return lists that the examples turn
into tensors.

    >>> from keras_birnn.data.readers import (
    ...     parse_columns, read_columns, read_conllu, read_polarity, split_held_out)

The readers take the corpora's files, which the examples download (the
doctests have no such files, so these lines are skipped there):

    >>> sentences = read_conllu("en_ewt-ud-dev.conllu")  # doctest: +SKIP
    >>> tokens, upos, xpos = sentences[0]  # doctest: +SKIP
    >>> chunks = read_columns("train.txt")  # doctest: +SKIP
    >>> texts, labels = read_polarity("rt-polarity.pos", "rt-polarity.neg")  # doctest: +SKIP

`read_columns` parses a file's text with `parse_columns` (word POS chunk:
the last column is the tag):

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
from typing import List, Sequence, Tuple, TypeVar

Sentence = Tuple[List[str], List[str], List[str]]
Tagged = Tuple[List[str], List[str]]
T = TypeVar("T")

_ID, _FORM, _UPOS, _XPOS = 0, 1, 3, 4


def _read_text(path) -> str:
    """UTF-8, or ISO-8859-1 for files that are not (the original Pang & Lee
    release is Latin-1)."""
    with open(os.fspath(path), "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.lstrip("\ufeff")


def parse_conllu(text: str, source: str = "<string>") -> List[Sentence]:
    """Sentences of CoNLL-U `text` as `(tokens, upos, xpos)` lists.

    Only syntactic words are kept: comment lines (`# ...`), multiword-token
    ranges (ID `1-2`, the surface form that the following words split) and
    empty nodes (ID `8.1`, enhanced-graph words with no surface form) are
    skipped. Sentences end at a blank line (a missing final blank line is
    tolerated). An XPOS of `_` stays `"_"`.

    Raises:
        ValueError: a word line with fewer than 10 tab-separated columns or a
            non-integer ID, naming `source` and the line number.
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
            raise ValueError(
                f"{source}:{number}: a CoNLL-U word line needs 10 tab-separated columns, "
                f"found {len(columns)}: {line[:80]!r}"
            )
        word_id = columns[_ID]
        if "-" in word_id or "." in word_id:
            continue  # multiword-token range or empty node
        if not word_id.isdigit():
            raise ValueError(f"{source}:{number}: invalid word ID {word_id!r}")
        tokens.append(columns[_FORM])
        upos.append(columns[_UPOS])
        xpos.append(columns[_XPOS])
    if tokens:
        sentences.append((tokens, upos, xpos))
    return sentences


def read_conllu(path) -> List[Sentence]:
    """Reads a CoNLL-U file: a list of `(tokens, upos, xpos)`, one per sentence.

    See `parse_conllu` for what is skipped (comments, blank lines,
    multiword-token ranges like `1-2`, empty nodes like `8.1`).
    """
    return parse_conllu(_read_text(path), source=os.fspath(path))


def parse_columns(text: str, source: str = "<string>", token_column: int = 0, tag_column: int = -1) -> List[Tagged]:
    """Sentences of a CoNLL column file as `(tokens, tags)` lists.

    One token a line, columns separated by spaces or tabs, a blank line
    between sentences (several blank lines, a missing final one and CRLF
    line ends are tolerated). `-DOCSTART-` lines (document breaks in
    CoNLL-2002 Dutch and CoNLL-2003) are skipped. Which column holds what:
    CoNLL-2000 chunking is `word POS chunk`, CoNLL-2002 `word tag` in the
    original release and `word POS tag` as distributed with NLTK; the
    defaults (first and last column) read all of them.

    Args:
        text: The file's contents.
        source: A name for error messages (the path).
        token_column: Index of the token column (negative counts from the end).
        tag_column: Index of the tag column (negative counts from the end).

    Raises:
        ValueError: a line with too few columns, naming `source` and the line number.
    """
    sentences: List[Tagged] = []
    tokens: List[str] = []
    tags: List[str] = []
    # Columns a line needs: a token and a tag, and the indices must exist.
    needed = max(2, *(c + 1 if c >= 0 else -c for c in (token_column, tag_column)))
    for number, line in enumerate(text.splitlines(), start=1):
        columns = line.split()
        if not columns or columns[0] == "-DOCSTART-":
            if tokens:
                sentences.append((tokens, tags))
                tokens, tags = [], []
            continue
        if len(columns) < needed:
            raise ValueError(
                f"{source}:{number}: a token line needs at least {needed} columns "
                f"(token column {token_column}, tag column {tag_column}), found {len(columns)}: {line[:80]!r}"
            )
        tokens.append(columns[token_column])
        tags.append(columns[tag_column])
    if tokens:
        sentences.append((tokens, tags))
    return sentences


def read_columns(path, token_column: int = 0, tag_column: int = -1) -> List[Tagged]:
    """Reads a CoNLL column file (UTF-8, else Latin-1: the original
    CoNLL-2002 files are Latin-1): a list of `(tokens, tags)`, one per
    sentence. See `parse_columns` for the format and the column indices."""
    return parse_columns(_read_text(path), os.fspath(path), token_column, tag_column)


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


def read_lines(path) -> List[str]:
    """Non-empty lines of a text file, stripped (UTF-8, else Latin-1)."""
    return [line.strip() for line in _read_text(path).splitlines() if line.strip()]


def read_polarity(pos_path, neg_path) -> Tuple[List[str], List[int]]:
    """Two files, one text per line: `(texts, labels)` with 1 for every line
    of `pos_path` followed by 0 for every line of `neg_path`. Blank lines
    are skipped."""
    positive, negative = read_lines(pos_path), read_lines(neg_path)
    return positive + negative, [1] * len(positive) + [0] * len(negative)
