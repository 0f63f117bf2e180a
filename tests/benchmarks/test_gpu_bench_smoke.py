"""The GPU benchmarks run where a GPU is lent for minutes only (benchmarks/gpu_suite.sh): a Python error there
wastes the loan. Their CPU smoke modes run here, small, and their results files are checked for shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_decode_benchmark_runs_on_cpu_and_writes_every_row(tmp_path):
    from helpers import subprocess_env

    out = tmp_path / "decode.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_decode.py"), "--device", "cpu",
                          "--preset", "tiny", "--prompt-length", "8", "--gen-length", "16", "--block-length", "8",
                          "--batches", "1,2", "--modes", "no cache;dual", "--repeats", "1", "--out", str(out)],
                         capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["mode"]) for r in rows] == [(1, "no cache"), (1, "dual"), (2, "no cache"), (2, "dual")]
    for r in rows:
        # one token per step: 16 steps for 16 tokens, and the rate is the tokens over the measured time
        assert r["steps"] == 16 and r["tokens"] == 16 * r["batch"] and r["ms_per_step"] > 0
        assert abs(r["tokens_per_s"] - r["tokens"] / r["seconds"]) < 1e-6 * r["tokens_per_s"]


def test_gpu_train_benchmark_refuses_without_a_gpu_in_one_line():
    """bench_gpu_train.py has no CPU mode (its numbers are CUDA-event timings and MFU): without a GPU it
    must say so in one line, not fail inside the measurement."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would measure, not refuse")
    from helpers import subprocess_env

    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_train.py")], capture_output=True,
                         text=True, env=subprocess_env(), timeout=120)
    assert run.returncode != 0 and "needs a CUDA GPU" in run.stderr and "Traceback" not in run.stderr
