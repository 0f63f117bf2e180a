"""Sampling throughput (issue 4): gen_length 128, steps 128, block 32; every ratio measured in one run.

  1. `sinkdlm.generate` vs the plain LLaDA loop of tests/diffusion/test_sampling.py (identical tokens asserted),
     both recomputing the sinks every step, so the ratio is the sampler's own;
  2. `generate` with the sink cache vs without (docs/method.md §3);
  3. threshold decoding (Fast-dLLM, 0.9) vs one token per step: speed-up, forwards, outputs that differ;
  4. memory across steps: resident set size at every step of a long run (flat = no growth).

The model: `--checkpoint DIR`, or by default the `tiny` preset with one sink and random weights scaled
so that its confidences spread over (0, 1) (`toy_model`). Speed does not depend on the weights; the
threshold's forward count and the share of outputs that differ do, so for a quality statement pass a
trained checkpoint. Timings are medians of interleaved repeats (the machine may be shared).

    .venv/bin/python benchmarks/bench_sampling.py [--checkpoint DIR] [--batch 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_sampling import reference_generate  # noqa: E402  (the reference loop the tests check against)

from sinkdlm import DiffusionLM, ModelConfig, generate  # noqa: E402

GEN, STEPS, BLOCK, PROMPT = 128, 128, 32, 32
REF = "reference loop (no sink cache)"


def toy_model(seed: int = 0) -> DiffusionLM:
    """The `tiny` preset with one sink, random weights at initializer_range 0.5: its confidences
    spread over (0, 1) (median ~0.56, ~10 % above 0.9 on a fully masked block), so a 0.9 threshold
    has something to do. At the default 0.02 every confidence is ~1/vocab."""
    torch.manual_seed(seed)
    return DiffusionLM(ModelConfig.from_preset("tiny", num_sink_tokens=1, initializer_range=0.5)).eval()


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def measure(model, prompt: torch.Tensor, repeats: int) -> dict:
    """Time the four variants on one prompt batch, interleaved; best of `repeats` (after a warm-up)."""
    variants = {
        REF: lambda: (reference_generate(model, prompt, GEN, STEPS, BLOCK), STEPS),
        "generate, no sink cache": lambda: _gen(model, prompt, use_sink_cache=False),
        "generate, sink cache": lambda: _gen(model, prompt, use_sink_cache=True),
        "generate, threshold 0.9": lambda: _gen(model, prompt, threshold=0.9),
    }
    outs, forwards = {}, {}
    for name, fn in variants.items():  # warm-up (the sink cache is built once here)
        outs[name], forwards[name] = fn()
    assert torch.equal(outs["generate, no sink cache"], outs[REF]), "sampler differs from the reference loop"
    assert torch.equal(outs["generate, sink cache"], outs[REF]), "the sink cache changes tokens"
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {"best": {k: min(v) for k, v in times.items()}, "forwards": forwards}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16, help="prompts compared for threshold vs one-per-step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps ratios stable on a shared CPU)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model = DiffusionLM.from_pretrained(args.checkpoint) if args.checkpoint else toy_model()
    g = torch.Generator().manual_seed(123)
    print(f"Sampling, gen_length {GEN}, steps {STEPS}, block {BLOCK}, prompt {PROMPT} tokens, "
          f"{'checkpoint ' + str(args.checkpoint) if args.checkpoint else 'toy model (tiny preset, 1 sink)'}, "
          f"CPU, {torch.get_num_threads()} threads, best of {args.repeats} interleaved repeats\n")
    print("| batch | variant | forwards | seconds | tokens/s | vs reference loop |")
    print("|---:|---|---:|---:|---:|---:|")
    summary, record = [], {"setup": {"gen_length": GEN, "steps": STEPS, "block_length": BLOCK, "prompt_tokens": PROMPT,
                                      "model": str(args.checkpoint) if args.checkpoint else "tiny preset + 1 sink, random weights",
                                      "threads": torch.get_num_threads(), "repeats": args.repeats}, "batches": {}}
    for batch in args.batch:
        prompt = torch.randint(0, model.config.mask_token_id, (batch, PROMPT), generator=g)
        r = measure(model, prompt, args.repeats)
        best, ref = r["best"], r["best"][REF]
        for k, sec in best.items():
            print(f"| {batch} | {k} | {r['forwards'][k]} | {sec:.3f} | {GEN * batch / sec:.1f} | {ref / sec:.2f}x |")
        record["batches"][str(batch)] = {
            "best_seconds": best, "forwards": r["forwards"],
            "generate_vs_reference": ref / best["generate, no sink cache"],
            "sink_cache_on_vs_off": best["generate, no sink cache"] / best["generate, sink cache"],
            "threshold_vs_one_per_step": best["generate, sink cache"] / best["generate, threshold 0.9"],
            "threshold_forwards": r["forwards"]["generate, threshold 0.9"],
        }
        summary.append(
            f"- batch {batch}: sampler vs reference loop (both without the sink cache) "
            f"{ref / best['generate, no sink cache']:.2f}x, identical tokens; sink cache on vs off "
            f"{best['generate, no sink cache'] / best['generate, sink cache']:.2f}x, identical tokens; "
            f"threshold 0.9 vs one token per step {best['generate, sink cache'] / best['generate, threshold 0.9']:.2f}x"
        )
    print()
    print("\n".join(summary))

    # Threshold vs one token per step, prompt by prompt: forwards and outputs that differ.
    differ, tokens, forwards = 0, 0, []
    for _ in range(args.prompts):
        prompt = torch.randint(0, model.config.mask_token_id, (1, PROMPT), generator=g)
        one = generate(model, prompt, gen_length=GEN, steps=STEPS, block_length=BLOCK)
        thr = generate(model, prompt, gen_length=GEN, steps=None, block_length=BLOCK, threshold=0.9, return_dict=True)
        differ += int(not torch.equal(one, thr.sequences))
        tokens += int((one != thr.sequences).sum())
        forwards.append(thr.steps_taken)
    print(f"- threshold 0.9 over {args.prompts} prompts: {min(forwards)}-{max(forwards)} forwards "
          f"(mean {statistics.mean(forwards):.1f}) instead of {STEPS}; {differ}/{args.prompts} outputs differ "
          f"from one-token-per-step, {100 * tokens / (args.prompts * GEN):.1f}% of generated tokens")

    # Memory across steps: resident set size at every step of a 2x longer run.
    gen = 2 * GEN if 2 * GEN + PROMPT + 1 <= model.config.max_position_embeddings else GEN
    rss: list[float] = []
    generate(model, prompt, gen_length=gen, steps=gen, block_length=BLOCK, callback=lambda s: rss.append(rss_mib()))
    print(f"- memory over {len(rss)} steps (gen_length {gen}): RSS {rss[8]:.1f} MiB at step 8, "
          f"max {max(rss[8:]):.1f} MiB after it, {rss[-1]:.1f} MiB at the last step")
    record["threshold"] = {"prompts": args.prompts, "forwards": forwards, "outputs_differing": differ,
                           "tokens_differing_share": tokens / (args.prompts * GEN)}
    record["memory"] = {"steps": len(rss), "gen_length": gen, "rss_mib_step8": rss[8], "rss_mib_max_after": max(rss[8:]),
                        "rss_mib_last": rss[-1]}
    out = Path(__file__).resolve().parent / "results" / "bench_sampling.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


def _gen(model, prompt, threshold=None, use_sink_cache=True):
    out = generate(model, prompt, gen_length=GEN, steps=None if threshold else STEPS, block_length=BLOCK, threshold=threshold,
                   use_sink_cache=use_sink_cache, return_dict=True)
    return out.sequences, out.steps_taken


if __name__ == "__main__":
    main()
