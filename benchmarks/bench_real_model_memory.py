"""Does `sinkdlm analyze` of an 8B model (LLaDA-8B, bf16, S ≈ 512) fit one 80 GB GPU? Measured on
CPU on random-weight models with LLaDA-8B's *layer shape* and fewer layers, then extrapolated.

LLaDA-8B: d_model 4096, 32 heads (no GQA), 32 layers, SwiGLU width 12288, 126,464 embedding rows,
untied head. Each child process builds that shape with `--layers` layers in bf16 (weights drawn in
bf16 directly, so no fp32 copy inflates the peak) and runs what `analyze` runs per generation:
  hook   `generate(..., probe=StepProbe(hook=recorder.step_hook))` (the recorder is fed one layer's maps
         at a time, docs/method.md §10), then one sink-masking step (`SinkMasker`, clean protocol,
         K = 1: an un-ablated forward whose per-layer maps become key masks, then the masked forward);
  all    the earlier path: `generate(..., callback=recorder,
         probe=StepProbe(attentions=True, values=True))`, which holds every layer's `[B, H, S, S]` maps of a step at once.
Peak RSS growth over the built model (`/proc/self/clear_refs` reset, VmHWM − VmRSS, glibc mmap
threshold fixed as in bench_analysis.py) is the transient memory of the analysis; the weights are
reported separately. Comparing 1 and 2 layers shows whether the transient grows with depth.

Run: `.venv/bin/python benchmarks/bench_real_model_memory.py [--seq 512] [--batch 1]`.
Writes `benchmarks/results/bench_real_model_memory.json` and prints a table and the extrapolation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analysis import _status_kib  # noqa: E402  (one implementation of the /proc reader)

LLADA_8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, intermediate_size=12288,
                vocab_size=126464, mask_token_id=126336, tie_word_embeddings=False, max_position_embeddings=4096,
                rope_theta=500000.0, rms_norm_eps=1e-5, num_hidden_layers=32)
GIB = 1024**3


def build(layers: int, dtype: torch.dtype):
    from sinkdlm import DiffusionLM, ModelConfig

    torch.set_default_dtype(dtype)  # parameters are drawn in bf16 directly
    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig(**{**LLADA_8B, "num_hidden_layers": layers, "initializer_range": 0.02}))
    torch.set_default_dtype(torch.float32)
    return model.eval()


def child(args) -> None:
    from sinkdlm import generate
    from sinkdlm.diffusion.sampling import StepProbe
    from sinkdlm.analysis import SinkRecorder
    from sinkdlm.analysis.ablation import SinkMasker

    torch.set_num_threads(args.threads)
    model = build(args.layers, getattr(torch, args.dtype))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 126000, (args.batch, args.seq - args.gen_length), generator=gen)
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS (the built model)
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    rec = SinkRecorder(model.config)
    if args.mode == "hook":
        generate(model, prompt, gen_length=args.gen_length, steps=args.steps, probe=StepProbe(hook=rec.step_hook))
        masker = SinkMasker(model, 1)  # the ablation: maps of step t-1 -> per-layer key masks at step t
        generate(model, prompt, gen_length=args.gen_length, steps=2, probe=masker.probe)
    else:
        generate(model, prompt, gen_length=args.gen_length, steps=args.steps, callback=rec, probe=StepProbe(attentions=True, values=True))
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    print(json.dumps({"layers": args.layers, "mode": args.mode, "seq": args.seq, "batch": args.batch,
                      "weights_bytes": weights, "rss_before_bytes": before * 1024,
                      "transient_bytes": (peak - before) * 1024, "seconds": seconds}))


def run_child(args, layers: int, mode: str, batch: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--layers", str(layers), "--mode", mode, "--batch", str(batch)]
    for k in ("seq", "gen_length", "steps", "dtype", "threads"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def summarise(rows: list[dict]) -> dict:
    """Print the table and the 32-layer extrapolation: weights = embeddings + head + 32 x one layer
    (the 2-layer minus the 1-layer model); transient = the 1-layer transient + 31 x its growth per
    extra layer (2-layer minus 1-layer transient), per (path, batch)."""
    print("| path | batch | layers | weights (GiB) | transient peak (GiB) | seconds |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['batch']} | {r['layers']} | {r['weights_bytes'] / GIB:.2f} | "
              f"{r['transient_bytes'] / GIB:.3f} | {r['seconds']:.0f} |")
    by = {(r["mode"], r["batch"], r["layers"]): r for r in rows}
    any1, any2 = next(r for r in rows if r["layers"] == 1), next(r for r in rows if r["layers"] == 2)
    w_8b = any1["weights_bytes"] + 31 * (any2["weights_bytes"] - any1["weights_bytes"])
    estimates = {}
    for (mode, batch, layers), r in by.items():
        if layers == 1 and (mode, batch, 2) in by:
            grow = by[(mode, batch, 2)]["transient_bytes"] - r["transient_bytes"]
            est = w_8b + r["transient_bytes"] + 31 * max(grow, 0)
            estimates[f"{mode}/batch{batch}"] = {"transient_growth_per_layer_bytes": grow, "estimate_32_layers_bytes": est}
            print(f"{mode}, batch {batch}: transient +{grow / GIB:.3f} GiB per layer -> 32 layers: "
                  f"{est / GIB:.1f} GiB (weights {w_8b / GIB:.1f} GiB)")
    return {"rows": rows, "weights_32_layers_bytes": w_8b, "estimates": estimates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1, help="(child) prompts per generation")
    ap.add_argument("--batches", type=lambda t: [int(x) for x in t.split(",")], default=[1, 4],
                    help="batch sizes to measure (the first also runs the 'all' path)")
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--mode", default="hook", choices=("hook", "all"))
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    rows = [run_child(args, layers, mode, batch) for batch in args.batches for mode in ("hook", "all")
            for layers in (1, 2) if mode == "hook" or batch == args.batches[0]]
    result = summarise(rows)
    result["args"] = vars(args)
    out = Path(__file__).resolve().parent / "results" / "bench_real_model_memory.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
