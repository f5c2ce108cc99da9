"""PyTorch's own GRU/LSTM kernels on a CPU: a training step packed against unpacked.

Why `keras_birnn.recurrence.vendor.torch_kernels` does not differentiate PyTorch's
packed kernels on a CPU (a masked training call runs unpacked over the
compacted rows there): one direction of `torch.nn.GRU`/`torch.nn.LSTM`,
a forward and the weights' gradients of the sum of squared outputs,
(a) packed with `pack_padded_sequence` (lengths uniform in 30-100% of T,
seed 1) and (b) unpacked over all T steps. Prints milliseconds (median of
`--repeats` after one warm-up) and packed / unpacked. PyTorch only; no
Keras, no keras_birnn.

    python benchmarks/bench_packed_training.py --threads 1
"""

import argparse
import time

import numpy as np
import torch
from torch.nn.utils import rnn as torch_rnn

SHAPES = {"textbook": (64, 100, 32, 64), "large": (32, 200, 128, 256)}


def _step(module, x, lengths, packed: bool) -> None:
    if packed:
        y, _ = module(torch_rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        y, _ = torch_rnn.pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
    else:
        y, _ = module(x)
    torch.autograd.grad((y ** 2).sum(), list(module.parameters()))


def _median_ms(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per series (default 5)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}")
    for shape, (batch, steps, features, units) in SHAPES.items():
        rng = np.random.default_rng(1)
        lengths = torch.tensor(rng.integers(int(0.3 * steps), steps + 1, size=batch))
        x = torch.tensor(rng.normal(size=(batch, steps, features)).astype("float32"))
        for kind in ("GRU", "LSTM"):
            module = getattr(torch.nn, kind)(features, units, batch_first=True)
            packed = _median_ms(lambda: _step(module, x, lengths, True), args.repeats)
            unpacked = _median_ms(lambda: _step(module, x, lengths, False), args.repeats)
            print(f"{kind:4} {shape:8} packed {packed:8.1f} ms  unpacked {unpacked:8.1f} ms  "
                  f"packed/unpacked x{packed / unpacked:.2f}", flush=True)


if __name__ == "__main__":
    main()
