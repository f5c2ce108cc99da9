"""UPOS tagging on Universal Dependencies (CoNLL-U): unidirectional vs bidirectional.

Every variant reads the same word representation: a word embedding
(lower-cased vocabulary of the training file, words seen once go to the
OOV bucket so that it gets trained) concatenated with a character-level
encoder (characters -> Embedding -> kb.Bidirectional(kb.GRUCell) final
states, one vector per word; within-word only, so it gives no sentence
context). The sentence-level layer is what the variants compare:

    gru      kb.Recurrent(kb.GRUCell(H)) + Dense softmax      (left to right only)
    bigru    kb.Bidirectional(kb.GRUCell(H), merge_mode="projection", softmax)
    bilstm   kb.Bidirectional(kb.LSTMCell(H), merge_mode="projection", softmax)
    bilstm2  two stacked BiLSTMs (kb.stacked_bidirectional) + a softmax over the
             top layer's concat, which is the projection merge's function

The loss is masked (Embedding(mask_zero=True); the mask propagates to the
output; the loss and the "upos" accuracy metric count words only).
Training is one `model.fit` over a fixed number of epochs (new
length-bucketed batches each epoch), Adam with a cosine learning rate
decay, dev UPOS after each epoch (watched, never used: no early stopping,
no model selection on dev); then it reports UPOS accuracy on dev (and on
test when given). `--tensorboard DIR` logs the runs; the curves go to a
PNG (`--plot`, when matplotlib is installed). The best variant is
exported for TF Serving under `<out>/pos_tagger/1/`, vocabularies inside
the graph:

    serving_default(tokens: string [batch, time], "" = padding)
        -> tags: string [batch, time] ("" at padding),
           probabilities: float32 [batch, time, n_tags],
           tag_ids: int32 [batch, time]

It is also converted for phones and other LiteRT runtimes, builtin ops
only (`kb.export_tflite`), to `<out>/pos_tagger_litert/pos_tagger.tflite`
with the vocabularies beside it in `ids.json`: LiteRT has no string ops,
so the app turns tokens into ids itself (`device_ids` spells out how):

    words: int32 [1, time], chars: int32 [1, time, width] (0 = padding)
        -> float32 [1, time, n_tags]; a word's tag is ids["tags"][argmax]

Data: with no path flags it downloads UD English EWT r2.15 (train, dev,
test) from the official UD GitHub repository with `keras.utils.get_file`
(cached under `--cache-dir`, by default `~/.keras`; no checksum: the files'
hashes are not pinned here). Without a network it stops and names the
flags to pass (`--train`, `--dev`). Any CoNLL-U files work:

    python examples/pos_tagging.py \\
        --train ../shared/data/ud_english_ewt/en_ewt-ud-train.conllu \\
        --dev ../shared/data/ud_english_ewt/en_ewt-ud-dev.conllu
    python examples/pos_tagging.py --quick --train ... --dev ...   # a minute

The recurrent loops run with keras_birnn's defaults: the character
encoder (`kb.NestedEncoder`, valid words only) meets a new batch size at
nearly every batch and stays plain TensorFlow, the sentence layer's
recurring shapes are XLA-compiled once met often enough
(`kb.compilation`, docs/design.md).

`--layers keras` builds each variant's twin from Keras's own layers,
same sizes and dropout:

    char encoder  keras.layers.Bidirectional(keras.layers.GRU(units)), concat
                  final states, on the same character embedding and mask
    gru           keras.layers.GRU(H, return_sequences=True) + Dense softmax
    bigru/bilstm  keras.layers.Bidirectional(keras.layers.GRU/LSTM(H,
                  return_sequences=True)) + Dense(n_tags, softmax): the
                  projection merge, V_f h_f + V_b h_b + c, is a Dense on the
                  concat whose kernel is [V_f; V_b]
    bilstm2       Bidirectional(LSTM) -> Dropout -> Bidirectional(LSTM) -> Dense

Same parameter counts and, given the same weights, the same probabilities
at every word (tests/test_examples_twins.py). What differs: wherever the
word mask reaches it, kb's projection merge writes zeros at padded
positions and Keras's Dense a softmax (the accuracy and the exported tags
read only words), the random draws of the initial weights and of dropout,
and the recurrent code. The twin is
exported the same way (`keras.export.ExportArchive`, the same serving
signature).
"""

import argparse
import json
import os
import sys
import time
import weakref
from collections import Counter
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

try:
    import keras_birnn as kb
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import keras_birnn as kb  # noqa: E402
from keras_birnn.cli import (  # noqa: E402
    LAYERS, EpochTimer, check_layers, finish_args, require_files, without_autotuning,
)
from keras_birnn.datasets import read_conllu  # noqa: E402

UD_RELEASE = "r2.15"
UD_URL = "https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/{release}/{name}"
EWT_FILES = {
    "train": "en_ewt-ud-train.conllu",
    "dev": "en_ewt-ud-dev.conllu",
    "test": "en_ewt-ud-test.conllu",
}
VARIANTS = ("gru", "bigru", "bilstm", "bilstm2")
PAD, OOV = "", "[UNK]"


# --- data ----------------------------------------------------------------------------


def download_ewt(release: str = UD_RELEASE, cache_dir: Optional[str] = None) -> Dict[str, str]:
    """Fetches UD English EWT (train, dev, test) with `keras.utils.get_file`;
    returns local paths. Cached under `~/.keras/datasets/ud_english_ewt_<release>/`."""
    paths = {}
    for split, name in EWT_FILES.items():
        paths[split] = keras.utils.get_file(
            fname=name,
            origin=UD_URL.format(release=release, name=name),
            cache_dir=cache_dir,
            cache_subdir=f"datasets/ud_english_ewt_{release}",
        )
    return paths


def build_vocabularies(sentences, min_word_count: int = 2, min_char_count: int = 1):
    """(words, chars, tags) from training sentences. Words are lower-cased
    (the same UTF-8 lower-casing the graph applies); words seen fewer than
    `min_word_count` times stay out, so that the OOV bucket is trained."""
    tokens = [t for toks, _, _ in sentences for t in toks]
    lowered = tf.strings.lower(tf.constant(tokens), encoding="utf-8").numpy()
    word_counts = Counter(w.decode("utf-8") for w in lowered)
    char_counts = Counter(c for t in tokens for c in t)
    words = sorted(w for w, n in word_counts.items() if n >= min_word_count and w not in (PAD, OOV))
    chars = sorted(c for c, n in char_counts.items() if n >= min_char_count and c not in (PAD, OOV))
    tags = sorted({tag for _, upos, _ in sentences for tag in upos})
    return words, chars, tags


class TokenEncoder:
    """Raw tokens to ids, in TensorFlow: used for the training data and
    inside the exported graph, so both see exactly the same ids.

    words: `tf.strings.lower` (UTF-8) then a StringLookup (0 = padding "",
    1 = OOV). chars: `tf.strings.unicode_split`, at most `max_chars` per
    word (longer words keep their first and last `max_chars // 2`
    characters: prefixes and suffixes carry the morphology), then a
    StringLookup (0 = padding, 1 = OOV).
    """

    def __init__(self, words: Sequence[str], chars: Sequence[str], max_chars: int = 16):
        self.max_chars = int(max_chars)
        self.word_lookup = keras.layers.StringLookup(
            vocabulary=list(words), mask_token=PAD, num_oov_indices=1, name="word_lookup"
        )
        self.char_lookup = keras.layers.StringLookup(
            vocabulary=list(chars), mask_token=PAD, num_oov_indices=1, name="char_lookup"
        )

    @property
    def word_count(self) -> int:
        return self.word_lookup.vocabulary_size()

    @property
    def char_count(self) -> int:
        return self.char_lookup.vocabulary_size()

    def __call__(self, tokens):
        """tokens: string `[batch, time]`, "" = padding -> (word ids `[B, T]`,
        char ids `[B, T, C]`, C = the longest kept word, at most max_chars)."""
        tokens = tf.convert_to_tensor(tokens, tf.string)
        word_ids = tf.cast(self.word_lookup(tf.strings.lower(tokens, encoding="utf-8")), tf.int32)
        chars = tf.strings.unicode_split(tokens, "UTF-8")  # ragged [B, T, (L)]
        lengths = tf.cast(chars.row_lengths(axis=2).to_tensor(), tf.int32)  # [B, T]
        padded = chars.to_tensor(default_value=PAD)  # [B, T, Lmax]
        longest = tf.shape(padded)[2]
        c = self.max_chars
        j = tf.range(c)
        head = c // 2
        long_word = (lengths > c)[..., None]
        source = tf.where(long_word & (j >= head), lengths[..., None] - c + j, j)  # [B, T, C]
        valid = j < lengths[..., None]
        source = tf.minimum(source, tf.maximum(longest - 1, 0))
        picked = tf.cond(
            longest > 0,
            lambda: tf.gather(padded, source, batch_dims=2),
            lambda: tf.fill(tf.shape(source), PAD),
        )
        picked = tf.where(valid, picked, PAD)
        width = tf.minimum(c, tf.reduce_max(tf.concat([tf.reshape(lengths, [-1]), [1]], 0)))
        char_ids = tf.cast(self.char_lookup(picked[:, :, :width]), tf.int32)
        return word_ids, char_ids


def pad_tokens(sentences: Sequence[Sequence[str]]) -> np.ndarray:
    """Right-pads token lists with "" into an object array `[N, T]`."""
    width = max((len(s) for s in sentences), default=0)
    out = np.full((len(sentences), max(width, 1)), PAD, dtype=object)
    for i, s in enumerate(sentences):
        out[i, : len(s)] = s
    return out


class EncodedSet:
    """Sentences encoded once (ids per sentence), batched by length on demand."""

    def __init__(self, sentences, encoder: TokenEncoder, tags: Sequence[str], chunk: int = 256):
        tag_index = {t: i for i, t in enumerate(tags)}
        self.tokens = [list(toks) for toks, _, _ in sentences]
        self.labels = [np.array([tag_index.get(t, -1) for t in upos], np.int32) for _, upos, _ in sentences]
        self.lengths = np.array([len(t) for t in self.tokens])
        self.word_ids: List[np.ndarray] = []
        self.char_ids: List[np.ndarray] = []
        order = np.argsort(self.lengths, kind="stable")
        words_by, chars_by = {}, {}
        for start in range(0, len(order), chunk):
            idx = order[start : start + chunk]
            w, c = encoder(pad_tokens([self.tokens[i] for i in idx]))
            w, c = w.numpy(), c.numpy()
            for row, i in enumerate(idx):
                n = self.lengths[i]
                words_by[i], chars_by[i] = w[row, :n], c[row, :n]
        self.word_ids = [words_by[i] for i in range(len(self.tokens))]
        self.char_ids = [chars_by[i] for i in range(len(self.tokens))]

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, idx):
        """Padded arrays for sentences `idx`: ((words [B,T], chars [B,T,C]), labels [B,T])."""
        t = max(int(self.lengths[i]) for i in idx)
        c = max(self.char_ids[i].shape[1] for i in idx)
        words = np.zeros((len(idx), t), np.int32)
        chars = np.zeros((len(idx), t, c), np.int32)
        labels = np.zeros((len(idx), t), np.int32)
        for row, i in enumerate(idx):
            n, k = self.lengths[i], self.char_ids[i].shape[1]
            words[row, :n], chars[row, :n, :k], labels[row, :n] = self.word_ids[i], self.char_ids[i], self.labels[i]
        return (words, chars), labels

    def batches(self, batch_size: int, rng: Optional[np.random.Generator] = None) -> list:
        """Length-bucketed batches (little padding); with `rng`, the sort is
        jittered and the batch order shuffled (a new draw per epoch)."""
        keys = self.lengths.astype(float)
        if rng is not None:
            keys = keys + rng.uniform(0, 3, size=len(keys))
        order = np.argsort(keys, kind="stable")
        groups = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
        if rng is not None:
            rng.shuffle(groups)
        return [self.batch(g) for g in groups]


BATCH_SPEC = (
    (tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None, None], tf.int32)),
    tf.TensorSpec([None, None], tf.int32),
)


def batch_spec(batch) -> tuple:
    """The `tf.data` signature of batches shaped like `batch` (any sizes):
    BATCH_SPEC for `((words, chars), labels)`, more inputs where a batch has them."""
    return tf.nest.map_structure(lambda a: tf.TensorSpec([None] * a.ndim, tf.as_dtype(a.dtype)), batch)


def dataset(batches) -> tf.data.Dataset:
    """A fixed list of batches as a tf.data.Dataset (the same every pass)."""
    spec = batch_spec(batches[0]) if len(batches) else BATCH_SPEC
    data = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec)
    return without_autotuning(data.apply(tf.data.experimental.assert_cardinality(len(batches))))


def training_data(encoded: "EncodedSet", batch_size: int, rng: Optional[np.random.Generator] = None):
    """`encoded`'s length-bucketed batches as a tf.data.Dataset for one
    `model.fit` over every epoch: with `rng`, each pass over the dataset
    (each epoch) draws new batches (`EncodedSet.batches`), so the data is
    reshuffled per epoch; without, the same length-sorted batches each pass."""
    count = -(-len(encoded) // batch_size)
    data = tf.data.Dataset.from_generator(lambda: iter(encoded.batches(batch_size, rng)), output_signature=BATCH_SPEC)
    return without_autotuning(data.apply(tf.data.experimental.assert_cardinality(count)))


# --- the model -------------------------------------------------------------------------


def over_every_word(encoder: keras.layers.Layer, embedded: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """The Keras twins' character encoders: `encoder` (a Keras
    `Bidirectional` returning final states) over every word of `embedded`
    `[B, T, C, D]` reshaped to `[B * T, C, D]`, padding words too, the
    way a Keras user writes it; back to `[B, T, width]`."""
    shape = tf.shape(embedded)
    flat = tf.reshape(embedded, [-1, shape[2], embedded.shape[-1]])  # one row per word
    states = encoder(flat, mask=tf.reshape(mask, [-1, shape[2]]))
    return tf.reshape(states, [shape[0], shape[1], states.shape[-1]])


class CharWordEncoder(keras.layers.Layer):
    """chars `[B, T, C]` -> one vector per word `[B, T, 2 * units]`: the final
    states of a kb.Bidirectional(kb.GRUCell) over each word's characters,
    run by `kb.NestedEncoder` on the valid words only (padding words give
    zeros). `layers="keras"`: a keras.layers.Bidirectional(keras.layers.GRU)
    over every word of the reshaped batch instead, same weights. Either way
    the output mask marks the words (a word has at least one character):
    the sentence layers and the loss read it."""

    def __init__(self, char_count: int, char_dim: int = 32, units: int = 32, layers: str = "kb", **kwargs):
        super().__init__(**kwargs)
        check_layers(layers)
        self.char_count, self.char_dim, self.units, self.layers_kind = char_count, char_dim, units, layers
        self.embedding = keras.layers.Embedding(char_count, char_dim, name="char_embedding")
        if layers == "keras":
            self.encoder = keras.layers.Bidirectional(keras.layers.GRU(units), name="char_bigru")
        else:
            self.encoder = kb.NestedEncoder(kb.Bidirectional(kb.GRUCell(units), name="char_bigru"), name="char_words")

    def build(self, input_shape):
        self.embedding.build((None, None))
        self.encoder.build((None, None, self.char_dim) if self.layers_kind == "keras" else (None, None, None, self.char_dim))

    def call(self, chars):
        if self.layers_kind == "kb":
            return self.encoder(self.embedding(chars), mask=chars != 0)
        return over_every_word(self.encoder, self.embedding(chars), chars != 0)

    def compute_mask(self, chars, mask=None):
        return keras.ops.any(keras.ops.not_equal(chars, 0), axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:2]) + (2 * self.units,)

    def get_config(self):
        config = super().get_config()
        config.update(char_count=self.char_count, char_dim=self.char_dim, units=self.units)
        if self.layers_kind != "kb":
            config.update(layers=self.layers_kind)
        return config


def _stacked_bilstm(hidden: int, dropout: float) -> keras.layers.Layer:
    """Two BiLSTMs (concat between them, dropout on it)."""
    return kb.stacked_bidirectional("lstm", units=(hidden, hidden), dropout=dropout, name="bilstm_stack")


def build_tagger(
    variant: str,
    word_count: int,
    char_count: int,
    n_tags: int,
    word_dim: int = 100,
    char_dim: int = 32,
    char_units: int = 48,
    hidden: int = 128,
    dropout: float = 0.33,
    layers: str = "kb",
) -> keras.Model:
    """words `[B, T]` + chars `[B, T, C]` -> tag probabilities `[B, T, n_tags]`.

    `layers="keras"` builds the twin from Keras's recurrent layers (see the
    module docstring): `_keras_sentence_layers`."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, received {variant!r}")
    check_layers(layers)
    words = keras.Input((None,), dtype="int32", name="words")
    chars = keras.Input((None, None), dtype="int32", name="chars")
    embedded = keras.layers.Embedding(word_count, word_dim, mask_zero=True, name="word_embedding")(words)
    spelled = CharWordEncoder(char_count, char_dim, char_units, layers=layers, name="char_encoder")(chars)
    x = keras.layers.Concatenate(name="word_repr")([embedded, spelled])  # keeps the word mask
    x = keras.layers.Dropout(dropout)(x)
    if layers == "keras":
        probs = _keras_sentence_layers(variant, x, n_tags, hidden, dropout)
        return keras.Model([words, chars], probs, name=f"{variant}_tagger")
    head = dict(merge_mode="projection", projection_units=n_tags, projection_activation="softmax",
                return_sequences=True)
    if variant == "gru":
        x = kb.Recurrent(kb.GRUCell(hidden), return_sequences=True, name="gru")(x)
        x = keras.layers.Dropout(dropout)(x)
        probs = keras.layers.Dense(n_tags, activation="softmax", name="tags")(x)
    elif variant == "bigru":
        probs = kb.Bidirectional(kb.GRUCell(hidden), name="bigru", **head)(x)
    elif variant == "bilstm":
        probs = kb.Bidirectional(kb.LSTMCell(hidden), name="bilstm", **head)(x)
    else:
        # A stack cannot end in the projection merge (it needs one tensor to
        # stack on), so the head is a Dense on the top layer's concat:
        # W [h_f; h_b] + c = V_f h_f + V_b h_b + c, the same function.
        x = _stacked_bilstm(hidden, dropout)(x)
        probs = keras.layers.Dense(n_tags, activation="softmax", name="tags")(x)
    return keras.Model([words, chars], probs, name=f"{variant}_tagger")


def _keras_sentence_layers(variant: str, x, n_tags: int, hidden: int, dropout: float):
    """The Keras twin of each variant's sentence-level layers and softmax."""
    sequences = dict(return_sequences=True)
    if variant == "gru":
        x = keras.layers.GRU(hidden, name="gru", **sequences)(x)
        x = keras.layers.Dropout(dropout)(x)
    elif variant == "bigru":
        x = keras.layers.Bidirectional(keras.layers.GRU(hidden, **sequences), name="bigru")(x)
    elif variant == "bilstm":
        x = keras.layers.Bidirectional(keras.layers.LSTM(hidden, **sequences), name="bilstm")(x)
    else:  # kb.stacked_bidirectional("lstm", (H, H), dropout): Dropout between the two layers
        x = keras.layers.Bidirectional(keras.layers.LSTM(hidden, **sequences), name="bilstm_1")(x)
        x = keras.layers.Dropout(dropout)(x)
        x = keras.layers.Bidirectional(keras.layers.LSTM(hidden, **sequences), name="bilstm_2")(x)
    # For bigru/bilstm this Dense is the projection merge: kernel [V_f; V_b], bias c.
    return keras.layers.Dense(n_tags, activation="softmax", name="tags")(x)


# One traced predictor per model, dropped with the model; kept out of the
# model's own attributes, so nothing the model tracks or saves changes.
_PREDICTORS = weakref.WeakKeyDictionary()


def predictor(model):
    """`model` in inference mode as one graph for any batch and sizes (the
    loops then run as graph while-loops, not op by op)."""
    if model not in _PREDICTORS:
        spec = [tf.TensorSpec([None] * len(x.shape), x.dtype) for x in model.inputs]
        model_ref = weakref.ref(model)  # the entry must not keep its key alive
        _PREDICTORS[model] = tf.function(
            lambda *inputs: model_ref()(tuple(inputs), training=False), input_signature=spec
        )
    return _PREDICTORS[model]


def predict_tags(model, encoded: EncodedSet, batch_size: int = 128) -> List[np.ndarray]:
    """Predicted tag ids per sentence (length-sorted batches, then reordered)."""
    out = [None] * len(encoded)
    order = np.argsort(encoded.lengths, kind="stable")
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        (words, chars), _ = encoded.batch(idx)
        probs = predictor(model)(words, chars).numpy()
        for row, i in enumerate(idx):
            out[i] = probs[row, : encoded.lengths[i]].argmax(-1)
    return out


def accuracy(model, encoded: EncodedSet, batch_size: int = 128) -> float:
    predicted = predict_tags(model, encoded, batch_size)
    hits = sum(int((p == y).sum()) for p, y in zip(predicted, encoded.labels))
    return hits / max(int(encoded.lengths.sum()), 1)


def compile_tagger(model, learning_rate) -> None:
    """Adam (gradient norm clipped at 5), masked cross-entropy, masked UPOS accuracy.

    The word mask reaches the softmax output, and Keras weights the loss and
    `weighted_metrics` by it, so padding counts in neither ("upos" is the
    share of words tagged right, as `accuracy` counts it). A dev tag unseen
    in training has the label -1: `ignore_class` leaves it out of the loss,
    the accuracy counts it wrong (as `accuracy` does).
    """
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate, clipnorm=5.0),
        loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=-1),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="upos")],
    )


def plot_training(rows, path: str) -> Optional[str]:
    """Train loss and dev UPOS per epoch of every variant as a PNG at `path`
    (nothing for an empty path); skipped with a note without matplotlib."""
    if not path:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("No training-curve plot: matplotlib is not installed.")
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        epochs = range(1, len(r["epoch_losses"]) + 1)
        left.plot(epochs, r["epoch_losses"], marker="o", label=r["variant"])
        right.plot(epochs, [100 * a for a in r["dev_curve"]], marker="o", label=r["variant"])
    left.set(xlabel="epoch", ylabel="train loss (masked cross-entropy)", title="Training loss")
    right.set(xlabel="epoch", ylabel="dev UPOS accuracy (%)", title="Dev accuracy")
    for axes in (left, right):
        axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        axes.legend()
        axes.grid(alpha=0.3)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    print(f"Training curves: {path}")
    return path


def mean_loss(model, batches) -> float:
    """Masked mean cross-entropy per token (no dropout)."""
    total, count = 0.0, 0
    for (words, chars), labels in batches:
        probs = predictor(model)(words, chars).numpy()
        valid = words != 0
        p = np.take_along_axis(probs, labels[..., None], axis=-1)[..., 0]
        total += float(-np.log(np.maximum(p[valid], 1e-12)).sum())
        count += int(valid.sum())
    return total / max(count, 1)


# --- export ------------------------------------------------------------------------------


def export_tagger(model, encoder: TokenEncoder, tags: Sequence[str], export_dir: str, version: int = 1) -> str:
    """Writes `export_dir/<version>/`: string tokens in, tag strings out.

    The lookups (word and character vocabularies, tag names) live in the
    graph; the loops are traced for serving (`kb.for_export()`: no XLA,
    the forward pass alone, so a reload warns of nothing), and the written
    graph is checked with `kb.check_graph_ops`.
    """
    from keras_birnn.export import write_version

    tag_names = tf.constant([PAD] + list(tags))  # index 0: padding

    def serve(tokens):
        word_ids, char_ids = encoder(tokens)
        probs = model((word_ids, char_ids), training=False)
        valid = word_ids != 0
        tag_ids = tf.where(valid, tf.argmax(probs, axis=-1, output_type=tf.int32), -1)
        return {
            "tags": tf.gather(tag_names, tag_ids + 1),
            "tag_ids": tag_ids,
            "probabilities": probs,
        }

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(encoder.word_lookup)
    archive.track(encoder.char_lookup)
    with kb.for_export():
        archive.add_endpoint(
            "serving_default", serve, input_signature=[tf.TensorSpec([None, None], tf.string, name="tokens")]
        )
        return write_version(archive, export_dir, version)


def export_tagger_litert(model, encoder: TokenEncoder, tags: Sequence[str], folder: str,
                         batch_size: int = 1) -> str:
    """Writes `folder/pos_tagger.tflite` (LiteRT builtin ops only, through
    `kb.export_tflite`) and `folder/ids.json`, the vocabularies that turn
    tokens into its inputs; returns the `.tflite` path.

    LiteRT has no string ops, so the lookups stay on the device (see
    `device_ids`). Inputs: `words` int32 `[batch_size, time]` and `chars`
    int32 `[batch_size, time, width]`, time and width dynamic, padding id 0
    (left padding and holes work too: the mask comes from the ids). Output:
    float32 `[batch_size, time, n_tags]`, zeros at padding; the tag of a word
    is `tags[argmax]`.
    """
    os.makedirs(folder, exist_ok=True)
    ids = {
        "words": encoder.word_lookup.get_vocabulary(),
        "chars": encoder.char_lookup.get_vocabulary(),
        "tags": list(tags),
        "max_chars": encoder.max_chars,
        "batch_size": batch_size,
    }
    with open(os.path.join(folder, "ids.json"), "w", encoding="utf-8") as f:
        json.dump(ids, f, ensure_ascii=False)
    return kb.export_tflite(model, os.path.join(folder, "pos_tagger.tflite"), batch_size=batch_size, lengths=False)


def device_ids(sentences: Sequence[Sequence[str]], ids: dict) -> Tuple[np.ndarray, np.ndarray]:
    """The LiteRT tagger's inputs from tokens, in plain Python: what an app
    on the device computes (`ids` is the export's `ids.json`).

    word id: the index of the lower-cased token in `ids["words"]` (0 is
    padding "", 1 is "[UNK]" for every other word). char ids: the token's
    characters (Unicode code points) looked up the same way in
    `ids["chars"]`; a word longer than `max_chars` keeps its first
    `max_chars // 2` and last `max_chars - max_chars // 2` characters;
    rows are right-padded with 0 to the longest sentence, words to the
    longest kept word. The same ids as `TokenEncoder`'s (tested).
    """
    word_index = {w: i for i, w in enumerate(ids["words"])}
    char_index = {c: i for i, c in enumerate(ids["chars"])}
    c = ids["max_chars"]
    kept = [[t if len(t) <= c else t[: c // 2] + t[len(t) - (c - c // 2) :] for t in s] for s in sentences]
    time_size = max([len(s) for s in sentences] + [1])
    width = max([len(t) for s in kept for t in s] + [1])
    words = np.zeros((len(sentences), time_size), np.int32)
    chars = np.zeros((len(sentences), time_size, width), np.int32)
    for i, sentence in enumerate(kept):
        for j, token in enumerate(sentence):
            words[i, j] = word_index.get(token.lower(), 1) if token else 0
            chars[i, j, : len(token)] = [char_index.get(ch, 1) for ch in token]
    return words, chars


def litert_interpreter(path: str):
    """The `.tflite` tagger in the interpreter of `ai-edge-litert`, else
    TensorFlow's; load it once, call `litert_probabilities` per batch."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = tf.lite.Interpreter
    return Interpreter(model_path=path)


def litert_probabilities(interpreter, words: np.ndarray, chars: np.ndarray) -> np.ndarray:
    """Runs the LiteRT tagger on a batch of its own batch size."""
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    interpreter.resize_tensor_input(index["words"], words.shape)
    interpreter.resize_tensor_input(index["chars"], chars.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(index["words"], words)
    interpreter.set_tensor(index["chars"], chars)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


# --- the run -------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python examples/pos_tagging.py",
        description="UPOS tagger on CoNLL-U files: GRU vs BiGRU vs BiLSTM vs two stacked BiLSTMs, "
        "word embeddings plus a character-level BiGRU; exports the best one for TF Serving.",
    )
    parser.add_argument("--train", help="training CoNLL-U file (default: download UD English EWT r2.15)")
    parser.add_argument("--dev", help="dev CoNLL-U file (required with --train)")
    parser.add_argument("--test", help="optional test CoNLL-U file (downloaded with the default data)")
    parser.add_argument("--cache-dir", help="where the default data is downloaded to (default ~/.keras)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)} (default: all)")
    parser.add_argument("--epochs", type=int, default=None, help="training epochs (default 6; --quick 2)")
    parser.add_argument("--max-train-sentences", type=int, default=None,
                        help="use only the first N training sentences (default all; --quick 600)")
    parser.add_argument("--max-dev-sentences", type=int, default=None,
                        help="evaluate on the first N dev sentences (default all; --quick 300)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=None, help="units per direction (default 128; --quick 32)")
    parser.add_argument("--word-dim", type=int, default=None, help="word embedding size (default 100; --quick 32)")
    parser.add_argument("--char-units", type=int, default=None,
                        help="char BiGRU units per direction (default 48; --quick 16)")
    parser.add_argument("--max-chars", type=int, default=16, help="characters kept per word (default 16)")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--dropout", type=float, default=0.33)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="saved_models",
                        help="export base folder: the best tagger goes to <out>/pos_tagger/1/ (default saved_models)")
    parser.add_argument("--no-export", action="store_true", help="skip the SavedModel and LiteRT exports")
    parser.add_argument("--layers", choices=LAYERS, default="kb",
                        help="kb: keras_birnn's layers (default); keras: the same taggers from "
                        "keras.layers.GRU / LSTM / Bidirectional, the projection merge as a Dense softmax on "
                        "the concat (same parameters; Keras's Dense gives probabilities, not zeros, at "
                        "padded positions); exported the same way")
    parser.add_argument("--report-json", metavar="PATH",
                        help="also write timings and accuracy to PATH as JSON, per variant: epoch_seconds "
                        "(the training part of each epoch of model.fit, its dev pass apart in "
                        "validation_seconds), fit_seconds, predict_sentences_per_second (a second, warm pass "
                        "over dev), accuracy (dev UPOS), dev_curve (dev UPOS after each epoch); and the export path")
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="also log each variant's training to DIR/<variant>/ (keras.callbacks.TensorBoard)")
    parser.add_argument("--plot", metavar="PATH",
                        help="training curves (train loss, dev UPOS per epoch, every variant) as a PNG, when "
                        "matplotlib is installed (default <out>/pos_tagging_training.png; '' for none)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in about a minute")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.train is None and (args.dev or args.test):
        parser.error("--dev/--test need --train (or give no path to download UD English EWT)")
    if args.train is not None and args.dev is None:
        parser.error("--train needs --dev")
    finish_args(
        parser, args,
        quick=dict(epochs=(2, 6), max_train_sentences=(600, None), max_dev_sentences=(300, None),
                   hidden=(32, 128), word_dim=(32, 100), char_units=(16, 48)),
        choices=("variants", VARIANTS),
        positive=("epochs", "batch_size", "hidden", "word_dim", "char_units", "max_chars"),
    )
    return find_data(parser, args)


def find_data(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Sets `args.train`, `args.dev` (and `args.test`) to existing files: the
    given ones, else UD English EWT downloaded (`download_ewt`). A missing
    file or a failed download stops through `parser.error` naming the flags."""
    hint = "pass CoNLL-U files with --train FILE --dev FILE (e.g. UD English EWT's en_ewt-ud-train.conllu and " \
        f"en_ewt-ud-dev.conllu, https://github.com/UniversalDependencies/UD_English-EWT/tree/{UD_RELEASE})"
    if args.train is None:
        try:
            paths = download_ewt(cache_dir=args.cache_dir)
        except Exception as error:  # get_file raises a bare Exception for URL failures
            parser.error(f"the default data, UD English EWT {UD_RELEASE}, could not be downloaded "
                         f"({str(error).splitlines()[0][:200]}); {hint}")
        args.train, args.dev, args.test = paths["train"], paths["dev"], paths["test"]
    require_files(parser, {"--train": args.train, "--dev": args.dev, "--test": args.test}, hint)
    return args


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Trains every variant, prints the table, exports the best; returns the results."""
    args = parse_args(argv)
    start = time.perf_counter()
    train = read_conllu(args.train)[: args.max_train_sentences]
    dev = read_conllu(args.dev)[: args.max_dev_sentences]
    test = read_conllu(args.test) if args.test else None

    words, chars, tags = build_vocabularies(train)
    encoder = TokenEncoder(words, chars, args.max_chars)
    train_set = EncodedSet(train, encoder, tags)
    dev_set = EncodedSet(dev, encoder, tags)
    test_set = EncodedSet(test, encoder, tags) if test else None
    print(
        f"Train {len(train)} sentences / {int(train_set.lengths.sum())} words, dev {len(dev)} / "
        f"{int(dev_set.lengths.sum())}" + (f", test {len(test)} / {int(test_set.lengths.sum())}" if test else "")
        + f"; vocabulary {encoder.word_count} words (lower-cased, count >= 2, with padding and OOV), "
        f"{encoder.char_count} characters, {len(tags)} UPOS tags."
    )
    print(f"Load average at start: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} CPUs.")

    rows, models = [], {}
    for variant in args.variants:
        keras.utils.set_random_seed(args.seed)
        rng = np.random.default_rng(args.seed)
        model = build_tagger(variant, encoder.word_count, encoder.char_count, len(tags), args.word_dim,
                             32, args.char_units, args.hidden, args.dropout, layers=args.layers)
        steps = args.epochs * int(np.ceil(len(train_set) / args.batch_size))
        schedule = keras.optimizers.schedules.CosineDecay(args.learning_rate, decay_steps=steps, alpha=0.05)
        compile_tagger(model, schedule)
        probe = train_set.batches(args.batch_size)[:8]
        loss_before = mean_loss(model, probe)
        print(f"\n{variant}: {model.count_params():,} parameters")
        began = time.perf_counter()
        timer = EpochTimer()
        callbacks = [timer]
        if args.tensorboard:
            callbacks.append(keras.callbacks.TensorBoard(log_dir=os.path.join(args.tensorboard, variant)))
        history = model.fit(
            training_data(train_set, args.batch_size, rng), epochs=args.epochs,
            validation_data=training_data(dev_set, 128), callbacks=callbacks,
            verbose=0 if args.quiet else (1 if sys.stdout.isatty() else 2), shuffle=False,  # reshuffled by training_data
        )
        losses = [float(v) for v in history.history["loss"]]
        dev_curve = [float(v) for v in history.history["val_upos"]]
        epoch_seconds = timer.seconds
        seconds = sum(epoch_seconds)  # training only; the dev passes are in validation_seconds
        predict_began = time.perf_counter()
        dev_accuracy = accuracy(model, dev_set)
        predict_first = time.perf_counter() - predict_began
        row = {
            "variant": variant,
            "params": model.count_params(),
            "dev": dev_accuracy,
            "test": accuracy(model, test_set) if test_set else None,
            "seconds": seconds,
            "load": os.getloadavg()[0],
            "loss_before": loss_before,
            "loss_after": mean_loss(model, probe),
            "epoch_losses": losses,
            "dev_curve": dev_curve,
            "epoch_seconds": epoch_seconds,
            "validation_seconds": timer.validation_seconds,
            "predict_first_seconds": predict_first,
        }
        if args.report_json:
            predict_began = time.perf_counter()
            predict_tags(model, dev_set)  # warm: the predictor is traced, the shapes seen
            row["predict_sentences_per_second"] = len(dev_set) / (time.perf_counter() - predict_began)
        rows.append(row)
        models[variant] = model
        print(f"  {variant}: dev UPOS {100 * row['dev']:.2f}% after {seconds:.0f} s of training "
              f"(+ {sum(timer.validation_seconds):.0f} s of dev passes, {time.perf_counter() - began:.0f} s in fit)")

    twin = ", Keras's recurrent layers (--layers keras)" if args.layers == "keras" else ""
    plot_training(rows, args.plot if args.plot is not None else os.path.join(args.out, "pos_tagging_training.png"))
    print(f"\nUPOS accuracy ({args.epochs} epochs, {len(train)} training sentences, hidden {args.hidden}{twin}):")
    print(format_table(rows))
    best = max(rows, key=lambda r: r["dev"])
    export_path = litert_path = None
    if not args.no_export:
        export_path = export_tagger(models[best["variant"]], encoder, tags,
                                    os.path.join(args.out, "pos_tagger"))
        served = tf.saved_model.load(export_path).signatures["serving_default"]
        example = [["The", "old", "man", "sat", "on", "the", "chair", "."], ["They", "lead", "the", "race"]]
        out = served(tokens=tf.constant(pad_tokens(example).tolist()))["tags"].numpy()
        print(f"\nExported the {best['variant']} tagger to {export_path} (string tokens in, tags out):")
        for toks, row in zip(example, out):
            print("  " + " ".join(f"{t}/{g.decode()}" for t, g in zip(toks, row) if t))
        if args.layers == "kb":
            litert_path = _export_and_try_litert(models[best["variant"]], encoder, tags, args.out, example)
        else:
            # Keras's GRU over the reshaped words has a batch (the number
            # of words) known only at run time: its loop's TensorLists
            # need Flex ops, which kb.export_tflite refuses.
            print("No LiteRT export for Keras's layers: their character encoder needs Flex ops.")
    total = time.perf_counter() - start
    print(f"Done in {total:.0f} s; load average now {os.getloadavg()[0]:.2f}.")
    if args.report_json:
        write_report(args.report_json, args, rows, len(dev_set), export_path, total)
    return {"rows": rows, "models": models, "encoder": encoder, "tags": tags, "best": best["variant"],
            "export_path": export_path, "litert_path": litert_path, "dev": dev, "dev_set": dev_set,
            "seconds": total}


def _export_and_try_litert(model, encoder: TokenEncoder, tags: Sequence[str], out: str, example) -> str:
    """Writes the LiteRT tagger and prints its tags for `example`."""
    litert_path = export_tagger_litert(model, encoder, tags, os.path.join(out, "pos_tagger_litert"))
    with open(os.path.join(os.path.dirname(litert_path), "ids.json"), encoding="utf-8") as f:
        ids = json.load(f)
    print(f"and to {litert_path} for LiteRT (builtin ops only; ids in, see ids.json beside it):")
    interpreter = litert_interpreter(litert_path)
    for toks in example:
        probs = litert_probabilities(interpreter, *device_ids([toks], ids))[0]
        print("  " + " ".join(f"{t}/{tags[k]}" for t, k in zip(toks, probs.argmax(-1))))
    return litert_path


def write_report(path: str, args, rows, dev_sentences: int, export_path, total: float) -> None:
    """--report-json: one entry per variant; with a single variant its
    numbers are also at the top level."""
    entries = [
        {"variant": r["variant"], "params": r["params"], "epoch_seconds": r["epoch_seconds"],
         "fit_seconds": sum(r["epoch_seconds"]), "validation_seconds": r["validation_seconds"],
         "dev_curve": r["dev_curve"], "predict_first_seconds": r["predict_first_seconds"],
         "predict_sentences_per_second": r["predict_sentences_per_second"], "accuracy": r["dev"]}
        for r in rows
    ]
    report = {"example": "pos_tagging", "layers": args.layers, "dev_sentences": dev_sentences,
              "export_path": export_path, "seconds": total, "variants": entries}
    if len(entries) == 1:
        report.update({k: v for k, v in entries[0].items() if k != "variant"}, variant=entries[0]["variant"])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


def format_table(rows) -> str:
    has_test = any(r["test"] is not None for r in rows)
    head = f"{'model':8}  {'params':>9}  {'dev UPOS':>8}" + ("  test UPOS" if has_test else "") + f"  {'train time':>10}"
    lines = [head]
    for r in rows:
        test = f"  {100 * r['test']:8.2f}%" if has_test and r["test"] is not None else ("  " + " " * 9 if has_test else "")
        lines.append(f"{r['variant']:8}  {r['params']:>9,}  {100 * r['dev']:7.2f}%{test}  {r['seconds']:9.0f}s")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
