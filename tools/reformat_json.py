"""Rewrite JSON results files in the format the library now writes (`sinkdlm.io.atomic.json_text`: lists of
plain values on one line), for files written before it or by a study pinned to older code.

    python tools/reformat_json.py              # every JSON file git tracks under docs/results/
    python tools/reformat_json.py FILE ...     # these files

Each file is read, rewritten only where its text changes, and checked to read back as the same JSON (NaN-aware)
before it replaces the old one (an atomic rename). Prints the bytes before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sinkdlm.io.atomic import atomic_write_bytes, json_text

ROOT = Path(__file__).resolve().parents[1]


def reformat(path: Path) -> tuple[int, int]:
    """(bytes before, bytes after) of one file; a file that is not JSON is left as it is."""
    old = path.read_bytes()
    try:
        value = json.loads(old)
    except ValueError:
        return len(old), len(old)
    new = (json_text(value) + "\n").encode()
    if new != old:
        if json.dumps(json.loads(new)) != json.dumps(value):  # canonical text: NaN compares equal this way
            raise RuntimeError(f"{path}: the reformatted text does not read back as the same JSON")
        atomic_write_bytes(path, new)
    return len(old), len(new)


def main(argv: list[str]) -> None:
    if argv:
        paths = [Path(a) for a in argv]
    else:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "docs/results"], capture_output=True,
                             check=True).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p.endswith(".json") and (ROOT / p).is_file()]
    before = after = 0
    for path in paths:
        b, a = reformat(path)
        before, after = before + b, after + a
    print(f"{len(paths)} JSON files: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
