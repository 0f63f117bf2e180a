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


EXTRAS = ("lora", "quant", "cluster")  # optional extras whose floors are installed too (peft: `train --trainable lora`, `merge`; torchao: `--quantize`; submitit: `experiment --launcher`)


def floor_pins(pyproject: Path = PYPROJECT) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    deps = [*project["dependencies"], *(d for extra in EXTRAS for d in project["optional-dependencies"][extra])]
    pins = []
    for dep in deps:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*", dep)
        if m is None:
            raise SystemExit(f"{pyproject}: dependency {dep!r} has no plain '>=X' floor to test")
        pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


if __name__ == "__main__":
    sys.stdout.write("\n".join(floor_pins()) + "\n")
