"""The public API the docs promise: every `kb.<name>` that README.md and
docs/*.md mention exists, every dotted `keras_birnn.<module>.<name>` they
name resolves, and `kb.__all__` lists only what `kb` has."""

import glob
import importlib
import os
import re

import keras_birnn as kb
from helpers import REPO

DOCS = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def _mentions(pattern: str) -> set:
    found = set()
    for path in DOCS:
        with open(path, encoding="utf-8") as f:
            found |= set(re.findall(pattern, f.read()))
    return found


def test_every_kb_name_in_the_docs_exists():
    names = _mentions(r"\bkb\.([A-Za-z_][A-Za-z0-9_]*)")
    assert len(names) > 20  # the pattern finds the docs' names
    missing = sorted(n for n in names if not hasattr(kb, n))
    assert not missing, f"the docs name kb.{missing} (absent from keras_birnn)"


def test_every_dotted_keras_birnn_name_in_the_docs_resolves():
    paths = _mentions(r"`(keras_birnn(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
    assert len(paths) > 5
    broken = []
    for path in sorted(paths):
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                target = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        try:
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
        except AttributeError:
            broken.append(path)
    assert not broken, f"the docs name {broken}, which do not resolve"


def test_all_lists_public_names_only():
    assert all(hasattr(kb, name) and not name.startswith("_") for name in kb.__all__)
    for name in ("lengths_to_mask", "reverse_within_lengths", "check_graph_ops", "flatbuffer_ops",
                 "xla_disabled", "for_export", "lockstep_directions", "fused_directions", "compilation"):
        assert name in kb.__all__, name
