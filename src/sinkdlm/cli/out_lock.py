"""One writer per output directory: `exclusive_out(path, "analyze")` around a command's work.

`analyze --out D` writes several files (analysis.json, arrays, figures, reports), each atomically
but not as a set: two runs on one D at once would leave one run's figures beside the other's
numbers. The second is refused instead, with one line, before it loads anything. The lock is an
exclusive `flock` on the directory itself (no lock file to leave behind); the OS drops it when
the process dies, so a crashed run never leaves a stale lock. Without `fcntl` (Windows) or on a
file system that refuses locks, the command runs unlocked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


@contextmanager
def exclusive_out(path: str | Path, command: str, flag: str = "--out") -> Iterator[Path]:
    """Create directory `path` if needed and hold it for the body; refuse (ValueError) when another
    process holds it. A body that refuses its input (ValueError) leaves no directory this call made."""
    path = Path(path)
    made, missing = [], path
    while not missing.exists() and missing != missing.parent:
        made.append(missing)
        missing = missing.parent
    path.mkdir(parents=True, exist_ok=True)
    fd = None
    if fcntl is not None:
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ValueError(f"{flag} {path} is in use by another `sinkdlm {command}`; wait for it to finish, "
                             f"or choose another {flag}") from None
        except OSError:  # e.g. a network file system without flock: run unlocked
            os.close(fd)
            fd = None
    try:
        yield path
    except ValueError:
        for folder in made:  # deepest first; stop at the first that is not empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    finally:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
