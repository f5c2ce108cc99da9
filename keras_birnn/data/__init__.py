"""Data for training: readers, a corpus summary, and the examples' downloads.

- `readers`: CoNLL column files (`read_conll`), CoNLL-U columns
  (`read_conllu_column`, `read_conllu`), one sentence a line with its tags
  (`read_tagged_lines`), tab-separated classification data (`read_tsv`),
  polarity files (`read_polarity`) and a seeded held-out split
  (`split_held_out`). Every reader raises `DataFormatError` (a
  ValueError) naming the file and line it cannot read.
- `summary`: `summarize(train, dev, scheme)` (counts, labels, scheme
  violations, dev OOV rates, sentence-length percentiles) and
  `format_summary`.
- `downloads`: `fetch_data`, the registered data sets with their checksums.

Plain Python: nothing here imports TensorFlow.
"""

from keras_birnn.data.readers import (
    DataFormatError,
    parse_columns,
    parse_conll,
    parse_conllu,
    parse_conllu_column,
    parse_tagged_lines,
    parse_tsv,
    read_columns,
    read_conll,
    read_conllu,
    read_conllu_column,
    read_lines,
    read_polarity,
    read_tagged_lines,
    read_text,
    read_tsv,
    split_held_out,
)
from keras_birnn.data.summary import CorpusSummary, Violation, format_summary, summarize

__all__ = [
    "CorpusSummary",
    "DataFormatError",
    "Violation",
    "format_summary",
    "parse_columns",
    "parse_conll",
    "parse_conllu",
    "parse_conllu_column",
    "parse_tagged_lines",
    "parse_tsv",
    "read_columns",
    "read_conll",
    "read_conllu",
    "read_conllu_column",
    "read_lines",
    "read_polarity",
    "read_tagged_lines",
    "read_text",
    "read_tsv",
    "split_held_out",
    "summarize",
]
