"""How do the two sink-masking protocols differ on a trained model?

At step t the masker hides the top-K sinks of step t-1, found either on the model's un-ablated
attention at step t-1's input ("clean", the default) or on the maps the masked model itself produced
at t-1 ("ablated", the earlier behaviour). For K in {1, 5, 10} and each protocol, on held-out
Shakespeare prompts (greedy, one token per step), this reports:
  remask rate   share of the keys masked at step t that are masked again at step t+1 (the dominant
                sinks persist across steps, so a protocol that tracks them should re-mask them);
  agreement     share of generated tokens equal to the unablated (K = 0) generation (lower = the
                ablation changes the output more);
  masked / head keys hidden per (step, row, layer, head).

Run: `.venv/bin/python benchmarks/bench_ablation_protocols.py --checkpoint DIR [--prompts 8]`.
Writes `benchmarks/results/bench_ablation_protocols.json` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from sinkdlm.analysis.ablation import PROTOCOLS, SinkMasker
from sinkdlm.data import encode_texts, load_documents
from sinkdlm.diffusion.sampling import StepProbe, generate
from sinkdlm.analysis import prompts_from_documents
from sinkdlm.experiment.presets import ANALYSIS_PROMPT_TOKENS
from sinkdlm.checkpoint.manager import load_model_and_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a trained sinkdlm model directory")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gen-length", type=int, default=32)
    ap.add_argument("--ks", default="1,5,10")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_ablation_protocols.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(args.checkpoint)
    model.eval()
    # the experiment's analysis prompts: seeded token windows of held-out text (docs/method.md §6)
    texts = prompts_from_documents(load_documents("shakespeare", "validation"), tok, args.prompts, ANALYSIS_PROMPT_TOKENS)
    prompts = encode_texts(tok, texts)
    g = args.gen_length
    base = generate(model, prompts, gen_length=g, steps=g, block_length=g)[:, -g:]
    rows = []
    for k in [int(x) for x in args.ks.split(",")]:
        for protocol in PROTOCOLS:
            masker = SinkMasker(model, k, protocol=protocol)
            hidden = []

            def key_masks_fn(step, prev, masker=masker, hidden=hidden):
                masks = masker(step, prev)
                if masks is not None:
                    hidden.append(torch.stack([~m for m in masks]))  # [L, B, H, S]
                return masks

            t0 = time.perf_counter()
            out = generate(model, prompts, gen_length=g, steps=g, block_length=g,
                           probe=StepProbe(key_masks=key_masks_fn, attentions=protocol == "ablated"))[:, -g:]
            seconds = time.perf_counter() - t0
            again = sum(int((a & b).sum()) for a, b in zip(hidden, hidden[1:]))
            total = sum(int(a.sum()) for a in hidden[:-1])
            rows.append({
                "k": k, "protocol": protocol, "remask_rate": again / total if total else None,
                "agreement_with_unablated": float((out == base).float().mean()),
                "masked_keys_per_head": masker.masked_keys / masker.head_slots if masker.head_slots else 0.0,
                "seconds": seconds,
            })
            print(rows[-1], flush=True)
    result = {"checkpoint": args.checkpoint, "prompts": len(prompts), "gen_length": g, "rows": rows,
              "machine": platform.platform(), "torch": torch.__version__}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| K | protocol | re-mask rate t→t+1 | token agreement with K = 0 | masked keys / head |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        rm = "–" if r["remask_rate"] is None else f"{r['remask_rate']:.2f}"
        print(f"| {r['k']} | {r['protocol']} | {rm} | {r['agreement_with_unablated']:.2f} | {r['masked_keys_per_head']:.2f} |")


if __name__ == "__main__":
    main()
