"""The code keeps its shape: settings travel as the typed configs (`sinkdlm.config`) or a small dataclass, so no
function in `src/` takes more than 8 named parameters (`self`/`cls`, `*args` and `**kwargs` not counted), and
`generate` (`diffusion/sampling.py`) stays a plan and its loop, at most 80 lines: a new decoding path is a
`GenerationPlan` path with its loop, not another branch in `generate`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "sinkdlm"
MAX_PARAMETERS = 8
GENERATE_LINES = 80  # the `def` line to the last line of the body, its docstring included


def named_parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The names a call can bind one by one: positional and keyword-only parameters, without `self`/`cls`."""
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]


def functions(tree: ast.Module):
    """Every function and method of a module, nested ones included."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def over_the_limit() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for fn in functions(ast.parse(path.read_text(encoding="utf-8"))):
            names = named_parameters(fn)
            if len(names) > MAX_PARAMETERS:
                found.append(f"{path.relative_to(ROOT)}:{fn.lineno} {fn.name} ({len(names)}: {', '.join(names)})")
    return found


def test_counter_counts_named_parameters_only():
    source = ("class C:\n    def m(self, a, b=1, *args, c, d=2, **kw):\n        pass\n"
              "def f(a, /, b, *, c):\n    def inner(x, y):\n        pass\n")
    counts = {fn.name: len(named_parameters(fn)) for fn in functions(ast.parse(source))}
    assert counts == {"m": 4, "f": 3, "inner": 2}


def test_no_function_takes_more_than_eight_named_parameters():
    found = over_the_limit()
    assert not found, (f"functions with more than {MAX_PARAMETERS} named parameters (group the settings into the typed "
                       f"config that holds them, or a small dataclass): " + "; ".join(found))


def test_generate_is_a_plan_and_its_loop():
    path = SRC / "diffusion" / "sampling.py"
    fn = next(f for f in ast.parse(path.read_text(encoding="utf-8")).body
              if isinstance(f, ast.FunctionDef) and f.name == "generate")
    lines = fn.end_lineno - fn.lineno + 1
    assert lines <= GENERATE_LINES, (f"sampling.generate is {lines} lines (at most {GENERATE_LINES}): plan the call "
                                     "in plan_generation and run the plan's loop (LOOPS), not another branch in generate")
