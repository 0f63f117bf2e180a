"""`--quantize` speed and memory (issue 66): torchao's int8 schemes against float32, each ratio in one process.

1. The MLP: sinkdlm's SwiGLU block at 2048 -> 8192 -> 2048 (gate/up/down, 3 matmuls), at 1 and 128 tokens,
   eager and under `torch.compile` (inductor, against compiled float32), compiled once more with inductor's
   `freezing` (torchao's CPU recipe for W8A8): fp32 time / quantized time (above 1: the quantized one is faster),
   medians of interleaved repeats.
2. Decoding: `generate` (batch 1, a 64-token prompt, 64 tokens in blocks of 16, one token per step, the dual
   cache) on the `tiny` preset + 1 sink and, when the example model is cached (`make example-model`), on
   SmolLM2-135M-Instruct converted to a DLM + 1 sink (random sink row: speed does not depend on it): generated
   tokens per second (interleaved repeats in this process), the weights' bytes (torchao's int8 data and scales
   counted), and the peak resident memory while decoding, read in one child process per scheme (VmHWM after
   `clear_refs`, so loading and converting the model do not count); and the float32 model with
   `--kv-cache-dtype int8`, with both caches' bytes at this length (keys, values, scales, the sink's columns).
int4-weight has no torchao kernel on a CPU: its one-line refusal is recorded instead. Run it with
OMP_NUM_THREADS=1 on a shared machine (the default: --threads 1). Raw numbers: results/bench_quant.json; another
machine's, `--out results/bench_quant_NAME.json` (docs/benchmarks.md shows its MLP table beside the first: whether the
CPU has int8 dot-product instructions, `int8_flags`, changes W8A8's speed most).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_quant.py [--repeats 5] [--no-real] [--no-compile]
        [--mlp-only | --real-only]   # one part again, into the results file
        [--out benchmarks/results/bench_quant_NAME.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig, generate
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.machine import cpu_name, int8_flags
from sinkdlm.model.kv_int8 import cache_bytes
from sinkdlm.model.quantize import check_quantize, quantize_model, torchao_config, torchao_version

OUT = Path(__file__).resolve().parent / "results" / "bench_quant.json"
SCHEMES = ("int8-weight", "int8-dynamic")
PROMPT, GEN, BLOCK = 64, 64, 16
D, FF = 2048, 8192


def _median_seconds(fns: dict, repeats: int) -> dict:
    """{name: median wall seconds of fn()} over `repeats` rounds, the names interleaved in every round."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


@torch.no_grad()
def bench_mlp(repeats: int, compile: bool) -> list[dict]:
    from sinkdlm.model.transformer import MLP

    configs = {scheme: torchao_config(scheme, D) for scheme in SCHEMES}  # int8 ignores the width; imports torchao
    from torchao.quantization import quantize_

    torch.manual_seed(0)
    base = MLP(ModelConfig(hidden_size=D, intermediate_size=FF)).eval()
    models = {"fp32": base}
    for scheme in SCHEMES:
        models[scheme] = copy.deepcopy(base)
        quantize_(models[scheme], configs[scheme])
    rows = []
    import torch._inductor.config as inductor_config

    for mode in ("eager", "compiled", "compiled, freezing") if compile else ("eager",):
        # "freezing": inductor folds the (quantized) weights into the graph as constants, torchao's CPU recipe for
        # W8A8 (its int8 matmul then lowers to oneDNN's); the fp32 baseline is compiled with the same setting
        torch._dynamo.reset()
        run = models if mode == "eager" else {k: torch.compile(m) for k, m in models.items()}
        for tokens in (1, 128):
            x = torch.randn(1, tokens, D)
            with torch.no_grad(), inductor_config.patch(freezing=mode.endswith("freezing")):
                for fn in run.values():  # warm-up (compiles)
                    fn(x)
                t = _median_seconds({k: (lambda f=f: f(x)) for k, f in run.items()}, repeats)
            for scheme in SCHEMES:
                rows.append({"mode": mode, "tokens": tokens, "scheme": scheme, "fp32_seconds": t["fp32"],
                             "seconds": t[scheme], "ratio": t["fp32"] / t[scheme]})
                print(f"MLP {mode} {tokens:>3} tokens {scheme}: fp32 / quantized = {t['fp32'] / t[scheme]:.2f}",
                      flush=True)
    return rows


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the parameters hold (a torchao tensor: its int8 data and scales), a tied tensor counted once."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        parts = [getattr(p, n) for n in getattr(p, "tensor_data_names", ())] or [p.data]
        total += sum(t.numel() * t.element_size() for t in parts)
    return total


def _prompt(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.mask_token_id, (1, PROMPT), generator=g)


def _decode(model, prompt, compile: bool = False, kv_cache_dtype: str | None = None):
    return generate(model, prompt, gen_length=GEN, steps=GEN, block_length=BLOCK, cache="dual", compile=compile,
                    kv_cache_dtype=kv_cache_dtype)


def _child(model_dir: str, scheme: str) -> None:
    """Load, quantize, then decode once with the peak reset: prints {"peak_decode_mib", "resident_before_mib"}."""
    def status(key: str) -> float:
        return int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024

    torch.set_num_threads(1)
    model = DiffusionLM.from_pretrained(model_dir).eval()
    quantize_model(model, None if scheme == "fp32" else scheme)
    prompt = _prompt(model)
    import gc

    gc.collect()
    before = status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on
    _decode(model, prompt)
    print(json.dumps({"peak_decode_mib": status("VmHWM"), "resident_before_mib": before}))


def bench_decode(name: str, model: DiffusionLM, repeats: int, compile: bool, schemes=SCHEMES) -> dict:
    models = {"fp32": model}
    for scheme in schemes:
        models[scheme] = quantize_model(copy.deepcopy(model), scheme)
    prompt = _prompt(model)
    runs = {k: (lambda m=m: _decode(m, prompt)) for k, m in models.items()}
    runs["fp32, int8 KV cache"] = lambda: _decode(model, prompt, kv_cache_dtype="int8")
    if compile:
        runs |= {f"{k}, compiled": (lambda m=models[k]: _decode(m, prompt, compile=True)) for k in ("fp32", "int8-dynamic")}
    tokens = {k: fn() for k, fn in runs.items()}  # warm-up: the sink cache, the compiled step
    t = _median_seconds(runs, repeats)
    variants = {}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for k, fn in runs.items():
            scheme = k.split(",")[0]
            v = {"seconds": t[k], "tokens_per_second": GEN / t[k], "speedup": t["fp32"] / t[k],
                 "weight_bytes": weight_bytes(models[scheme]),
                 "tokens_equal_fp32": int((tokens[k] == tokens["fp32"]).sum()) - PROMPT}
            if "," not in k:  # one child per scheme (the KV cache and compiled runs share its weights)
                child = subprocess.run([sys.executable, __file__, "--child", tmp, scheme], capture_output=True,
                                       text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                v |= json.loads(child.stdout.strip().splitlines()[-1])
            variants[k] = v
            print(f"decode {name} {k}: {v['tokens_per_second']:.1f} tok/s ({v['speedup']:.2f}x), weights "
                  f"{v['weight_bytes'] / 2**20:.1f} MiB, peak {v.get('peak_decode_mib', float('nan')):.0f} MiB", flush=True)
    length = PROMPT + GEN
    kv = {dtype or "fp32": cache_bytes(model.allocate_cache(1, length, kv_cache_dtype=dtype)) for dtype in (None, "int8")}
    print(f"KV cache {name}, {length} columns: fp32 {kv['fp32'] / 2**20:.2f} MiB, int8 {kv['int8'] / 2**20:.2f} MiB",
          flush=True)
    return {"model": name, "parameters": model.num_parameters(), "variants": variants, "kv_cache_bytes": kv}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-real", action="store_true", help="leave out the SmolLM2 DLM")
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    ap.add_argument("--real-only", action="store_true", help="measure the SmolLM2 DLM only, into the results file")
    ap.add_argument("--mlp-only", action="store_true", help="measure the MLP only, into the results file")
    ap.add_argument("--out", type=Path, default=OUT,
                    help="the results file (another machine's: results/bench_quant_NAME.json, shown beside this one)")
    ap.add_argument("--child", nargs=2, metavar=("MODEL_DIR", "SCHEME"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(*args.child)
    torch.set_num_threads(args.threads)
    out = args.out
    if args.mlp_only:
        result = json.loads(out.read_text())
        result.update(torch=torch.__version__, torchao=torchao_version(), cpu=cpu_name(), int8_flags=int8_flags(),
                      threads=args.threads, repeats=args.repeats)
        result["mlp"] = {"shape": [D, FF, D], "rows": bench_mlp(args.repeats, not args.no_compile)}
        atomic_write_json(out, result)
        return print(f"wrote {out}")
    if args.real_only:
        result = json.loads(out.read_text())
        result["decode"] = [d for d in result["decode"] if not d["model"].startswith("SmolLM2")] + [_real(args.repeats)]
        atomic_write_json(out, result)
        return print(f"wrote {out}")
    try:
        check_quantize("int4-weight", torch.device("cpu"))
        int4 = None
    except ValueError as e:
        int4 = str(e)
    result = {"torch": torch.__version__, "torchao": torchao_version(), "cpu": cpu_name(), "int8_flags": int8_flags(),
              "threads": args.threads,
              "repeats": args.repeats, "int4_refusal": int4, "mlp": {"shape": [D, FF, D], "rows": []}, "decode": [],
              "decode_setting": {"prompt": PROMPT, "gen_length": GEN, "block_length": BLOCK, "cache": "dual",
                                 "batch": 1}}
    result["mlp"]["rows"] = bench_mlp(args.repeats, not args.no_compile)
    torch.manual_seed(0)
    tiny = DiffusionLM(ModelConfig.from_preset("tiny", num_sink_tokens=1)).eval()
    result["decode"].append(bench_decode("tiny + 1 sink", tiny, args.repeats, not args.no_compile))
    atomic_write_json(out, result)  # kept if the real model's part is stopped; --real-only adds it later
    from sinkdlm.checkpoint.example_model import example_model_path

    if not args.no_real and example_model_path().is_file():
        result["decode"].append(_real(args.repeats))
        atomic_write_json(out, result)
    print(f"wrote {out}")


def _real(repeats: int) -> dict:
    """The SmolLM2 DLM + 1 sink, eager, float32 against int8-weight (W8A8's eager int8 matmul takes minutes a
    generation on a CPU: see the MLP rows), fewer repeats (about 10 s a generation at one thread)."""
    from sinkdlm.checkpoint.example_model import example_model_path
    from sinkdlm.model.hf import convert_hf_model

    smol, _ = convert_hf_model(example_model_path(), num_sink_tokens=1)
    return bench_decode("SmolLM2-135M-Instruct DLM + 1 sink", smol.eval(), max(2, repeats // 2), False,
                        schemes=("int8-weight",))


if __name__ == "__main__":
    main()
