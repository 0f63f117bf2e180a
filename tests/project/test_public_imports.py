"""sinkdlm uses only its dependencies' public API: no import of (and no attribute path through) a
`_`-prefixed module or name of torch, transformers, typer, gguf, ... anywhere in `src/`, lazy imports
included; transformers only from its top level. A private module moves or vanishes between releases
(transformers' GGUF tokenizer code did), and the user then gets a traceback on a version that
pyproject.toml declares supported."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "sinkdlm"
# Top-level names of the dependencies (and their usual aliases) in pyproject.toml.
DEPENDENCIES = {"torch", "transformers", "tokenizers", "safetensors", "datasets", "matplotlib", "numpy", "np",
                "tqdm", "yaml", "typer", "click", "scipy", "gguf", "lm_eval", "accelerate", "pyarrow"}


# transformers' public API is its top-level namespace; its submodules (`transformers.integrations.*`,
# `transformers.models.*`) are reorganised between major versions.
TOP_LEVEL_ONLY = {"transformers"}


def _private(parts) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def private_uses(source: str) -> list[str]:
    """Each `from dep._x import`, `import dep._x`, `from dep import _x` and `dep._x.y` in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            deep = parts[0] in TOP_LEVEL_ONLY and len(parts) > 1
            if parts[0] in DEPENDENCIES and (deep or _private(parts) or _private(a.name for a in node.names)):
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in DEPENDENCIES
                      and (_private(a.name.split(".")) or (a.name.split(".")[0] in TOP_LEVEL_ONLY and "." in a.name))]
        elif isinstance(node, ast.Attribute) and _private([node.attr]):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in DEPENDENCIES:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scanner_finds_each_kind_of_private_use():
    code = ("from transformers.integrations.gguf import y\nimport torch._dynamo\nfrom typer import _click\n"
            "def f():\n    return torch.utils._triton.has_triton()\n"
            "from lm_eval.__main__ import cli_evaluate\nimport torch.nn.functional as F\nx = obj._private\n"
            "from transformers import AutoTokenizer\nimport transformers.models.llama\n")
    assert sorted(int(u.split(":")[0][5:]) for u in private_uses(code)) == [1, 2, 3, 5, 10]


def test_src_uses_no_private_module_of_a_dependency():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    offenders = {str(f.relative_to(SRC)): uses for f in files if (uses := private_uses(f.read_text()))}
    assert offenders == {}
