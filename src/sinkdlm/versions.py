"""The dependency floors sinkdlm is tested at (`make test-floors`, tests/smoke), checked on first use.

A user on an older release than a floor gets one line naming the version needed (the command line
prints it as its `error:` line; the library raises `ImportError` with it) instead of a traceback from
deep inside a dependency. Read from installed metadata only: nothing is imported, so `--help` stays
fast. `tests/test_versions.py` checks that this table is pyproject.toml's.
"""

from __future__ import annotations

import re
from importlib import metadata

# The `>=` floors of pyproject.toml's dependencies that sinkdlm's own code depends on.
FLOORS = {
    "torch": "2.6",  # F.scaled_dot_product_attention(enable_gqa=) (2.5), public FSDP2 fully_shard (2.6)
    "transformers": "4.46",
    "tokenizers": "0.20",
    "safetensors": "0.4.1",
    "gguf": "0.11",  # 0.10.0 imports sentencepiece, which it does not declare
    "typer": "0.17.5",  # 0.14-0.16 break on today's click: --help (click >= 8.2), required options (>= 8.3)
    "click": "8.2",  # typer's engine; the CLI's tests run on 8.2 and later
    "numpy": "1.26",
}


def _release(version: str) -> tuple[int, ...]:
    """(2, 13, 0) for "2.13.0+cpu", (4, 46) for "4.46.0.dev0": the leading release numbers."""
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


def too_old() -> list[str]:
    """`name X < Y` for each installed dependency older than its floor (a missing one is pip's to say)."""
    old = []
    for name, floor in FLOORS.items():
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if _release(have) < _release(floor):
            old.append(f"{name} {have} < {floor}")
    return old


def check_versions() -> None:
    """Raise `ImportError` (one line) when an installed dependency is older than sinkdlm's floor."""
    old = too_old()
    if old:
        pins = " ".join(f"'{o.split()[0]}>={o.split()[-1]}'" for o in old)
        raise ImportError(f"sinkdlm needs newer dependencies ({', '.join(old)}): pip install -U {pins}")
