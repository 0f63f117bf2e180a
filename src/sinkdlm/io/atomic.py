"""Atomic file writes: write a temp file beside the target, fsync it, rename it over the target.

A crash leaves either the old file or the new one, never half of one. Used for checkpoints,
JSON, reports, figures and analysis arrays (torch-free, so plotting code can use it too).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask() sets it, racing other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[str], None], suffix: str = ".tmp") -> Path:
    """Call `write(tmp_path)`, then publish the temp file as `path` (parents created).

    The temp file gets the mode a plain `open()` would (`mkstemp` makes it 0600, which would
    leave every checkpoint private to its writer) and is fsynced before the rename.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def json_text(obj: Any, indent: int = 2) -> str:
    """`obj` as JSON that people read and a repository keeps light: objects and nested lists indented as
    `json.dumps(indent=2)` writes them, a list of plain values (numbers, strings, booleans, null) on one line.
    A study's per-draw losses or per-layer masses are such lists: one number a line made them 1.3-2.3x larger
    (docs/results/ went from 11.6 MB of JSON to 9.0 MB). Every value is `json.dumps`'s own, so it reads back
    the same."""
    def dump(o: Any, level: int) -> str:
        pad, inner = " " * (indent * level), " " * (indent * (level + 1))
        if isinstance(o, dict) and o:
            items = (f"{inner}{json.dumps(k if isinstance(k, str) else json.dumps(k))}: {dump(v, level + 1)}"
                     for k, v in o.items())  # a non-string key as json.dumps writes it: 1 -> "1", True -> "true"
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(o, (list, tuple)) and any(isinstance(x, (dict, list, tuple)) for x in o):
            return "[\n" + ",\n".join(inner + dump(x, level + 1) for x in o) + "\n" + pad + "]"
        if isinstance(o, (list, tuple)):
            return "[" + ", ".join(json.dumps(x) for x in o) + "]"
        return json.dumps(o)

    return dump(obj, 0)


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_bytes(path, (json_text(obj) + "\n").encode())
