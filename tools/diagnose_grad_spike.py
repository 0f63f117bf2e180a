"""Where the converted vanilla DLM's gradient spikes come from (issue 30 item 3): massive activations.

For each of `--sequences` training rows of Shakespeare in SmolLM2's tokenizer, on the converted models
before training (vanilla, + 1 front sink; `shift_logits`, as the `real` preset trains them), one masked
draw per row (t and masks from seed 0, the same for both models):
  * the gradient norm of that row's diffusion loss over every parameter (what clipping sees);
  * the residual stream's massive activations at layer `--layer`: the largest row norm among the content
    tokens divided by their median (content tokens only: the extra sink is reported on its own).
Prints a table and writes JSON (Spearman correlation of the two over rows, per model, with its p).

    .venv/bin/python tools/diagnose_grad_spike.py --init-from runs/real/converted --out docs/results/smollm2/grad_spike.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from scipy import stats as st

from sinkdlm.checkpoint.manager import load_model_and_tokenizer
from sinkdlm.data import load_documents
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.io.atomic import atomic_write_json


def measure(ckpt: Path, x0: torch.Tensor, layer: int) -> list[dict]:
    model, _ = load_model_and_tokenizer(str(ckpt))
    model.config.shift_logits = True
    model.train()
    n_sink = model.config.num_sink_tokens
    rows = []
    for i in range(len(x0)):
        seen: dict[str, torch.Tensor] = {}

        def hook(_m, _i, out):  # content rows: the pass over the sequence (the sink pass has n_sink rows)
            h = out[0].detach()
            seen["content" if h.shape[1] >= x0.shape[1] else "sink"] = h

        handle = model.layers[layer].register_forward_hook(hook)
        model.zero_grad(set_to_none=True)
        with model.sink_cache_mode(False):
            loss = diffusion_loss(model, x0[i: i + 1], MaskNoise(generator=torch.Generator().manual_seed(i))).loss
        loss.backward()
        handle.remove()
        grad = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
        h = seen["content"][0]
        if h.shape[0] > x0.shape[1]:  # the sink rows ran inside this pass
            h = h[n_sink:] if model.config.sink_position == "front" else h[: x0.shape[1]]
        norms = h.norm(dim=-1)
        row = {"grad_norm": float(grad), "loss": float(loss), "massive_ratio": float(norms.max() / norms.median()),
               "median_norm": float(norms.median())}
        if n_sink:
            s = seen.get("sink")
            s = s[0] if s is not None else seen["content"][0][:n_sink]
            row["sink_norm"] = float(s.norm(dim=-1).max())
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--init-from", required=True, help="directory holding the converted checkpoints vanilla/ and sink1-front/")
    p.add_argument("--out", required=True)
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--layer", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    base = Path(args.init_from)
    _, tok = load_model_and_tokenizer(str(base / "vanilla"))
    text = "\n".join(load_documents("shakespeare", "train")[:60])
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids[0]
    x0 = ids[: args.sequences * 128].view(args.sequences, 128)
    result = {"sequences": args.sequences, "seq_len": 128, "layer": args.layer, "models": {}}
    for name in ("vanilla", "sink1-front"):
        rows = measure(base / name, x0, args.layer)
        rho, p_rho = st.spearmanr([r["grad_norm"] for r in rows], [r["massive_ratio"] for r in rows])
        summary = {"rows": rows, "spearman_grad_vs_massive": float(rho), "spearman_p": float(p_rho),
                   "median_grad_norm": statistics.median(r["grad_norm"] for r in rows),
                   "max_grad_norm": max(r["grad_norm"] for r in rows),
                   "median_massive_ratio": statistics.median(r["massive_ratio"] for r in rows)}
        result["models"][name] = summary
        print(f"{name}: grad norm median {summary['median_grad_norm']:.1f} max {summary['max_grad_norm']:.1f}; "
              f"massive ratio (layer {args.layer}) median {summary['median_massive_ratio']:.1f}; "
              f"Spearman(grad, massive) {rho:+.2f} (p {p_rho:.3g})"
              + (f"; sink row norm {statistics.median(r['sink_norm'] for r in rows):.0f}" if "sink_norm" in rows[0] else ""),
              flush=True)
    atomic_write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
