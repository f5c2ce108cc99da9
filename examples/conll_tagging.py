"""Named entities, chunking and UPOS: a BiLSTM tagger with a softmax or a CRF head.

The BiLSTM-CRF of Lample et al. 2016 ("Neural Architectures for Named
Entity Recognition"), with the character CNN of Ma and Hovy 2016
("End-to-end Sequence Labeling via Bi-directional LSTM-CNNs-CRF") as an
option, on column files and CoNLL-U:

    words   lower-cased (--keep-case: not), digits mapped to 0 (--keep-digits: kept),
            Embedding(mask_zero=True); words seen fewer than --min-word-count
            times in training (2) train the OOV vector; word dropout: during training each known word's id
            becomes the OOV id with probability --word-dropout (the
            character encoder still sees the word)
    chars   each word's characters -> Embedding -> --char-encoder:
              gru   kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(U))), final states
              lstm  the same with kb.LSTMCell (Lample et al. 2016)
              cnn   Conv1D(2U filters, width 3, tanh), then kb.MaskedMaxPooling
                    over each word's characters (Ma and Hovy 2016); padding
                    characters are zeroed, so a word's vector does not depend
                    on the padding
    feats   --feature-columns K [K ...]: those columns of a column file
            (by default the POS tags of CoNLL-2000, column 1, with --data
            conll2000), each value embedded in --feature-dim (16); unseen
            values share one vector
    then    the concatenation -> Dropout ->
            kb.Bidirectional(kb.LSTMCell(H), return_sequences=True) (--depth
            N: N of them, kb.stacked_bidirectional, dropout between) -> Dropout
            -> --head:
              softmax  Dense(n_tags, softmax), masked cross-entropy per word
              crf      Dense(n_tags) emissions -> kb.CRF (Viterbi tags out;
                       kb.CRFLoss, the sentence's negative log-likelihood); tag
                       sets in IOB2 get kb.CRF's "iob2" constraints (I-X only
                       after B-X or I-X)

Training: `model.fit` one epoch at a time on length-bucketed batches, Adam
with cosine decay and gradient clipping, a fixed number of epochs (no early
stopping, no selection on dev). Evaluation on dev: for IOB2 tag sets the
span F1 of conlleval, the CoNLL shared tasks' scorer (a span counts when
its start, end and type are all right; `span_scores`), else the tag
accuracy (UPOS). The seconds of each epoch's `fit` are printed, so that the
heads' costs compare (`--head softmax,crf` trains both with the same
settings and seeds).

Data (`--data NAME` reads `--data-dir`, by default `../shared/data` beside
the repository; where that is absent, as in a fresh clone, the example
stops and names `--data-dir` and `--train`/`--dev`; any files of the same
formats work with --train/--dev):

    conll2002  CoNLL-2002 Spanish NER, esp.train / esp.testa (dev)
    conll2000  CoNLL-2000 chunking, train.txt: a fixed, seeded 10% of its
               sentences is held out as dev (`keras_birnn.datasets.split_held_out`)
    ewt        UD English EWT, train / dev, UPOS (CoNLL-U)

    python examples/conll_tagging.py --data conll2002 --head crf
    python examples/conll_tagging.py --data conll2000 --head softmax,crf --char-encoder cnn
    python examples/conll_tagging.py --data conll2000 --feature-columns   # without the POS tags
    python examples/conll_tagging.py --data ewt --head crf --char-encoder lstm
    python examples/conll_tagging.py --train my.train --dev my.dev --tag-column 1
    python examples/conll_tagging.py --quick --data conll2002 --head softmax,crf  # small: a smoke run
    python examples/conll_tagging.py --data conll2000 --layers keras   # the twin from Keras's layers

Each trained tagger is exported for TF Serving under
`<out>/<data>_<head>_tagger/1/`, vocabularies inside the graph:

    serving_default(tokens: string [batch, time], "" = padding
                    [, features: string [batch, time, columns] with --feature-columns])
        -> tags: string [batch, time] (IOB2 or UPOS; "" at padding),
           tag_ids: int32 [batch, time] (-1 at padding)

`iob_spans` turns a row of tags into `(type, start, end)` spans, by the
same rules as the scorer.
"""

import argparse
import json
import os
import sys
import time
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EXAMPLES = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(EXAMPLES)
try:
    import keras_birnn as kb
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, REPO)
    import keras_birnn as kb  # noqa: E402
sys.path.insert(0, EXAMPLES)
import pos_tagging as pos  # noqa: E402  (TokenEncoder, EncodedSet, pad_tokens, dataset, predictor)
from keras_birnn.cli import LAYERS, check_layers, finish_args, require_files  # noqa: E402
from keras_birnn.datasets import read_columns, read_conllu, read_lines, split_held_out  # noqa: E402

SHARED_DATA = os.path.join(REPO, "..", "shared", "data")
DATA = {  # name: (format, train, dev or None for a held-out share of train)
    "conll2002": ("columns", "conll2002_spanish/esp.train", "conll2002_spanish/esp.testa"),
    "conll2000": ("columns", "conll2000_chunking/train.txt", None),
    "ewt": ("conllu", "ud_english_ewt/en_ewt-ud-train.conllu", "ud_english_ewt/en_ewt-ud-dev.conllu"),
}
# Columns read as word features by default: the POS tags that the CoNLL-2000
# data gives every token (its shared task's systems all read them).
DATA_FEATURE_COLUMNS = {"conll2000": [1]}
HEADS = ("softmax", "crf")
CHAR_ENCODERS = ("gru", "lstm", "cnn")
PAD, OOV_ID = "", 1
Tagged = Tuple[List[str], List[str]]
Features = List[List[str]]  # one sentence's extra columns: [token][column]


# --- scoring: conlleval's spans ----------------------------------------------------------------


def _iob_parts(tag: str) -> Tuple[str, str]:
    """(prefix, type): "O" -> ("O", ""), "B-PER" -> ("B", "PER"); a bare "B" or "I" has type ""."""
    prefix, _, kind = tag.partition("-")
    if prefix not in ("B", "I", "O") or (prefix == "O" and kind):
        raise ValueError(f"IOB tags are 'O', 'B-<type>' or 'I-<type>', received {tag!r}.")
    return prefix, kind


def iob_spans(tags: Sequence[str]) -> List[Tuple[str, int, int]]:
    """The spans `(type, start, end)` (end exclusive) of one sentence's IOB tags.

    conlleval's rules (the CoNLL-2000 to 2003 scorer), for IOB1 and IOB2: a
    span starts at `B-X`, and at `I-X` after `O`, after another type or at
    the sentence start; it goes on over `I-X` and ends before anything else.
    So a span may start with `I-X` (conlleval counts it; a CRF with IOB2
    constraints never predicts it).
    """
    spans: List[Tuple[str, int, int]] = []
    previous, previous_kind, start = "O", "", 0
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, kind = _iob_parts(tag)
        if previous != "O" and (prefix != "I" or kind != previous_kind):
            spans.append((previous_kind, start, i))
        if prefix == "B" or (prefix == "I" and (previous == "O" or kind != previous_kind)):
            start = i
        previous, previous_kind = prefix, kind
    return spans


def _ratio(a: int, b: int) -> float:
    return a / b if b else 0.0


def span_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> Dict:
    """conlleval's precision, recall and F1 over all sentences (micro), and per type.

    A predicted span is correct when a gold span has the same start, end and
    type. precision = correct / predicted spans, recall = correct / gold
    spans, F1 = 2PR / (P + R); each 0 when its denominator is 0.

    Args:
        gold: Gold IOB tags, one list per sentence.
        predicted: Predicted IOB tags, the same lengths.
    """
    counts: Dict[str, Counter] = {}
    for g, p in zip(gold, predicted, strict=True):
        if len(g) != len(p):
            raise ValueError(f"A sentence has {len(g)} gold tags and {len(p)} predicted ones.")
        gold_spans, predicted_spans = set(iob_spans(g)), set(iob_spans(p))
        found = {"gold": gold_spans, "predicted": predicted_spans, "correct": gold_spans & predicted_spans}
        for name, spans in found.items():
            for kind, _, _ in spans:
                counts.setdefault(kind, Counter())[name] += 1
    total = sum(counts.values(), Counter())
    return dict(_prf(total), types={kind: _prf(c) for kind, c in sorted(counts.items())})


def _prf(c: Counter) -> Dict:
    precision, recall = _ratio(c["correct"], c["predicted"]), _ratio(c["correct"], c["gold"])
    f1 = _ratio(2 * precision * recall, precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1,
            "gold": c["gold"], "predicted": c["predicted"], "correct": c["correct"]}


def is_iob(tags: Sequence[str]) -> bool:
    """Whether every tag is `O`, `B-<type>` or `I-<type>` (then spans are scored)."""
    return all(t == "O" or (len(t) > 2 and t[0] in "BI" and t[1] == "-") for t in tags)


def to_iob2(tags: Sequence[str]) -> List[str]:
    """The same spans (`iob_spans`) in IOB2: each span starts with `B-X`.

    IOB1 files (an `I-X` starts a span unless it follows a span of the same
    type) and the odd `I-X` at a sentence start in IOB2 files become paths
    that the CRF's "iob2" constraints allow; the spans do not change.
    """
    out = list(tags)
    for kind, start, _ in iob_spans(tags):
        out[start] = f"B-{kind}"
    return out


# --- data --------------------------------------------------------------------------------------


def data_files(args: argparse.Namespace) -> Tuple[str, str, Optional[str]]:
    """(format, train path, dev path or None) of --data or --train/--dev."""
    if args.data:
        fmt, train_path, dev_path = DATA[args.data]
        return fmt, os.path.join(args.data_dir, train_path), dev_path and os.path.join(args.data_dir, dev_path)
    fmt = args.format or ("conllu" if args.train.endswith(".conllu") else "columns")
    return fmt, args.train, args.dev


def read_sentences(path: str, fmt: str, args: argparse.Namespace) -> Tuple[List[Tagged], List[Features]]:
    """A file's sentences, and their --feature-columns' values (`[token][column]`
    per sentence; an empty list without --feature-columns)."""
    if fmt == "conllu":
        return [(t, upos) for t, upos, _ in read_conllu(path)], []
    sentences = read_columns(path, args.token_column, args.tag_column)
    check_feature_columns(path, args)
    columns = [read_columns(path, args.token_column, c) for c in args.feature_columns or ()]
    if not columns:
        return sentences, []
    return sentences, [[list(row) for row in zip(*(c[i][1] for c in columns))] for i in range(len(sentences))]


def check_feature_columns(path: str, args: argparse.Namespace) -> None:
    """Each of --feature-columns must exist in the file's first token line,
    and be neither the token nor the tag column (a feature equal to the
    tags would hand the model the answer)."""
    if not args.feature_columns:
        return
    count = len(read_lines(path)[0].split())
    named = {"token": args.token_column, "tag": args.tag_column}
    for k in args.feature_columns:
        if not -count <= k < count:
            raise ValueError(f"--feature-columns {k}: {path} has {count} columns (0 to {count - 1}).")
        for name, column in named.items():
            if column % count == k % count:
                raise ValueError(f"--feature-columns {k} is the {name} column (--{name}-column {column}).")


def load_data(args: argparse.Namespace) -> Tuple[List[Tagged], List[Tagged], str, List[Features], List[Features]]:
    """(train, dev, what dev is, train features, dev features): the files of
    --data or --train/--dev; without a dev file, a seeded --held-out share
    of train (`split_held_out`). Features as `read_sentences`."""
    fmt, train_path, dev_path = data_files(args)
    train, train_features = read_sentences(train_path, fmt, args)
    if dev_path:
        (dev, dev_features), what = read_sentences(dev_path, fmt, args), os.path.basename(dev_path)
    else:
        kept, held = split_held_out(range(len(train)), args.held_out, args.split_seed)
        dev, dev_features = _pick(train, held), _pick(train_features, held)
        train, train_features = _pick(train, kept), _pick(train_features, kept)
        what = f"held-out {args.held_out:.0%} of {os.path.basename(train_path)}, split seed {args.split_seed}"
    n, m = args.max_train_sentences, args.max_dev_sentences
    return train[:n], dev[:m], what, train_features[:n], dev_features[:m]


def _pick(items: list, indices: Sequence[int]) -> list:
    return [items[i] for i in indices] if items else []


class WordEncoder(pos.TokenEncoder):
    """`pos_tagging.TokenEncoder` (word and character ids, in TensorFlow, the
    same in training and in the exported graph) whose word key also maps
    every ASCII digit to 0, unless `digits=True`, and keeps the case with
    `case=True` (`word_keys`)."""

    def __init__(self, words: Sequence[str], chars: Sequence[str], max_chars: int = 16, digits: bool = False,
                 case: bool = False):
        super().__init__(words, chars, max_chars)
        self.digits, self.case = bool(digits), bool(case)

    def __call__(self, tokens):
        tokens = tf.convert_to_tensor(tokens, tf.string)
        _, char_ids = super().__call__(tokens)
        return tf.cast(self.word_lookup(word_keys(tokens, self.digits, self.case)), tf.int32), char_ids


def word_keys(tokens, digits: bool = False, case: bool = False) -> tf.Tensor:
    """The word vocabulary's key of each token: UTF-8 lower case (kept with
    `case=True`), digits -> 0 (kept with `digits=True`)."""
    keys = tf.convert_to_tensor(tokens, tf.string)
    keys = keys if case else tf.strings.lower(keys, encoding="utf-8")
    return keys if digits else tf.strings.regex_replace(keys, "[0-9]", "0")


def build_vocabularies(train: Sequence[Tagged], min_word_count: int = 2, digits: bool = False, case: bool = False):
    """(words, chars, tags) of the training sentences: word keys seen at least
    `min_word_count` times (the rest train the OOV vector), every character,
    the tags sorted."""
    tokens = [t for toks, _ in train for t in toks]
    counts = Counter(k.decode("utf-8") for k in word_keys(tokens, digits, case).numpy())
    words = sorted(w for w, n in counts.items() if n >= min_word_count and w not in (PAD, "[UNK]"))
    chars = sorted({c for t in tokens for c in t} - {PAD, "[UNK]"})
    return words, chars, sorted({tag for _, tags in train for tag in tags})


class FeatureEncoder:
    """Values of the extra columns (--feature-columns: CoNLL-2000's POS tags,
    for example) to ids: one StringLookup over `"<k>=<value>"` keys (k: the
    column's place among the feature columns), 0 = padding, 1 = unseen.

    Args:
        values: The training values, `[token][column]` per sentence.
    """

    def __init__(self, values: Sequence[Features]):
        rows = [row for sentence in values for row in sentence]
        self.columns = len(rows[0]) if rows else 0
        keys = sorted({f"{k}={v}" for row in rows for k, v in enumerate(row)})
        self.lookup = keras.layers.StringLookup(vocabulary=keys, mask_token=PAD, num_oov_indices=1,
                                                name="feature_lookup")

    @property
    def count(self) -> int:
        return self.lookup.vocabulary_size()

    def ids(self, sentences: Sequence[Features], chunk: int = 256) -> List[np.ndarray]:
        """Each sentence's ids `[tokens, columns]`, through `__call__` (the
        exported graph's lookup), a chunk of sentences at a time."""
        out = []
        for start in range(0, len(sentences), chunk):
            part = sentences[start : start + chunk]
            padded = np.full((len(part), max(map(len, part), default=0), self.columns), PAD, dtype=object)
            for row, sentence in enumerate(part):
                padded[row, : len(sentence)] = np.array(sentence, dtype=object).reshape(-1, self.columns)
            ids = self(padded).numpy()
            out.extend(ids[row, : len(sentence)] for row, sentence in enumerate(part))
        return out

    def __call__(self, values) -> tf.Tensor:
        """values: string `[batch, time, columns]`, "" = padding -> int32 ids, in TensorFlow."""
        values = tf.convert_to_tensor(values, tf.string)
        keyed = tf.strings.as_string(tf.range(self.columns)) + "=" + values
        return tf.cast(self.lookup(tf.where(values == PAD, PAD, keyed)), tf.int32)


class TaggedSet(pos.EncodedSet):
    """`pos_tagging.EncodedSet` (word and character ids per sentence, tags
    unseen in training -> -1), with the --feature-columns' ids: its batches'
    inputs are then `(words, chars, features [B, T, columns])`."""

    def __init__(self, sentences: Sequence[Tagged], encoder: WordEncoder, tags: Sequence[str],
                 features: Sequence[Features] = (), feature_encoder: Optional[FeatureEncoder] = None):
        if feature_encoder is not None and len(features) != len(sentences):
            raise ValueError(f"`features` needs one entry per sentence: {len(sentences)} sentences, "
                             f"received {len(features)}.")
        super().__init__([(toks, labels, None) for toks, labels in sentences], encoder, tags)
        self.feature_encoder = feature_encoder
        if feature_encoder is not None:
            self.feature_ids = feature_encoder.ids(features)

    def batch(self, idx):
        inputs, labels = super().batch(idx)
        if self.feature_encoder is None:
            return inputs, labels
        features = np.zeros(labels.shape + (self.feature_encoder.columns,), np.int32)
        for row, i in enumerate(idx):
            features[row, : self.lengths[i]] = self.feature_ids[i]
        return (*inputs, features), labels


def encode(sentences: Sequence[Tagged], encoder: WordEncoder, tags: Sequence[str], features: Sequence[Features] = (),
           feature_encoder: Optional[FeatureEncoder] = None) -> TaggedSet:
    """Ids of every sentence (`TaggedSet`)."""
    return TaggedSet(sentences, encoder, tags, features, feature_encoder)


def drop_words(batches: list, rate: float, rng: np.random.Generator) -> list:
    """Word dropout: in a copy of the batches, each known word id (not padding
    0 nor OOV 1) becomes the OOV id with probability `rate`."""
    if rate <= 0:
        return batches
    dropped = []
    for (words, *others), labels in batches:
        drop = (words > OOV_ID) & (rng.random(words.shape) < rate)
        dropped.append(((np.where(drop, OOV_ID, words).astype(np.int32), *others), labels))
    return dropped


# --- the model ---------------------------------------------------------------------------------


class CharEncoder(keras.layers.Layer):
    """chars `[B, T, C]` (0 = padding) -> one vector per word `[B, T, 2 * units]`.

    Args:
        char_count: Size of the character vocabulary (with padding and OOV).
        kind: "gru" or "lstm": a kb.Bidirectional over each word's characters
            (`kb.NestedEncoder`, valid words only), the final states
            concatenated; "cnn": Conv1D (`2 * units` filters, tanh) over the
            characters, then the maximum over each word's characters
            (`kb.MaskedMaxPooling`).
        char_dim: Character embedding size.
        units: Units per direction (the CNN has twice as many filters).
        width: The CNN's window, in characters.
        layers: "kb", or "keras": the GRU and LSTM encoders from
            `keras.layers.Bidirectional(GRU/LSTM)` over every word of the
            batch reshaped to `[B * T, C]`, same weights (the twin; the CNN
            is the same either way).

    The output mask marks the words (at least one character).
    """

    def __init__(self, char_count: int, kind: str = "gru", char_dim: int = 32, units: int = 32,
                 width: int = 3, layers: str = "kb", **kwargs):
        super().__init__(**kwargs)
        if kind not in CHAR_ENCODERS:
            raise ValueError(f"kind must be one of {CHAR_ENCODERS}, received {kind!r}")
        self.char_count, self.kind, self.char_dim, self.units, self.width = char_count, kind, char_dim, units, width
        self.layers_kind = check_layers(layers)
        self.embedding = keras.layers.Embedding(char_count, char_dim, name="char_embedding")
        if kind == "cnn":
            self.conv = keras.layers.Conv1D(2 * units, width, padding="same", activation="tanh", name="char_conv")
            self.pool = kb.MaskedMaxPooling(name="char_max")
        elif layers == "keras":
            rnn = keras.layers.GRU(units) if kind == "gru" else keras.layers.LSTM(units)
            self.encoder = keras.layers.Bidirectional(rnn, name=f"char_bi{kind}")
        else:
            cell = kb.GRUCell(units) if kind == "gru" else kb.LSTMCell(units)
            self.encoder = kb.NestedEncoder(kb.Bidirectional(cell, name=f"char_bi{kind}"), name="char_words")

    def build(self, input_shape):
        self.embedding.build((None, None))
        if self.kind == "cnn":
            self.conv.build((None, None, self.char_dim))
        elif self.layers_kind == "keras":
            self.encoder.build((None, None, self.char_dim))
        else:
            self.encoder.build((None, None, None, self.char_dim))

    def call(self, chars):
        mask = chars != 0
        embedded = self.embedding(chars)
        if self.kind != "cnn" and self.layers_kind == "kb":
            return self.encoder(embedded, mask=mask)
        if self.kind != "cnn":  # the Keras twin
            return pos.over_every_word(self.encoder, embedded, mask)
        shape = tf.shape(chars)
        flat_mask = tf.reshape(mask, [-1, shape[2]])  # one row per word
        flat = tf.reshape(embedded, [-1, shape[2], self.char_dim])
        flat = tf.where(flat_mask[..., None], flat, tf.zeros_like(flat))  # as the convolution's own padding
        pooled = self.pool(self.conv(flat), mask=flat_mask)  # zeros for padding words
        return tf.reshape(pooled, [shape[0], shape[1], 2 * self.units])

    def compute_mask(self, chars, mask=None):
        return keras.ops.any(keras.ops.not_equal(chars, 0), axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:2]) + (2 * self.units,)

    def get_config(self):
        config = super().get_config()
        config.update(char_count=self.char_count, kind=self.kind, char_dim=self.char_dim, units=self.units,
                      width=self.width)
        if self.layers_kind != "kb":
            config.update(layers=self.layers_kind)
        return config


class FeatureEmbedding(keras.layers.Layer):
    """Feature ids `[B, T, columns]` (0 = padding, `FeatureEncoder`) -> one
    vector per word `[B, T, columns * dim]`, each column's value embedded in
    `dim`. The output mask marks the words (a nonzero id): so does every
    other part of the tagger's word vectors.

    Args:
        count: Number of ids (with padding and unseen).
        dim: Embedding size per column.
    """

    def __init__(self, count: int, dim: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.count, self.dim = count, dim
        self.embedding = keras.layers.Embedding(count, dim, name="feature_embedding")

    def build(self, input_shape):
        self.columns = input_shape[-1]  # static here; a graph traced for any shape may not know it
        self.embedding.build((None, None))

    def call(self, features):
        shape = keras.ops.shape(features)
        return keras.ops.reshape(self.embedding(features), (shape[0], shape[1], self.columns * self.dim))

    def compute_mask(self, features, mask=None):
        return keras.ops.any(keras.ops.not_equal(features, 0), axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:2]) + (input_shape[2] * self.dim,)

    def get_config(self):
        config = super().get_config()
        config.update(count=self.count, dim=self.dim)
        return config


def build_tagger(word_count: int, char_count: int, tags: Sequence[str], head: str = "crf",
                 char_encoder: str = "gru", word_dim: int = 100, char_dim: int = 32, char_units: int = 32,
                 hidden: int = 128, dropout: float = 0.33, layers: str = "kb", feature_count: int = 0,
                 feature_columns: int = 0, feature_dim: int = 16, depth: int = 1) -> keras.Model:
    """words `[B, T]` + chars `[B, T, C]` (+ features `[B, T, columns]`) ->
    tag probabilities `[B, T, n_tags]` (softmax) or int32 Viterbi tags
    `[B, T]`, 0 at padding (crf).

    Args:
        word_count, char_count: Vocabulary sizes (with padding and OOV).
        tags: The tag names; IOB2 names give the CRF its "iob2" constraints.
        head: "softmax" or "crf".
        char_encoder: "gru", "lstm" or "cnn" (`CharEncoder`).
        word_dim, char_dim, char_units, hidden: Sizes (units per direction).
        dropout: Dropout on the word vectors and on the BiLSTM's outputs.
        layers: "kb", or "keras": the twin, its recurrent character
            encoder and BiLSTM from `keras.layers.Bidirectional(GRU/LSTM)`,
            same weights; Keras has no CRF and no masked max pooling, so
            the CRF head and the CNN encoder's pooling are kb's in both.
        feature_count, feature_columns, feature_dim: With `feature_columns`,
            a third input of `FeatureEncoder` ids (`feature_count` of them),
            each embedded in `feature_dim` and concatenated to the word's
            vector.
        depth: Stacked BiLSTMs (`sentence_layers`).
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, received {head!r}")
    words = keras.Input((None,), dtype="int32", name="words")
    chars = keras.Input((None, None), dtype="int32", name="chars")
    embedded = keras.layers.Embedding(word_count, word_dim, mask_zero=True, name="word_embedding")(words)
    spelled = CharEncoder(char_count, char_encoder, char_dim, char_units, layers=layers, name="char_encoder")(chars)
    inputs, parts = [words, chars], [embedded, spelled]
    if feature_columns:
        inputs.append(keras.Input((None, feature_columns), dtype="int32", name="features"))
        parts.append(FeatureEmbedding(feature_count, feature_dim, name="feature_vectors")(inputs[-1]))
    # Concatenate's mask: any part's; every part carries the word mask (an
    # unmasked part would mark padding valid).
    x = keras.layers.Concatenate(name="word_repr")(parts)
    x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Dropout(dropout)(sentence_layers(x, hidden, depth, dropout, layers))
    if head == "softmax":
        out = keras.layers.Dense(len(tags), activation="softmax", name="tags")(x)
    else:
        emissions = keras.layers.Dense(len(tags), name="emissions")(x)
        constraints = "iob2" if is_iob(tags) else None
        out = kb.CRF(len(tags), tags=list(tags), allowed_transitions=constraints, name="crf")(emissions)
    return keras.Model(inputs, out, name=f"{char_encoder}_bilstm_{head}_tagger")


def sentence_layers(x, hidden: int, depth: int, dropout: float, layers: str):
    """`depth` BiLSTMs of `hidden` units per direction over the word vectors,
    dropout between them: `kb.Bidirectional` (one) or
    `kb.stacked_bidirectional` (more); the twin's from
    `keras.layers.Bidirectional(LSTM)` and `Dropout`."""
    if layers != "keras":
        if depth == 1:
            return kb.Bidirectional(kb.LSTMCell(hidden), return_sequences=True, name="bilstm")(x)
        return kb.stacked_bidirectional("lstm", units=(hidden,) * depth, dropout=dropout, name="bilstm_stack")(x)
    for k in range(depth):
        x = keras.layers.Dropout(dropout)(x) if k else x
        name = "bilstm" if depth == 1 else f"bilstm_{k + 1}"
        x = keras.layers.Bidirectional(keras.layers.LSTM(hidden, return_sequences=True), name=name)(x)
    return x


def compile_tagger(model: keras.Model, head: str, learning_rate: float, steps: int) -> None:
    """Adam with cosine decay over `steps` and clipnorm 5; the CRF's NLL or the
    masked cross-entropy."""
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=max(steps, 1), alpha=0.05)
    loss = kb.CRFLoss() if head == "crf" else "sparse_categorical_crossentropy"
    model.compile(optimizer=keras.optimizers.Adam(schedule, clipnorm=5.0), loss=loss)


def predict_ids(model: keras.Model, encoded: pos.EncodedSet, batch_size: int = 128) -> List[np.ndarray]:
    """Tag ids per sentence: the CRF's Viterbi tags, or the softmax's argmax."""
    out = [None] * len(encoded)
    order = np.argsort(encoded.lengths, kind="stable")
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        inputs, _ = encoded.batch(idx)
        y = pos.predictor(model)(*inputs).numpy()
        ids = y.argmax(-1) if y.ndim == 3 else y
        for row, i in enumerate(idx):
            out[i] = ids[row, : encoded.lengths[i]]
    return out


def evaluate(model: keras.Model, encoded: pos.EncodedSet, gold: Sequence[Sequence[str]],
             tags: Sequence[str]) -> Dict:
    """Dev scores: conlleval span scores for IOB2 tag sets, else tag accuracy;
    `score` is the F1 or the accuracy; `predicted_tags` the tag names per sentence."""
    predicted = [[tags[k] for k in ids] for ids in predict_ids(model, encoded)]
    if is_iob(tags):
        scores = span_scores(gold, predicted)
        scores["score"] = scores["f1"]
    else:
        hits = sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs))
        scores = {"accuracy": hits / max(sum(len(g) for g in gold), 1)}
        scores["score"] = scores["accuracy"]
    scores["predicted_tags"] = predicted
    return scores


# --- export ------------------------------------------------------------------------------------


def export_tagger(model: keras.Model, encoder: WordEncoder, tags: Sequence[str], export_dir: str,
                  version: int = 1, feature_encoder: Optional[FeatureEncoder] = None) -> str:
    """Writes `export_dir/<version>/`: string tokens (and, with a
    `feature_encoder`, the string `features [batch, time, columns]`) in,
    tag strings out.

    The lookups live in the graph; the CRF's Viterbi decoding too. Traced
    with `kb.for_export()` (no XLA, forward pass alone) and checked with
    `kb.check_graph_ops`.
    """
    from keras_birnn.export import write_version

    tag_names = tf.constant([PAD] + list(tags))  # index 0: padding
    signature = [tf.TensorSpec([None, None], tf.string, name="tokens")]
    if feature_encoder is not None:
        signature.append(tf.TensorSpec([None, None, feature_encoder.columns], tf.string, name="features"))

    def serve(tokens, *features):
        word_ids, char_ids = encoder(tokens)
        inputs = (word_ids, char_ids, *(feature_encoder(f) for f in features))
        y = model(inputs, training=False)
        ids = tf.argmax(y, axis=-1, output_type=tf.int32) if y.shape.rank == 3 else tf.cast(y, tf.int32)
        tag_ids = tf.where(word_ids != 0, ids, -1)
        return {"tags": tf.gather(tag_names, tag_ids + 1), "tag_ids": tag_ids}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(encoder.word_lookup)
    archive.track(encoder.char_lookup)
    if feature_encoder is not None:
        archive.track(feature_encoder.lookup)
    with kb.for_export():
        archive.add_endpoint("serving_default", serve, input_signature=signature)
        return write_version(archive, export_dir, version)


# --- the run -----------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, checked (`check_args`)."""
    parser = argparse.ArgumentParser(
        prog="python examples/conll_tagging.py",
        description="BiLSTM tagger (word embedding + character encoder) with a softmax or CRF head on "
        "CoNLL column files (NER, chunking) or CoNLL-U (UPOS); reports conlleval span F1 or accuracy on dev.",
    )
    add_data_arguments(parser.add_argument_group("data"))
    model = parser.add_argument_group("model")
    model.add_argument("--head", default="crf", help="softmax, crf, or both comma-separated (default crf)")
    model.add_argument("--char-encoder", choices=CHAR_ENCODERS, default="lstm", help="default lstm")
    model.add_argument("--layers", choices=LAYERS, default="kb",
                       help="kb (default), or keras: the same tagger's recurrent layers from keras.layers "
                            "(GRU, LSTM, Bidirectional; the CRF head stays kb.CRF), an end-to-end benchmark")
    model.add_argument("--hidden", type=int, default=None, help="BiLSTM units per direction (default 128; --quick 32)")
    model.add_argument("--depth", type=int, default=1, help="stacked BiLSTMs (default 1)")
    model.add_argument("--word-dim", type=int, default=None, help="word embedding size (default 100; --quick 32)")
    model.add_argument("--char-dim", type=int, default=None, help="character embedding size (default 32; --quick 16)")
    model.add_argument("--char-units", type=int, default=None,
                       help="character encoder units per direction, CNN filters / 2 (default 32; --quick 16)")
    model.add_argument("--max-chars", type=int, default=16, help="characters kept per word (default 16)")
    model.add_argument("--min-word-count", type=int, default=2, help="training count for a word vector (default 2)")
    model.add_argument("--keep-digits", action="store_true", help="do not map digits to 0 in the word keys")
    model.add_argument("--keep-case", action="store_true", help="do not lower-case the word keys")
    model.add_argument("--feature-columns", type=int, nargs="*", default=None, metavar="K",
                       help="column files: columns whose values are embedded as word features (default: 1, the "
                       "POS tags, for --data conll2000; none otherwise; no K: none)")
    model.add_argument("--feature-dim", type=int, default=16, help="embedding size per feature column (default 16)")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=None, help="training epochs (default 8; --quick 3)")
    train.add_argument("--batch-size", type=int, default=None, help="default 32; --quick 16")
    train.add_argument("--learning-rate", type=float, default=None, help="Adam's initial rate, decayed to 5%% "
                       "of it by a cosine (default 3e-3; --quick 1e-2)")
    train.add_argument("--dropout", type=float, default=0.33)
    train.add_argument("--word-dropout", type=float, default=0.05, help="probability that a known word's id "
                       "becomes the OOV id in training (default 0.05)")
    train.add_argument("--seed", type=int, default=0)
    out = parser.add_argument_group("output")
    out.add_argument("--out", default="saved_models", help="export base folder (default saved_models)")
    out.add_argument("--no-export", action="store_true", help="skip the SavedModel export")
    out.add_argument("--report-json", metavar="PATH", help="also write the results to PATH as JSON")
    out.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    out.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    return check_args(parser, parser.parse_args(argv))


def add_data_arguments(data) -> None:
    """The data flags (an argparse argument group)."""
    data.add_argument("--data", choices=sorted(DATA), help="a shared data set (see --data-dir)")
    data.add_argument("--data-dir", default=SHARED_DATA, help="folder holding the shared data sets")
    data.add_argument("--train", help="training file (instead of --data)")
    data.add_argument("--dev", help="dev file (default: --held-out of --train)")
    data.add_argument("--format", choices=("columns", "conllu"), help="default: conllu for *.conllu, else columns")
    data.add_argument("--token-column", type=int, default=0, help="column files: token column (default 0)")
    data.add_argument("--tag-column", type=int, default=-1, help="column files: tag column (default -1, the last)")
    data.add_argument("--held-out", type=float, default=0.1, help="share of train held out as dev when there is "
                      "no dev file (default 0.1)")
    data.add_argument("--split-seed", type=int, default=0, help="seed of the held-out split (default 0)")
    data.add_argument("--max-train-sentences", type=int, default=None,
                      help="use only the first N training sentences (default all; --quick 600)")
    data.add_argument("--max-dev-sentences", type=int, default=None,
                      help="evaluate on the first N dev sentences (default all; --quick 300)")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Completes and checks the parsed arguments (errors through `parser.error`)."""
    if bool(args.data) == bool(args.train):
        parser.error("give either --data or --train")
    if args.dev and not args.train:
        parser.error("--dev needs --train")
    if not 0 < args.held_out < 1:
        parser.error("--held-out must be in (0, 1)")
    if not 0 <= args.word_dropout < 1:
        parser.error("--word-dropout must be in [0, 1)")
    if args.feature_columns is None:
        args.feature_columns = DATA_FEATURE_COLUMNS.get(args.data, [])
    if args.feature_columns and data_files(args)[0] == "conllu":
        parser.error(f"--feature-columns reads column files, received CoNLL-U ({args.data or args.train})")
    args.heads = args.head
    args = finish_args(
        parser, args,
        quick=dict(epochs=(3, 8), max_train_sentences=(600, None), max_dev_sentences=(300, None),
                   hidden=(32, 128), word_dim=(32, 100), char_dim=(16, 32), char_units=(16, 32),
                   batch_size=(16, 32), learning_rate=(1e-2, 3e-3)),
        choices=("heads", HEADS),
        positive=("epochs", "batch_size", "hidden", "word_dim", "char_dim", "char_units", "max_chars",
                  "min_word_count", "feature_dim", "depth"),
    )
    args.name = args.data or os.path.splitext(os.path.basename(args.train))[0]
    if args.data:
        _, train, dev = DATA[args.data]
        require_files(
            parser, [("--data-dir", os.path.join(args.data_dir, p)) for p in (train, dev) if p],
            f"--data {args.data} reads {os.path.dirname(train)}/ in --data-dir (default ../shared/data beside "
            "the repository, absent from a fresh clone): pass --data-dir DIR, or your own files with "
            "--train FILE [--dev FILE]",
        )
    else:
        require_files(parser, {"--train": args.train, "--dev": args.dev},
                      "pass existing files with --train FILE [--dev FILE]")
    return args


def fit_head(head: str, args, train_set: TaggedSet, dev_set: TaggedSet, dev_gold, tags,
             sizes: Tuple[int, int]) -> Tuple[keras.Model, Dict]:
    """Trains one head; returns the model and its row of results.

    `loss_before`/`loss_after`: the compiled loss (no dropout) on 8 fixed
    batches drawn across the training set. `epoch_seconds`: wall clock of
    each epoch's `fit`; `epoch_cpu_seconds`: this process's CPU time in it
    (all threads), less sensitive to other jobs on the machine.
    """
    keras.utils.set_random_seed(args.seed)
    features = train_set.feature_encoder
    model = build_tagger(*sizes, tags, head, args.char_encoder, args.word_dim, args.char_dim, args.char_units,
                         args.hidden, args.dropout, layers=args.layers, feature_count=features.count if features else 0,
                         feature_columns=features.columns if features else 0, feature_dim=args.feature_dim,
                         depth=args.depth)
    compile_tagger(model, head, args.learning_rate, args.epochs * int(np.ceil(len(train_set) / args.batch_size)))
    probe = pos.dataset(train_set.batches(args.batch_size, np.random.default_rng(args.seed + 1))[:8])
    loss_before = float(model.evaluate(probe, verbose=0))
    print(f"\n{head} head: {model.count_params():,} parameters")
    row = dict(head=head, params=model.count_params(), loss_before=loss_before,
               **train_epochs(model, args, train_set, dev_set, dev_gold, tags))
    began = time.perf_counter()
    scores = evaluate(model, dev_set, dev_gold, tags)
    row.update(evaluate_seconds=time.perf_counter() - began, loss_after=float(model.evaluate(probe, verbose=0)),
               load=os.getloadavg()[0], **scores)
    print(f"  {head}: dev {metric_name(tags)} {100 * row['score']:.2f} after {sum(row['epoch_seconds']):.0f} s of "
          f"fit ({', '.join(f'{s:.1f}' for s in row['epoch_seconds'])} s per epoch; CPU "
          f"{', '.join(f'{s:.1f}' for s in row['epoch_cpu_seconds'])} s)")
    if "types" in row:
        print("  per type F1: " + ", ".join(f"{k} {100 * v['f1']:.2f}" for k, v in row["types"].items()))
    return model, row


def train_epochs(model: keras.Model, args, train_set: TaggedSet, dev_set: TaggedSet, dev_gold,
                 tags) -> Dict:
    """`model.fit` one epoch at a time on new length-bucketed batches (word
    dropout applied); the dev score after each epoch unless --quiet."""
    rng = np.random.default_rng(args.seed)
    losses, seconds, cpu_seconds, curve = [], [], [], []
    for epoch in range(args.epochs):
        batches = pos.dataset(drop_words(train_set.batches(args.batch_size, rng), args.word_dropout, rng))
        began, cpu_began = time.perf_counter(), time.process_time()
        history = model.fit(batches, epochs=1, verbose=0, shuffle=False)
        seconds.append(time.perf_counter() - began)
        cpu_seconds.append(time.process_time() - cpu_began)
        losses.append(float(history.history["loss"][-1]))
        if not args.quiet:
            curve.append(evaluate(model, dev_set, dev_gold, tags)["score"])
            print(f"  epoch {epoch + 1}/{args.epochs}: train loss {losses[-1]:.4f}, {seconds[-1]:.1f} s "
                  f"(CPU {cpu_seconds[-1]:.1f} s), dev {metric_name(tags)} {100 * curve[-1]:.2f}")
    return dict(epoch_losses=losses, epoch_seconds=seconds, epoch_cpu_seconds=cpu_seconds, dev_curve=curve)


def training_tags_in_iob2(train: Sequence[Tagged]) -> Tuple[List[Tagged], int]:
    """IOB training tags in IOB2 (`to_iob2`), so that every gold path obeys
    the CRF's constraints (both heads train on the same tags); other tag
    sets unchanged. Returns the sentences and how many tags changed."""
    if not is_iob([t for _, tags in train for t in tags]):
        return list(train), 0
    fixed = [(tokens, to_iob2(tags)) for tokens, tags in train]
    changed = sum(a != b for (_, old), (_, new) in zip(train, fixed) for a, b in zip(old, new))
    return fixed, changed


def metric_name(tags: Sequence[str]) -> str:
    return "span F1" if is_iob(tags) else "accuracy"


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Trains each head, prints the table, exports each tagger; returns the results."""
    args = parse_args(argv)
    start = time.perf_counter()
    train, dev, dev_name, train_features, dev_features = load_data(args)
    train, repaired = training_tags_in_iob2(train)
    words, chars, tags = build_vocabularies(train, args.min_word_count, args.keep_digits, args.keep_case)
    encoder = WordEncoder(words, chars, args.max_chars, digits=args.keep_digits, case=args.keep_case)
    features = FeatureEncoder(train_features) if args.feature_columns else None
    train_set = encode(train, encoder, tags, train_features, features)
    dev_set = encode(dev, encoder, tags, dev_features, features)
    dev_gold = [labels for _, labels in dev]
    print(f"Train {len(train)} sentences / {int(train_set.lengths.sum())} tokens, dev ({dev_name}) {len(dev)} / "
          f"{int(dev_set.lengths.sum())}; vocabulary {encoder.word_count} words, {encoder.char_count} characters, "
          f"{len(tags)} tags ({metric_name(tags)} on dev). Load average {os.getloadavg()[0]:.2f} on "
          f"{os.cpu_count()} CPUs." + (f" {repaired} training spans made to start with B- (IOB2)." if repaired else ""))
    rows, models, exports = [], {}, {}
    for head in args.heads:
        model, row = fit_head(head, args, train_set, dev_set, dev_gold, tags, (encoder.word_count, encoder.char_count))
        rows.append(row)
        models[head] = model
        if not args.no_export:
            exports[head] = export_tagger(model, encoder, tags, os.path.join(args.out, f"{args.name}_{head}_tagger"),
                                          feature_encoder=features)
            print(f"  exported to {exports[head]} (string tokens in, tags out)")
    print(format_table(rows, args, len(train), dev_name, tags))
    total = time.perf_counter() - start
    print(f"Done in {total:.0f} s; load average now {os.getloadavg()[0]:.2f}.")
    if args.report_json:
        write_report(args.report_json, args, rows, dev_name, exports, total)
    return {"rows": rows, "models": models, "encoder": encoder, "tags": tags, "train": train, "dev": dev,
            "dev_features": dev_features, "feature_encoder": features, "dev_set": dev_set, "exports": exports,
            "seconds": total}


def format_table(rows, args, n_train: int, dev_name: str, tags) -> str:
    metric = metric_name(tags)
    lines = [f"\nDev {metric} on {dev_name} ({args.epochs} epochs, {n_train} training sentences, "
             f"char encoder {args.char_encoder}, hidden {args.hidden}):",
             f"{'head':8}  {'params':>9}  {'dev ' + metric:>12}  {'s per epoch':>11}  {'CPU s per epoch':>15}"]
    for r in rows:
        lines.append(f"{r['head']:8}  {r['params']:>9,}  {100 * r['score']:11.2f}%  "
                     f"{np.mean(r['epoch_seconds']):11.1f}  {np.mean(r['epoch_cpu_seconds']):15.1f}")
    return "\n".join(lines)


def write_report(path: str, args, rows, dev_name: str, exports, total: float) -> None:
    """--report-json: the settings, and per head its timings and dev scores."""
    settings = {k: v for k, v in vars(args).items() if k not in ("report_json", "head")}
    heads = [{k: v for k, v in r.items() if k != "predicted_tags"} for r in rows]
    report = {"example": "conll_tagging", "dev": dev_name, "settings": settings, "exports": exports,
              "seconds": total, "heads": heads}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
