"""Training throughput and model-FLOPs utilisation (MFU) of the tiny preset on this machine.

Everything is measured in one process:
  * the machine's own fp32 matmul rate (a square GEMM, the best a training step could hope for);
  * a training step of the `tiny` preset (forward + backward + AdamW), median over N steps;
  * the data-loading part of a step (batch gather from the memory-mapped cache + noise draw).
MFU = model FLOPs per step / step time / matmul rate, with model FLOPs = 6 * N_params * tokens
(embedding lookups excluded, the tied head included) + the attention matmuls 12 * layers * d * S
per token (PaLM appendix B accounting). Prints a markdown table; writes results/bench_train.json.

    .venv/bin/python benchmarks/bench_train.py [--steps 20] [--seq-len 256] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.data import PackedTokens, batch_for_step, pack_corpus, train_bpe_tokenizer, load_documents
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.training import TrainConfig
from sinkdlm.experiment.gpu_cost import flops_per_token
from sinkdlm.training.trainer import build_optimizer, global_noise


def matmul_rate(n: int = 1024, repeats: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def model_flops_per_step(cfg: ModelConfig, tokens: int, seq_len: int) -> float:
    """Training FLOPs of one step of `tokens` tokens (the library's count, experiment/gpu_cost.py)."""
    return tokens * flops_per_token(cfg, seq_len)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        docs = load_documents("shakespeare", "train")
        tok = train_bpe_tokenizer(docs[:6], 2048)
        path = pack_corpus("shakespeare", tok, args.seq_len, "train", cache_dir=tmp, max_tokens=args.seq_len * args.batch_size * 64)
        data = PackedTokens(path)
        peak = matmul_rate()  # measured again after the steps; the higher is the machine's rate
        for sinks in (0, 1):
            cfg = ModelConfig.from_preset("tiny", mask_token_id=tok.mask_token_id, num_sink_tokens=sinks)
            model = DiffusionLM(cfg).train()
            tcfg = TrainConfig.resolve(batch_size=args.batch_size, seq_len=args.seq_len)
            opt = build_optimizer(model, tcfg)
            step_times, data_times = [], []
            for step in range(args.steps + 3):
                t0 = time.perf_counter()
                x0 = data.get_batch(batch_for_step(step, len(data), args.batch_size, 0))
                t, u = global_noise(tcfg, step, args.batch_size, args.seq_len)
                t1 = time.perf_counter()
                loss = diffusion_loss(model, x0, MaskNoise(t=t, u=u)).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                t2 = time.perf_counter()
                if step >= 3:  # warm-up excluded
                    step_times.append(t2 - t0)
                    data_times.append(t1 - t0)
            step_s = statistics.median(step_times)
            tokens = args.batch_size * args.seq_len
            flops = model_flops_per_step(cfg, tokens, args.seq_len)
            rows.append({
                "model": f"tiny, {sinks} sink", "tokens_per_s": tokens / step_s, "step_ms": 1e3 * step_s,
                "model_tflops_per_s": flops / step_s / 1e12, "mfu": flops / step_s / peak,
                "data_share": statistics.median(data_times) / step_s,
            })
    peak = max(peak, matmul_rate())
    for r in rows:  # MFU against the better of the two matmul measurements
        r["mfu"] = r["model_tflops_per_s"] * 1e12 / peak
    print(f"machine fp32 matmul rate (1024^3 GEMM, {args.threads} threads): {peak / 1e9:.1f} GFLOP/s")
    print(f"batch {args.batch_size} x seq {args.seq_len}, median of {args.steps} steps\n")
    print("| model | tokens/s | step ms | MFU | data loading share of step |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['tokens_per_s']:.0f} | {r['step_ms']:.1f} | {100 * r['mfu']:.1f} % | {100 * r['data_share']:.2f} % |")
    out = Path(__file__).parent / "results" / "bench_train.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"matmul_gflops": peak / 1e9, "args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
