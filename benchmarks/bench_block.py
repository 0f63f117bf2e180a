"""Block diffusion's speed (issue 65 part 7): a block model's decoding and training step against a whole-sequence DLM's.

Everything is timed in one process, the variants interleaved, best of `--repeats` (after one warm-up call each):
  * decoding: the same random weights opened as a block model (`block_size = --block`, docs/method.md §13) and as a
    whole-sequence DLM; a `--prompt`-token prompt and `--gen` new tokens, one token per step (`--gen` steps), the
    whole-sequence model in blocks of the same size (`block_length`). The block model decodes block by block with
    its exact cache of the finished blocks (`diffusion/block_sampling.py`); the whole-sequence model without a cache
    and with the dual cache (Fast-dLLM). Tokens/s of each, and the block model's speed-up over both;
  * training: one step (forward + backward + AdamW) of BD3-LM's loss (`block_diffusion_loss`: the x_t ⊕ x_0 pass,
    2L positions under the block-diffusion mask) and of the whole-sequence loss (`diffusion_loss`: L positions),
    on batches of `--batch` × `--seq-len` tokens: seconds per token of each and their ratio, what the 2L attention
    pass costs a block model per token trained.
Random weights (speed does not depend on them), so the tokens decoded say nothing about quality. Writes its JSON
after each part (a run cut by a time limit keeps what it measured): benchmarks/results/bench_block.json (CPU) or
bench_block_gpu.json (CUDA); docs/benchmarks.md's tables are generated from them (tools/readme_results.py).

    .venv/bin/python benchmarks/bench_block.py [--repeats 3] [--threads 1]
    .venv/bin/python benchmarks/bench_block.py --device cuda --preset qwen2.5-0.5b --dtype bfloat16   # on a GPU
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig, generate
from sinkdlm.diffusion.block import block_diffusion_loss
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.machine import cpu_name

OUT = Path(__file__).resolve().parent / "results" / "bench_block.json"
DECODERS = ("block model, its cache", "whole sequence, no cache", "whole sequence, dual cache")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (then times are synchronised CUDA wall times)")
    ap.add_argument("--preset", default="tiny", help="model size, e.g. qwen2.5-0.5b on a GPU")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    ap.add_argument("--gen", type=int, default=64, help="new tokens, one per step")
    ap.add_argument("--block", type=int, default=16, help="the block model's block_size; the whole-sequence block_length")
    ap.add_argument("--seq-len", type=int, default=256, help="training sequence length L")
    ap.add_argument("--batch", type=int, default=8, help="training batch")
    ap.add_argument("--out", type=Path, help="default: results/bench_block.json on CPU, bench_block_gpu.json on CUDA")
    return ap.parse_args(argv)


def best_of(fns: dict, repeats: int, sync) -> tuple[dict, dict]:
    """{name: result of the warm-up call}, {name: [seconds]} with the calls interleaved, `repeats` rounds."""
    first, times = {}, {name: [] for name in fns}
    for name, fn in fns.items():
        first[name] = fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return first, times


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    out_path = args.out or (OUT if device.type == "cpu" else OUT.with_name("bench_block_gpu.json"))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    block_cfg = ModelConfig.from_preset(args.preset, block_size=args.block, initializer_range=0.5)
    block = DiffusionLM(block_cfg).eval().to(device, dtype)
    with torch.device("meta"):  # the same weights, not a second random draw (0.5B on a GPU): only the attention's reach differs
        whole = DiffusionLM(block_cfg.replace(block_size=None))
    whole = whole.to_empty(device=device).to(dtype).eval()
    whole.load_state_dict(block.state_dict())
    if block_cfg.tie_word_embeddings:  # to_empty gave the tied head a tensor of its own
        whole.lm_head.weight = whole.embed_tokens.weight
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, block_cfg.mask_token_id, (1, args.prompt), generator=g).to(device)
    where = f"CPU ({cpu_name()}), {args.threads} thread(s)" if device.type == "cpu" else torch.cuda.get_device_name(device)
    record = dict(preset=args.preset, dtype=args.dtype, device=where, torch=torch.__version__, repeats=args.repeats,
                  threads=args.threads, block_size=args.block, model=f"{args.preset} preset, random weights, {args.dtype}",
                  load_average=dict(start=os.getloadavg()))  # a shared machine: how busy it was (the ratios are in-process)

    # ---- decoding: the same number of new tokens, one per step
    def decode(model, **kw):
        out = generate(model, prompt, gen_length=args.gen, steps=args.gen, return_dict=True, **kw)
        return out.steps_taken

    fns = {DECODERS[0]: lambda: decode(block),
           DECODERS[1]: lambda: decode(whole, block_length=args.block, cache=None),
           DECODERS[2]: lambda: decode(whole, block_length=args.block, cache="dual")}
    forwards, times = best_of(fns, args.repeats, sync)
    rows = {name: dict(seconds=min(times[name]), all_seconds=times[name], forwards=forwards[name],
                       tokens_per_s=args.gen / min(times[name])) for name in fns}
    for name in fns:
        rows[name]["block_speedup"] = rows[name]["seconds"] / rows[DECODERS[0]]["seconds"]
    record["decoding"] = dict(prompt_length=args.prompt, gen_length=args.gen, steps=args.gen, rows=rows)
    atomic_write_json(out_path, record)
    print(f"{args.prompt}-token prompt, {args.gen} new tokens one per step, blocks of {args.block}; {record['model']}, "
          f"{where}, best of {args.repeats}\n")
    print("| decoding | forwards | seconds | tokens/s | block model's speed-up over it |\n|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['forwards']} | {r['seconds']:.3f} | {r['tokens_per_s']:.1f} | {r['block_speedup']:.2f}x |")

    # ---- training: one step per token, BD3-LM's 2L pass against the whole sequence's L
    x0 = torch.randint(0, block_cfg.mask_token_id, (args.batch, args.seq_len), generator=g).to(device)

    def step(model, loss_fn, opt):
        opt.zero_grad(set_to_none=True)
        loss_fn(model, x0).loss.backward()
        opt.step()

    block.train(), whole.train()
    opts = {m: torch.optim.AdamW(m.parameters(), lr=1e-6) for m in (block, whole)}
    fns = {"block model (x_t ⊕ x_0, 2L)": lambda: step(block, block_diffusion_loss, opts[block]),
           "whole sequence (L)": lambda: step(whole, diffusion_loss, opts[whole])}
    _, times = best_of(fns, args.repeats, sync)
    tokens = args.batch * args.seq_len
    train = {name: dict(seconds=min(t), all_seconds=t, us_per_token=1e6 * min(t) / tokens) for name, t in times.items()}
    names = list(train)
    ratio = train[names[0]]["seconds"] / train[names[1]]["seconds"]
    record["training"] = dict(batch=args.batch, seq_len=args.seq_len, tokens=tokens, rows=train, block_cost_ratio=ratio)
    record["load_average"]["end"] = os.getloadavg()
    atomic_write_json(out_path, record)
    print(f"\ntraining step (forward + backward + AdamW), {args.batch} x {args.seq_len} tokens\n")
    print("| training step | seconds | µs per token |\n|---|---:|---:|")
    for name, r in train.items():
        print(f"| {name} | {r['seconds']:.3f} | {r['us_per_token']:.1f} |")
    print(f"- a block model's step costs {ratio:.2f}x the whole-sequence step per token\n\nwrote {out_path}")


if __name__ == "__main__":
    main()
