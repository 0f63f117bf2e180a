"""Print every dependency of pyproject.toml (and of the extras in EXTRAS) pinned at its declared floor
(`name>=X` -> `name==X`), one per line, for `make test-floors`: the environment in which the floors are tested.

A dependency declared without a `>=` floor is an error here: every one must state what it needs.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


# torchao (`quant`) is left out: 0.18, its floor and newest release, needs torch >= 2.11 and breaks transformers'
# import beside torch 2.6 (torch.utils._pytree.register_constant); the main environment tests it at exactly 0.18.0
EXTRAS = ("lora", "cluster", "serve")  # optional extras whose floors are installed too (peft: `train --trainable lora`, `merge`; submitit: `experiment --launcher`; fastapi, uvicorn: `serve`)
DEV_FOR_TESTS = ("openai", "httpx", "hypothesis")  # the dev extra's test clients the floor tests run (tests/serving)


def floor_pins(pyproject: Path = PYPROJECT, extra: str | None = None) -> list[str]:
    """The floors pinned; `extra`: that extra's alone (`make test-quant` installs the quant extra's)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    deps = [*project["dependencies"], *(d for extra in EXTRAS for d in extras[extra]),
            *(d for d in extras["dev"] if re.split(r"[<>=\s\[]", d)[0] in DEV_FOR_TESTS)]
    if extra is not None:
        deps = extras[extra]
    pins = []
    for dep in deps:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*", dep)
        if m is None:
            raise SystemExit(f"{pyproject}: dependency {dep!r} has no plain '>=X' floor to test")
        pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


if __name__ == "__main__":
    only = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--extra" else None
    sys.stdout.write("\n".join(floor_pins(extra=only)) + "\n")
