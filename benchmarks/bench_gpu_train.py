"""GPU training speed of the `qwen2.5-0.5b` preset at L = 1024 in bf16: MFU and three ratios.

Needs a CUDA GPU and refuses clearly without one (the CPU benchmarks are bench_train.py and
bench_train_memory.py). Everything is measured in this one process, timed with CUDA events after
a warm-up, medians of N runs:
  * the GPU's own bf16 matmul rate (a square 8192^3 GEMM): the MFU denominator;
  * our full training step (bf16 autocast over fp32 master weights, as `sinkdlm train --bf16`:
    forward, backward, clipping, AdamW) with 1 sink, plain / `--activation-checkpointing` /
    `--compile`: tokens/s, MFU (model FLOPs as bench_train.py: 6 N tokens + attention), peak memory;
  * forward + backward ratios on the same weights and inputs (bench_model.py's protocol, on the GPU):
    1 sink / vanilla; 1 sink / a joined sequence with a boolean eq. 6 mask in SDPA; `transformers`
    Qwen2ForCausalLM (sdpa, run bidirectionally) / our vanilla model; sink_logit and softmax_one / vanilla.
Writes results/bench_gpu_train.json and prints markdown tables.

    .venv/bin/python benchmarks/bench_gpu_train.py [--batch 8] [--seq-len 1024] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from bench_model import reference_joined_forward  # noqa: E402
from bench_train import model_flops_per_step  # noqa: E402

from sinkdlm import DiffusionLM, ModelConfig  # noqa: E402
from sinkdlm.diffusion.loss import diffusion_loss  # noqa: E402
from sinkdlm.diffusion.noise import MaskNoise  # noqa: E402
from sinkdlm.training import TrainConfig  # noqa: E402
from sinkdlm.training.distributed import check_compile, prepare_blocks  # noqa: E402
from sinkdlm.training.trainer import build_optimizer, global_noise  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "bench_gpu_train.json"


def cuda_time(fn, warmup: int, repeats: int) -> list[float]:
    """Seconds per call, by CUDA events (no host timing of asynchronous work)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def bf16_matmul_rate(n: int = 8192, repeats: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / statistics.median(cuda_time(lambda: a @ b, 5, repeats))


def hf_twin(cfg: ModelConfig):
    """`transformers` Qwen2ForCausalLM with the same shapes, run bidirectionally (no mask, SDPA)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_cfg = Qwen2Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
        attn_implementation="sdpa",
    )
    hf = Qwen2ForCausalLM(hf_cfg)
    hf.config.is_causal = False  # as bench_model.py: no mask tensor, is_causal=False in SDPA
    for layer in hf.model.layers:
        layer.self_attn.is_causal = False
    return hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="skip the --compile row (no Triton)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench_gpu_train.py measures CUDA training and needs a CUDA GPU, but torch.cuda.is_available() is "
            "False here; run it on a machine with one (the CPU benchmarks are bench_train.py and bench_train_memory.py)"
        )
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    peak = bf16_matmul_rate()
    base = ModelConfig.from_preset(args.preset)
    b, l = args.batch, args.seq_len
    gen = torch.Generator().manual_seed(0)
    ids_host = torch.randint(0, base.mask_token_id, (b, l), generator=gen)
    ids = ids_host.to(device)
    targets = torch.randint(0, base.vocab_size, (b, l), generator=gen).to(device)
    tcfg = TrainConfig.resolve(batch_size=b, seq_len=l, bf16=True)
    t, u = global_noise(tcfg, 0, b, l)  # on the host, as the trainer draws them: the loss plans there
    tokens = b * l

    # ---- our full training step, three ways
    train_rows = []
    variants = {"plain": (False, None), "activation checkpointing": (True, None)}
    if not args.no_compile:
        check_compile("inductor", device)
        variants["compile (inductor)"] = (False, "inductor")
    cfg1 = base.replace(num_sink_tokens=1)
    flops = model_flops_per_step(cfg1, tokens, l)
    for name, (ac, backend) in variants.items():
        torch.manual_seed(0)
        model = DiffusionLM(cfg1).to(device).train()
        prepare_blocks(model, ac, backend)
        opt = build_optimizer(model, tcfg)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = diffusion_loss(model, ids_host, MaskNoise(t=t, u=u)).loss  # host batch: no host sync in the step
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        torch.cuda.reset_peak_memory_stats()
        s = statistics.median(cuda_time(step, args.warmup, args.repeats))
        train_rows.append({"variant": name, "step_ms": 1e3 * s, "tokens_per_s": tokens / s, "mfu": flops / s / peak,
                           "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
        del model, opt
        torch.cuda.empty_cache()

    # ---- forward + backward ratios on shared weights (bench_model.py's protocol)
    hf = hf_twin(base).to(device).train()
    sd = {k.removeprefix("model."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    vanilla = DiffusionLM(base).to(device).train()
    vanilla.load_state_dict(sd, strict=False)
    sink = DiffusionLM(cfg1).to(device).train()
    sink.load_state_dict(sd, strict=False)
    column = {}
    for switch in ("sink_logit", "softmax_one"):
        column[switch] = DiffusionLM(base.replace(**{switch: True})).to(device).train()
        column[switch].load_state_dict(sd, strict=False)

    def fwd_bwd(model, forward):
        def run():
            for p in model.parameters():
                p.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = forward(ids)
            F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).backward()
        return run

    timed = {
        "vanilla": fwd_bwd(vanilla, lambda x: vanilla(x).logits),
        "sink1": fwd_bwd(sink, lambda x: sink(x).logits),
        "sink1_joined_eq6_mask": fwd_bwd(sink, lambda x: reference_joined_forward(sink, x)),
        "hf_qwen2_sdpa_bidirectional": fwd_bwd(hf, lambda x: hf(input_ids=x).logits),
        "sink_logit": fwd_bwd(column["sink_logit"], lambda x: column["sink_logit"](x).logits),
        "softmax_one": fwd_bwd(column["softmax_one"], lambda x: column["softmax_one"](x).logits),
    }
    runs = {k: [] for k in timed}
    for r in range(args.repeats):  # round-robin, rotating order
        names = list(timed)
        for name in names[r % len(names):] + names[: r % len(names)]:
            runs[name] += cuda_time(timed[name], 1 if r == 0 else 0, 1)
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratios = {
        "1 sink / vanilla": med["sink1"] / med["vanilla"],
        "1 sink / joined sequence with a boolean eq. 6 mask": med["sink1"] / med["sink1_joined_eq6_mask"],
        "transformers Qwen2 (sdpa, bidirectional) / our vanilla": med["hf_qwen2_sdpa_bidirectional"] / med["vanilla"],
        "sink_logit / vanilla": med["sink_logit"] / med["vanilla"],
        "softmax_one / vanilla": med["softmax_one"] / med["vanilla"],
    }

    print(f"{torch.cuda.get_device_name()}: bf16 matmul rate {peak / 1e12:.0f} TFLOP/s (8192^3 GEMM)")
    print(f"{args.preset} + 1 sink, batch {b} x L {l}, bf16 autocast, median of {args.repeats}\n")
    print("| training step | step ms | tokens/s | MFU | peak GiB |")
    print("|---|---:|---:|---:|---:|")
    for r in train_rows:
        print(f"| {r['variant']} | {r['step_ms']:.0f} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f} % | {r['peak_gib']:.1f} |")
    print("\n| forward + backward ratio | value |\n|---|---:|")
    for k, v in ratios.items():
        print(f"| {k} | {v:.3f} |")
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps({
        "device": torch.cuda.get_device_name(), "bf16_matmul_tflops": peak / 1e12,
        "args": {k: str(v) for k, v in vars(args).items()}, "train": train_rows,
        "fwd_bwd_ms": {k: 1e3 * v for k, v in med.items()}, "ratios": ratios,
    }, indent=2))


if __name__ == "__main__":
    main()
