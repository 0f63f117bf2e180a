"""Which CPU settings change fp32 results on this machine: the measurement behind the suite's rerun guard.

A tolerance written from one machine's rounding passes there and fails on another vendor's BLAS path
(issue 51: a 1e-6 absolute tolerance green on Intel AMX, red on AMD Zen 4). The guard reruns the numerics
tests under a setting that changes kernel selection or reduction order, so such a tolerance fails where it
is written. Only a setting that changes results is worth its CI time; this tool measures which do.

Each setting runs the same fp32 computations in a fresh process (the settings are read at start-up): a
small model's forward over all columns and over a cached slice, its loss and gradient, an odd-shaped
matmul, a long sum and a softmax. Every output is compared bitwise with the baseline's (one thread, no
variable set) and its largest difference printed in units of fp32 eps at the output's scale.

    .venv/bin/python tools/kernel_sensitivity.py [--json benchmarks/results/kernel_sensitivity.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from sinkdlm.io.machine import cpu_name

SETTINGS: dict[str, dict[str, str]] = {
    "baseline (1 thread)": {},
    "2 threads": {"SINKDLM_KS_THREADS": "2"},
    "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default"},
    "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "ONEDNN_MAX_CPU_ISA=AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "MKL_ENABLE_INSTRUCTIONS=AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "2 threads + ATEN_CPU_CAPABILITY=default": {"SINKDLM_KS_THREADS": "2", "ATEN_CPU_CAPABILITY": "default"},
}

_CHILD = r"""
import os, sys, torch
torch.set_num_threads(int(os.environ.get("SINKDLM_KS_THREADS", "1")))
from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from safetensors.torch import save_file
out = {}
torch.manual_seed(0)
cfg = ModelConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=48, max_position_embeddings=64, initializer_range=0.2, num_sink_tokens=1)
model = DiffusionLM(cfg).eval()
ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(1))
attn = torch.ones(2, 10, dtype=torch.bool); attn[0, :3] = False
with torch.no_grad():
    out["forward"] = model(ids, attention_mask=attn).logits
    kv = model.allocate_cache(2, 10, attn); model(ids, cache=kv); kv.start = 4
    out["cached slice"] = model(ids[:, 4:7], cache=kv).logits
big = DiffusionLM(ModelConfig(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=352, max_position_embeddings=128)).train()
x0 = torch.randint(0, 255, (4, 96), generator=torch.Generator().manual_seed(2))
loss = diffusion_loss(big, x0, MaskNoise(generator=torch.Generator().manual_seed(3)), mask_id=255).loss
loss.backward()
out["loss"] = loss.detach().reshape(1)
out["grad"] = big.lm_head.weight.grad
g = torch.Generator().manual_seed(4)
a, b = torch.randn(67, 509, generator=g), torch.randn(509, 71, generator=g)
out["matmul 67x509x71"] = a @ b
out["sum 1e6"] = torch.randn(1_000_000, generator=g).sum().reshape(1)
out["softmax"] = torch.randn(8, 4, 97, 97, generator=g).softmax(-1)
save_file({k: v.detach().contiguous() for k, v in out.items()}, sys.argv[1])
"""


def run(env: dict[str, str], path: Path) -> None:
    subprocess.run([sys.executable, "-c", _CHILD, str(path)], env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                   check=True)


def main() -> None:
    import tempfile

    import torch
    from safetensors.torch import load_file

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the table here as JSON")
    args = ap.parse_args()
    eps = torch.finfo(torch.float32).eps
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        outs = {}
        for name, env in SETTINGS.items():
            run(env, Path(tmp) / "out.safetensors")
            outs[name] = load_file(Path(tmp) / "out.safetensors")
        base = outs["baseline (1 thread)"]
        for name, got in outs.items():
            rows[name] = {k: float((got[k] - v).abs().max() / (eps * v.abs().max())) for k, v in base.items()}
    cpu = cpu_name()
    keys = list(next(iter(rows.values())))
    print(f"largest difference from the baseline, in fp32 eps at the output's scale ({cpu}, torch {torch.__version__})")
    print(f"{'setting':<42}" + "".join(f"{k:>18}" for k in keys))
    for name, row in rows.items():
        print(f"{name:<42}" + "".join(f"{row[k]:>18.2f}" for k in keys))
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu, "torch": torch.__version__, "unit": "fp32 eps x max|baseline|",
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
