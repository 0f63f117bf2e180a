"""CPU training speed with and without flushing denormals to zero (training/cpu.py), in one process.

A trained DLM's attention is peaked (sinks): many attention probabilities fall below float32's smallest
normal (1.2e-38), and the CPU's flash-attention backward slows down on such denormals. This benchmark
builds that state on purpose: the `tiny` preset with its query and key projections scaled by `--scale`
(attention logits scaled by its square), measures forward + backward of the diffusion loss at batch
8 x 128 with 2 intra-op threads, once with denormals kept and once flushed, and reports the ratio.
Each measurement runs in its own fresh thread, which sets the mode before its first op: a setting changed
after a thread's first parallel op was measured to gain nothing (training/cpu.py), so one thread per
setting gives both settings in one process.
Also reported: the fraction of the softmax probabilities that are denormal, and whether the loss and
gradients differ between the two settings (they should not).

    .venv/bin/python benchmarks/bench_denormal.py [--scale 1 6] [--steps 12]

Writes benchmarks/results/bench_denormal.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise

RESULTS = Path(__file__).parent / "results" / "bench_denormal.json"


def peaked_model(scale: float) -> DiffusionLM:
    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig.from_preset("tiny", mask_token_id=2, num_sink_tokens=1)).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(scale)
    return model


def denormal_share(model: DiffusionLM, x0: torch.Tensor) -> float:
    """The share of attention probabilities in the denormal range, from the first layer's queries and keys."""
    tiny = torch.finfo(torch.float32).tiny
    with torch.no_grad():
        h = model.layers[0].input_layernorm(model.embed_tokens(x0))
        attn = model.layers[0].self_attn
        q, k = attn.q_proj(h), attn.k_proj(h)
        d = model.config.hidden_size // model.config.num_attention_heads
        q = q.view(*q.shape[:2], -1, d)[:, :, :1].transpose(1, 2)  # the first head
        k = k.view(*k.shape[:2], -1, d)[:, :, :1].transpose(1, 2)
        p = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, dim=-1)
    return float(((p > 0) & (p < tiny)).float().mean())


def timed(model: DiffusionLM, flush: bool, steps: int, out: dict) -> None:
    torch.set_flush_denormal(flush)  # this thread, and the OpenMP pool it creates next
    gen = torch.Generator().manual_seed(0)
    times, grads = [], None
    for step in range(steps + 2):
        x0 = torch.randint(3, model.config.vocab_size, (8, 128), generator=gen)
        noise = MaskNoise(t=torch.full((8,), 0.5), u=torch.rand(8, 128, generator=gen))
        t0 = time.perf_counter()
        loss = diffusion_loss(model, x0, noise).loss
        loss.backward()
        times.append(time.perf_counter() - t0)
        if step == 0:
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            out["loss"] = loss.item()
        model.zero_grad(set_to_none=True)
    out["ms"] = 1e3 * statistics.median(times[2:])
    out["grads"] = grads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, nargs="+", default=[1.0, 20.0, 30.0, 70.0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for scale in args.scale:
        model = peaked_model(scale)
        share = denormal_share(model, torch.randint(3, model.config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0)))
        res = {}
        for flush in (False, True):
            res[flush] = {}
            th = threading.Thread(target=timed, args=(model, flush, args.steps, res[flush]))
            th.start()
            th.join()
        same = res[False]["loss"] == res[True]["loss"] and all(torch.equal(a, b) for a, b in zip(res[False]["grads"], res[True]["grads"]))
        rows.append({"qk_scale": scale, "denormal_attention_share": share, "ms_kept": res[False]["ms"],
                     "ms_flushed": res[True]["ms"], "speedup": res[False]["ms"] / res[True]["ms"],
                     "loss_and_grads_identical": same})
    print(f"tiny preset + 1 sink, batch 8 x 128, forward + backward, {args.threads} threads, median of {args.steps}\n")
    print("| q/k scale | denormal share of attention probabilities (layer 0, head 0) | denormals kept (ms) | flushed (ms) | speed-up | loss and gradients identical |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['qk_scale']:g} | {100 * r['denormal_attention_share']:.1f} % | {r['ms_kept']:.1f} | {r['ms_flushed']:.1f} | "
              f"{r['speedup']:.2f}x | {'yes' if r['loss_and_grads_identical'] else 'no'} |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"args": vars(args), "torch": torch.__version__, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
