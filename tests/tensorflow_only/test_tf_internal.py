"""Private TensorFlow and Keras internals are reached from one module only.

`keras_birnn/tf_internal.py` wraps every use of `tensorflow.python`,
`keras.src`, `tf.__internal__` and Keras's private node, mask and
layer-walk attributes, so that an upgrade that moves one breaks in one place. This
test reads the package's source (it imports nothing) and names any other
module that reaches them directly.
"""

import ast
import pathlib
from typing import List

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "keras_birnn"
HOME = PACKAGE / "tf_internal.py"
PRIVATE_MODULES = ("tensorflow.python", "keras.src", "jax._src")
PRIVATE_ATTRIBUTES = ("_inbound_nodes", "_keras_mask", "__internal__", "_flatten_layers")


def _is_private_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in PRIVATE_MODULES)


def _reaches(node: ast.AST) -> List[str]:
    """What `node` reaches of the private internals, if anything."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if _is_private_module(a.name)]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        full = [f"{node.module}.{a.name}" for a in node.names]
        return [n for n in full if _is_private_module(n)]
    if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES:
        return [node.attr]
    if isinstance(node, ast.Constant) and node.value in PRIVATE_ATTRIBUTES:
        return [node.value]  # getattr(x, "_inbound_nodes") and the like
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _is_private_module(node.value):
        return [node.value]  # importlib.import_module("tensorflow.python...")
    return []


def _violations(path: pathlib.Path) -> List[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(PACKAGE.parent)
    return [f"{where}:{node.lineno}: {name}" for node in ast.walk(tree) for name in _reaches(node)]


def test_only_tf_internal_reaches_private_internals():
    found = [v for path in sorted(PACKAGE.rglob("*.py")) if path != HOME for v in _violations(path)]
    assert not found, "Reach private internals through keras_birnn/tf_internal.py:\n" + "\n".join(found)


def test_the_scan_sees_what_tf_internal_reaches():
    """The scan is not vacuous: it finds the home module's own uses."""
    found = " ".join(_violations(HOME))
    for name in ("tensorflow.python.eager.forwardprop_util", "_inbound_nodes", "_keras_mask", "__internal__",
                 "_flatten_layers"):
        assert name in found, (name, found)
