"""The training step on the real shape: SmolLM2-135M converted to a DLM (+ 1 sink) vs transformers.

One process, one batch (`--batch-size` x `--seq-len` of Shakespeare in SmolLM2's tokenizer), fp32,
forward + backward (no optimizer step, so both sides do the same work):
  * `transformers`: `LlamaForCausalLM` loaded from the same GGUF, bidirectional (an explicit 4-D
    all-visible mask, sdpa), its own loss over every position (full LM head) — what a user of
    transformers would run to train the same function;
  * `sinkdlm (head on masked)`: `diffusion_loss` on the converted DLM (+ 1 sink token), the LM head
    only at the masked positions (t ~ U(eps, 1): half the positions on average);
  * `sinkdlm (full head)`: the same step with the head on every position (the previous code path),
    to isolate the gain of the masked-only head.
The three are timed round-robin (`--repeats` rounds, median), so load on the machine hits each
alike. Prints a markdown table; writes results/bench_real_train.json.

    .venv/bin/python benchmarks/bench_real_train.py [--repeats 7] [--batch-size 4] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.checkpoint.example_model import fetch_example_model
from sinkdlm.model.hf import convert_hf_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = fetch_example_model()

    from transformers import LlamaForCausalLM

    from sinkdlm.data import load_documents

    dlm, tok = convert_hf_model(path, num_sink_tokens=1)
    dlm.train()
    hf = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                          attn_implementation="sdpa").train()
    text = "\n".join(load_documents("shakespeare", "train")[:3])
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    b, l = args.batch_size, args.seq_len
    x0 = ids[: b * l].view(b, l)
    full_mask = torch.zeros(b, 1, l, l)  # 4-D additive mask, all visible: bidirectional sdpa

    def ours(masked_head: bool):
        g = torch.Generator().manual_seed(0)
        if masked_head:
            loss = diffusion_loss(dlm, x0, MaskNoise(generator=g)).loss
        else:  # the previous path: head on every position, CE read at the masked ones
            from sinkdlm.diffusion.noise import forward_mask, sample_t

            t = sample_t(b, 1e-3, False, generator=g)
            xt, masked = forward_mask(x0, t, dlm.config.mask_token_id, torch.ones_like(x0, dtype=torch.bool), generator=g)
            logits = dlm(xt).logits
            ce = F.cross_entropy(logits.flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
            loss = ((ce * masked).sum(-1) / t / l).mean()
        loss.backward()
        dlm.zero_grad(set_to_none=True)

    def theirs():
        out = hf(input_ids=x0, attention_mask=full_mask, labels=x0)
        out.loss.backward()
        hf.zero_grad(set_to_none=True)

    cases = {"transformers LlamaForCausalLM (bidirectional sdpa)": theirs,
             "sinkdlm + 1 sink, head on masked positions": lambda: ours(True),
             "sinkdlm + 1 sink, head on every position": lambda: ours(False)}
    for fn in cases.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for r in range(args.repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{v[-1]:.2f}s" for v in times.values()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["transformers LlamaForCausalLM (bidirectional sdpa)"]
    masked_name, full_name = "sinkdlm + 1 sink, head on masked positions", "sinkdlm + 1 sink, head on every position"
    result = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to fp32)", "batch": [b, l], "threads": args.threads,
        "repeats": args.repeats, "median_s": med, "speedup_vs_transformers": {k: base / v for k, v in med.items()},
        "masked_head_gain": med[full_name] / med[masked_name],
    }
    print("\n| step (fwd + bwd, fp32) | median s | speed-up vs transformers |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {base / v:.2f}x |")
    print(f"\nhead on masked positions only: {result['masked_head_gain']:.2f}x faster than the full head")
    out = Path(__file__).parent / "results" / "bench_real_train.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
