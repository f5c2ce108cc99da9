"""Readers for the example data sets: CoNLL-U treebanks and sentence polarity files.

Plain Python (no TensorFlow): they return lists that the examples turn
into tensors.

    >>> sentences = read_conllu("en_ewt-ud-dev.conllu")
    >>> tokens, upos, xpos = sentences[0]
    >>> texts, labels = read_polarity("rt-polarity.pos", "rt-polarity.neg")
"""

import os
from typing import List, Tuple

Sentence = Tuple[List[str], List[str], List[str]]

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


def read_lines(path) -> List[str]:
    """Non-empty lines of a text file, stripped (UTF-8, else Latin-1)."""
    return [line.strip() for line in _read_text(path).splitlines() if line.strip()]


def read_polarity(pos_path, neg_path) -> Tuple[List[str], List[int]]:
    """Two files, one text per line: `(texts, labels)` with 1 for every line
    of `pos_path` followed by 0 for every line of `neg_path`. Blank lines
    are skipped."""
    positive, negative = read_lines(pos_path), read_lines(neg_path)
    return positive + negative, [1] * len(positive) + [0] * len(negative)
