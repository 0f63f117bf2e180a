"""benchmarks/bench_block.py (block diffusion's speed) runs at toy size on a CPU and writes every row: it is also a
step of benchmarks/gpu_suite.sh, where a Python error would waste a lent GPU's minutes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_block_benchmark_runs_at_toy_size_and_writes_both_parts(tmp_path):
    from helpers import subprocess_env

    out = tmp_path / "block.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_block.py"), "--repeats", "1", "--prompt", "8",
                          "--gen", "8", "--block", "4", "--seq-len", "8", "--batch", "2", "--out", str(out)],
                         capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    r = json.loads(out.read_text())
    rows = r["decoding"]["rows"]
    assert list(rows) == ["block model, its cache", "whole sequence, no cache", "whole sequence, dual cache"]
    for name, v in rows.items():
        # one token per step: the whole-sequence model runs 8 forwards; the block model adds its prefill and
        # the passes that write each finished block's exact keys and values
        assert v["forwards"] == 8 if name.startswith("whole") else v["forwards"] > 8
        assert abs(v["tokens_per_s"] - 8 / v["seconds"]) < 1e-9 * v["tokens_per_s"]
        assert abs(v["block_speedup"] - v["seconds"] / rows["block model, its cache"]["seconds"]) < 1e-12
    t = r["training"]
    block, whole = t["rows"].values()
    assert t["tokens"] == 16 and abs(block["us_per_token"] - 1e6 * block["seconds"] / 16) < 1e-6
    assert abs(t["block_cost_ratio"] - block["seconds"] / whole["seconds"]) < 1e-12
