"""Developer tooling: which sinkdlm source files a command runs, and how often it opens config.json.

Two measures of how many files a developer follows:
- every `src/sinkdlm` file in which a function is called while the command runs (import-time
  module code is left out), in the order they are first entered;
- with `--follow NAME`: only the files in which a line that names `NAME` runs — the path of one
  option's value from the flag to the kernel (`--follow num_sink_tokens` for `train
  --num-sink-tokens`). A file that merely passes a whole config along is not on it.
Plus each open of a file named `config.json` (not `tokenizer_config.json`, which transformers reads).

    .venv/bin/python tools/trace_files.py analyze --model DIR --prompts p.txt --gen-length 4 --out o
    .venv/bin/python tools/trace_files.py --follow num_sink_tokens train --data shakespeare --max-steps 1 ...
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def trace(argv: list[str], follow: str | None = None) -> tuple[list[str], int]:
    """(sinkdlm files entered — or, with `follow`, files where a line naming it ran — in first-entry
    order; config.json opens) while `sinkdlm argv` runs."""
    src = str(ROOT / "src" / "sinkdlm") + os.sep
    files: dict[str, None] = {}
    opens = [0]
    word = re.compile(rf"\b{re.escape(follow)}\b") if follow else None

    def local(frame, event, arg):  # line events of one sinkdlm frame (`follow` only)
        if event == "line" and word.search(linecache.getline(frame.f_code.co_filename, frame.f_lineno)):
            files.setdefault(os.path.relpath(frame.f_code.co_filename, ROOT / "src"), None)
        return local

    def tracer(frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(src) or code.co_name == "<module>":
            return None
        if word is None:
            files.setdefault(os.path.relpath(code.co_filename, ROOT / "src"), None)
            return None
        return local

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, os.PathLike)) and os.path.basename(os.fspath(args[0])) == "config.json":
            opens[0] += 1

    sys.addaudithook(audit)
    from sinkdlm.cli import main

    sys.settrace(tracer)
    try:
        main(argv)
    except SystemExit:
        pass
    finally:
        sys.settrace(None)
    return list(files), opens[0]


if __name__ == "__main__":
    args = sys.argv[1:]
    follow = None
    if args[:1] == ["--follow"]:
        follow, args = args[1], args[2:]
    entered, config_opens = trace(args, follow)
    what = f"files where a line naming {follow!r} ran" if follow else "sinkdlm files entered"
    print(f"{len(entered)} {what}; config.json opened {config_opens} time(s)", file=sys.stderr)
    for path in entered:
        print(path, file=sys.stderr)
