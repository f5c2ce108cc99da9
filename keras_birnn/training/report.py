"""What a run writes for people: the epoch line, history.csv and report.txt."""

from __future__ import annotations

import csv
import io
from collections import Counter
from typing import Any, Dict, List, Sequence

from keras_birnn.training.checkpoint import atomic_write

# seconds: the whole epoch (training, the dev pass, checkpoints); train_seconds: `fit` alone.
HISTORY_FIELDS = ("epoch", "loss", "dev_score", "dev_accuracy", "learning_rate", "train_seconds", "seconds")


def duration(seconds: float) -> str:
    """`41 s`, `9 min 12 s` or `2 h 05 min`."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def format_epoch(row: Dict[str, Any], epochs: int, best: float, best_epoch: int, eta: float) -> str:
    """One line per epoch: loss, dev score, best so far, time and ETA (at most
    the epochs left, at the mean epoch time: early stopping may end sooner)."""
    width = len(str(epochs))
    return (f"epoch {row['epoch']:>{width}}/{epochs}  loss {row['loss']:.4f}  dev {100 * row['dev_score']:.2f}  "
            f"best {100 * best:.2f} (epoch {best_epoch})  {duration(row['seconds'])}  ETA {duration(eta)}")


def write_history(path: str, history: Sequence[Dict[str, Any]]) -> None:
    """The history rows as CSV (rewritten whole, atomically)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=HISTORY_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in history:
        writer.writerow({k: row[k] for k in HISTORY_FIELDS})
    atomic_write(path, text.getvalue().encode("utf-8"))


def label_scores(gold: Sequence[str], predicted: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """Per label: precision, recall, F1 and gold count of paired predictions."""
    pairs = list(zip(gold, predicted))
    gold_counts, predicted_counts = Counter(gold), Counter(predicted)
    hits = Counter(g for g, p in pairs if g == p)
    found = {}
    for label in sorted(set(gold) | set(predicted)):
        precision = hits[label] / predicted_counts[label] if predicted_counts[label] else 0.0
        recall = hits[label] / gold_counts[label] if gold_counts[label] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        found[label] = {"precision": precision, "recall": recall, "f1": f1, "gold": gold_counts[label]}
    return found


def table(rows: Dict[str, Dict[str, float]], count: str, title: str) -> List[str]:
    """A fixed-width table of per-type scores (percentages) and counts."""
    width = max([len(title)] + [len(k) for k in rows])
    lines = [f"{title:<{width}}  precision  recall      f1  {count}"]
    for name, s in rows.items():
        lines.append(f"{name or '<none>':<{width}}  {100 * s['precision']:9.2f}  {100 * s['recall']:6.2f}  "
                     f"{100 * s['f1']:6.2f}  {int(s[count])}")
    return lines


def per_type_report(scores: Dict[str, Any], dev, model) -> str:
    """report.txt: the overall dev score, then per span type (a span scheme)
    or per tag or label (predicted again by `model`)."""
    head = [f"dev score {100 * scores['score']:.2f}  accuracy {100 * scores['accuracy']:.2f}"]
    if "types" in scores:
        head[0] += f"  span precision {100 * scores['precision']:.2f}  recall {100 * scores['recall']:.2f}"
        return "\n".join(head + [""] + table(scores["types"], "gold", "type")) + "\n"
    predicted = model.predict(dev.x)
    if hasattr(predicted[0], "label"):
        rows = label_scores(dev.y, [p.label for p in predicted])
        return "\n".join(head + [""] + table(rows, "gold", "label")) + "\n"
    gold = [t for tags in dev.y for t in tags]
    rows = label_scores(gold, [t for p in predicted for t in p.tags])
    return "\n".join(head + [""] + table(rows, "gold", "tag")) + "\n"

