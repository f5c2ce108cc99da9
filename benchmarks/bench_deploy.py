"""Deploy targets: keras_birnn against keras.layers.Bidirectional, exported and converted the same way.

Two taggers per cell (GRU, LSTM): int32 token ids -> `Embedding(vocab, 64,
mask_zero=True)` -> a bidirectional layer of 64 units per direction ->
17 softmax tags at every position. keras_birnn's is
`kb.Bidirectional(kb.GRUCell(64), return_sequences=True,
merge_mode="projection", projection_units=17, projection_activation="softmax")`;
its twin `keras.layers.Bidirectional(keras.layers.GRU(64,
return_sequences=True))` + `Dense(17, softmax)`, with the same weights
(the Dense kernel's two halves are the projection's V_f and V_b), so every
artifact is checked against one reference: the in-process Keras twin,
at the valid positions of a right-padded batch (padding: id 0), at the
timed time size and at a second one (time is dynamic in every artifact).

Per target, for each peer: how it was made, whether it converts and runs,
its size, the seconds to convert and to load, the first call after loading,
the median of the timed calls (peers interleaved call by call, after
warm-up calls), the ratio to keras_birnn's size and median from this run,
the largest difference from the reference, and the ops it holds:

- SavedModel / TF Serving: `kb.export_saved_model(model, dir)`
  (`serving_default`: inputs + lengths) against Keras's `model.export(dir)`
  (`serving_default`: ids); loaded with `tf.saved_model.load`, called
  through `serving_default`. Size: the folder; ops: TF op types of the
  graph and its function library.
- .keras: `model.save(path)`, `keras.saving.load_model`, then
  `model.predict_on_batch` in-process (the first call traces).
- LiteRT: `kb.export_tflite(model, path, batch_size=B)` (fixed batch,
  dynamic time, builtins only) against Keras's model converted the same
  way (`TFLiteConverter.from_concrete_functions` of `tf.function(model)`
  at `TensorSpec([B, None], int32)`, builtins only), and Keras's model with
  a dynamic batch (`TFLiteConverter.from_keras_model`): builtins only, then
  `[TFLITE_BUILTINS, SELECT_TF_OPS]` (Flex ops; the same ops with the
  `_experimental_lower_tensor_list_ops = False` that the converter's error
  message suggests). Run in `ai_edge_litert.interpreter.Interpreter`; ops:
  the op names of every subgraph (loop bodies included).
- ONNX: tf2onnx (opset 17) of the `serving_default` signature of each
  peer's SavedModel (docs/deploy.md), of keras_birnn's exported under
  `kb.lockstep_directions()` too (one loop for both directions), and
  `tf2onnx.convert.from_keras` of the Keras model; run in onnxruntime
  (default session options); ops: the node op types, Loop bodies included.

Every peer runs with its runtime's default threads, in this one process.

    python benchmarks/bench_deploy.py                     # GRU and LSTM, batch 1 and 32, time 40: a few minutes
    python benchmarks/bench_deploy.py --quick             # a smoke run: GRU only, small sizes, few calls
    python benchmarks/bench_deploy.py --cells gru --targets litert onnx --json deploy.json
"""

import argparse
import contextlib
import dataclasses
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Callable, Dict, List, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_birnn as kb  # noqa: E402
from keras_birnn.export.saved_model import SIGNATURE_DEFAULT, saved_model_op_types  # noqa: E402

SIZES = {  # vocabulary, embedding, units per direction, tags, time, batches
    "full": dict(vocab=5000, embed=64, units=64, tags=17, time=40, batches=(1, 32)),
    "quick": dict(vocab=50, embed=8, units=8, tags=5, time=6, batches=(1, 4)),
}
CELLS = {"gru": (keras.layers.GRU, kb.GRUCell), "lstm": (keras.layers.LSTM, kb.LSTMCell)}
TARGETS = ("savedmodel", "keras_file", "litert", "onnx")
TARGET_NAMES = {"savedmodel": "SavedModel", "keras_file": ".keras", "litert": "LiteRT", "onnx": "ONNX"}

Predict = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (ids [B, T], lengths [B]) -> probabilities [B, T, tags]
Opener = Callable[[], Predict]  # loads the artifact


@dataclasses.dataclass
class Artifact:
    """One peer's artifact on one target, before it is loaded."""

    peer: str  # "kb" or "keras"
    how: str  # the command that made it
    opener: Optional[Opener] = None  # None: it did not convert
    error: Optional[str] = None
    size_bytes: Optional[int] = None
    make_s: Optional[float] = None
    ops: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Row:
    target: str
    cell: str
    batch: int
    peer: str
    how: str
    converts: bool
    runs: Optional[bool] = None
    error: Optional[str] = None
    size_bytes: Optional[int] = None
    make_s: Optional[float] = None
    load_s: Optional[float] = None
    first_ms: Optional[float] = None
    median_ms: Optional[float] = None
    max_abs_diff: Optional[float] = None
    size_vs_kb: Optional[float] = None
    latency_vs_kb: Optional[float] = None
    ops: List[str] = dataclasses.field(default_factory=list)


def first_line(error: BaseException) -> str:
    """The error's first `error:` line (converters print many, each after its source location), else its first line."""
    text = str(error).strip() or type(error).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line:
            message = line[line.index("error:") + len("error:"):].strip()
            if message.startswith("loc("):  # loc(callsite(fused[...] at ...)): message
                message = message[message.rindex(")): ") + 4:] if ")): " in message else message
            return f"converter error: {message[:240]}"
    return f"{type(error).__name__}: {lines[0][:400]}"


def attempt(artifact: Artifact, make: Callable[[], Tuple[Opener, int, List[str]]]) -> Artifact:
    """Runs `make` (which writes the artifact and returns its opener, size and ops) into `artifact`."""
    began = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the converters' "Saved artifact at ..."
            artifact.opener, artifact.size_bytes, artifact.ops = make()
    except Exception as error:  # one failure is a row, not a crash
        artifact.error = first_line(error)
    artifact.make_s = time.perf_counter() - began
    return artifact


# --- the two models --------------------------------------------------------------------------


def build_twins(cell: str, sizes: dict) -> Dict[str, keras.Model]:
    """The Keras tagger and keras_birnn's, with the Keras tagger's weights."""
    keras.utils.set_random_seed(0)
    keras_layer, kb_cell = CELLS[cell]
    units, tags = sizes["units"], sizes["tags"]
    models = {}
    for peer in ("keras", "kb"):
        ids = keras.Input((None,), dtype="int32", name="ids")
        x = keras.layers.Embedding(sizes["vocab"], sizes["embed"], mask_zero=True)(ids)
        if peer == "keras":
            x = keras.layers.Bidirectional(keras_layer(units, return_sequences=True))(x)
            y = keras.layers.Dense(tags, activation="softmax")(x)
        else:
            y = kb.Bidirectional(kb_cell(units), return_sequences=True, merge_mode="projection",
                                 projection_units=tags, projection_activation="softmax")(x)
        models[peer] = keras.Model(ids, y, name=f"{peer}_{cell}_tagger")
    weights = models["keras"].get_weights()
    kernel, bias = weights[-2:]  # Dense [V_f; V_b] and c
    models["kb"].set_weights(weights[:-2] + [kernel[:units], kernel[units:], bias])
    return models


def padded_batch(sizes: dict, batch: int, time_size: int, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Token ids [batch, time] right-padded with 0, and the lengths: the first row full, the others 1 to time."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, time_size + 1, batch).astype(np.int32)
    lengths[0] = time_size
    ids = rng.integers(1, sizes["vocab"], (batch, time_size)).astype(np.int32)
    ids[np.arange(time_size)[None] >= lengths[:, None]] = 0
    return ids, lengths


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


# --- SavedModel -------------------------------------------------------------------------------


def open_signature(path: str, with_lengths: bool) -> Opener:
    def opener() -> Predict:
        serve = tf.saved_model.load(path).signatures[SIGNATURE_DEFAULT]
        name = next(iter(serve.structured_input_signature[1]))  # kb: inputs (and lengths); Keras: ids

        def predict(ids, lengths):
            feeds = {"inputs": tf.constant(ids), "lengths": tf.constant(lengths)} if with_lengths else {
                name: tf.constant(ids)}
            return next(iter(serve(**feeds).values())).numpy()

        return predict

    return opener


def export_peer_saved_model(peer: str, model: keras.Model, workdir: str) -> str:
    """kb.export_saved_model for keras_birnn, Keras's own model.export for Keras: the folder."""
    target = os.path.join(workdir, f"{model.name}_savedmodel")
    if peer == "kb":
        return kb.export_saved_model(model, target, version=1)
    model.export(target, verbose=False)
    return target


def savedmodel_artifacts(models, workdir, batch, cache) -> List[Artifact]:
    hows = {"kb": "kb.export_saved_model(model, dir)", "keras": "model.export(dir)"}

    def make(peer):
        path = cache[f"savedmodel_{peer}"] = export_peer_saved_model(peer, models[peer], workdir)
        return open_signature(path, peer == "kb"), folder_bytes(path), sorted(saved_model_op_types(path))

    return [attempt(Artifact(peer, hows[peer]), lambda peer=peer: make(peer)) for peer in ("kb", "keras")]


# --- .keras -----------------------------------------------------------------------------------


def keras_file_artifacts(models, workdir, batch, cache) -> List[Artifact]:
    def make(peer):
        path = os.path.join(workdir, f"{models[peer].name}.keras")
        models[peer].save(path)

        def opener() -> Predict:
            model = keras.saving.load_model(path)
            return lambda ids, lengths: np.asarray(model.predict_on_batch(ids))

        return opener, os.path.getsize(path), []

    how = "model.save(path.keras); load_model; predict_on_batch"
    return [attempt(Artifact(peer, how), lambda peer=peer: make(peer)) for peer in ("kb", "keras")]


# --- LiteRT -----------------------------------------------------------------------------------


def open_litert(path: str, with_lengths: bool) -> Opener:
    from ai_edge_litert.interpreter import Interpreter

    def opener() -> Predict:
        interpreter = Interpreter(model_path=path)
        inputs = interpreter.get_input_details()
        index = {d["name"]: d["index"] for d in inputs}
        ids_index = index["inputs"] if with_lengths else inputs[0]["index"]
        output = interpreter.get_output_details()[0]["index"]
        shape = []

        def predict(ids, lengths):
            if shape != list(ids.shape):  # a new time size: resize, then allocate again
                interpreter.resize_tensor_input(ids_index, ids.shape)
                interpreter.allocate_tensors()
                shape[:] = ids.shape
            interpreter.set_tensor(ids_index, ids)
            if with_lengths:
                interpreter.set_tensor(index["lengths"], lengths)
            interpreter.invoke()
            return interpreter.get_tensor(output)

        return predict

    return opener


def litert_ops(path: str) -> List[str]:
    """Op names of every subgraph (loop bodies included); Flex and custom ops by their custom name."""
    from keras_birnn.export.litert import flatbuffer_ops

    return sorted(op.split(":", 1)[-1] for op in flatbuffer_ops(path))


def convert_keras_tflite(model: keras.Model, path: str, batch: Optional[int], flex: bool) -> Tuple[Opener, int, list]:
    """Keras's model to LiteRT: the fixed batch as kb converts (batch given) or from_keras_model (None)."""
    if batch is not None:
        spec = tf.TensorSpec([batch, None], tf.int32, name="inputs")
        concrete = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    else:
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if flex:
        converter.target_spec.supported_ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    with open(path, "wb") as f:
        f.write(converter.convert())
    return open_litert(path, False), os.path.getsize(path), litert_ops(path)


def litert_artifacts(models, workdir, batch, cache) -> List[Artifact]:
    def make_kb():
        path = kb.export_tflite(models["kb"], os.path.join(workdir, f"kb_{batch}.tflite"), batch_size=batch)
        return open_litert(path, True), os.path.getsize(path), litert_ops(path)

    fixed = os.path.join(workdir, f"k_{batch}.tflite")
    artifacts = [
        attempt(Artifact("kb", f"kb.export_tflite(model, path, batch_size={batch})"), make_kb),
        attempt(Artifact("keras", f"from_concrete_functions, TensorSpec([{batch}, None]), builtins"),
                lambda: convert_keras_tflite(models["keras"], fixed, batch, False)),
    ]
    if "litert_dynamic" not in cache:  # dynamic batch: once, then shown under every batch
        cache["litert_dynamic"] = [
            attempt(Artifact("keras", "from_keras_model (dynamic batch), builtins"),
                    lambda: convert_keras_tflite(models["keras"], os.path.join(workdir, "kd.tflite"), None, False)),
            attempt(Artifact("keras", "from_keras_model (dynamic batch), builtins + SELECT_TF_OPS"),
                    lambda: convert_keras_tflite(models["keras"], os.path.join(workdir, "kf.tflite"), None, True)),
        ]
    return artifacts + cache["litert_dynamic"]


# --- ONNX -------------------------------------------------------------------------------------


def onnx_ops(graph) -> List[str]:
    """Node op types of an ONNX graph and its subgraphs (Loop and If bodies)."""
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                ops.update(onnx_ops(sub))
    return sorted(ops)


def open_onnx(proto, with_lengths: bool) -> Opener:
    import onnxruntime as ort

    def opener() -> Predict:
        session = ort.InferenceSession(proto.SerializeToString())
        names = {i.name.split(":")[0]: i.name for i in session.get_inputs()}
        first = session.get_inputs()[0].name

        def predict(ids, lengths):
            feeds = {names["inputs"]: ids, names["lengths"]: lengths} if with_lengths else {first: ids}
            return session.run(None, feeds)[0]

        return predict

    return opener


def onnx_from_saved_model(path: str, with_lengths: bool) -> Tuple[Opener, int, list]:
    import tf2onnx
    from tf2onnx import tf_loader

    graph_def, inputs, outputs, rename = tf_loader.from_saved_model(
        path, None, None, signatures=[SIGNATURE_DEFAULT], return_tensors_to_rename=True)
    proto, _ = tf2onnx.convert.from_graph_def(
        graph_def, input_names=inputs, output_names=outputs, opset=17, tensors_to_rename=rename)
    return open_onnx(proto, with_lengths), len(proto.SerializeToString()), onnx_ops(proto.graph)


def onnx_from_keras(model: keras.Model) -> Tuple[Opener, int, list]:
    import tf2onnx

    spec = [tf.TensorSpec([None, None], tf.int32, name="ids")]
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=17)
    return open_onnx(proto, False), len(proto.SerializeToString()), onnx_ops(proto.graph)


def onnx_artifacts(models, workdir, batch, cache) -> List[Artifact]:
    def from_saved_model(peer):
        path = cache.get(f"savedmodel_{peer}") or export_peer_saved_model(peer, models[peer], workdir)
        return onnx_from_saved_model(path, peer == "kb")

    def from_lockstep_saved_model():
        # One loop for both directions: onnxruntime's default session runs
        # one node at a time, so a loop per direction overlaps nothing there.
        with kb.lockstep_directions():
            path = kb.export_saved_model(models["kb"], os.path.join(workdir, f"{models['kb'].name}_lockstep"), version=1)
        return onnx_from_saved_model(path, True)

    how = "tf2onnx from_graph_def(serving_default of its SavedModel), opset 17"
    return [
        attempt(Artifact("kb", how), lambda: from_saved_model("kb")),
        attempt(Artifact("kb", how.replace("its SavedModel", "a SavedModel exported under kb.lockstep_directions()")),
                from_lockstep_saved_model),
        attempt(Artifact("keras", how), lambda: from_saved_model("keras")),
        attempt(Artifact("keras", "tf2onnx.convert.from_keras(model), opset 17"),
                lambda: onnx_from_keras(models["keras"])),
    ]


MAKERS = {"savedmodel": savedmodel_artifacts, "keras_file": keras_file_artifacts,
          "litert": litert_artifacts, "onnx": onnx_artifacts}


# --- measuring --------------------------------------------------------------------------------


def valid_diff(outputs: np.ndarray, reference: keras.Model, ids: np.ndarray) -> float:
    """The largest difference from the reference's outputs at the valid (non-zero id) positions."""
    expected = np.asarray(reference(ids, training=False))
    if outputs.shape != expected.shape:
        raise ValueError(f"outputs of shape {outputs.shape}, the reference's {expected.shape}")
    valid = ids != 0
    return float(np.abs(outputs[valid] - expected[valid]).max())


def open_and_check(row: Row, opener: Opener, reference: keras.Model, sizes: dict) -> Optional[Predict]:
    """Loads the artifact, times its first call, and checks it at two time sizes; None if it does not run."""
    try:
        began = time.perf_counter()
        predict = opener()
        row.load_s = time.perf_counter() - began
        ids, lengths = padded_batch(sizes, row.batch, sizes["time"])
        began = time.perf_counter()
        outputs = predict(ids, lengths)
        row.first_ms = 1e3 * (time.perf_counter() - began)
        other_ids, other_lengths = padded_batch(sizes, row.batch, sizes["time"] // 2 + 1, seed=1)
        row.max_abs_diff = max(valid_diff(outputs, reference, ids),
                               valid_diff(predict(other_ids, other_lengths), reference, other_ids))
    except Exception as error:
        row.runs, row.error = False, first_line(error)
        return None
    row.runs = True
    return predict


def interleaved_medians(runners: Dict[int, Predict], ids, lengths, calls: int, warmup: int) -> Dict[int, float]:
    """Median milliseconds of each runner's calls, the runners taking turns (the order rotating each round)."""
    keys = list(runners)
    for _ in range(warmup):
        for key in keys:
            runners[key](ids, lengths)
    times = {key: [] for key in keys}
    for round_ in range(calls):
        shift = round_ % max(len(keys), 1)
        for key in keys[shift:] + keys[:shift]:
            began = time.perf_counter()
            runners[key](ids, lengths)
            times[key].append(time.perf_counter() - began)
    return {key: 1e3 * statistics.median(t) for key, t in times.items()}


def with_ratios(rows: List[Row]) -> List[Row]:
    """Each row's size and median over keras_birnn's on the same target, cell and batch."""
    ours = next((r for r in rows if r.peer == "kb"), None)
    for row in rows:
        if ours is not None and ours.size_bytes and row.size_bytes:
            row.size_vs_kb = row.size_bytes / ours.size_bytes
        if ours is not None and ours.median_ms and row.median_ms:
            row.latency_vs_kb = row.median_ms / ours.median_ms
    return rows


def measure(target: str, cell: str, batch: int, artifacts: List[Artifact], models, sizes, args) -> List[Row]:
    rows, runners = [], {}
    for i, a in enumerate(artifacts):
        row = Row(target, cell, batch, a.peer, a.how, a.opener is not None, error=a.error, size_bytes=a.size_bytes,
                  make_s=a.make_s, ops=a.ops)
        if a.opener is not None:
            predict = open_and_check(row, a.opener, models["keras"], sizes)
            if predict is not None:
                runners[i] = predict
        rows.append(row)
    ids, lengths = padded_batch(sizes, batch, sizes["time"])
    for i, ms in interleaved_medians(runners, ids, lengths, args.calls, args.warmup).items():
        rows[i].median_ms = ms
    return with_ratios(rows)


# --- the table --------------------------------------------------------------------------------


def number(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def yes_no(value: Optional[bool], row: Row, notes: List[str]) -> str:
    if value is None:
        return "-"
    if value:
        return "yes"
    if (row.error or "?") not in notes:
        notes.append(row.error or "?")
    return f"no [{notes.index(row.error or '?') + 1}]"


def table(rows: List[Row]) -> Tuple[List[str], List[str]]:
    """Markdown lines of the table, and the notes (errors' first lines) its [n] refer to."""
    lines = ["| target | cell | batch | peer | how | converts | runs | size KiB | make s | load s | first ms "
             "| median ms | size / kb | median / kb | max diff vs Keras |", "|" + "---|" * 15]
    notes: List[str] = []
    for r in rows:
        converts = yes_no(r.converts, r, notes)
        runs = yes_no(r.runs, r, notes) if r.converts else "-"
        lines.append(
            f"| {TARGET_NAMES[r.target]} | {r.cell} | {r.batch} | {r.peer} | {r.how} | {converts} | {runs} "
            f"| {number(r.size_bytes and r.size_bytes / 1024, '.0f')} | {number(r.make_s, '.1f')} "
            f"| {number(r.load_s, '.2f')} | {number(r.first_ms, '.1f')} | {number(r.median_ms, '.2f')} "
            f"| {number(r.size_vs_kb, '.2f')} | {number(r.latency_vs_kb, '.2f')} | {number(r.max_abs_diff, '.1e')} |")
    return lines, notes


def compact(ops: List[str]) -> str:
    """Op names, those sharing a TensorList / TensorArray prefix as one `Prefix*`."""
    shown = []
    for op in ops:
        prefix = next((p for p in ("TensorList", "TensorArray") if op.startswith(p)), op)
        name = f"{prefix}*" if prefix != op else op
        if name not in shown:
            shown.append(name)
    return ", ".join(shown)


def ops_lines(rows: List[Row]) -> List[str]:
    """One line per artifact of the first batch: its op types, Keras's as the difference from kb's."""
    first = min((r.batch for r in rows), default=0)
    kb_ops = {(r.target, r.cell): set(r.ops) for r in rows if r.peer == "kb" and r.ops and r.batch == first}
    lines = []
    for r in rows:
        if not r.ops or r.batch != first:
            continue
        ours = kb_ops.get((r.target, r.cell))
        if r.peer == "kb" or ours is None:
            text = compact(r.ops)
        else:
            more, fewer = sorted(set(r.ops) - ours), sorted(ours - set(r.ops))
            text = f"kb's and {', '.join(more) or 'no other'}; not {', '.join(fewer) or '-'}"
        lines.append(f"- {TARGET_NAMES[r.target]} {r.cell} {r.peer} ({r.how}): {len(r.ops)} op types: {text}")
    return lines


# --- main -------------------------------------------------------------------------------------


def versions() -> str:
    from importlib import metadata

    found = [f"TensorFlow {tf.__version__}", f"Keras {keras.__version__}"]
    for package in ("tf2onnx", "onnxruntime", "ai-edge-litert"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} absent")
    return ", ".join(found)


def run_cell(cell: str, sizes: dict, args) -> List[Row]:
    """Every target's rows for one cell, each batch size's peers timed together."""
    models, rows, cache = build_twins(cell, sizes), [], {}
    with tempfile.TemporaryDirectory(prefix="bench_deploy_") as workdir:
        for target in args.targets:
            for batch in sizes["batches"]:
                if target not in cache or target == "litert":  # LiteRT: one file per batch size
                    cache[target] = MAKERS[target](models, workdir, batch, cache)
                rows += measure(target, cell, batch, cache[target], models, sizes, args)
                print(f"  {TARGET_NAMES[target]} {cell} batch {batch}: done", file=sys.stderr, flush=True)
    return rows


def quiet_converters() -> None:
    import logging

    for name in ("tf2onnx", "absl", "tensorflow"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", choices=list(CELLS), help="default: gru and lstm (--quick: gru)")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--calls", type=int, default=30, help="timed calls of each peer (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls of each peer first (default 3)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, 3 calls")
    parser.add_argument("--json", metavar="PATH", help="also write the rows and the settings to PATH")
    args = parser.parse_args(argv)
    args.cells = args.cells or (["gru"] if args.quick else list(CELLS))
    if args.quick:
        args.calls, args.warmup = min(args.calls, 3), min(args.warmup, 1)
    if args.calls < 1 or args.warmup < 0:
        parser.error("--calls must be at least 1 and --warmup at least 0")
    quiet_converters()
    sizes = SIZES["quick" if args.quick else "full"]
    load = os.getloadavg()
    header = (f"Deploy targets, keras_birnn against keras.layers.Bidirectional + Dense (same weights): "
              f"ids (vocab {sizes['vocab']}) -> Embedding({sizes['embed']}, mask_zero) -> bidirectional "
              f"{sizes['units']} units -> {sizes['tags']} softmax tags; time {sizes['time']} (dynamic: checked at "
              f"{sizes['time'] // 2 + 1} too), batches {', '.join(map(str, sizes['batches']))} (right-padded); "
              f"median of {args.calls} interleaved calls after {args.warmup} warm-up; {versions()}; "
              f"{os.cpu_count()} CPUs, load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(header, flush=True)
    rows = []
    for cell in args.cells:
        rows += run_cell(cell, sizes, args)
    lines, notes = table(rows)
    print("\n".join(lines))
    print("\n" + "\n".join(f"[{i}] {note}" for i, note in enumerate(notes, 1)) if notes else "")
    print("Op types (first batch; Keras's against kb's on the same target):\n" + "\n".join(ops_lines(rows)))
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": header, "sizes": sizes, "calls": args.calls, "warmup": args.warmup,
                       "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
