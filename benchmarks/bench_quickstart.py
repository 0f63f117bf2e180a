"""The README's Quick start, run exactly as written at full size: each line's wall time, peak memory and what
it wrote (and, for `analyze`, where the attention went per layer), so the README's table and its sentence about
the sink token come from a measurement (`make readme-results`, blocks `bench/quickstart`, `bench/quickstart-sinks`).

The bash block under "## Quick start", then the Python block below it, are read from README.md and run line by line in a fresh directory that
holds only links to this checkout's `.venv`, `Makefile` and `pyproject.toml` (what its lines need), so `runs/`
is created there as a newcomer's would be. Set-up lines (`source ...`, `M=...`) are replayed before each
command; a command runs as `exec` under bash, so `os.wait4` gives that process's own peak RSS (what
`/usr/bin/time -v` prints). Needs the example model (`make example-model`) and a quiet machine: how many
cores other work kept busy at the start is recorded beside the times.

Run: `.venv/bin/python benchmarks/bench_quickstart.py` (about 10 min on 2 cores).
Writes `benchmarks/results/bench_quickstart.json`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sinkdlm.io.machine import cpu_name

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "bench_quickstart.json"


def quick_start_block(readme: Path = ROOT / "README.md") -> list[str]:
    """The non-empty lines of the README's Quick start bash block, comments kept (they are part of the line)."""
    text = readme.read_text(encoding="utf-8").split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line for line in text.splitlines() if line.strip()]


def quick_start_python(readme: Path = ROOT / "README.md") -> str:
    """The Python block that follows the Quick start's bash block."""
    text = readme.read_text(encoding="utf-8").split("## Quick start", 1)[1].split("## ", 1)[0]
    return text.split("```python", 1)[1].split("```", 1)[0]


def is_setup(line: str) -> bool:
    """A line that sets up the shell (`source`, `export`, `NAME=value`) rather than running a command."""
    return line.startswith(("source ", "export ")) or re.match(r"^\w+=", line) is not None


def _du(path: Path) -> int | None:
    if not path.exists():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def busy_cores(seconds: float = 3.0) -> float:
    """How many cores other processes kept busy over the last `seconds` (/proc/stat: non-idle jiffies over
    the interval); the 1-minute load average lags a process that just stopped."""
    def ticks() -> tuple[int, int]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(f) - f[3] - f[4], sum(f)  # busy (all but idle and iowait), total
    (b0, t0), _ = ticks(), time.sleep(seconds)
    b1, t1 = ticks()
    return round(os.cpu_count() * (b1 - b0) / max(1, t1 - t0), 2)


def run_line(setup: list[str], line: str, cwd: Path) -> dict:
    script = "set -e\n" + "\n".join(setup) + "\nexec " + line + "\n"
    out_f, err_f = (tempfile.TemporaryFile("w+") for _ in range(2))  # files, not pipes: no read may reap it
    start = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, stdout=out_f, stderr=err_f, text=True)
    _, status, usage = os.wait4(proc.pid, 0)  # this process's own rusage (Popen.wait would discard it)
    wall = time.perf_counter() - start
    out, err = (f.seek(0) or f.read() for f in (out_f, err_f))
    target = re.search(r"--out\s+(\S+)", line)
    written = None if target is None else {"path": target.group(1), "bytes": _du(cwd / target.group(1))}
    return {"line": line, "returncode": os.waitstatus_to_exitcode(status), "wall_s": round(wall, 1),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "written": written,
            "stdout_tail": out.strip()[-400:], "stderr_tail": err.strip()[-400:],
            "attention": None if written is None else attention_summary(cwd / written["path"])}


def attention_summary(out: Path) -> dict | None:
    """Per layer, the attention mass on the detected sinks and (a DLM with sink tokens) on the sink token,
    from an `analyze` run's analysis.json; None for other outputs. The README's sentence about where the
    converted model's attention goes is generated from these lists, not typed."""
    path = out / "analysis.json"
    if not path.is_file():
        return None
    a = json.loads(path.read_text())
    extra = a.get("extra_sink") or {}
    return {"label": a["model"]["label"], "detected_sink_mass": a["sink_attention_mass"],
            "sink_token_mass": extra.get("attention_mass")}


def main() -> int:
    lines = quick_start_block()
    record = {"benchmark": "bench_quickstart", "cpu": cpu_name(), "cpu_count": os.cpu_count(), "busy_cores_at_start": busy_cores(),
              "python_version": sys.version.split()[0], "lines": []}
    with tempfile.TemporaryDirectory(prefix="quickstart-") as tmp:
        cwd = Path(tmp)
        for name in (".venv", "Makefile", "pyproject.toml"):
            (cwd / name).symlink_to(ROOT / name)
        setup: list[str] = []
        for line in lines:
            if is_setup(line):
                setup.append(line)
                continue
            row = run_line(setup, line, cwd)
            record["lines"].append(row)
            print(f"{row['wall_s']:7.1f} s {row['peak_rss_bytes'] / 1e9:5.2f} GB rc {row['returncode']}  {line[:90]}",
                  flush=True)
            if row["returncode"] != 0:
                print(row["stderr_tail"], file=sys.stderr)
                break
        source = quick_start_python()
        (cwd / "quickstart.py").write_text(source)
        record["python"] = {**run_line(setup, "python quickstart.py", cwd), "source": source}  # as a newcomer pastes it
        print(f"{record['python']['wall_s']:7.1f} s {record['python']['peak_rss_bytes'] / 1e9:5.2f} GB "
              f"rc {record['python']['returncode']}  the Python block", flush=True)
    record["all_ran"] = (all(r["returncode"] == 0 for r in record["lines"]) and record["python"]["returncode"] == 0
                         and len(record["lines"]) == sum(not is_setup(ln) for ln in lines))
    tmp_out = OUT.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(record, indent=1) + "\n")
    tmp_out.replace(OUT)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0 if record["all_ran"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
