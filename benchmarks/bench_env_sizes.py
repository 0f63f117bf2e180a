"""How much disk the two environments take: `make demo`'s runtime and `make install`'s runtime + dev extras.

Each environment is built in a fresh temporary directory by the Makefile's own recipe lines (read from the
Makefile, `$(PY)` and `$(VENV)` pointing at the temporary venv, so what is measured is what `make` runs),
then sized with `du -sb`, with its largest site-packages entries beside, and deleted.

Run: `python3 benchmarks/bench_env_sizes.py` (a few minutes: pip installs from the local wheels). Writes
`benchmarks/results/env_sizes.json`; docs/benchmarks.md and the README's set-up sentence come from it
(`make readme-results`, block `bench/env-sizes`).
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "env_sizes.json"
TARGETS = {"runtime": "$(RUNTIME_STAMP)", "dev": "$(STAMP)"}  # `make demo` needs the first, `make install` builds the second


def recipe(target: str, makefile: Path = ROOT / "Makefile") -> list[str]:
    """The commands of `target`'s recipe that build the environment (the venv and the pip lines, not `touch`)."""
    lines = makefile.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{target}:"))
    body = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        cmd = ln.strip()
        if cmd.startswith(("$(PY) -m pip", "python3 -m venv")):
            body.append(cmd)
    return body


def du_bytes(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True, text=True).stdout.split()[0])


def measure(name: str, tmp: Path) -> dict:
    venv = tmp / name
    commands = recipe(TARGETS[name])
    start = time.perf_counter()
    for cmd in commands:
        line = cmd.replace("$(PY)", str(venv / "bin" / "python")).replace("$(VENV)", str(venv))
        print(f"[{name}] {line}", flush=True)
        subprocess.run(line, shell=True, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    site = next((venv / "lib").glob("python*/site-packages"))
    entries = {p.name: du_bytes(p) for p in site.iterdir() if p.is_dir() and not re.search(r"\.(dist|egg)-info$", p.name)}
    largest = dict(sorted(entries.items(), key=lambda kv: -kv[1])[:5])
    return {"make_target": TARGETS[name], "commands": commands, "bytes": du_bytes(venv),
            "largest_site_packages": largest, "install_s": round(seconds, 1)}


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="sinkdlm-env-"))
    try:
        envs = {name: measure(name, tmp) for name in TARGETS}
    finally:
        shutil.rmtree(tmp)
    result = {"environments": envs, "python": platform.python_version(), "platform": platform.platform(),
              "note": "du -sb of the whole venv, after the Makefile's recipe; install_s depends on the machine and its "
                      "load (pip installs from local wheels here), the sizes do not"}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    for name, env in envs.items():
        print(f"{name}: {env['bytes'] / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
