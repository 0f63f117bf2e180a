"""The package's layers point one way: no import cycle among sinkdlm's modules.

Every `import` statement counts, including the ones inside functions (a lazy import is still a
dependency: it only moves the cycle from import time to call time). An import of `a.b.c` also
depends on the packages `a.b` above it, whose `__init__` runs first — except the packages that
contain the importing module, whose `__init__` is already running.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "sinkdlm"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (SRC / ROOT).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []  # modules this statement runs
            explicit: list[str] = []  # modules whose namespace it reads (`from pkg import name`)
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against this module's package
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for a in node.names:
                    if f"{mod}.{a.name}" in files:
                        targets.append(f"{mod}.{a.name}")
                    else:
                        targets.append(mod)
                        explicit.append(mod)
            for t in targets:
                if not t.startswith(ROOT):
                    continue
                parts = t.split(".")
                # the module itself (or the nearest module that exists) and the packages above it
                for k in range(len(parts), 0, -1):
                    candidate = ".".join(parts[:k])
                    # A package above the importing module has already run its __init__; reading a
                    # name from its namespace (`from sinkdlm import x`) still depends on it.
                    above = name.startswith(candidate + ".") and candidate not in explicit
                    if candidate in files and candidate != name and not above:
                        graph[name].add(candidate)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (lazy imports count): " + "; ".join(" <-> ".join(c) for c in found)


def test_io_leaves_import_nothing_above_them():
    """files.py and gguf_file.py are the bottom layer: they import no model, data or loader code."""
    graph = import_graph()
    for leaf in ("sinkdlm.io.files", "sinkdlm.io.gguf_file"):
        assert graph[leaf] <= {"sinkdlm.io.atomic", "sinkdlm.io.files"}, (leaf, graph[leaf])
