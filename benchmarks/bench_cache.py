"""KV caches (issue 11): a 448-token prompt, 64 generated tokens in blocks of 16, one token per step.

Every variant is timed in one process, interleaved, against `generate(cache=None)`:
  * `cache=None` with the LM head on every column (a callback forces that; the pre-issue-11 cost)
    vs the head on the block's masked columns only;
  * `cache="prefix"` and `cache="dual"` (Fast-dLLM), each must be >= 2x faster than no cache;
  * each cache with threshold 0.9;
  * each cache with its cached steps through `torch.compile` (`generate(compile=True)`: inductor, CUDA
    graphs on a GPU): in fp32 on a CPU it must give the eager cache's tokens, bit for bit (asserted);
    in bf16 inductor sums in another order, so near-ties may flip and the tokens agreeing with the
    eager cache are reported instead. The warm-up call's seconds (compiling included) are a column.
The model is the `tiny` preset with one sink and random weights (speed does not depend on them), so
the share of tokens that differ from `cache=None` is reported but says nothing about quality: see
`bench_decoding.py` for accuracy on a trained model. Raw numbers: benchmarks/results/bench_cache.json.

    .venv/bin/python benchmarks/bench_cache.py [--repeats 3] [--threads 1]
    .venv/bin/python benchmarks/bench_cache.py --device cuda --preset qwen2.5-0.5b --dtype bfloat16   # on a GPU
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig, generate
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.machine import cpu_name

PROMPT, GEN, BLOCK = 448, 64, 16
OUT = Path(__file__).resolve().parent / "results" / "bench_cache.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (then times are synchronised CUDA wall times)")
    ap.add_argument("--preset", default="tiny", help="model size, e.g. qwen2.5-0.5b on a GPU")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--no-compile", action="store_true", help="leave out the compiled cached steps")
    ap.add_argument("--out", type=Path, help="default: results/bench_cache.json on CPU, bench_cache_gpu.json on CUDA")
    args = ap.parse_args()
    device = torch.device(args.device)
    out_path = args.out or (OUT if device.type == "cpu" else OUT.with_name("bench_cache_gpu.json"))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig.from_preset(args.preset, num_sink_tokens=1, initializer_range=0.5)).eval()
    model = model.to(device, getattr(torch, args.dtype))
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.mask_token_id, (args.batch, PROMPT), generator=g).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run(cache=None, threshold=None, full_head=False, compile=False):
        out = generate(model, prompt, gen_length=GEN, steps=None if threshold else GEN, block_length=BLOCK,
                       threshold=threshold, cache=cache, compile=compile,
                       callback=(lambda s: None) if full_head else None, return_dict=True)
        return out.sequences, out.steps_taken

    variants = {
        "no cache, head on all columns": dict(full_head=True),
        "no cache": {},
        "prefix": dict(cache="prefix"),
        "dual": dict(cache="dual"),
        "prefix + threshold 0.9": dict(cache="prefix", threshold=0.9),
        "dual + threshold 0.9": dict(cache="dual", threshold=0.9),
    }
    if not args.no_compile:  # the cached steps through torch.compile (inductor; CUDA graphs on a GPU)
        variants |= {"prefix, compiled": dict(cache="prefix", compile=True),
                     "dual, compiled": dict(cache="dual", compile=True)}
    outs, steps, warmup = {}, {}, {}
    for name, kw in variants.items():  # warm-up: builds the sink cache, compiles (one graph per generation)
        sync()
        t0 = time.perf_counter()
        outs[name], steps[name] = run(**kw)
        sync()
        warmup[name] = time.perf_counter() - t0
    exact = device.type == "cpu" and args.dtype == "float32"  # where bitwise equality holds
    agree = {}  # compiled variant -> generated tokens equal to the same cache's eager ones
    for c in ("prefix", "dual"):
        if f"{c}, compiled" in outs:
            same = outs[c][:, PROMPT:] == outs[f"{c}, compiled"][:, PROMPT:]
            agree[f"{c}, compiled"] = int(same.sum())
            assert not exact or bool(same.all()), f"the compiled {c} cache changed tokens (fp32, CPU)"
    if exact:
        assert torch.equal(outs["no cache"], outs["no cache, head on all columns"]), "the block head changed tokens"
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, kw in variants.items():
            sync()
            t0 = time.perf_counter()
            run(**kw)
            sync()
            times[name].append(time.perf_counter() - t0)
    base = min(times["no cache"])
    rows = {}
    where = (f"CPU, {args.threads} thread(s)" if device.type == "cpu" else torch.cuda.get_device_name(device))
    print(f"prompt {PROMPT}, gen {GEN}, block {BLOCK}, batch {args.batch}, {args.preset} preset + 1 sink (random), "
          f"{args.dtype}, {where}, best of {args.repeats}\n")
    print("| variant | forwards | seconds | tokens/s | speed-up vs no cache | tokens differing from no cache | "
          "warm-up s | tokens agreeing with eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in variants:
        sec = min(times[name])
        differ = int((outs[name] != outs["no cache"]).sum())
        rows[name] = dict(seconds=sec, all_seconds=times[name], forwards=steps[name],
                          tokens_per_s=GEN * args.batch / sec, speedup=base / sec, tokens_differing=differ,
                          warmup_seconds=warmup[name], tokens_agreeing_with_eager=agree.get(name))
        agreeing = f"{agree[name]} of {GEN * args.batch}" if name in agree else ""
        print(f"| {name} | {steps[name]} | {sec:.3f} | {GEN * args.batch / sec:.1f} | {base / sec:.2f}x | {differ} | "
              f"{warmup[name]:.1f} | {agreeing} |")
    for c in ("prefix", "dual"):
        ok = rows[c]["speedup"] >= 2.0
        print(f"- {c}: {rows[c]['speedup']:.2f}x vs no cache ({'meets' if ok else 'MISSES'} the 2x target)")
    atomic_write_json(out_path, dict(
        prompt_length=PROMPT, gen_length=GEN, block_length=BLOCK, batch=args.batch, threads=args.threads,
        repeats=args.repeats, model=f"{args.preset} preset, 1 sink, random weights (initializer_range 0.5), {args.dtype}",
        device=(f"CPU ({cpu_name()})" if device.type == "cpu"
                else torch.cuda.get_device_name(device)), torch=torch.__version__, variants=rows,
    ))
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
