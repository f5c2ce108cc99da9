"""docs/api.md's signatures are the real ones.

Every entry of docs/api.md written as `` `name(args)` `` (`kb.X(...)`,
`keras_birnn.module.X(...)`, `crf.method(...)` on `kb.CRF`,
`layer.method(...)` on `kb.Bidirectional`) is checked against
`inspect.signature` of the object it names (a class: its `__init__`):

- every argument it lists exists, in the signature's order, and `**name`
  is the signature's own `**name`;
- a listed default (`name=value`) is the real default, and an argument
  listed without one has none;
- every argument without a default is listed, unless the entry has `...`
  (an entry may leave out optional arguments).
"""

import ast
import importlib
import inspect
import pathlib
import re

import pytest

import keras_birnn as kb

REPO = pathlib.Path(__file__).resolve().parents[2]
API = REPO / "docs" / "api.md"
ENTRY = re.compile(r"`((?:kb|keras_birnn|crf|layer)(?:\.\w+)+)\(([^`\n]*)\)`")
INSTANCES = {"crf": kb.CRF, "layer": kb.Bidirectional}


def entries(markdown: str) -> list:
    """(line, name, arguments text) of each `name(args)` entry."""
    found = []
    for number, line in enumerate(markdown.splitlines(), 1):
        found += [(number, match.group(1), match.group(2)) for match in ENTRY.finditer(line)]
    return found


def resolve(name: str):
    head, *parts = name.split(".")
    obj = INSTANCES.get(head, kb if head == "kb" else importlib.import_module("keras_birnn"))
    for part in parts:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


def _pieces(arguments: str) -> list:
    """The top-level comma-separated pieces of an argument list."""
    pieces, depth, current, quote = [], 0, "", None
    for char in arguments:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(current.strip())
            current = ""
            continue
        current += char
    return [piece for piece in pieces + [current.strip()] if piece]


def documented(arguments: str) -> list:
    """(name, has default, default) per listed argument, in order; ("...",
    False, None) for the ellipsis and ("**name", False, None) for a keyword
    catch-all."""
    listed = []
    for piece in _pieces(arguments):
        if piece == "...":
            listed.append(("...", False, None))
            continue
        call = ast.parse(f"f({piece})", mode="eval").body
        if call.args:
            listed.append((call.args[0].id, False, None))
        elif call.keywords[0].arg is None:
            listed.append((f"**{call.keywords[0].value.id}", False, None))
        else:
            listed.append((call.keywords[0].arg, True, ast.literal_eval(call.keywords[0].value)))
    return listed


def mismatches(obj, arguments: str) -> list:
    function = obj.__init__ if inspect.isclass(obj) else obj
    real = [p for p in inspect.signature(function).parameters.values() if p.name != "self"]
    names = [f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name for p in real]
    listed = documented(arguments)
    found, last = [], -1
    for name, has_default, default in listed:
        if name == "...":
            continue
        if name not in names:
            found.append(f"{name!r} is no argument of the real signature {names}")
            continue
        index = names.index(name)
        parameter = real[index]
        if index < last:
            found.append(f"{name!r} is out of the signature's order")
        last = index
        if has_default and parameter.default is parameter.empty:
            found.append(f"{name}={default!r}, but it has no default")
        elif has_default and parameter.default != default:
            found.append(f"{name}={default!r}, but the default is {parameter.default!r}")
        elif not has_default and not name.startswith("**") and parameter.default is not parameter.empty:
            found.append(f"{name} listed without its default {parameter.default!r}")
    listed_names = {name for name, _, _ in listed}
    required = [p.name for p in real if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    found += [f"required argument {name!r} is not listed" for name in required
              if name not in listed_names and "..." not in listed_names]
    return found


def test_every_entry_matches_its_signature():
    found = entries(API.read_text(encoding="utf-8"))
    assert len(found) > 30, "the entry pattern finds too few entries: is it still right?"
    wrong = []
    for line, name, arguments in found:
        try:
            problems = mismatches(resolve(name), arguments)
        except (AttributeError, ImportError) as error:
            problems = [f"does not exist ({error})"]
        wrong += [f"docs/api.md:{line}: {name}: {problem}" for problem in problems]
    assert not wrong, "\n".join(wrong)


def _sample(a, b=1, *, c="x", **options):
    pass


@pytest.mark.parametrize("arguments, expected", [
    ('a, b=1, c="x", **options', []),
    ("a, ...", []),
    ("a, c=\"x\"", []),
    ("a, b=2", ["b=2, but the default is 1"]),
    ("b=1", ["required argument 'a' is not listed"]),
    ("a, d=1", ["'d' is no argument of the real signature ['a', 'b', 'c', '**options']"]),
    ("a, b", ["b listed without its default 1"]),
    ("a, c=\"x\", b=1", ["'b' is out of the signature's order"]),
])
def test_the_check_itself(arguments, expected):
    assert mismatches(_sample, arguments) == expected
