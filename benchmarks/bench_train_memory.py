"""Peak memory and step time of a training step with `--activation-checkpointing` and `--compile`.

All variants run in one process on the same model, data and noise, built by the trainer's own
`sinkdlm.training.distributed.prepare_blocks`, and are reported as ratios to the plain step:
  * peak memory of one step (forward + backward + AdamW) from `torch.distributed._tools.mem_tracker.
    MemTracker`, which follows every tensor the step allocates (parameters, gradients, optimizer
    state, activations, temporaries), on CPU as on CUDA. Inductor allocates the buffers of a compiled
    block past the dispatcher, out of the tracker's sight: with `--compile` it counts only tensors
    that cross a block's boundary (on CUDA, `torch.cuda.max_memory_allocated` sees everything);
  * step time, median over N steps after warm-up (compilation excluded);
  * the loss of the first step, which must agree (recomputation and compilation change no maths).
Prints a markdown table; writes results/bench_train_memory.json.

    .venv/bin/python benchmarks/bench_train_memory.py [--steps 10] [--seq-len 256] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.training import TrainConfig
from sinkdlm.training.distributed import check_compile, prepare_blocks
from sinkdlm.training.trainer import build_optimizer, global_noise

VARIANTS = {
    "plain": dict(),
    "activation checkpointing": dict(activation_checkpointing=True),
    "compile (inductor)": dict(compile_backend="inductor"),
    "activation checkpointing + compile": dict(activation_checkpointing=True, compile_backend="inductor"),
}


def one_step(model, opt, tcfg, x0, step):
    t, u = global_noise(tcfg, step, x0.shape[0], x0.shape[1])
    loss = diffusion_loss(model, x0, MaskNoise(t=t.to(x0.device), u=u.to(x0.device))).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def peak_bytes(model, opt, tcfg, x0) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        one_step(model, opt, tcfg, x0, 0)
    snap = tracker.get_tracker_snapshot("peak")
    return int(sum(s["Total"] for s in snap.values()))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="small")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = ModelConfig.from_preset(args.preset, num_sink_tokens=1)
    tcfg = TrainConfig.resolve(batch_size=args.batch_size, seq_len=args.seq_len)
    x0 = torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    x0[x0 == cfg.mask_token_id] = 0
    x0 = x0.to(device)
    rows = []
    for name, opts in VARIANTS.items():
        backend = opts.get("compile_backend")
        if backend is not None:
            check_compile(backend, device)
        torch.manual_seed(0)
        model = DiffusionLM(cfg).to(device).train()
        prepare_blocks(model, opts.get("activation_checkpointing", False), backend)
        opt = build_optimizer(model, tcfg)
        first_loss = float(one_step(model, opt, tcfg, x0, 0))  # also compiles
        times = []
        for step in range(1, args.steps + 3):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            one_step(model, opt, tcfg, x0, step)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step > 2:
                times.append(time.perf_counter() - t0)
        # The memory step runs on the same (already compiled) model: every variant has taken the same
        # number of steps, so parameters, gradients and AdamW state are the same size in each.
        rows.append({"variant": name, "step_ms": 1e3 * statistics.median(times), "peak_mib": peak_bytes(model, opt, tcfg, x0) / 2**20,
                     "first_loss": first_loss})
        print(f"[bench] {name}: {rows[-1]['step_ms']:.0f} ms/step, peak {rows[-1]['peak_mib']:.0f} MiB", flush=True)
    base = rows[0]
    for r in rows:
        r["time_ratio"] = r["step_ms"] / base["step_ms"]
        r["memory_ratio"] = r["peak_mib"] / base["peak_mib"]
    print(f"{args.preset} preset + 1 sink, batch {args.batch_size} x seq {args.seq_len}, {args.device}, "
          f"{args.threads} threads, median of {args.steps} steps\n")
    print("| variant | step ms | time / plain | peak MiB | memory / plain | first loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['step_ms']:.0f} | {r['time_ratio']:.2f} | {r['peak_mib']:.0f} | "
              f"{r['memory_ratio']:.2f} | {r['first_loss']:.5f} |")
    out = Path(__file__).parent / "results" / "bench_train_memory.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
