"""The textbook's exercises on merging and stacking, and the ensemble remark
(BRNN, BPTT and boundary states).

1. concat vs sum ("Instead of concatenation, try addition. What information
   is lost?"). With the same weights in both directions (one cell shared by
   the two `kb.Recurrent`s), reversing a sequence swaps its two sentence
   states: h_f(reversed x) = h_b(x) and h_b(reversed x) = h_f(x). Their sum
   is then identical for x and its reverse, their concatenation is not. A
   classifier asked "is the first element larger than the last?" (x and its
   reverse always have opposite answers) trains to high accuracy on concat
   and is stuck at exactly 50% on sum, whatever the training. With
   independent weights per direction (the usual BiRNN) sum can learn it:
   what addition loses is which direction said what, which matters as soon
   as the two directions can say the same thing.
2. BiGRU vs BiLSTM (same hidden size) on the textbook's "inside a run of 1s"
   labelling task and on the HMM task of 4: accuracy, parameters, time, and
   the mean per-position norm of each direction's output
   (`kb.diagnostics.direction_norms`), the book's way of comparing them.
3. Two stacked BiGRUs (`kb.stacked_bidirectional`): the representation is
   2 x 64 = 128 wide after each layer; the parameter count per layer is
   2 directions x 3 gates x (input x units + units x units + bias), the
   second layer's input being the first's 128-wide output.
4. BRNN, BPTT and boundary states: "a bidirectional network achieves
   almost the same quality as an ensemble of two separate recurrent
   networks, one reading the input as is and one reading it reversed".
   Two per-position tasks, each with a forward GRU and a GRU on the
   reversed input trained separately and averaged (or multiplied) at the
   output, against a jointly trained BiGRU:
   - an HMM (a sticky hidden bit seen through noise), with the
     forward-backward algorithm's Bayes optimum as the reference;
   - runs of 1s, where given x_t = 1 the label is an OR of the two
     neighbours, which averaging the two separate models recovers.

    python examples/merge_modes.py            # a few minutes on 2 busy cores
    python examples/merge_modes.py --quick    # seconds
"""

import argparse
import os
import sys
import time
from typing import Optional, Sequence

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
from keras_birnn import demo  # noqa: E402  (the run-of-1s task)
from keras_birnn.cli.arguments import finish_args  # noqa: E402

SECTIONS = ("merge", "cells", "stack", "ensemble")


def _compile(model, learning_rate, loss):
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss, metrics=["accuracy"])
    return model


def predict(model, x, batch_size: int = 512) -> np.ndarray:
    """Inference as one graph per model (the loops run as graph while-loops)."""
    run = tf.function(lambda inputs: model(inputs, training=False),
                      input_signature=[tf.TensorSpec([None, None, x.shape[-1]], tf.float32)])
    return np.concatenate([run(x[s : s + batch_size]).numpy() for s in range(0, len(x), batch_size)])


def _fit(model, x, y, args, **kwargs):
    """Fits; returns (first-epoch loss, last-epoch loss, seconds)."""
    began = time.perf_counter()
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0, shuffle=True, **kwargs)
    losses = history.history["loss"]
    return losses[0], losses[-1], time.perf_counter() - began


# --- 1. concat vs sum ----------------------------------------------------------------------


def first_vs_last_data(count: int, length: int, rng: np.random.Generator):
    """Sequences and their reverses (pairs), label = first element > last."""
    x = rng.normal(size=(count // 2, length, 1)).astype("float32")
    x = np.concatenate([x, x[:, ::-1]])
    y = (x[:, 0, 0] > x[:, -1, 0]).astype("float32")
    order = rng.permutation(len(x))
    return x[order], y[order]


def sentence_classifier(merge_mode: str, tied: bool, hidden: int) -> keras.Model:
    """BiGRU sentence vector -> MLP -> P(first > last). `tied`: one cell
    shared by both directions (the same weights read both ways)."""
    cell = kb.GRUCell(hidden)
    backward = kb.Recurrent(cell, reverse=True) if tied else None
    x = keras.Input((None, 1))
    h = kb.Bidirectional(cell, merge_mode=merge_mode, backward_layer=backward, name="bigru")(x)
    h = keras.layers.Dense(32, activation="relu")(h)
    p = keras.layers.Dense(1, activation="sigmoid")(h)
    return keras.Model(x, p, name=f"{merge_mode}_{'tied' if tied else 'independent'}")


def swap_check(hidden: int, rng: np.random.Generator) -> str:
    """The exact construction: shared weights, x and its reverse."""
    cell = kb.GRUCell(hidden)
    bi = kb.Bidirectional(cell, merge_mode=None, backward_layer=kb.Recurrent(cell, reverse=True))
    x = rng.normal(size=(1, 6, 1)).astype("float32")
    (h_f, h_b), (r_f, r_b) = bi(x), bi(x[:, ::-1])
    h_f, h_b, r_f, r_b = (np.asarray(a)[0] for a in (h_f, h_b, r_f, r_b))
    fmt = lambda v: "[" + ", ".join(f"{a:+.3f}" for a in v[:3]) + (", ...]" if len(v) > 3 else "]")  # noqa: E731
    return "\n".join([
        f"  x = {[round(float(v), 2) for v in x[0, :, 0]]}, one GRU cell shared by both directions:",
        f"    x          h_f = {fmt(h_f)}  h_b = {fmt(h_b)}",
        f"    reversed x h_f = {fmt(r_f)}  h_b = {fmt(r_b)}   (the two are swapped)",
        f"    sum:    max |sum(x) - sum(reversed x)|       = {np.abs((h_f + h_b) - (r_f + r_b)).max():.1e}",
        f"    concat: max |concat(x) - concat(reversed x)| = "
        f"{np.abs(np.concatenate([h_f, h_b]) - np.concatenate([r_f, r_b])).max():.3f}",
    ])


def section_merge(args, rng) -> dict:
    print("1. concat vs sum: what addition loses")
    keras.utils.set_random_seed(args.seed)
    print(swap_check(args.hidden, rng))
    x, y = first_vs_last_data(args.samples, args.length, rng)
    x_test, y_test = first_vs_last_data(args.samples // 2, args.length, rng)
    print(f"  Task: is the first element larger than the last? {len(x)} training sequences, each with "
          f"its reverse (opposite label); {len(x_test)} held out.")
    rows = []
    for merge_mode, tied in (("concat", True), ("sum", True), ("sum", False)):
        keras.utils.set_random_seed(args.seed)
        model = _compile(sentence_classifier(merge_mode, tied, args.hidden), 3e-3, "binary_crossentropy")
        first, last, seconds = _fit(model, x, y, args)
        accuracy = float(np.mean((predict(model, x_test)[:, 0] > 0.5) == (y_test > 0.5)))
        rows.append({"merge": merge_mode, "weights": "shared" if tied else "independent", "accuracy": accuracy,
                     "loss_first": first, "loss_last": last, "seconds": seconds})
    print(f"  {'merge':7}{'directions':13}{'held-out acc':>13}{'train loss':>22}")
    for r in rows:
        print(f"  {r['merge']:7}{r['weights']:13}{100 * r['accuracy']:12.2f}%"
              f"{r['loss_first']:>12.4f} -> {r['loss_last']:.4f}")
    print("  With shared weights, sum gives x and its reverse the same vector, so any classifier on it is\n"
          "  right on exactly one of each pair: 50%. Concat keeps the directions apart. Independent\n"
          "  weights let the two directions write different features, so sum can still separate them.\n")
    return {"rows": rows}


# --- 2. BiGRU vs BiLSTM ---------------------------------------------------------------------


def tagger(cell, hidden: int, name: str) -> keras.Model:
    bits = keras.Input((None, 1))
    probs = kb.Bidirectional(cell(hidden), merge_mode="projection", projection_units=2,
                             projection_activation="softmax", return_sequences=True, name=name)(bits)
    return keras.Model(bits, probs, name=name)


def section_cells(args, rng) -> dict:
    print(f"2. BiGRU vs BiLSTM, hidden {args.cell_hidden} per direction, {args.epochs} epochs")
    tasks = {
        "runs of 1s": lambda n: demo.make_data(n, args.length, rng),
        "HMM": lambda n: hmm_data(n, args.length, rng, stay=0.9, flip=0.25),
    }
    rows, optimum = [], None
    for task, make in tasks.items():
        x, y = make(args.samples)
        x_test, y_test = make(args.samples // 2)
        if task == "HMM":
            optimum = float(np.mean((hmm_posterior(x_test, 0.9, 0.25) > 0.5) == y_test))
        for name, cell in (("BiGRU", kb.GRUCell), ("BiLSTM", kb.LSTMCell)):
            keras.utils.set_random_seed(args.seed)
            model = _compile(tagger(cell, args.cell_hidden, name.lower()), 1e-2, "sparse_categorical_crossentropy")
            first, last, seconds = _fit(model, x, y, args)
            accuracy = float(np.mean(predict(model, x_test).argmax(-1) == y_test))
            norms = kb.diagnostics.direction_norms(model.get_layer(name.lower()), x_test[:256])  # reads the input
            rows.append({"task": task, "model": name, "params": model.count_params(), "accuracy": accuracy,
                         "norm_f": float(norms.forward.mean()), "norm_b": float(norms.backward.mean()),
                         "loss_first": first, "loss_last": last, "seconds": seconds})
    print(f"  {'task':12}{'model':8}{'params':>7}{'accuracy':>10}{'mean |h_f|':>12}{'mean |h_b|':>12}"
          f"{'train time':>12}")
    for r in rows:
        print(f"  {r['task']:12}{r['model']:8}{r['params']:>7}{100 * r['accuracy']:9.2f}%"
              f"{r['norm_f']:12.3f}{r['norm_b']:12.3f}{r['seconds']:11.1f}s")
    print(f"  {'HMM':12}{'Bayes optimum':15}{100 * optimum:9.2f}%  (forward-backward on the same held-out set)")
    print("  Same hidden size: the LSTM has 4 gate blocks to the GRU's 3 (4/3 of the recurrent weights).\n"
          "  Its output h = o * tanh(c) passes through an output gate, the GRU's h is a convex mix of\n"
          "  tanh candidates: both stay in (-1, 1); the norms show how much of that range each uses.\n")
    return {"rows": rows, "hmm_optimum": optimum}


# --- 3. stacking -------------------------------------------------------------------------------


def gru_params(input_dim: int, units: int, reset_after: bool) -> int:
    """One direction: 3 gates x (input x units + units x units) + biases."""
    bias = 2 * 3 * units if reset_after else 3 * units
    return 3 * (input_dim * units + units * units) + bias


def section_stack(args) -> dict:
    print("3. Two stacked BiGRUs (input 32, hidden 64 per direction)")
    out = {}
    for reset_after in (False, True):
        stack = kb.stacked_bidirectional("gru", units=(64, 64), reset_after=reset_after)
        stack.build((None, None, 32))
        table = stack.summary_table()
        first, second = 2 * gru_params(32, 64, reset_after), 2 * gru_params(128, 64, reset_after)
        width = stack.compute_output_shape((None, None, 32))[-1]
        assert [row["params"] for row in table] == [first, second], table
        assert width == 128
        label = "the textbook's GRU (reset_after=False)" if not reset_after else "Keras's default GRU (reset_after=True)"
        print(f"  {label}:")
        print("    " + str(table).replace("\n", "\n    "))
        bias = "3*64" if not reset_after else "2*3*64"
        print(f"    layer 1: 2 x [3 x (32*64 + 64*64) + {bias}] = {first:,}")
        print(f"    layer 2: 2 x [3 x (128*64 + 64*64) + {bias}] = {second:,}  (reads the 2*64 = 128 concat)")
        print(f"    representation after each layer: {width} wide; the second layer adds {second:,} "
              f"parameters, {second / first:.2f}x the first")
        out[reset_after] = {"first": first, "second": second, "width": width}
    print()
    return out


# --- 4. ensemble vs joint BRNN ---------------------------------------------------------------------


def hmm_data(count: int, length: int, rng: np.random.Generator, stay: float, flip: float):
    """A sticky hidden bit (keeps its value with P=stay) seen through a
    channel that flips it with P=flip: (observations [N, T, 1], hidden [N, T])."""
    hidden = np.zeros((count, length), np.int32)
    hidden[:, 0] = rng.integers(0, 2, count)
    for t in range(1, length):
        keep = rng.random(count) < stay
        hidden[:, t] = np.where(keep, hidden[:, t - 1], 1 - hidden[:, t - 1])
    observed = np.where(rng.random((count, length)) < flip, 1 - hidden, hidden)
    return observed[..., None].astype("float32"), hidden


def hmm_posterior(observed: np.ndarray, stay: float, flip: float) -> np.ndarray:
    """Forward-backward: P(hidden_t = 1 | all observations), [N, T]."""
    obs = observed[..., 0].astype(int)
    n, length = obs.shape
    trans = np.array([[stay, 1 - stay], [1 - stay, stay]])
    emit = np.where(obs[..., None] == np.arange(2), 1 - flip, flip)  # [N, T, 2]
    alpha = np.zeros((n, length, 2))
    beta = np.ones((n, length, 2))
    alpha[:, 0] = 0.5 * emit[:, 0]
    alpha[:, 0] /= alpha[:, 0].sum(-1, keepdims=True)
    for t in range(1, length):
        alpha[:, t] = (alpha[:, t - 1] @ trans) * emit[:, t]
        alpha[:, t] /= alpha[:, t].sum(-1, keepdims=True)
    for t in range(length - 2, -1, -1):
        beta[:, t] = (emit[:, t + 1] * beta[:, t + 1]) @ trans.T
        beta[:, t] /= beta[:, t].sum(-1, keepdims=True)
    post = alpha * beta
    return post[..., 1] / post.sum(-1)


def one_direction_tagger(hidden: int, reverse: bool) -> keras.Model:
    """A GRU tagger reading left to right, or the input reversed (outputs
    aligned with the positions again)."""
    x = keras.Input((None, 1))
    h = kb.Recurrent(kb.GRUCell(hidden), reverse=reverse, return_sequences=True)(x)
    probs = keras.layers.Dense(2, activation="softmax")(h)
    return keras.Model(x, probs, name="backward" if reverse else "forward")


def combine(p_forward: np.ndarray, p_backward: np.ndarray, how: str) -> np.ndarray:
    if how == "average":
        return (p_forward + p_backward) / 2
    product = np.exp(np.log(np.clip(p_forward, 1e-7, 1)) + np.log(np.clip(p_backward, 1e-7, 1)))
    return product / product.sum(-1, keepdims=True)


def section_ensemble(args, rng) -> dict:
    print("4. Ensemble of two separate GRUs (forward, reversed input) vs a jointly trained BiGRU (BRNN, BPTT and boundary states)")
    results = {}
    tasks = {
        "hmm": lambda n: hmm_data(n, args.length, rng, stay=0.9, flip=0.25),
        "runs": lambda n: demo.make_data(n, args.length, rng),
    }
    for task, make in tasks.items():
        x, y = make(args.samples)
        x_test, y_test = make(args.samples // 2)
        probs, rows = {}, []
        for name in ("forward GRU", "backward GRU", "BiGRU (joint)"):
            keras.utils.set_random_seed(args.seed)
            if name == "BiGRU (joint)":
                model = tagger(kb.GRUCell, args.hidden, "bigru")
            else:
                model = one_direction_tagger(args.hidden, reverse=name.startswith("backward"))
            _compile(model, 1e-2, "sparse_categorical_crossentropy")
            first, last, seconds = _fit(model, x, y, args)
            probs[name] = predict(model, x_test)
            rows.append({"model": name, "params": model.count_params(), "loss_first": first, "loss_last": last,
                         "seconds": seconds})
        probs["ensemble, averaged"] = combine(probs["forward GRU"], probs["backward GRU"], "average")
        probs["ensemble, product"] = combine(probs["forward GRU"], probs["backward GRU"], "product")
        params = {r["model"]: r["params"] for r in rows}
        params["ensemble, averaged"] = params["ensemble, product"] = params["forward GRU"] + params["backward GRU"]
        if task == "hmm":
            print(f"  a) HMM: hidden bit keeps its value with P=0.9, observed through a 25% flip "
                  f"({len(x)} sequences of {args.length})")
            optimum = float(np.mean((hmm_posterior(x_test, 0.9, 0.25) > 0.5) == y_test))
            print(f"     {'model':20}{'params':>7}{'accuracy':>10}")
            table = {}
            for name, p in probs.items():
                table[name] = float(np.mean(p.argmax(-1) == y_test))
                print(f"     {name:20}{params[name]:>7}{100 * table[name]:9.2f}%")
            print(f"     {'Bayes optimum':20}{'':>7}{100 * optimum:9.2f}%  (forward-backward algorithm)")
            results[task] = {"accuracy": table, "optimum": optimum, "rows": rows}
        else:
            print(f"  b) inside a run of 1s ({len(x)} sequences of {args.length})")
            bits = x_test[..., 0].astype(int)
            lone = bits.astype(bool) & (demo.run_labels(bits) == 0)  # a 1 with no 1 beside it
            print(f"     {'model':20}{'params':>7}{'overall':>10}{'boundary':>10}{'lone 1s':>10}")
            table = {}
            for name, p in probs.items():
                scores = demo.accuracies(p, bits, y_test)
                scores["lone"] = float(np.mean(p.argmax(-1)[lone] == y_test[lone]))
                table[name] = scores
                print(f"     {name:20}{params[name]:>7}{100 * scores['overall']:9.2f}%"
                      f"{100 * scores['boundary']:9.2f}%{100 * scores['lone']:9.2f}%")
            results[task] = {"accuracy": table, "rows": rows}
    hmm, runs = results["hmm"]["accuracy"], results["runs"]["accuracy"]
    print(f"  Joint BiGRU minus averaged ensemble: {100 * (hmm['BiGRU (joint)'] - hmm['ensemble, averaged']):+.2f} "
          f"points on the HMM, {100 * (runs['BiGRU (joint)']['overall'] - runs['ensemble, averaged']['overall']):+.2f} "
          "on runs of 1s." + (" (--quick: undertrained models; the notes below are about converged ones.)"
                              if args.quick else "") + "\n"
          "  Runs of 1s: given x_t = 1 the label is (left neighbour OR right neighbour); the forward model\n"
          "  says 1.0 when the left one is 1 and 50% otherwise, the backward model likewise for the right,\n"
          "  so their average is above 50% when the OR holds and a tie at 50% when it does not (broken\n"
          "  the right way by the models' lean to the majority label 0): little is lost training apart.\n"
          "  HMM: each separate model already counts the evidence at t, so combining their outputs counts\n"
          "  it twice, and a fixed rule (average, product) cannot learn how to weigh the two sides; the\n"
          "  jointly trained output layer can (BRNN, BPTT and boundary states: the parameters are 'trained jointly').\n")
    return results


# --- the run ----------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python examples/merge_modes.py",
        description="The textbook's merge/stacking exercises and the ensemble vs joint BRNN "
        "(BRNN, BPTT and boundary states).",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--samples", type=int, default=None, help="training sequences (default 3000; --quick 300)")
    parser.add_argument("--length", type=int, default=None, help="sequence length (default 20; --quick 10)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per model (default 15; --quick 2)")
    parser.add_argument("--hidden", type=int, default=None, help="units per direction (default 16; --quick 4)")
    parser.add_argument("--cell-hidden", type=int, default=None,
                        help="units per direction for BiGRU vs BiLSTM (default 4; --quick 4)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size of every model (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the weights (default 0)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in seconds")
    args = parser.parse_args(argv)
    finish_args(
        parser, args,
        quick=dict(samples=(300, 3000), length=(10, 20), epochs=(2, 15), hidden=(4, 16), cell_hidden=(4, 4)),
        choices=("sections", SECTIONS),
        positive=("samples", "length", "epochs", "hidden", "cell_hidden", "batch_size"),
    )
    if args.samples < 4:
        parser.error("--samples must be at least 4")
    return args


def run(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    print(f"seed {args.seed}, {args.samples} training sequences of {args.length}, {args.epochs} epochs; "
          f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs\n")
    results = {}
    level = tf.get_logger().level
    tf.get_logger().setLevel("ERROR")  # one small inference graph per model: retracing is expected
    try:
        for section in args.sections:
            rng = np.random.default_rng([args.seed, SECTIONS.index(section)])
            if section == "merge":
                results[section] = section_merge(args, rng)
            elif section == "cells":
                results[section] = section_cells(args, rng)
            elif section == "stack":
                results[section] = section_stack(args)
            else:
                results[section] = section_ensemble(args, rng)
    finally:
        tf.get_logger().setLevel(level)
    results["seconds"] = time.perf_counter() - start
    print(f"Done in {results['seconds']:.0f} s; load now {os.getloadavg()[0]:.2f}.")
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
