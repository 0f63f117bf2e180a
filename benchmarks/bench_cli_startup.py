"""How long does `sinkdlm --help` take, against importing torch alone?

Each sample is a fresh interpreter (`python -m sinkdlm --help` vs `python -c "import torch"`),
so the numbers include interpreter start-up and the import chain a user waits for. The two
commands run round-robin (rotating which goes first) after one warm-up each, so page-cache and
load changes on a shared machine hit both alike; medians and the median of per-round paired
ratios are reported. The target: the CLI's `--help` is no slower than `import torch`
(ratio <= 1), because `import sinkdlm.cli` imports neither torch nor transformers, datasets,
matplotlib or lm_eval.

Run: `.venv/bin/python benchmarks/bench_cli_startup.py [--repeats N]`.
Writes `benchmarks/results/bench_cli_startup.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "sinkdlm --help": [sys.executable, "-m", "sinkdlm", "--help"],
    "sinkdlm train --help": [sys.executable, "-m", "sinkdlm", "train", "--help"],
    "import torch": [sys.executable, "-c", "import torch"],
}


def run_once(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    names = list(COMMANDS)
    for name in names:  # warm-up: fill the page cache for both import chains
        run_once(COMMANDS[name], env)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            times[name].append(run_once(COMMANDS[name], env))
    base = times["import torch"]
    result = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "repeats": args.repeats,
        "seconds": times,
        "median_seconds": {n: statistics.median(v) for n, v in times.items()},
        "median_paired_ratio_vs_import_torch": {
            n: statistics.median(a / b for a, b in zip(v, base)) for n, v in times.items() if n != "import torch"
        },
    }
    out = ROOT / "benchmarks" / "results" / "bench_cli_startup.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("| command | median s | ratio vs `import torch` |\n|---|---|---|")
    for n in names:
        ratio = result["median_paired_ratio_vs_import_torch"].get(n, 1.0)
        print(f"| `{n}` | {result['median_seconds'][n]:.3f} | {ratio:.2f} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
