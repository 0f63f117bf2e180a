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


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())
