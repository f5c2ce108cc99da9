"""UPOS tagging on Universal Dependencies (CoNLL-U): unidirectional vs bidirectional.

Every variant is `keras_birnn.tagging.build_tagger` with a softmax head:
word embeddings (`TokenEncoder`: lower-cased, digits -> 0, words seen once
are OOV so that the OOV vector trains; or --embeddings, pretrained vectors
through `load_vectors`) and a character BiGRU (`kb.NestedEncoder`, final
states per word), then the sentence-level layer that the variants compare:

    gru      kb.Recurrent(kb.GRUCell(H)), left to right only, on build_tagger's word vectors
    bigru    kb.Bidirectional(kb.GRUCell(H))
    bilstm   kb.Bidirectional(kb.LSTMCell(H))
    bilstm2  two stacked BiLSTMs (kb.stacked_bidirectional)

each followed by Dropout and Dense(n_tags, softmax). The loss and the
"upos" accuracy are masked (the word mask reaches the output). One
`model.fit` over a fixed number of epochs (new length-bucketed batches each
epoch), Adam with cosine decay, dev UPOS after each epoch (watched, never
used for selection). `--tensorboard DIR` logs the runs; the curves go to a
PNG (`--plot`, with matplotlib). The best variant is exported with
`export_tagger` to `<out>/pos_tagger/1/` (`serving_default(inputs: string
[batch, time], "" = padding) -> tags, tag_ids, confidence`), and, with
kb's layers, for LiteRT (builtin ops only, `kb.export_tflite`) to
`<out>/pos_tagger_litert/pos_tagger.tflite` with the vocabularies in
`ids.json` beside it: LiteRT has no string ops, so the app computes the ids
(`device_ids` spells out how):

    words: int32 [1, time], chars: int32 [1, time, max_chars] (0 = padding)
        -> float32 [1, time, n_tags]; a word's tag is ids["tags"][argmax]

Data: by default UD English EWT r2.16 (`keras_birnn.data.downloads`, found in
--data-dir or $KERAS_BIRNN_DATA, else downloaded once and cached); any
CoNLL-U files with --train/--dev:

    python examples/pos_tagging.py --data-dir ../shared/data
    python examples/pos_tagging.py --train my-train.conllu --dev my-dev.conllu --variants bigru
    python examples/pos_tagging.py --quick   # a minute

`--layers keras` builds each variant's twin (`keras_twin`): the same
model with its kb recurrent layers converted to keras.layers (GRU, LSTM,
Bidirectional, `kb.to_keras_bidirectional`; the character encoder run over
every word of the reshaped batch), the same weights, so the same
probabilities at every word (tests/tensorflow_only/test_examples_twins.py).

This module also holds what examples/conll_tagging.py shares: `Encoded`
(sentences as ids once; length-bucketed batches and word dropout by
`keras_birnn.tagging.batching`),
`dataset`, `keras_twin` and `predict_ids`.
"""

import argparse
import json
import os
import sys
import time
import weakref
from typing import Callable, List, Optional, Sequence, Tuple, Union

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402

try:
    import keras_birnn as kb
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import keras_birnn as kb  # noqa: E402
from keras_birnn.cli.arguments import (  # noqa: E402
    LAYERS, EpochTimer, add_data_arguments, check_layers, fetch_data_or_exit, finish_args, require_files,
    without_autotuning,
)
from keras_birnn.data.readers import read_conllu  # noqa: E402
from keras_birnn.tagging import TokenEncoder, build_tagger, export_tagger, load_vectors, pad_tokens  # noqa: E402
from keras_birnn.tagging import batching  # noqa: E402
from keras_birnn.tagging.batching import bucket_batches  # noqa: E402

EWT = ("ud_english_ewt", "en_ewt-ud-train.conllu", "en_ewt-ud-dev.conllu")  # keras_birnn.data.downloads
VARIANTS = ("gru", "bigru", "bilstm", "bilstm2")
OOV_ID = 1
Tagged = Tuple[List[str], List[str]]


# --- shared with conll_tagging.py: ids, batches, the twin, prediction ------------------------------


class Encoded:
    """Sentences encoded once: `TokenEncoder` ids, feature ids (`[tokens, columns]`), tag ids (unseen: -1)."""

    def __init__(self, sentences: Sequence[Tagged], encoder: TokenEncoder, tags: Sequence[str],
                 features: list = (), lookups: Sequence = (), chunk: int = 256):
        if lookups and len(features) != len(sentences):
            raise ValueError(f"`features` needs one entry per sentence: {len(sentences)} sentences, "
                             f"received {len(features)}.")
        index = {t: i for i, t in enumerate(tags)}
        self.lengths = np.array([len(tokens) for tokens, _ in sentences], np.int64)
        self.labels = [np.array([index.get(t, -1) for t in labels], np.int32) for _, labels in sentences]
        self.words, self.chars = [], []
        for start in range(0, len(sentences), chunk):
            part = [tokens for tokens, _ in sentences[start:start + chunk]]
            words, chars = (np.asarray(x) for x in encoder(pad_tokens(part)))
            self.words += [words[row, :len(t)] for row, t in enumerate(part)]
            self.chars += [chars[row, :len(t)] for row, t in enumerate(part)]
        bounds = np.cumsum([0] + [len(s) for s in features]) if lookups else []
        flat = [[row[k] for s in features for row in s] for k in range(len(lookups))]
        ids = np.stack([np.asarray(lookup(np.array(v + [""], object)))[:-1] for lookup, v in zip(lookups, flat)],
                       -1) if lookups else None
        self.features = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])] if lookups else []

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, idx) -> tuple:
        """((words [B, T], chars [B, T, C], one [B, T] per feature column), labels [B, T]), 0 at padding."""
        t, n = max(int(self.lengths[i]) for i in idx), len(idx)
        columns = self.features[0].shape[1] if self.features else 0
        words, labels = np.zeros((n, t), np.int32), np.zeros((n, t), np.int32)
        chars, feats = np.zeros((n, t, self.chars[0].shape[1]), np.int32), np.zeros((columns, n, t), np.int32)
        for row, i in enumerate(idx):
            k = self.lengths[i]
            words[row, :k], chars[row, :k], labels[row, :k] = self.words[i], self.chars[i], self.labels[i]
            if columns:
                feats[:, row, :k] = self.features[i].T
        return (words, chars, *feats), labels

    def batches(self, batch_size: int, rng: Optional[np.random.Generator] = None, word_dropout: float = 0.0) -> list:
        """Length-bucketed batches; with `rng` jittered, shuffled and with word dropout (a new draw each call)."""
        groups = bucket_batches(self.lengths, batch_size, rng)
        return [drop_words(self.batch(g), word_dropout, rng) for g in groups]


def drop_words(batch: tuple, rate: float, rng: Optional[np.random.Generator]) -> tuple:
    """Word dropout: in a copy, each known word id (not padding 0 nor OOV 1) becomes OOV with probability `rate`."""
    if rate <= 0 or rng is None:
        return batch
    (words, *others), labels = batch
    return (batching.drop_words(words, rate, rng), *others), labels


def dataset(batches: Union[list, Callable[[], list]], sample: Optional[tuple] = None,
            count: Optional[int] = None) -> tf.data.Dataset:
    """Batches as a tf.data.Dataset: a fixed list, or `batches()` drawn anew at
    each pass (each epoch of one `fit`; then give a `sample` batch and the `count`)."""
    sample, count = (batches[0], len(batches)) if isinstance(batches, list) else (sample, count)
    spec = tf.nest.map_structure(lambda a: tf.TensorSpec([None] * a.ndim, tf.as_dtype(a.dtype)), sample)
    draw = (lambda: iter(batches)) if isinstance(batches, list) else (lambda: iter(batches()))
    data = tf.data.Dataset.from_generator(draw, output_signature=spec)
    return without_autotuning(data.apply(tf.data.experimental.assert_cardinality(count)))


# --- the Keras twin (--layers keras) -------------------------------------------------------------


class EveryWord(keras.layers.Layer):
    """`kb.NestedEncoder`'s twin: a Keras layer over every word of `[B, T, C, D]`
    reshaped to `[B * T, C, D]`, padding words too, as a Keras user writes it."""

    def __init__(self, inner: keras.layers.Layer, **kwargs):
        super().__init__(**kwargs)
        self.inner, self.supports_masking = inner, True

    def call(self, x, mask=None):
        shape = ops.shape(x)
        flat_mask = None if mask is None else ops.reshape(mask, (-1, shape[2]))
        out = self.inner(ops.reshape(x, (-1, shape[2], x.shape[-1])), mask=flat_mask)
        return ops.reshape(out, (shape[0], shape[1], out.shape[-1]))

    def compute_mask(self, x, mask=None):
        return None if mask is None else ops.any(mask, axis=-1)


class KerasStack(keras.layers.Layer):
    """`kb.StackedBidirectional`'s twin: Keras `Bidirectional` layers, `Dropout` between."""

    def __init__(self, layers: Sequence[keras.layers.Layer], dropout: float, **kwargs):
        super().__init__(**kwargs)
        self.stack, self.drop, self.supports_masking = list(layers), keras.layers.Dropout(dropout), True

    def call(self, x, mask=None, training=None):
        for k, layer in enumerate(self.stack):
            x = layer(self.drop(x, training=training) if k else x, mask=mask, training=training)
        return x


def keras_twin(model: keras.Model, swap=None) -> keras.Model:
    """`model` with its kb recurrent layers as `keras.layers` (`kb.to_keras_bidirectional`,
    the same weights); every other layer is shared. `swap(layer)`: more conversions (or None)."""
    def convert(layer):
        if isinstance(layer, kb.StackedBidirectional):
            return KerasStack([kb.to_keras_bidirectional(b) for b in layer.bidirectionals], layer.dropout,
                              name=layer.name)
        if isinstance(layer, kb.NestedEncoder):
            return EveryWord(kb.to_keras_bidirectional(layer.encoder), name=layer.name)
        return (swap and swap(layer)) or layer
    return keras.models.clone_model(model, clone_function=convert)


_PREDICTORS = weakref.WeakKeyDictionary()  # one traced graph per model, dropped with it


def predict_ids(model: keras.Model, encoded: Encoded, batch_size: int = 128) -> List[np.ndarray]:
    """Tag ids per sentence: the CRF's Viterbi tags or the softmax's argmax, in one traced graph."""
    if model not in _PREDICTORS:
        spec, ref = [tf.TensorSpec([None] * len(x.shape), x.dtype) for x in model.inputs], weakref.ref(model)
        _PREDICTORS[model] = tf.function(lambda *xs: ref()(list(xs), training=False), input_signature=spec,
                                         autograph=False)
    out, order = [None] * len(encoded), np.argsort(encoded.lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        y = _PREDICTORS[model](*encoded.batch(idx)[0]).numpy()
        for row, i in enumerate(idx):
            out[i] = (y.argmax(-1) if y.ndim == 3 else y)[row, :encoded.lengths[i]]
    return out


# --- the variants --------------------------------------------------------------------------------


def keras_gru(layer: keras.layers.Layer) -> Optional[keras.layers.Layer]:
    """The "gru" variant's twin of `kb.Recurrent(kb.GRUCell)`: `keras.layers.GRU`, same weights (Keras's layout)."""
    if not isinstance(layer, kb.Recurrent):
        return None
    cell = layer.cell
    twin = keras.layers.GRU(cell.units, return_sequences=True, reset_after=cell.reset_after, name=layer.name)
    twin.build((None, None, cell.kernel.shape[0]))
    twin.set_weights(layer.get_weights())
    return twin


def build_variant(variant: str, num_words: int, num_chars: int, tags: Sequence[str], word_dim: int = 100,
                  char_units: int = 48, hidden: int = 128, dropout: float = 0.33, layers: str = "kb",
                  embeddings: Optional[np.ndarray] = None, trainable_embeddings: bool = True) -> keras.Model:
    """`build_tagger` (softmax head, character BiGRU) for a variant; "gru" swaps in a
    left-to-right `kb.Recurrent`. `layers="keras"`: its `keras_twin`."""
    if variant not in VARIANTS:
        raise ValueError(f"`variant` must be one of {VARIANTS}, received {variant!r}.")
    check_layers(layers)
    model = build_tagger(
        num_words, tags, embedding_dim=None if embeddings is not None else word_dim, embeddings=embeddings,
        trainable_embeddings=trainable_embeddings, char_encoder="gru", num_chars=num_chars, char_dim=32,
        char_units=char_units, hidden=hidden, depth=2 if variant == "bilstm2" else 1, dropout=dropout,
        cell="lstm" if variant.startswith("bilstm") else "gru", head="softmax", name=f"{variant}_tagger")
    if variant == "gru":  # build_tagger's word vectors, then one direction
        x = kb.Recurrent(kb.GRUCell(hidden), return_sequences=True, name="gru")(model.get_layer("input_dropout").output)
        x = keras.layers.Dropout(dropout, name="output_dropout")(x)
        out = keras.layers.Dense(len(tags), activation="softmax", name="tags")(x)
        model = keras.Model(model.inputs, out, name="gru_tagger")
    return keras_twin(model, keras_gru) if layers == "keras" else model


def accuracy(model: keras.Model, encoded: Encoded) -> float:
    """The share of words tagged right (a tag unseen in training, -1, counts wrong)."""
    hits = sum(int((p == y).sum()) for p, y in zip(predict_ids(model, encoded), encoded.labels))
    return hits / max(int(encoded.lengths.sum()), 1)


def compile_tagger(model: keras.Model, learning_rate) -> None:
    """Adam (clipnorm 5), masked cross-entropy (unseen tags, -1, left out) and masked "upos" accuracy:
    Keras weights the loss and `weighted_metrics` by the word mask that reaches the softmax."""
    model.compile(optimizer=keras.optimizers.Adam(learning_rate, clipnorm=5.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=-1),
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="upos")])


def plot_training(rows: list, path: str) -> Optional[str]:
    """Train loss and dev UPOS per epoch of every variant as a PNG (none for ""; a note without matplotlib)."""
    if not path:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("No training-curve plot: matplotlib is not installed.")
        return None
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        epochs = range(1, len(r["epoch_losses"]) + 1)
        left.plot(epochs, r["epoch_losses"], marker="o", label=r["variant"])
        right.plot(epochs, [100 * a for a in r["dev_curve"]], marker="o", label=r["variant"])
    left.set(xlabel="epoch", ylabel="train loss (masked cross-entropy)")
    right.set(xlabel="epoch", ylabel="dev UPOS accuracy (%)")
    for axes in (left, right):
        axes.legend(), axes.grid(alpha=0.3)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.tight_layout(), figure.savefig(path, dpi=100), plt.close(figure)
    print(f"Training curves: {path}")
    return path


# --- LiteRT: ids in, probabilities out -----------------------------------------------------------


def export_tagger_litert(model: keras.Model, encoder: TokenEncoder, tags: Sequence[str], folder: str) -> str:
    """Writes `folder/pos_tagger.tflite` (builtin ops only, `kb.export_tflite`, batch 1) and
    `folder/ids.json`, what turns tokens into its inputs on the device (`device_ids`)."""
    os.makedirs(folder, exist_ok=True)
    ids = {"words": encoder.get_word_vocabulary(), "chars": encoder.get_char_vocabulary(), "tags": list(tags),
           "max_chars": encoder.max_chars, "lowercase": encoder.lowercase, "fold_digits": encoder.fold_digits,
           "batch_size": 1}
    with open(os.path.join(folder, "ids.json"), "w", encoding="utf-8") as f:
        json.dump(ids, f, ensure_ascii=False)
    return kb.export_tflite(model, os.path.join(folder, "pos_tagger.tflite"), batch_size=1, lengths=False)


def device_ids(sentences: Sequence[Sequence[str]], ids: dict) -> Tuple[np.ndarray, np.ndarray]:
    """The LiteRT tagger's inputs in plain Python, as `TokenEncoder` computes them (tested): the
    word key (lower case, every decimal digit -> "0") in `ids["words"]` (0 padding, 1 OOV); each
    token's characters in `ids["chars"]`, a long token's first ceil(c / 2) and last floor(c / 2)."""
    words_at, chars_at, c = ({w: i for i, w in enumerate(ids["words"])}, {ch: i for i, ch in enumerate(ids["chars"])},
                             ids["max_chars"])
    words = np.zeros((len(sentences), max([len(s) for s in sentences] + [1])), np.int32)
    chars = np.zeros(words.shape + (c,), np.int32)
    for i, sentence in enumerate(sentences):
        for j, token in enumerate(sentence):
            key = token.lower() if ids["lowercase"] else token
            key = "".join("0" if ch.isdecimal() else ch for ch in key) if ids["fold_digits"] else key
            words[i, j] = words_at.get(key, OOV_ID) if token else 0
            kept = token if len(token) <= c else token[:c - c // 2] + token[len(token) - c // 2:]
            chars[i, j, :len(kept)] = [chars_at.get(ch, OOV_ID) for ch in kept]
    return words, chars


def litert_interpreter(path: str):
    """The `.tflite` tagger in `ai-edge-litert`'s interpreter, else TensorFlow's."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = tf.lite.Interpreter
    return Interpreter(model_path=path)


def litert_probabilities(interpreter, words: np.ndarray, chars: np.ndarray) -> np.ndarray:
    """Runs the LiteRT tagger on one batch of its batch size."""
    index = {d["name"]: d["index"] for d in interpreter.get_input_details()}
    for name, value in (("words", words), ("chars", chars)):
        interpreter.resize_tensor_input(index[name], value.shape)
    interpreter.allocate_tensors()
    for name, value in (("words", words), ("chars", chars)):
        interpreter.set_tensor(index[name], value)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])


# --- the run -------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, checked; --train/--dev, else UD English EWT (`fetch_data_or_exit`)."""
    parser = argparse.ArgumentParser(prog="python examples/pos_tagging.py", description="UPOS tagger on CoNLL-U "
                                     "files: GRU vs BiGRU vs BiLSTM vs two stacked BiLSTMs; exports the best.")
    add_data_arguments(parser)
    add = parser.add_argument
    add("--train", help="training CoNLL-U file (default: UD English EWT r2.16's, see --data-dir)")
    add("--dev", help="dev CoNLL-U file, required with --train (default: UD English EWT r2.16's)")
    add("--test", help="optional test CoNLL-U file (default none)")
    add("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)} (default all)")
    add("--epochs", type=int, help="training epochs (default 6; --quick 2)")
    add("--max-train-sentences", type=int, help="first N training sentences (default all; --quick 600)")
    add("--max-dev-sentences", type=int, help="first N dev sentences (default all; --quick 300)")
    add("--batch-size", type=int, default=32, help="default 32")
    add("--hidden", type=int, help="units per direction (default 128; --quick 32)")
    add("--word-dim", type=int, help="word embedding size (default 100; --quick 32; with --embeddings the file's)")
    add("--embeddings", metavar="PATH", help="pretrained word vectors, word2vec/GloVe/fastText (default none)")
    add("--freeze-embeddings", action="store_true", help="keep --embeddings fixed (default: fine-tuned)")
    add("--char-units", type=int, help="character BiGRU units per direction (default 48; --quick 16)")
    add("--max-chars", type=int, default=16, help="characters kept per word (default 16)")
    add("--learning-rate", type=float, default=3e-3, help="Adam's initial rate, cosine-decayed (default 3e-3)")
    add("--dropout", type=float, default=0.33, help="dropout rate (default 0.33)")
    add("--seed", type=int, default=0, help="random seed (default 0)")
    add("--out", default="saved_models", help="export base folder: <out>/pos_tagger/1/ (default saved_models)")
    add("--no-export", action="store_true", help="skip the SavedModel and LiteRT exports (default: export)")
    add("--layers", choices=LAYERS, default="kb", help="kb: keras_birnn's layers (default); keras: each "
        "variant's twin from keras.layers (same weights and probabilities at every word)")
    add("--report-json", metavar="PATH", help="also write timings and accuracy to PATH as JSON (default none): per "
        "variant epoch_seconds, validation_seconds, fit_seconds, predict_sentences_per_second, accuracy, dev_curve")
    add("--tensorboard", metavar="DIR", help="also log each variant to DIR/<variant>/ (default none)")
    add("--plot", metavar="PATH", help="training curves PNG, with matplotlib (default "
        "<out>/pos_tagging_training.png; '' for none)")
    add("--quick", action="store_true", help="small sizes: a smoke run in about a minute (default off)")
    add("--quiet", action="store_true", help="no progress bar (default off)")
    args = parser.parse_args(argv)
    if (args.train is None) != (args.dev is None) or (args.test and not args.train):
        parser.error("--train and --dev go together (--test needs them); give none for UD English EWT")
    finish_args(parser, args, choices=("variants", VARIANTS),
                quick=dict(epochs=(2, 6), max_train_sentences=(600, None), max_dev_sentences=(300, None),
                           hidden=(32, 128), word_dim=(32, 100), char_units=(16, 48)),
                positive=("epochs", "batch_size", "hidden", "word_dim", "char_units", "max_chars"))
    require_files(parser, {"--train": args.train, "--dev": args.dev, "--test": args.test,
                           "--embeddings": args.embeddings}, "pass existing files")
    if args.train is None:
        paths = fetch_data_or_exit(parser, args, EWT[0], EWT[1:])
        args.train, args.dev = paths[EWT[1]], paths[EWT[2]]
    return args


def fit_variant(variant: str, args, train_set: Encoded, dev_set: Encoded, test_set, encoder, tags,
                embeddings) -> Tuple[keras.Model, dict]:
    """One `model.fit` over every epoch (new batches each epoch); the variant's row of results."""
    keras.utils.set_random_seed(args.seed)
    model = build_variant(variant, encoder.word_count, encoder.char_count, tags, args.word_dim, args.char_units,
                          args.hidden, args.dropout, args.layers, embeddings, not args.freeze_embeddings)
    count = -(-len(train_set) // args.batch_size)
    compile_tagger(model, keras.optimizers.schedules.CosineDecay(args.learning_rate, args.epochs * count, alpha=0.05))
    probe = dataset(train_set.batches(args.batch_size)[:8])
    probe_loss = lambda: float(model.evaluate(probe, verbose=0, return_dict=True)["loss"])  # noqa: E731
    row = dict(variant=variant, params=model.count_params(), loss_before=probe_loss())
    print(f"\n{variant}: {row['params']:,} parameters")
    rng, timer = np.random.default_rng(args.seed), EpochTimer()
    callbacks = [timer] + ([keras.callbacks.TensorBoard(os.path.join(args.tensorboard, variant))]
                           if args.tensorboard else [])
    history = model.fit(dataset(lambda: train_set.batches(args.batch_size, rng), train_set.batch([0]), count),
                        epochs=args.epochs, validation_data=dataset(dev_set.batches(128)), callbacks=callbacks,
                        verbose=0 if args.quiet else (1 if sys.stdout.isatty() else 2), shuffle=False)
    began = time.perf_counter()
    row.update(dev=accuracy(model, dev_set), predict_first_seconds=time.perf_counter() - began)
    began = time.perf_counter()
    predict_ids(model, dev_set)  # a second, warm pass: traced, shapes seen
    row.update(predict_sentences_per_second=len(dev_set) / (time.perf_counter() - began),
               test=accuracy(model, test_set) if test_set else None, loss_after=probe_loss(),
               epoch_losses=[float(v) for v in history.history["loss"]], load=os.getloadavg()[0],
               dev_curve=[float(v) for v in history.history["val_upos"]], epoch_seconds=timer.seconds,
               validation_seconds=timer.validation_seconds, seconds=sum(timer.seconds))
    print(f"  {variant}: dev UPOS {100 * row['dev']:.2f}% after {row['seconds']:.0f} s of training "
          f"(+ {sum(timer.validation_seconds):.0f} s of dev passes)")
    return model, row


def export_best(model: keras.Model, encoder: TokenEncoder, tags, args) -> Tuple[str, Optional[str]]:
    """`export_tagger` to <out>/pos_tagger/1/, and with kb's layers the LiteRT tagger; prints their tags."""
    path = export_tagger(model, encoder, os.path.join(args.out, "pos_tagger"), tags, version=1, overwrite=True)
    example = [["The", "old", "man", "sat", "on", "the", "chair", "."], ["They", "lead", "the", "race"]]
    out = tf.saved_model.load(path).signatures["serving_default"](inputs=tf.constant(pad_tokens(example)))
    print(f"\nExported the {model.name} to {path} (string tokens in, tags out):")
    for tokens, row in zip(example, out["tags"].numpy()):
        print("  " + " ".join(f"{t}/{g.decode()}" for t, g in zip(tokens, row)))
    if args.layers != "kb":  # Keras's GRU over the reshaped words needs Flex ops (TensorLists)
        print("No LiteRT export for Keras's layers: their character encoder needs Flex ops.")
        return path, None
    litert = export_tagger_litert(model, encoder, tags, os.path.join(args.out, "pos_tagger_litert"))
    with open(os.path.join(os.path.dirname(litert), "ids.json"), encoding="utf-8") as f:
        ids = json.load(f)
    interpreter = litert_interpreter(litert)
    print(f"and to {litert} for LiteRT (ids in, see ids.json beside it):")
    for tokens in example:
        probs = litert_probabilities(interpreter, *device_ids([tokens], ids))[0]
        print("  " + " ".join(f"{t}/{tags[k]}" for t, k in zip(tokens, probs.argmax(-1))))
    return path, litert


def run(argv: Optional[Sequence[str]] = None) -> dict:
    """Trains every variant, prints the table, exports the best; returns the results."""
    args, start = parse_args(argv), time.perf_counter()
    train = [(t, upos) for t, upos, _ in read_conllu(args.train)[: args.max_train_sentences]]
    dev = [(t, upos) for t, upos, _ in read_conllu(args.dev)[: args.max_dev_sentences]]
    test = [(t, upos) for t, upos, _ in read_conllu(args.test)] if args.test else None
    encoder, tags = TokenEncoder(args.max_chars, min_word_count=2), sorted({t for _, upos in train for t in upos})
    encoder.adapt([tokens for tokens, _ in train])
    embeddings = None
    if args.embeddings:
        embeddings, stats = load_vectors(args.embeddings, encoder.get_word_vocabulary(), seed=args.seed)
        print(f"Word vectors from {args.embeddings}: {stats}")
    train_set, dev_set = Encoded(train, encoder, tags), Encoded(dev, encoder, tags)
    test_set = Encoded(test, encoder, tags) if test else None
    print(f"Train {len(train)} sentences / {int(train_set.lengths.sum())} words, dev {len(dev)} / "
          f"{int(dev_set.lengths.sum())}; vocabulary {encoder.word_count} words (count >= 2, with padding and OOV), "
          f"{encoder.char_count} characters, {len(tags)} UPOS tags. Load {os.getloadavg()[0]:.2f}.")
    rows, models = [], {}
    for variant in args.variants:
        models[variant], row = fit_variant(variant, args, train_set, dev_set, test_set, encoder, tags, embeddings)
        rows.append(row)
    plot_training(rows, args.plot if args.plot is not None else os.path.join(args.out, "pos_tagging_training.png"))
    twin = ", Keras's recurrent layers (--layers keras)" if args.layers == "keras" else ""
    print(f"\nUPOS accuracy ({args.epochs} epochs, {len(train)} training sentences, hidden {args.hidden}{twin}):")
    for r in rows:
        test_column = f"  test {100 * r['test']:.2f}%" if r["test"] is not None else ""
        print(f"{r['variant']:8}  {r['params']:>9,}  dev {100 * r['dev']:.2f}%{test_column}  {r['seconds']:.0f} s")
    best = max(rows, key=lambda r: r["dev"])["variant"]
    export_path, litert_path = (None, None) if args.no_export else export_best(models[best], encoder, tags, args)
    total = time.perf_counter() - start
    print(f"Done in {total:.0f} s; load now {os.getloadavg()[0]:.2f}.")
    if args.report_json:
        write_report(args.report_json, args, rows, len(dev_set), export_path, total)
    return {"rows": rows, "models": models, "encoder": encoder, "tags": tags, "best": best, "dev": dev,
            "dev_set": dev_set, "export_path": export_path, "litert_path": litert_path, "seconds": total}


def write_report(path: str, args, rows: list, dev_sentences: int, export_path, total: float) -> None:
    """--report-json: one entry per variant; with a single variant, its numbers at the top level too."""
    keys = ("params", "epoch_seconds", "validation_seconds", "dev_curve", "predict_first_seconds",
            "predict_sentences_per_second")
    entries = [dict({k: r[k] for k in keys}, variant=r["variant"], fit_seconds=r["seconds"], accuracy=r["dev"])
               for r in rows]
    report = {"example": "pos_tagging", "layers": args.layers, "dev_sentences": dev_sentences,
              "export_path": export_path, "seconds": total, "variants": entries}
    if len(entries) == 1:
        report.update(entries[0])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    run()
