"""The textbook's figures 17-2 to 17-5, computed with keras_birnn's public API.

Programs 092-094 use hand-written weights; they are copied into
`kb.Bidirectional` layers (the C code computes z_i = b_i + w_x[i] x +
sum_j w_h[i][j] h_j, so Keras's row-vector layout stores the transposes)
and the tables are printed in the programs' own format.

Program 095 (figure 17-5, a BiGRU with 3 units over 8 inputs) draws its
weights with the C library's `srand(42)` / `rand()`: W uniform in
[-0.2, 0.2], U in [-0.1, 0.1], zero biases, forward cell first. Its numbers
therefore depend on the C library. This example offers three weight
sources (`--init`):

    msvc   the Microsoft C runtime's rand() (a 32-bit LCG, RAND_MAX 32767):
           reproduces the book's figure 17-5 exactly (the book was evidently
           printed from a Windows build)
    glibc  glibc's rand() (TYPE_3 additive feedback): what `gcc 095_Bigru.c`
           prints on Linux, which differs from the book
    numpy  a seeded NumPy draw with the same ranges (`--seed`): the same
           structure with other random numbers, where only the qualitative
           pattern (uneven direction norms) holds

By default it prints figure 17-5 from `msvc` and then from `numpy`.

The C program's candidate is tanh(W_s x + r_i * (U_s h)_i): the reset
gate scales the recurrent product per unit, which is Keras's
`reset_after=True` form (with zero biases). The example uses that, and
prints how far `reset_after=False` (reset before the matmul) lands: with
these tiny weights, below 1e-4, invisible at the figure's precision.

The per-position norms come from `kb.diagnostics.direction_norms`; the figure
is drawn with `kb.diagnostics.plot_direction_norms` (needs matplotlib).

    python examples/book_figures.py
    python examples/book_figures.py --init glibc --png /tmp/figure_17_5.png
"""

import argparse
import os
import sys
import tempfile
from typing import Iterator, Optional, Sequence

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

try:
    import keras_birnn as kb
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import keras_birnn as kb  # noqa: E402

SEQ_092 = np.array([1.0, 0.0, -1.0, 0.5, 2.0], "float32")
FW_092 = ([0.5, -0.3], [[0.4, 0.1], [-0.1, 0.4]])
BW_092 = ([-0.2, 0.6], [[0.3, -0.1], [0.2, 0.3]])

SEQ_094 = np.array([0.2, -0.5, 0.8, -0.1, 0.6, -0.3], "float32")
WORDS_094 = ["The", "old", "man", "sat", "on", "chair"]
GOLD_094 = ["DET", "ADJ", "NOUN", "VERB", "PREP", "NOUN"]
TAGS_094 = ["DET", "ADJ", "NOUN", "VERB", "PREP"]
FW_094 = ([0.5, -0.3, 0.2], [[0.3, 0.1, 0], [0, 0.3, 0.1], [0.1, 0, 0.3]])
BW_094 = ([-0.2, 0.4, 0.1], [[0.3, 0, -0.1], [0.1, 0.3, 0], [0, 0.1, 0.3]])
W_OUT_094 = np.array(  # one row per tag, columns fwd[0..2] then bwd[0..2]
    [
        [1.0, 0.2, -0.3, 0.5, -0.1, 0.4],
        [-0.5, 0.8, 0.1, -0.2, 0.6, -0.3],
        [0.2, -0.4, 0.7, 0.1, -0.3, 0.5],
        [-0.3, 0.5, -0.2, 0.7, 0.2, -0.4],
        [0.4, 0.1, -0.6, -0.3, 0.5, 0.2],
    ],
    "float32",
)

SEQ_095 = np.array([0.5, -0.2, 0.8, 0.1, -0.5, 0.3, 0.9, -0.1], "float32")
UNITS_095 = 3
INITS = ("msvc", "glibc", "numpy")


# --- programs 092-094: hand-written weights -------------------------------------------


def set_c_weights(recurrent, w_x, w_h, bias=None) -> None:
    """Copies a C program's simple-RNN weights into a kb.Recurrent's cell."""
    cell = recurrent.cell
    cell.kernel.assign(np.array([w_x], "float32"))
    cell.recurrent_kernel.assign(np.array(w_h, "float32").T)
    cell.bias.assign(np.zeros(len(w_x), "float32") if bias is None else np.asarray(bias, "float32"))


def program_092(merge_mode=None) -> "kb.Bidirectional":
    """Two simple-RNN directions of 2 units with the book's weights."""
    bi = kb.Bidirectional(kb.SimpleRNNCell(2), merge_mode=merge_mode, return_sequences=True)
    bi.build((None, None, 1))
    set_c_weights(bi.forward_layer, *FW_092)
    set_c_weights(bi.backward_layer, *BW_092)
    return bi


def program_094() -> "kb.Bidirectional":
    """Two 3-unit directions and a 5-tag softmax over [h_f | h_b] (W_out's
    first three columns are V_f, the last three V_b)."""
    bi = kb.Bidirectional(
        kb.SimpleRNNCell(3), merge_mode="projection", projection_units=5,
        projection_activation="softmax", return_sequences=True,
    )
    bi.build((None, None, 1))
    set_c_weights(bi.forward_layer, *FW_094)
    set_c_weights(bi.backward_layer, *BW_094)
    bi.projection.forward_kernel.assign(W_OUT_094[:, :3].T)
    bi.projection.backward_kernel.assign(W_OUT_094[:, 3:].T)
    bi.projection.bias.assign(np.zeros(5, "float32"))
    return bi


def figure_17_2() -> str:
    fwd, bwd = program_092(None)(SEQ_092[None, :, None])
    fwd, bwd = np.asarray(fwd)[0], np.asarray(bwd)[0]
    lines = ["Forward and backward hidden states:", "",
             "  t  input   fwd[0]  fwd[1]   bwd[0]  bwd[1]",
             "  -- ------  ------  ------   ------  ------"]
    for t, x in enumerate(SEQ_092):
        lines.append("  %d  %+4.1f   %+.3f  %+.3f   %+.3f  %+.3f" % (t, x, *fwd[t], *bwd[t]))
    lines += ["", "At each position, fwd has seen everything to the left,",
              "bwd has seen everything to the right."]
    return "\n".join(lines)


def figure_17_3() -> str:
    combined = np.asarray(program_092("concat")(SEQ_092[None, :, None]))[0]
    lines = ["Combined bidirectional representations:", "",
             "  t  input   combined[0..3]",
             "  -- ------  --------------------------------"]
    for t, x in enumerate(SEQ_092):
        lines.append("  %d  %+4.1f   [%+.3f, %+.3f | %+.3f, %+.3f]" % (t, x, *combined[t]))
    n_hid = combined.shape[-1] // 2
    lines += ["", "The | separates forward (left) from backward (right).",
              f"Each position has a {2 * n_hid}-dimensional representation",
              "that encodes context from both directions.", "",
              "The output layer takes the combined vector.",
              "  y_t = W_out * combined_t + b_out",
              f"  W_out has {2 * n_hid} columns instead of {n_hid}."]
    return "\n".join(lines)


def figure_17_4() -> str:
    probs = np.asarray(program_094()(SEQ_094[None, :, None]))[0]
    lines = ["Bidirectional RNN for sequence labeling:", "",
             "  word    gold   DET   ADJ   NOUN  VERB  PREP   pred",
             "  ------  -----  ----  ----  ----  ----  ----   ----"]
    for t, (word, gold) in enumerate(zip(WORDS_094, GOLD_094)):
        pred = TAGS_094[int(np.argmax(probs[t]))]
        lines.append("  %-6s  %-5s  %.2f  %.2f  %.2f  %.2f  %.2f   %s" % (word, gold, *probs[t], pred))
    lines += ["", "Weights are random, so predictions are wrong.",
              "With training, the bidirectional context would let",
              "the model correctly tag each word."]
    return "\n".join(lines)


# --- program 095: rand()-initialised BiGRU -----------------------------------------------


def msvc_rand(seed: int) -> Iterator[float]:
    """rand() / RAND_MAX of the Microsoft C runtime after srand(seed)."""
    state = seed & 0xFFFFFFFF
    while True:
        state = (state * 214013 + 2531011) & 0xFFFFFFFF
        yield ((state >> 16) & 0x7FFF) / 32767


def glibc_rand(seed: int) -> Iterator[float]:
    """rand() / RAND_MAX of glibc after srand(seed) (TYPE_3, degree 31)."""
    r = [seed & 0xFFFFFFFF]
    for i in range(1, 31):
        hi, lo = divmod(r[i - 1], 127773)
        word = 16807 * lo - 2836 * hi
        r.append(word + 2147483647 if word < 0 else word)
    r += r[:3]  # r[31..33] = r[0..2]
    for i in range(34, 344):  # discarded warm-up
        r.append((r[i - 31] + r[i - 3]) & 0xFFFFFFFF)
    while True:
        value = (r[-31] + r[-3]) & 0xFFFFFFFF
        r.append(value)
        del r[0]
        yield (value >> 1) / 2147483647


def c_gru_weights(draw: Iterator[float], units: int = UNITS_095) -> dict:
    """gru_init of program 095: per unit i, W_z, W_r, W_s, then per j the U's."""
    w = {k: np.zeros(units) for k in ("W_z", "W_r", "W_s")}
    u = {k: np.zeros((units, units)) for k in ("U_z", "U_r", "U_s")}
    for i in range(units):
        for k in ("W_z", "W_r", "W_s"):
            w[k][i] = next(draw) * 0.4 - 0.2
        for j in range(units):
            for k in ("U_z", "U_r", "U_s"):
                u[k][i][j] = next(draw) * 0.2 - 0.1
    return {**w, **u}


def numpy_gru_weights(rng: np.random.Generator, units: int = UNITS_095) -> dict:
    """The same ranges drawn with NumPy."""
    weights = {k: rng.uniform(-0.2, 0.2, units) for k in ("W_z", "W_r", "W_s")}
    weights.update({k: rng.uniform(-0.1, 0.1, (units, units)) for k in ("U_z", "U_r", "U_s")})
    return weights


def set_c_gru(recurrent, weights: dict) -> None:
    """Keras layout: kernel [1, 3U] = [W_z | W_r | W_s], recurrent kernel
    [U, 3U] = [U_z^T | U_r^T | U_s^T] (gate order z, r, h), zero biases."""
    cell = recurrent.cell
    cell.kernel.assign(np.concatenate([weights["W_z"], weights["W_r"], weights["W_s"]])[None, :].astype("float32"))
    cell.recurrent_kernel.assign(
        np.concatenate([weights["U_z"].T, weights["U_r"].T, weights["U_s"].T], axis=1).astype("float32")
    )
    cell.bias.assign(np.zeros(cell.bias.shape, "float32"))


def program_095(init: str = "msvc", seed: int = 42, reset_after: bool = True) -> "kb.Bidirectional":
    """The BiGRU of program 095 with weights from `init` (forward cell drawn first)."""
    if init == "msvc":
        draw = msvc_rand(42)
        forward, backward = c_gru_weights(draw), c_gru_weights(draw)
    elif init == "glibc":
        draw = glibc_rand(42)
        forward, backward = c_gru_weights(draw), c_gru_weights(draw)
    elif init == "numpy":
        rng = np.random.default_rng(seed)
        forward, backward = numpy_gru_weights(rng), numpy_gru_weights(rng)
    else:
        raise ValueError(f"init must be one of {INITS}, received {init!r}")
    bi = kb.Bidirectional(kb.GRUCell(UNITS_095, reset_after=reset_after), merge_mode=None, return_sequences=True)
    bi.build((None, None, 1))
    set_c_gru(bi.forward_layer, forward)
    set_c_gru(bi.backward_layer, backward)
    return bi


def direction_norms(bi, x):
    """(forward norms [T], backward norms [T], how): kb.diagnostics when present,
    else computed from the merge_mode=None outputs."""
    inspect = getattr(kb, "inspect", None)
    if inspect is not None and hasattr(inspect, "direction_norms"):
        norms = inspect.direction_norms(bi, x)
        return norms.forward[0], norms.backward[0], "kb.diagnostics.direction_norms"
    fwd, bwd = bi(x)
    return (np.linalg.norm(np.asarray(fwd)[0], axis=-1), np.linalg.norm(np.asarray(bwd)[0], axis=-1),
            "norms of the merge_mode=None outputs")


def figure_17_5(init: str = "msvc", seed: int = 42):
    """The figure's table for weights from `init`; returns (text, forward
    norms, backward norms, the layer)."""
    bi = program_095(init, seed)
    x = SEQ_095[None, :, None]
    fwd, bwd = (np.asarray(y)[0] for y in bi(x))
    norm_f, norm_b, how = direction_norms(bi, x)
    lines = ["Bidirectional GRU (BiGRU):", "",
             "  t  input   fwd             bwd             |fwd|  |bwd|",
             "  -- ------  --------------- --------------- ------ ------"]
    for t, value in enumerate(SEQ_095):
        lines.append("  %d  %+4.1f   [%+.2f,%+.2f,%+.2f] [%+.2f,%+.2f,%+.2f] %.3f  %.3f"
                     % (t, value, *fwd[t], *bwd[t], norm_f[t], norm_b[t]))
    lines += ["", f"Each position has {UNITS_095} forward plus {UNITS_095} backward = "
              f"{2 * UNITS_095} combined.", f"(norms: {how})"]
    return "\n".join(lines), norm_f, norm_b, bi


def unevenness(norm_f, norm_b) -> str:
    ratio = np.maximum(norm_f, norm_b) / np.maximum(np.minimum(norm_f, norm_b), 1e-12)
    t = int(np.argmax(ratio))
    return (f"most uneven position: t={t}, |fwd| {norm_f[t]:.3f} vs |bwd| {norm_b[t]:.3f} "
            f"(a factor of {ratio[t]:.1f}); norms range {min(norm_f.min(), norm_b.min()):.3f} "
            f"to {max(norm_f.max(), norm_b.max()):.3f}")


INIT_NOTES = {
    "msvc": "weights from the Microsoft C runtime's rand() after srand(42): the book's numbers",
    "glibc": "weights from glibc's rand() after srand(42): what gcc builds print on Linux "
             "(not the book's numbers)",
    "numpy": "weights drawn with NumPy (seed {seed}) in the program's ranges. The C library's "
             "rand() numbers differ, so only the qualitative pattern holds, not the book's values",
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python examples/book_figures.py",
        description="The textbook's figures 17-2 to 17-5 through keras_birnn's public API.",
    )
    parser.add_argument("--init", choices=INITS + ("both",), default="both",
                        help="weights of figure 17-5: msvc (the book's), glibc, numpy, or both = msvc "
                             "then numpy (default)")
    parser.add_argument("--seed", type=int, default=42, help="NumPy seed for --init numpy (default 42)")
    parser.add_argument("--png", default=os.path.join(tempfile.gettempdir(), "figure_17_5.png"),
                        help="where to draw figure 17-5's norms (default: %(default)s); '' for none")
    parser.add_argument("--quick", action="store_true", help="accepted for symmetry; this example is instant")
    return parser.parse_args(argv)


def run(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    out = {}
    for number, make in (("17-2", figure_17_2), ("17-3", figure_17_3), ("17-4", figure_17_4)):
        out[number] = make()
        print(f"=== Figure {number} ===\n{out[number]}\n")
    inits = ["msvc", "numpy"] if args.init == "both" else [args.init]
    for init in inits:
        text, norm_f, norm_b, bi = figure_17_5(init, args.seed)
        out[f"17-5/{init}"] = (text, norm_f, norm_b)
        print(f"=== Figure 17-5 ({INIT_NOTES[init].format(seed=args.seed)}) ===\n{text}")
        print(unevenness(norm_f, norm_b))
        before = program_095(init, args.seed, reset_after=False)
        x = SEQ_095[None, :, None]
        gap = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(bi(x), before(x)))
        print(f"reset_after=True (the C code: r_i * (U_s h)_i) vs reset_after=False (r * h before the "
              f"matmul): max |difference| {gap:.1e}\n")
        if args.png and init == inits[0]:
            out["png"] = write_png(bi, x, args.png, init)
    return out


def write_png(bi, x, path: str, init: str) -> Optional[str]:
    inspect = getattr(kb, "inspect", None)
    if inspect is None or not hasattr(inspect, "plot_direction_norms"):
        print("kb.diagnostics.plot_direction_norms is not available: no PNG written.")
        return None
    try:
        inspect.plot_direction_norms(bi, x, path, title=f"Figure 17-5: per-position norms ({init} weights)")
    except ImportError as error:
        print(f"No PNG written: {error}")
        return None
    print(f"Wrote {path} (kb.diagnostics.plot_direction_norms).")
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
