"""Decoding speed at about 1B parameters on a GPU: tok/s and the fraction of the weight-read bound.

A batch-1 decoding step reads every weight once, so its floor is (weight bytes) / (memory bandwidth):
the weight-read bound. The bandwidth is measured here (a device-to-device copy), the step time of
every mode is timed with CUDA events, and the ratio bound / step is reported next to tok/s, for
batch 1 and 8, eager and compiled (`generate(compile=True)`: inductor, CUDA graphs), no cache,
prefix and dual (Fast-dLLM). Issue 44's setting: a 128-token prompt + 256 tokens in blocks of 32,
one token per step. The model is TinyLlama-1.1B's shape (LLaMA layout, 22 layers, d 2048, GQA
32/4) with one sink and random weights, in bf16 (speed does not depend on the weights). The compiled
rows give the first call's seconds (the compile warm-up) and how many tokens agree with the same cache
run eagerly (in bf16 inductor sums in another order, so near-ties may flip).

    python benchmarks/bench_gpu_decode.py [--out FILE]          # on a CUDA machine (benchmarks/gpu_suite.sh)
    python benchmarks/bench_gpu_decode.py --device cpu --preset tiny --gen-length 32 --block-length 16   # a smoke run

Writes results/bench_gpu_decode.json (or --out); docs/benchmarks.md's table is generated from it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig, generate

RESULTS = Path(__file__).parent / "results" / "bench_gpu_decode.json"
# TinyLlama-1.1B's shape (1.1B parameters with its 32k vocabulary)
SHAPE_1B = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                num_key_value_heads=4, intermediate_size=5632, max_position_embeddings=2048,
                tie_word_embeddings=False, rms_norm_eps=1e-5)
MODES = {"no cache": dict(), "prefix": dict(cache="prefix"), "dual": dict(cache="dual"),
         "dual, compiled": dict(cache="dual", compile=True), "prefix, compiled": dict(cache="prefix", compile=True)}


def bandwidth_gbs(device: torch.device) -> float:
    """Device memory bandwidth in GB/s, from the best of 5 copies of 1 GiB (bytes read + written)."""
    if device.type != "cuda":
        return None
    src = torch.empty(2**30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * src.numel() / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default=None, help="a ModelConfig preset instead of the 1.1B shape")
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--modes", default="no cache;prefix;dual;dual, compiled",
                    help="';'-separated, from: " + "; ".join(MODES))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu_decode.py: no CUDA GPU here (torch.cuda.is_available() is False); "
                         "pass --device cpu for a smoke run")
    modes = args.modes.split(";")
    cfg = (ModelConfig.from_preset(args.preset, num_sink_tokens=1) if args.preset
           else ModelConfig(**SHAPE_1B, num_sink_tokens=1))
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = DiffusionLM(cfg).eval().to(device, dtype)
    params = model.num_parameters()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gbs = bandwidth_gbs(device)
    bound_s = weight_bytes / (gbs * 1e9) if gbs else float("nan")  # one step reads every weight once
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    kw = dict(gen_length=args.gen_length, steps=args.gen_length, block_length=args.block_length, return_dict=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{where}: {params / 1e9:.2f} B parameters, {weight_bytes / 1e9:.2f} GB of weights, {gbs or float('nan'):.0f} GB/s "
          f"measured -> weight-read bound {1e3 * bound_s:.2f} ms per step\n")
    print("| batch | mode | ms / step | tok/s | of the weight-read bound | warm-up s | tokens agreeing with eager |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    rows = []
    result = dict(benchmark="bench_gpu_decode", device=where, torch=torch.__version__, dtype=str(dtype),
                  model=f"{'preset ' + args.preset if args.preset else 'TinyLlama-1.1B shape'} + 1 sink, random weights",
                  parameters=params, weight_bytes=weight_bytes, bandwidth_gbs=gbs,
                  bound_ms_per_step=1e3 * bound_s if gbs else None,
                  prompt_length=args.prompt_length, gen_length=args.gen_length, block_length=args.block_length,
                  repeats=args.repeats, rows=rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for batch in (int(b) for b in args.batches.split(",")):
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, cfg.mask_token_id, (batch, args.prompt_length), generator=g).to(device)
        eager = {}  # cache -> the eager tokens, which its compiled mode is compared with
        for name in modes:
            sync()
            t0 = time.perf_counter()
            out = generate(model, prompt, **kw, **MODES[name])  # warm-up: the sink cache, compiling
            sync()
            warm = time.perf_counter() - t0
            if "compiled" not in name:
                eager[MODES[name].get("cache")] = out.sequences
            times = []
            for _ in range(args.repeats):
                sync()
                t0 = time.perf_counter()
                out = generate(model, prompt, **kw, **MODES[name])
                sync()
                times.append(time.perf_counter() - t0)
            sec = min(times)
            step_s = sec / out.steps_taken
            agree, ref = None, eager.get(MODES[name].get("cache"))
            if ref is not None and "compiled" in name:  # bf16: inductor fuses in another order
                agree = int((out.sequences == ref)[:, args.prompt_length:].sum())
            row = dict(batch=batch, mode=name, seconds=sec, steps=out.steps_taken, ms_per_step=1e3 * step_s,
                       tokens_per_s=batch * args.gen_length / sec, fraction_of_bound=bound_s / step_s if gbs else None,
                       warmup_s=warm if "compiled" in name else None, compile_s=out.compile_seconds,
                       tokens_agreeing_with_eager=agree, tokens=batch * args.gen_length)
            rows.append(row)
            warm_cell = f"{warm:.0f}" if "compiled" in name else ""
            agree_cell = "" if agree is None else f"{agree} of {row['tokens']}"
            print(f"| {batch} | {name} | {row['ms_per_step']:.2f} | {row['tokens_per_s']:.0f} | "
                  f"{100 * (row['fraction_of_bound'] or float('nan')):.0f} % | {warm_cell} | {agree_cell} |")
            # after every row: a run cut short by a time limit (gpu_suite.sh) keeps what it measured
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
