"""JSON Lines files, read one record at a time, with the line number in every error (corpora, SFT data, prompt
files). Torch-free, so a command can check its input file before its heavy imports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def not_utf8_error(path: Path, exc: UnicodeDecodeError) -> ValueError:
    """The error for a text file that is not UTF-8: names the file and the byte offset."""
    return ValueError(
        f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); text corpora must be UTF-8 — "
        f"convert it, e.g. `iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`"
    )


def iter_jsonl(path: Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed value)`` for each non-blank line of a JSON Lines file."""
    with path.open(encoding="utf-8") as f:
        lineno = 0
        try:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno} is not valid JSON ({exc.msg}); expected one object per line") from exc
                yield lineno, record
        except UnicodeDecodeError as exc:
            raise not_utf8_error(path, exc) from None
