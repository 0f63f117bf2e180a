"""What a GPU-scale study costs before it runs (`--dry-run` of `paper-0.5b`, `paper-1.5b`; docs/method.md §14).

GPU-hours of one run = training tokens x model FLOPs per token / (the GPU's bf16 peak x MFU), for pre-training
and SFT. The FLOPs per token are the benchmarks' (`bench_train.py`): 6 N for the forward and backward of the
N non-embedding parameters (the head counted when tied) plus 12 L d S for attention over S keys. The MFU is a
measured one: `benchmarks/results/bench_gpu_train.json` where a GPU run of this code committed it, else the
step-cost figures of an earlier H100 run of `bench_gpu_train.py` (0.5 B, eager 27 %, compiled 37 %), which the
line labels as not reproduced in a committed file. Nothing here trains; the model is built on the meta device.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sinkdlm.config import ModelConfig, TrainConfig

GPU_RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "bench_gpu_train.json"
H100_BF16_PEAK = 989.4e12  # FLOP/s, dense bf16, H100 SXM (NVIDIA's data sheet): the MFU denominator's card
# An earlier H100 run of bench_gpu_train.py (qwen2.5-0.5b, L = 1024, bf16) whose results file was not committed
EARLIER_MFU = {"eager": 0.27, "compiled": 0.37}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward): 6 N + 12 L d S, N without the input embedding."""
    import torch

    from sinkdlm.model.transformer import DiffusionLM

    with torch.device("meta"):  # the parameter count without allocating 0.5-1.5 B weights
        model = DiffusionLM(cfg)
    n_params = sum(p.numel() for n, p in model.named_parameters() if n != "embed_tokens.weight")
    if cfg.tie_word_embeddings:  # the head matmul still happens
        n_params += cfg.vocab_size * cfg.hidden_size
    keys = seq_len + cfg.num_sink_tokens
    return 6 * n_params + 12 * cfg.num_hidden_layers * cfg.hidden_size * keys


def measured_mfu(path: Path = GPU_RESULTS) -> tuple[dict[str, float], str]:
    """{"eager", "compiled"} MFU and where they come from: the committed GPU results file, else the earlier run."""
    try:
        rows = json.loads(path.read_text())["train"]
        eager = next(r["mfu"] for r in rows if r["variant"] == "vanilla")
        compiled = next((r["mfu"] for r in rows if "compile" in r["variant"]), eager)
        return {"eager": eager, "compiled": compiled}, f"measured by bench_gpu_train.py ({path.name})"
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return dict(EARLIER_MFU), "an earlier H100 run of bench_gpu_train.py, not reproduced in a committed results file"


def run_gpu_hours(model: ModelConfig, train: TrainConfig, sft: TrainConfig | None, mfu: float,
                  peak: float = H100_BF16_PEAK) -> float:
    """GPU-hours of one run: its pre-training and SFT tokens at `mfu` of `peak`."""
    flops = sum(t.max_steps * t.batch_size * t.seq_len * flops_per_token(model, t.seq_len)
                for t in (train, sft) if t is not None)
    return flops / (peak * mfu) / 3600


def study_cost(model_preset: str, train: TrainConfig, sft: TrainConfig | None, runs: int) -> dict[str, Any]:
    """GPU-hours per run and for the study's `runs`, eager and compiled (the + 1 sink arm's extra key is within
    rounding: one key in a thousand)."""
    model = ModelConfig.from_preset(model_preset)
    mfu, source = measured_mfu()
    per_run = {mode: run_gpu_hours(model, train, sft, m) for mode, m in mfu.items()}
    return {"model": model_preset, "tokens": train.max_steps * train.batch_size * train.seq_len,
            "flops_per_token": flops_per_token(model, train.seq_len), "mfu": mfu, "mfu_source": source,
            "per_run_h": per_run, "study_h": {mode: h * runs for mode, h in per_run.items()}, "runs": runs}


def cost_line(cost: dict[str, Any], mde: str) -> str:
    """The dry run's GPU line: per run and for the study, eager and compiled, the MFU's source, the MDE."""
    e, c = cost["per_run_h"]["eager"], cost["per_run_h"]["compiled"]
    return (f"GPU cost (H100 bf16, {cost['model']}, {cost['tokens'] / 1e9:.1f} B training tokens a run, "
            f"{cost['flops_per_token'] / 1e9:.2f} GFLOP/token): {e:,.0f} GPU-h per run eager, {c:,.0f} compiled "
            f"(--compile); the study's {cost['runs']} runs {cost['study_h']['eager']:,.0f} / "
            f"{cost['study_h']['compiled']:,.0f} GPU-h, at MFU {100 * cost['mfu']['eager']:.0f} % / "
            f"{100 * cost['mfu']['compiled']:.0f} % ({cost['mfu_source']}); minimum detectable effect: {mde}")
