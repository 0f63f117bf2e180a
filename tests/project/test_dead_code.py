"""No dead code: every function, method and class defined in `src/sinkdlm` is used somewhere.

A vulture-style check with `ast`: a definition counts as used when its name is read anywhere in
`src/`, `tests/`, `benchmarks/` or `tools/` (a name, an attribute, or a string such as an `__all__`
or lazy-import entry). Dunder methods, decorated definitions (commands, properties, registered
hooks) and the methods of subclasses (`forward`, `from_hf`, protocol methods) are called by their
framework, not by name, and are left out. Silence a false alarm by adding the name to
`USED_ELSEWHERE` with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "sinkdlm"
READERS = [ROOT / d for d in ("src", "tests", "benchmarks", "tools")]
# name -> why it is used although no code reads it by name
USED_ELSEWHERE: dict[str, str] = {}


def definitions(tree: ast.Module) -> list[tuple[str, int]]:
    """(name, line) of the module's classes, functions and UPPER_CASE constants, and of the methods
    of its classes without a base class (a subclass's methods may implement its base's interface,
    `forward` or a protocol, and are called by that code, not by name)."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.decorator_list:
            out.append((node.name, node.lineno))
        if isinstance(node, ast.ClassDef) and not node.bases:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.decorator_list:
                    out.append((item.name, item.lineno))
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        out += [(t.id, node.lineno) for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
    return [(n, line) for n, line in out if not (n.startswith("__") and n.endswith("__"))]


def names_read(tree: ast.Module) -> set[str]:
    """Every name the module reads: identifiers, attributes and identifier-like strings."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            used.add(node.value)
        elif isinstance(node, ast.alias):
            used.add(node.name.rsplit(".", 1)[-1])
    return used


def unused_definitions() -> list[str]:
    used: set[str] = set()
    for folder in READERS:
        for path in folder.rglob("*.py"):
            if ".venv" not in path.parts:
                used |= names_read(ast.parse(path.read_text(encoding="utf-8")))
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, line in definitions(tree):
            if name not in used and name not in USED_ELSEWHERE:
                found.append(f"{path.relative_to(ROOT)}:{line} {name}")
    return found


def test_finder_flags_an_unused_function():
    source = "A = 1\nB = 2\ndef used():\n    return A\n\ndef unused():\n    pass\n\nclass C:\n    def m(self):\n        pass\n\nused(C)\n"
    tree = ast.parse(source)
    defined = {n for n, _ in definitions(tree)}
    assert defined == {"A", "B", "used", "unused", "C", "m"}
    assert defined - names_read(tree) == {"B", "unused", "m"}


def test_no_unused_definitions():
    found = unused_definitions()
    assert not found, "defined but never used (delete, or list in USED_ELSEWHERE with the reason): " + ", ".join(found)
