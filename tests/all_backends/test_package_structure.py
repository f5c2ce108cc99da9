"""The package's imports keep its layering: no circle, no upward import,
no private name reached from another module.

Data flows one way (docs/design.md, "Map"): core -> cells -> recurrence ->
layers -> heads (CRF, diagnostics, export) -> tagging -> data -> training -> cli ->
demo. A module may import from its own folder and from folders on lower
tiers; a folder never imports a folder on its own tier or above. Inside
`recurrence/` the same holds for its parts: the contract (`direction`,
`cache`, `compile_policy`) under the engines (`scan`, `vendor/`,
`tensorflow/`) under the one selection (`engine`).

The test reads the source (imports inside functions included) and imports
nothing of the package, so it runs the same on every backend.
"""

import ast
import collections
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "keras_birnn"
ROOT = "keras_birnn"

# Top-level folders and modules, lowest tier first; the package's own
# __init__ (the public API) sits above them all.
TIERS: List[Set[str]] = [
    {"backend"},
    {"config", "api_export", "serialization", "functions", "tf_internal"},
    {"masking", "losses"},
    {"cells"},
    {"recurrence"},
    {"layers"},
    {"crf", "diagnostics", "export"},
    {"tagging"},
    {"data"},
    {"training"},
    {"cli"},
    {"demo"},
]
RECURRENCE_TIERS: List[Set[str]] = [
    {"direction", "cache", "compile_policy"},
    {"scan", "vendor", "tensorflow"},
    {"engine"},
]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Dict[str, pathlib.Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def parsed(path: pathlib.Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"))


def imports_of(tree: ast.AST) -> Iterator[Tuple[int, str, str]]:
    """(line, imported module, imported name or "") for every import of the package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] == ROOT:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    yield (node.lineno, full, "") if full in MODULES else (node.lineno, node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == ROOT:
                    yield node.lineno, alias.name, ""


def graph() -> Dict[str, Set[str]]:
    edges: Dict[str, Set[str]] = collections.defaultdict(set)
    for name, path in MODULES.items():
        for _, target, _ in imports_of(parsed(path)):
            if target != name:
                edges[name].add(target)
    return edges


def circles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(set(edges).union(*edges.values())):
        if node not in index:
            visit(node)
    return found


def tier(parts: List[str], tiers: List[Set[str]]) -> int:
    for level, members in enumerate(tiers):
        if parts and parts[0] in members:
            return level
    return len(tiers)  # a package __init__ and anything unlisted: the top


def upward(source: str, target: str) -> bool:
    """Whether `source` importing `target` goes up or sideways between folders."""
    src, dst = source.split(".")[1:], target.split(".")[1:]
    if src[:1] == dst[:1] == ["recurrence"]:
        src, dst, tiers = src[1:], dst[1:], RECURRENCE_TIERS
    else:
        tiers = TIERS
    if not src or not dst or src[0] == dst[0]:
        return False  # within one folder (a package's __init__ imports its parts)
    return tier(dst, tiers) >= tier(src, tiers)


def test_every_module_has_a_tier():
    top = {name.split(".")[1] for name in MODULES if name.count(".") >= 1}
    listed = set().union(*TIERS)
    assert top <= listed, f"place these in TIERS: {sorted(top - listed)}"
    parts = {name.split(".")[2] for name in MODULES if name.startswith(ROOT + ".recurrence.")}
    assert parts <= set().union(*RECURRENCE_TIERS), sorted(parts - set().union(*RECURRENCE_TIERS))


def test_no_import_circle():
    assert circles(graph()) == []


def test_no_upward_import_between_folders():
    found = [f"{source} imports {target}" for source, targets in sorted(graph().items())
             for target in sorted(targets) if upward(source, target)]
    assert not found, "\n".join(found)


def private_reaches(tree: ast.AST, where: str) -> List[str]:
    """`from keras_birnn.x import _y` and `x._y` where `x` names a package module."""
    modules: Set[str] = set()  # local names bound to the package's modules
    found: List[str] = []
    for line, target, name in imports_of(tree):
        if name.startswith("_") and not name.startswith("__"):
            found.append(f"{where}:{line}: {target}.{name}")
        if not name and target.rsplit(".", 1)[-1].startswith("_"):
            found.append(f"{where}:{line}: {target}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == ROOT:
            modules.update(a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in MODULES)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name.split(".")[0] == ROOT)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_private_name_imported_across_modules():
    found = [v for path in MODULES.values()
             for v in private_reaches(parsed(path), str(path.relative_to(PACKAGE.parent)))]
    assert not found, "give shared helpers plain names in the module that owns them:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("from keras_birnn.crf.maths import _scan, viterbi\n", ["keras_birnn.crf.maths._scan"]),
    ("from keras_birnn.crf import maths\nmaths._scan(1)\nmaths.viterbi(2)\n", ["maths._scan"]),
    ("from keras_birnn import backend\nbackend.__name__\n", []),
])
def test_the_private_scan_finds_what_it_should(source, expected):
    """The check is not vacuous: planted violations are found, plain names pass."""
    assert "keras_birnn.crf.maths" in MODULES  # the planted imports name a real module
    found = private_reaches(ast.parse(source), "planted.py")
    assert [f.split(": ", 1)[1] for f in found] == expected


def test_every_import_is_absolute_and_static():
    """The graph above sees every import: none relative, none through importlib."""
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.level:
                found.append(f"{name}:{node.lineno}: relative import")
            if isinstance(node, ast.Attribute) and node.attr == "import_module":
                found.append(f"{name}:{node.lineno}: importlib.import_module")
    assert not found, "\n".join(found)


def test_the_layering_checks_can_fail():
    assert upward("keras_birnn.cells.gru", "keras_birnn.layers.recurrent")
    assert upward("keras_birnn.crf.layer", "keras_birnn.export.saved_model")  # same tier, another folder
    assert upward("keras_birnn.recurrence.scan", "keras_birnn.recurrence.engine")
    assert not upward("keras_birnn.layers.recurrent", "keras_birnn.recurrence")
    assert not upward("keras_birnn.recurrence.engine", "keras_birnn.recurrence.vendor.torch_kernels")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
