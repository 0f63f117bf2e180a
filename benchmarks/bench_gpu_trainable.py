"""One training step of a random-initialised LLaDA-8B layout with `--trainable lora` and `--trainable sink` (issue 52).

The layout is LLaDA-8B-Base's (d 4096, 32 heads without GQA, MLP 12288, 32 layers, vocab 126464) plus one sink
token, weights in bf16, drawn at random on the device (no checkpoint is read: the memory and the speed of a step
do not depend on the values). For each mode, a fresh model gets the trainer's own set-up
(`training.trainable.apply_trainable`, `trainer.build_optimizer`), one warm-up step (AdamW's state allocated),
then `--steps` timed steps of the trainer's step (eq. 3-4 loss, backward, clip, AdamW). Recorded per mode: the
peak memory the CUDA allocator handed out (`torch.cuda.max_memory_allocated`), tokens/s, and the memory
formula's prediction at the same token count (`bench_trainable.llada_prediction`, its rho fitted on CPU and kept
in results/trainable.json), so the formula is checked on the card.

    .venv/bin/python benchmarks/bench_gpu_trainable.py [--seq-len 2048] [--steps 3]    # a CUDA GPU, ~2 min
    .venv/bin/python benchmarks/bench_gpu_trainable.py --layout tiny --device cpu       # the CPU proxy (tests)

Writes --out (default results/gpu_trainable.json). Without a CUDA GPU the LLaDA-8B layout is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trainable import LLADA_8B, llada_prediction, one_step  # noqa: E402  (the formula and the step, one home)

from sinkdlm import DiffusionLM, ModelConfig  # noqa: E402
from sinkdlm.training import TrainConfig  # noqa: E402
from sinkdlm.training.trainable import apply_trainable  # noqa: E402
from sinkdlm.training.trainer import build_optimizer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("lora", "sink")


def layout(name: str) -> ModelConfig:
    """LLaDA-8B-Base's shapes (its config.json) with one front sink; `tiny` for the CPU proxy."""
    if name == "tiny":
        return ModelConfig.from_preset("tiny", num_sink_tokens=1, mask_token_id=2047)
    m = LLADA_8B
    return ModelConfig(vocab_size=m["vocab"], hidden_size=m["hidden_size"], num_hidden_layers=m["layers"],
                       num_attention_heads=32, num_key_value_heads=32, intermediate_size=m["intermediate_size"],
                       max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False,
                       num_sink_tokens=1, mask_token_id=126336)


def measure(config: ModelConfig, mode: str, args, device: torch.device) -> dict:
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, args.dtype))  # drawn in bf16 on the card: no 32 GB fp32 copy first
    try:
        with torch.device(device):
            model = DiffusionLM(config)
    finally:
        torch.set_default_dtype(previous)
    tcfg = TrainConfig.resolve(batch_size=args.batch_size, seq_len=args.seq_len, trainable=mode, lora_rank=args.rank,
                               lora_alpha=2.0 * args.rank, seed=0)
    apply_trainable(model, tcfg)
    model.train()
    opt = build_optimizer(model, tcfg)
    x0 = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len),
                       generator=torch.Generator().manual_seed(0)).to(device)
    x0[x0 == config.mask_token_id] = 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    losses = [float(one_step(model, opt, tcfg, x0, 0))]  # warm-up: AdamW's state allocated, kernels chosen
    times = []
    for k in range(1, args.steps + 1):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        losses.append(float(one_step(model, opt, tcfg, x0, k)))  # float() synchronises
        times.append(time.perf_counter() - t0)
    params = {id(p): p for p in model.parameters()}.values()
    row = {"mode": mode, "params": sum(p.numel() for p in params),
           "trainable": sum(p.numel() for p in params if p.requires_grad),
           "tokens": args.batch_size * args.seq_len, "step_s": sorted(times)[len(times) // 2],
           "losses": losses, "peak_gb": torch.cuda.max_memory_allocated(device) / 1e9 if cuda else None}
    row["tokens_per_s"] = row["tokens"] / row["step_s"]
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", choices=("llada-8b", "tiny"), default="llada-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3, help="timed steps, after one warm-up step")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--out", type=Path, default=RESULTS / "gpu_trainable.json")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu_trainable.py: no CUDA GPU here; the LLaDA-8B layout needs one "
                 "(--layout tiny --device cpu runs the CPU proxy)")
    if args.layout == "llada-8b" and device.type != "cuda":
        sys.exit("bench_gpu_trainable.py: the LLaDA-8B layout (16 GB of bf16 weights) is measured on a CUDA GPU only; "
                 "use --layout tiny for a CPU run")
    config = layout(args.layout)
    rows = [measure(config, mode, args, device) for mode in MODES]
    fitted = json.loads((RESULTS / "trainable.json").read_text()) if (RESULTS / "trainable.json").is_file() else None
    if args.layout == "llada-8b" and fitted is not None:  # the CPU-fitted formula at this token count
        predicted = {r["mode"]: r for r in llada_prediction(fitted["rho"], args.rank)}
        for r in rows:
            pr = predicted[r["mode"]]
            r["predicted_gb"] = pr["fixed_gb"] + pr["act_gb_per_1k_tokens"] * r["tokens"] / 1024
            r["measured_over_predicted"] = r["peak_gb"] / r["predicted_gb"]
    result = {"layout": args.layout, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": args.dtype, "batch_size": args.batch_size, "seq_len": args.seq_len, "rank": args.rank,
              "torch": torch.__version__, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for r in rows:
        print(f"[bench] {args.layout} {r['mode']}: {r['step_s']:.3f} s/step, {r['tokens_per_s']:,.0f} tokens/s, "
              f"{r['trainable']:,} of {r['params']:,} parameters train"
              + (f", peak {r['peak_gb']:.1f} GB (formula {r.get('predicted_gb', float('nan')):.1f} GB)" if r["peak_gb"] else ""),
              flush=True)


if __name__ == "__main__":
    main()
