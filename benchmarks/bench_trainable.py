"""Memory and step time of `--trainable all | lora | sink`, a memory formula, and its LLaDA-8B prediction.

Two models, each with one sink: the `tiny` preset, and the SmolLM2-135M DLM converted from the example GGUF
(`sinkdlm convert`, skipped with a note when the file is absent). For each mode the trainer's own pieces set up
the run (`training.trainable.apply_trainable`, `trainer.build_optimizer`) and one step is the trainer's step
(diffusion loss, backward, clip, AdamW), on CPU, fp32:
  * step time: median over `--steps` steps after one warm-up step, the three modes interleaved;
  * the memory of one step, after those (AdamW's state exists), measured on its tensors by kind: parameters,
    gradients, AdamW state, activations (what autograd saves for backward) — `step_memory`; MemTracker (as
    `bench_train_memory.py` uses it) cannot follow frozen parameters (it hooks every parameter's gradient) —
    and the growth of the resident set over the step, which adds temporaries and the allocator's slack.
The formula, in bytes (P parameters, T trainable, b bytes per weight, tokens = batch x seq_len, m masked):
    weights P b  +  gradients T b  +  AdamW moments 2 T b
    +  activations  rho_mode * tokens * layers * (8 d + 4 kv + 4 I) * b_act  +  4 m V (the loss's fp32 log-softmax)
with 8 d + 4 kv + 4 I the elements one block saves per token for backward (its two norms' inputs and outputs,
q/k/v and the rotated q/k, the attention output; the MLP's gate, up, SiLU and product). rho_mode is fitted per
mode on the tiny preset (a frozen projection saves no input for its weight's gradient, so `sink` keeps less)
and checked on SmolLM2 (formula / measured). The prediction for LLaDA-8B at bf16 (b = b_act = 2, AdamW
moments in the weights' dtype as torch keeps them, LoRA adapters and their moments fp32) takes the larger
fit of the two models per mode. Writes results/trainable.json and prints the tables of docs/benchmarks.md.
About 3 minutes on 2 CPU threads of a machine shared with other work.

    .venv/bin/python benchmarks/bench_trainable.py [--steps 2] [--threads 2]
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
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.training import TrainConfig
from sinkdlm.training.cpu import flush_denormals
from sinkdlm.training.trainable import apply_trainable
from sinkdlm.training.trainer import build_optimizer, global_noise

MODES = ("all", "lora", "sink")
GGUF = Path.home() / ".cache" / "sinkdlm" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# LLaDA-8B-Base (its config.json): d 4096, 32 heads (no GQA), MLP 12288, 32 layers, vocab 126464.
LLADA_8B = dict(hidden_size=4096, kv_dim=4096, intermediate_size=12288, layers=32, vocab=126464, params=8.02e9)
GPUS_GB = (24, 48, 80)


def one_step(model, opt, tcfg, x0, step):
    """The trainer's step: eq. 3-4 loss on the global noise of `step` (drawn on the CPU, moved to x0's device),
    backward, clip, AdamW."""
    t, u = global_noise(tcfg, step, x0.shape[0], x0.shape[1])
    noise = MaskNoise(t=t.to(x0.device), u=u.to(x0.device))
    loss = diffusion_loss(model, x0, noise, mask_id=model.config.mask_token_id).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def step_memory(model, opt, tcfg, x0) -> dict[str, int]:
    """Bytes of one step's tensors by kind, measured on the tensors themselves: parameters, gradients (after
    backward), AdamW state, activations (every tensor autograd saves for backward, by storage, parameters
    excluded; `torch.autograd.graph.saved_tensors_hooks`); and the growth of the process's resident set over
    the step (Linux: VmHWM reset through /proc/self/clear_refs), which adds temporaries and the allocator."""
    params = {id(p): p for p in model.parameters()}.values()
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_ptrs:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    rss_before = _rss("VmRSS")
    _reset_peak_rss()
    t, u = global_noise(tcfg, 99, x0.shape[0], x0.shape[1])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = diffusion_loss(model, x0, MaskNoise(t=t, u=u), mask_id=model.config.mask_token_id).loss
    loss.backward()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    peak_rss = _rss("VmHWM")
    state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
    return {"weights": sum(p.numel() * p.element_size() for p in params), "gradients": grads, "adam": state,
            "activations": sum(saved.values()), "rss_growth": max(0, peak_rss - rss_before)}


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux, or not allowed: the peak is then the process's since it began
        pass


def block_elements(c: ModelConfig) -> int:
    """Elements one block saves per token for backward (the formula's count, before rho)."""
    return 8 * c.hidden_size + 4 * c.num_key_value_heads * c.head_dim + 4 * c.intermediate_size


def measure(name: str, make_model, args, batch_size: int, seq_len: int) -> list[dict]:
    """The three modes on fresh copies of one model; their timed steps interleaved (a busy machine slows
    them alike), then each one's memory step."""
    runs = []
    for mode in MODES:
        model = make_model()
        tcfg = TrainConfig.resolve(batch_size=batch_size, seq_len=seq_len, trainable=mode,
                                   lora_rank=args.rank, lora_alpha=2.0 * args.rank, seed=0)
        apply_trainable(model, tcfg)
        runs.append((mode, model.train(), build_optimizer(model, tcfg), tcfg, []))
    c = runs[0][1].config
    x0 = torch.randint(0, c.vocab_size, (batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    x0[x0 == c.mask_token_id] = 0
    for step in range(args.steps + 1):
        for mode, model, opt, tcfg, times in runs:
            t0 = time.perf_counter()
            one_step(model, opt, tcfg, x0, step)
            if step >= 1:  # one warm-up step: AdamW's state allocated, caches warm
                times.append(time.perf_counter() - t0)
    rows = []
    for mode, model, opt, tcfg, times in runs:
        mem = step_memory(model, opt, tcfg, x0)
        mem["total"] = mem["weights"] + mem["gradients"] + mem["adam"] + mem["activations"]
        params = {id(p): p for p in model.parameters()}.values()  # a tied head counted once
        trainable = sum(p.numel() for p in params if p.requires_grad)
        total = sum(p.numel() for p in params)
        rows.append({"model": name, "mode": mode, "params": total, "trainable": trainable,
                     "step_s": statistics.median(times), "memory": mem, "layers": c.num_hidden_layers,
                     "batch_size": batch_size, "seq_len": seq_len, "tokens": batch_size * seq_len, "block_elements": block_elements(c)})
        print(f"[bench] {name} {mode}: {rows[-1]['step_s']:.3f} s/step, {mem['total'] / 2**20:.0f} MiB, "
              f"{trainable:,} of {total:,} parameters train", flush=True)
    del runs
    t, u = global_noise(TrainConfig.resolve(seed=0), 99, batch_size, seq_len)  # as step_memory draws them
    masked = int((u < t[:, None]).sum())  # the memory step's masked positions: the head's rows
    for r in rows:
        r["masked"], r["vocab"] = masked, c.vocab_size
    return rows


def head_bytes(masked: int, vocab: int) -> float:
    """The loss's log-softmax over the masked positions' logits, fp32 (what cross-entropy saves)."""
    return 4.0 * masked * vocab


def fit_rho(rows: list[dict]) -> dict[str, float]:
    """Per mode: measured activations less the head, over tokens x layers x the block count x 4 bytes."""
    return {r["mode"]: (r["memory"]["activations"] - head_bytes(r["masked"], r["vocab"]))
            / (r["tokens"] * r["layers"] * r["block_elements"] * 4) for r in rows}


def apply_formula(rows: list[dict], rho: dict[str, float]) -> None:
    for r in rows:
        weights, grads, adam = 4 * r["params"], 4 * r["trainable"], 8 * r["trainable"]
        acts = rho[r["mode"]] * r["tokens"] * r["layers"] * r["block_elements"] * 4 + head_bytes(r["masked"], r["vocab"])
        r["rho"] = rho[r["mode"]]
        r["formula"] = {"weights": weights, "gradients": grads, "adam": adam, "activations": acts,
                        "total": weights + grads + adam + acts}
        r["formula_over_measured"] = r["formula"]["total"] / r["memory"]["total"]


def llada_prediction(rho: dict[str, float], rank: int) -> list[dict]:
    """Formula for LLaDA-8B, weights and activations bf16 (2 bytes); AdamW moments in the parameter's dtype
    (bf16, as torch keeps them); LoRA adapters fp32 (peft keeps them so) with fp32 moments."""
    m = LLADA_8B
    d, kv, i, layers = m["hidden_size"], m["kv_dim"], m["intermediate_size"], m["layers"]
    lora = layers * rank * (2 * d + 2 * (d + kv) + 2 * d + 3 * (d + i))  # r (in + out): q, k, v, o; gate, up, down
    head = head_bytes(1, m["vocab"]) / 2  # about half the positions are masked (t ~ U(0, 1])
    fixed = {"all": m["params"] * (2 + 2 + 4), "lora": m["params"] * 2 + lora * (4 + 4 + 8),
             "sink": m["params"] * 2 + d * (2 + 2 + 4)}
    rows = []
    for mode in MODES:
        per_token = rho[mode] * layers * (8 * d + 4 * kv + 4 * i) * 2 + head
        row = {"mode": mode, "rho": rho[mode], "fixed_gb": fixed[mode] / 1e9, "act_gb_per_1k_tokens": per_token * 1024 / 1e9}
        for gb in GPUS_GB:  # the longest batch-1 sequence that fits, 10 % of the card kept for the allocator
            room = 0.9 * gb * 1e9 - fixed[mode]
            row[f"max_tokens_{gb}gb"] = max(0, int(room / per_token)) if room > 0 else 0
        rows.append(row)
    return rows


def render(result: dict) -> str:
    """The Markdown tables of docs/benchmarks.md from a results/trainable.json."""
    args, rows, mib = result["args"], result["rows"], 2**20
    lines = [f"CPU fp32, {args['threads']} threads, LoRA rank {args['rank']} on attn + mlp, median of {args['steps']} "
             f"steps, torch {result['torch']}; {result['seconds']:.0f} s in all (`benchmarks/bench_trainable.py`):", "",
             "| model | batch x seq | mode | trains | step s | step / all | weights MiB | grads MiB | AdamW MiB | "
             "activations MiB | sum MiB | formula MiB | formula / sum |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = next(b for b in rows if b["model"] == r["model"] and b["mode"] == "all")
        m = r["memory"]
        lines.append(
            f"| {r['model']} | {r['batch_size']} x {r['seq_len']} | {r['mode']} | {r['trainable'] / r['params']:.2%} | "
            f"{r['step_s']:.3f} | {r['step_s'] / base['step_s']:.2f} | {m['weights'] / mib:.1f} | "
            f"{m['gradients'] / mib:.1f} | {m['adam'] / mib:.1f} | {m['activations'] / mib:.1f} | {m['total'] / mib:.1f} | "
            f"{r['formula']['total'] / mib:.1f} | {r['formula_over_measured']:.3f} |")
    fits = {model: ", ".join(f"{k} {v:.2f}" for k, v in fit_rho([r for r in rows if r["model"] == model]).items())
            for model in dict.fromkeys(r["model"] for r in rows)}
    lines += ["", "rho (measured activations less the head, over the block count) per mode: "
              + "; ".join(f"{k}: {v}" for k, v in fits.items()) + ". The formula takes tiny's.", "",
              "LLaDA-8B at bf16, batch 1, no activation checkpointing (rho: the larger fit per mode):", "",
              "| mode | weights + grads + AdamW GB | activations GB per 1k tokens | "
              + " | ".join(f"longest sequence on {gb} GB" for gb in GPUS_GB) + " |",
              "|---|---:|---:|" + "---:|" * len(GPUS_GB)]
    for r in result["llada_8b_bf16"]:
        lines.append(f"| {r['mode']} | {r['fixed_gb']:.1f} | {r['act_gb_per_1k_tokens']:.2f} | "
                     + " | ".join(f"{r[f'max_tokens_{gb}gb']:,}" if r[f"max_tokens_{gb}gb"] else "does not fit"
                                  for gb in GPUS_GB) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2, help="timed steps, after one warm-up step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4, help="tiny; SmolLM2 takes --smol-batch-size")
    p.add_argument("--seq-len", type=int, default=128, help="tiny; SmolLM2 takes --smol-seq-len")
    p.add_argument("--smol-batch-size", type=int, default=1)
    p.add_argument("--smol-seq-len", type=int, default=64)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--render", action="store_true", help="print the tables of results/trainable.json, measure nothing")
    args = p.parse_args()
    out = Path(__file__).parent / "results" / "trainable.json"
    if args.render:
        print(render(json.loads(out.read_text())))
        return
    torch.set_num_threads(args.threads)
    flush_denormals()  # as the trainer does: denormals slow the CPU's attention backward 2x
    began = time.perf_counter()

    def tiny():
        torch.manual_seed(0)
        return DiffusionLM(ModelConfig.from_preset("tiny", num_sink_tokens=1))

    rows = measure("tiny", tiny, args, args.batch_size, args.seq_len)
    with tempfile.TemporaryDirectory() as tmp:
        if GGUF.is_file():
            from sinkdlm.model.hf import convert_hf_checkpoint

            convert_hf_checkpoint(GGUF, Path(tmp) / "smol", num_sink_tokens=1)
            rows += measure("SmolLM2-135M DLM", lambda: DiffusionLM.from_pretrained(Path(tmp) / "smol"), args,
                            args.smol_batch_size, args.smol_seq_len)
        else:
            print(f"[bench] {GGUF} is absent (make example-model): SmolLM2 rows skipped", flush=True)
    rho = fit_rho(rows[:3])  # fitted on tiny; the SmolLM2 rows check it
    apply_formula(rows, rho)
    if len(rows) > 3:  # the larger of the two models' fits, per mode, for the prediction
        rho = {k: max(v, fit_rho(rows[3:])[k]) for k, v in rho.items()}
    prediction = llada_prediction(rho, args.rank)

    seconds = time.perf_counter() - began
    print(f"[bench] {seconds:.0f} s")
    out.parent.mkdir(exist_ok=True)
    result = {"args": vars(args), "rows": rows, "rho": rho, "llada_8b_bf16": prediction, "seconds": seconds,
              "torch": torch.__version__}
    out.write_text(json.dumps(result, indent=2))
    print(render(result))


if __name__ == "__main__":
    main()
