"""Training flushes denormal floats to zero on every intra-op CPU thread (training/cpu.py).

The CPU proxy of a speed property: what is checked is the floating-point mode itself, in a fresh process
with 2 intra-op threads, by multiplying a million denormals by 1 (each thread computes part of the
product; a thread that does not flush leaves its part non-zero). The speed it buys is measured in
benchmarks/bench_denormal.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import subprocess_env, write_corpus

ROOT = Path(__file__).resolve().parents[2]  # the child imports tests.helpers from here

PROBE = "int((torch.full((1 << 20,), 1e-39) * 1.0).count_nonzero())"  # 1e-39 < float32's smallest normal


def _child(code: str, tmp_path) -> dict:
    env = subprocess_env()
    # 2 intra-op threads whatever the caller's environment: with MKL built in, torch takes MKL's thread count
    # over OMP_NUM_THREADS, so a caller's MKL_NUM_THREADS=1 alone would give the child one thread
    threads = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    env = {**env, **threads, "PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{ROOT}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_keeps_denormals_and_train_flushes_them_on_every_thread(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    code = f"""
import json, torch
from tests.helpers import cfg_for
from pathlib import Path
before = {PROBE}
from sinkdlm.training import train
train(cfg_for(Path({str(tmp_path)!r}), Path({str(corpus)!r}), max_steps=2, eval_every=2, save_every=2))
print(json.dumps({{"threads": torch.get_num_threads(), "before": before, "after": {PROBE}}}))
"""
    got = _child(code, tmp_path)
    assert got["threads"] == 2
    assert got["before"] == 1 << 20  # denormals survive a product by default: the probe can see the mode
    assert got["after"] == 0  # every thread's part flushed


def test_flush_denormals_reaches_the_threads_created_after_it(tmp_path):
    got = _child(f"""
import json, torch
from sinkdlm.training.cpu import flush_denormals
supported = flush_denormals()
print(json.dumps({{"supported": supported, "after": {PROBE}}}))
""", tmp_path)
    assert got["supported"] and got["after"] == 0
