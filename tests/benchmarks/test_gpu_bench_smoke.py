"""The GPU benchmarks run where a GPU is lent for minutes only (benchmarks/gpu_suite.sh): a Python error there
wastes the loan. Their CPU smoke modes run here, small, and their results files are checked for shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~8 s: a benchmark process; make test-slow (tests/benchmarks/test_bench_block.py stays default)
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


@pytest.mark.slow  # ~10 s: a benchmark process; make test-slow
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


@pytest.mark.slow  # ~9 s: a benchmark process; make test-slow
def test_gpu_trainable_benchmark_cpu_proxy_counts_what_trains_and_the_layout_is_llada_8b(tmp_path):
    """bench_gpu_trainable.py (issue 52's LLaDA-8B step) runs its CPU proxy on the tiny layout, trains what each
    mode should (counted here from the shapes: LoRA's r (in + out) per projection plus the sink row; the sink
    row alone), and its LLaDA-8B layout has LLaDA-8B-Base's 8.02 B parameters (built on the meta device)."""
    import torch

    from helpers import subprocess_env

    out = tmp_path / "gpu_trainable.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_trainable.py"), "--layout", "tiny",
                          "--device", "cpu", "--seq-len", "32", "--steps", "1", "--out", str(out)],  # bf16, as on the card
                         capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    rows = {r["mode"]: r for r in result["rows"]}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_gpu_trainable import layout

    from sinkdlm import DiffusionLM

    c, r = layout("tiny"), 8
    d, kv, i = c.hidden_size, c.num_key_value_heads * (c.hidden_size // c.num_attention_heads), c.intermediate_size
    lora = c.num_hidden_layers * r * (2 * (d + d) + 2 * (d + kv) + 2 * (d + i) + (i + d))  # q o, k v, gate up, down
    assert rows["sink"]["trainable"] == d and rows["lora"]["trainable"] == lora + d
    assert all(len(x["losses"]) == 2 and all(map(lambda v: v == v, x["losses"])) for x in rows.values())
    with torch.device("meta"):
        big = DiffusionLM(layout("llada-8b"))
    assert abs(sum(p.numel() for p in big.parameters()) / 8.02e9 - 1) < 0.002


@pytest.mark.slow  # ~8 s: a benchmark process; make test-slow
def test_gpu_trainable_benchmark_refuses_llada_8b_without_a_gpu_in_one_line():
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would measure, not refuse")
    from helpers import subprocess_env

    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_trainable.py")], capture_output=True,
                         text=True, env=subprocess_env(), timeout=120)
    assert run.returncode == 1 and run.stderr.strip().count("\n") == 0 and "no CUDA GPU here" in run.stderr
