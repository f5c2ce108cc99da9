"""What the first training step of an example costs: tracing, graph
optimisation and the first run, against Keras's twin and a model without
recurrence.

The first step of `model.fit` traces the training function, then
TensorFlow optimises the traced graph (grappler) and runs it; every later
step only runs it. For the POS tagger (`--variants bigru`) and the
sentence classifier (`bi-attention`), with their own data, batches and
optimizer (`bench_recurrence_share.pos_setup` / `classifier_setup`), each
peer (kb, keras, and none: every recurrent layer replaced by a Dense, see
`bench_recurrence_share.py`) is trained for `--steps` steps in a fresh
process. Printed per run: the first step's seconds, the median of the
later steps, and, read from TensorFlow's own log of the training graph's
optimisation (`TF_CPP_VMODULE=meta_optimizer=1`), the graph's size when
grappler received it (nodes, after TensorFlow inlined the functions it
inlines; the others, like a `tf.while_loop`'s body in Keras's layers,
are optimised apart and not counted) and grappler's milliseconds on it. Results and command:
benchmarks/README.md.

    python -u benchmarks/bench_first_step.py --rounds 2
"""

import argparse
import json
import os
import re
import statistics
import time
from typing import Optional, Sequence

import bench_recurrence_share as share  # this folder is on the path: the scripts run as scripts

PEERS, EXAMPLES = share.PEERS, share.EXAMPLES


def child(example: str, peer: str, steps: int) -> None:
    import keras

    model, data = share.setup(example, peer, 1, 1_000_000)
    ends = []

    class StepTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            ends.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[StepTimer()], verbose=0, shuffle=False)
    seconds = [b - a for a, b in zip(ends, ends[1:])]
    print("RESULT " + json.dumps(dict(first=seconds[0], later=statistics.median(seconds[1:]))), flush=True)


def grappler(log: str) -> dict:
    """Nodes in and milliseconds of grappler's passes over the training
    function's graph (`multi_step_on_iterator`), from TensorFlow's log:
    that graph only, not the functions it calls without inlining them
    (optimised as items of their own, as a `tf.while_loop`'s body is)."""
    nodes, millis, current = None, 0.0, False
    for line in log.splitlines():
        item = re.search(r"grappler item: (\S+)", line)
        if item:
            current = "multi_step_on_iterator" in item.group(1) and nodes is None
            continue
        size = re.search(r"Graph size after: (\d+) nodes \((-?\d+)\).*time = ([\d.]+)ms", line)
        if current and size:
            if nodes is None:  # the first pass: the size it received
                nodes = int(size.group(1)) - int(size.group(2))
            millis += float(size.group(3))
    return dict(nodes=nodes, grappler_ms=millis if nodes else None)


def measure(example: str, peer: str, steps: int) -> dict:
    result, log = share.run_child(__file__, [example, peer, "--steps", str(steps)],
                                  TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="meta_optimizer=1")
    return dict(result, **grappler(log), load=os.getloadavg()[0])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", nargs="+", default=EXAMPLES, choices=EXAMPLES)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    parser.add_argument("--child", nargs=2, metavar=("EXAMPLE", "PEER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child[0], args.child[1], args.steps)
    if args.rounds < 1 or args.steps < 2:
        parser.error("--rounds must be at least 1, --steps at least 2")
    print(f"first training step, peers {', '.join(PEERS)} (none: no recurrence); "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    for example in args.examples:
        firsts = {peer: [] for peer in PEERS}
        for round_, peer in share.alternating(PEERS, args.rounds):
            r = measure(example, peer, args.steps)
            firsts[peer].append(r["first"])
            graph = f"{r['nodes']:6d} nodes, grappler {r['grappler_ms']:5.0f} ms" if r["nodes"] else "graph -"
            print(f"{example:10s} round {round_ + 1} {peer:5s} first step {r['first']:5.2f} s | later "
                  f"{1000 * r['later']:5.1f} ms | {graph} | load {r['load']:.1f}", flush=True)
        median = {peer: statistics.median(v) for peer, v in firsts.items()}
        print(f"{example}: first step (medians) kb {median['kb']:.2f} s, keras {median['keras']:.2f} s, none "
              f"{median['none']:.2f} s; keras/kb x{median['keras'] / median['kb']:.2f}", flush=True)


if __name__ == "__main__":
    main()
