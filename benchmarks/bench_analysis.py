"""What does the sink analysis cost? A recorded generation vs the same generation without recording.

Measured in this one process, same weights and prompts (CPU, fp32):
  plain      `generate(...)`: no callback, the fast sdpa attention;
  maps only  `generate(..., probe=StepProbe(attentions=True, values=True), callback=no-op)`: the price
             of materialising the attention maps (eager attention), without any statistics;
  recorded   `generate(..., callback=SinkRecorder(...))` with the maps and values: everything
             `sinkdlm analyze` computes per step.
Time ratio recorded / plain, target <= 2. The variants run round-robin (rotating order) after a
warm-up; medians and the median of per-round paired ratios are reported.

Memory, at `--steps` S1 vs S2 (default 32 vs 128) with the same gen_length:
  * bytes of tensors the recorder keeps at the end (`SinkRecorder.nbytes`);
  * peak RSS growth of the generation, each (variant, steps) in a fresh child process: the kernel's
    peak-RSS counter is reset just before the run (`/proc/self/clear_refs`, Linux), and VmHWM after
    it minus VmRSS before it is reported; flat in the step count means no per-step maps are kept.
    The children run with a fixed glibc mmap threshold (`MALLOC_MMAP_THRESHOLD_`): glibc otherwise
    raises the threshold after large frees and keeps freed tensors in its heap, so RSS would
    creep with the number of allocations (plain generation included) rather than with live data.
One thread by default: on a shared machine two threads oversubscribe and the times scatter 3x.

Run: `.venv/bin/python benchmarks/bench_analysis.py [--repeats N] [--batch B] [--gen-length G]`.
Writes `benchmarks/results/bench_analysis.json` and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig, generate
from sinkdlm.diffusion.sampling import StepProbe
from sinkdlm.analysis import SinkRecorder
from sinkdlm.config import AnalyzeConfig

RESULTS = Path(__file__).parent / "results" / "bench_analysis.json"


def build(args) -> DiffusionLM:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, intermediate_size=args.intermediate,
        max_position_embeddings=args.prompt_length + args.gen_length + 8, num_sink_tokens=args.sinks,
        initializer_range=0.05,
    )
    return DiffusionLM(cfg).eval()


def prompts(args) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, args.vocab - 1, (args.batch, args.prompt_length), generator=gen)


def run_variant(model, ids, args, variant: str, steps: int) -> tuple[float, SinkRecorder | None]:
    recorder = None
    kw = {}
    if variant == "maps":
        kw = dict(probe=StepProbe(attentions=True, values=True), callback=lambda state: None)
    elif variant == "recorded":
        recorder = SinkRecorder(model.config, AnalyzeConfig(epsilon=3.0))
        kw = dict(probe=StepProbe(attentions=True, values=True), callback=recorder)
    t0 = time.perf_counter()
    generate(model, ids, gen_length=args.gen_length, steps=steps, **kw)
    seconds = time.perf_counter() - t0
    if recorder is not None:
        recorder.summary()  # the end-of-run reduction is part of the cost
        seconds = time.perf_counter() - t0
    return seconds, recorder


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def child(args) -> None:
    """One (variant, steps) generation in a fresh process: print the peak-RSS growth in bytes."""
    torch.set_num_threads(args.threads)
    model, ids = build(args), prompts(args)
    with torch.no_grad():  # imports, allocator and kernels warm, without running a generation
        model(ids[:1, :8])
    try:  # reset the peak RSS (VmHWM) to the current RSS, so the imports' peak does not hide ours
        Path("/proc/self/clear_refs").write_text("5")
        before, how = _status_kib("VmRSS"), "VmHWM after - VmRSS before (peak reset)"
    except OSError:
        before, how = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss delta (no reset)"
    _, rec = run_variant(model, ids, args, args.child_variant, args.child_steps)
    after = _status_kib("VmHWM") if how.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rss_growth_bytes": (after - before) * 1024, "method": how,
                      "recorder_bytes": rec.nbytes() if rec else 0}))


def peak_rss(args, variant: str, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--child-variant", variant, "--child-steps", str(steps)]
    for k in ("batch", "prompt_length", "gen_length", "hidden", "layers", "heads", "kv_heads", "intermediate",
              "vocab", "sinks", "threads"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}  # see the module docstring
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--gen-length", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--sinks", type=int, default=1)
    ap.add_argument("--steps", type=int, nargs=2, default=(32, 128), help="the two step counts of the memory test")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--child-variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-steps", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_variant:
        return child(args)
    torch.set_num_threads(args.threads)
    model, ids = build(args), prompts(args)
    s1, s2 = args.steps

    # ---- time, at the first step count (the ratio does not depend on it: all costs are per step)
    names = ["plain", "maps", "recorded"]
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.warmup + args.repeats):
        order = names[r % 3:] + names[: r % 3]
        for name in order:
            seconds, _ = run_variant(model, ids, args, name, s1)
            if r >= args.warmup:
                times[name].append(seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))  # noqa: E731

    # ---- memory: recorder bytes in process; peak RSS growth in fresh children
    rec_bytes = {steps: run_variant(model, ids, args, "recorded", steps)[1].nbytes() for steps in (s1, s2)}
    rss = {(v, steps): peak_rss(args, v, steps) for v in ("plain", "recorded") for steps in (s1, s2)}

    cfg = model.config
    seq = args.prompt_length + args.gen_length + args.sinks
    maps_bytes = cfg.num_hidden_layers * args.batch * cfg.num_attention_heads * seq * seq * 4
    shapes = (f"B={args.batch}, prompt {args.prompt_length} + gen {args.gen_length} tokens + {args.sinks} sink "
              f"(S={seq}), d={args.hidden}, layers={args.layers}, heads={args.heads}, kv_heads={args.kv_heads}, "
              f"vocab={args.vocab}, fp32, {args.threads} threads, "
              f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params")
    print(f"\nSink analysis of a generation ({shapes}); {s1} steps, median of {args.repeats} runs.\n")
    print("| variant | median s | min s | max s | / plain (paired) |")
    print("|---|---:|---:|---:|---:|")
    labels = {"plain": "generate, no recording (sdpa)", "maps": "generate + maps/values, no-op callback (eager)",
              "recorded": "generate + SinkRecorder (full analysis)"}
    for k in names:
        print(f"| {labels[k]} | {med[k]:.3f} | {min(times[k]):.3f} | {max(times[k]):.3f} | {paired(k, 'plain'):.2f} |")
    print(f"\nrecorded / plain = {paired('recorded', 'plain'):.2f} (target <= 2); "
          f"recorder alone (recorded / maps) = {paired('recorded', 'maps'):.2f}\n")
    print(f"| memory | {s1} steps | {s2} steps | growth |")
    print("|---|---:|---:|---:|")
    mb = lambda x: f"{x / 2**20:.2f} MiB"  # noqa: E731
    print(f"| bytes kept by the recorder | {mb(rec_bytes[s1])} | {mb(rec_bytes[s2])} | "
          f"{mb(rec_bytes[s2] - rec_bytes[s1])} |")
    for v in ("plain", "recorded"):
        a, b = rss[(v, s1)]["rss_growth_bytes"], rss[(v, s2)]["rss_growth_bytes"]
        print(f"| peak RSS growth, {v} (fresh process) | {mb(a)} | {mb(b)} | {mb(b - a)} |")
    print(f"\npeak RSS measured as: {rss[('plain', s1)]['method']}, fixed glibc mmap threshold")
    print(f"\n(one step's attention maps, all layers, fp32: {mb(maps_bytes)}; "
          f"kept for {s2} steps they would be {mb(maps_bytes * s2)})")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "bench_analysis",
        "description": shapes,
        "shapes": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(args).items()
                   if k not in ("out", "child_variant", "child_steps")},
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "machine": platform.machine(), "threads": torch.get_num_threads()},
        "median_seconds": med, "runs_seconds": times,
        "ratios": {"recorded_over_plain": paired("recorded", "plain"), "maps_over_plain": paired("maps", "plain"),
                   "recorded_over_maps": paired("recorded", "maps"), "target": "recorded_over_plain <= 2"},
        "memory": {"recorder_bytes": {str(k): v for k, v in rec_bytes.items()},
                   "peak_rss_growth_bytes": {f"{v}@{s}": r["rss_growth_bytes"] for (v, s), r in rss.items()},
                   "one_step_maps_bytes": maps_bytes},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
