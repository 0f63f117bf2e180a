"""Developer tooling: which sinkdlm source files a command runs, and how often it opens config.json.

A measure of how many files a developer follows from a flag to the kernel: every `src/sinkdlm`
file in which a function is called while the command runs (import-time module code is left
out), in the order they are first entered, plus each open of a file named `config.json` (not `tokenizer_config.json`, which transformers reads).

    .venv/bin/python tools/trace_files.py analyze --model DIR --prompts p.txt --gen-length 4 --out o
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def trace(argv: list[str]) -> tuple[list[str], int]:
    """(sinkdlm files entered, in first-entry order; config.json opens) while `sinkdlm argv` runs."""
    src = str(ROOT / "src" / "sinkdlm") + os.sep
    files: dict[str, None] = {}
    opens = [0]

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(src) and code.co_name != "<module>":
            files.setdefault(os.path.relpath(code.co_filename, ROOT / "src"), None)

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, os.PathLike)) and os.path.basename(os.fspath(args[0])) == "config.json":
            opens[0] += 1

    sys.addaudithook(audit)
    from sinkdlm.cli import main

    sys.setprofile(profile)
    try:
        main(argv)
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return list(files), opens[0]


if __name__ == "__main__":
    entered, config_opens = trace(sys.argv[1:])
    print(f"{len(entered)} sinkdlm files entered; config.json opened {config_opens} time(s)", file=sys.stderr)
    for path in entered:
        print(path, file=sys.stderr)
