"""What one decoding step asks of the device, counted on a CPU: ATen ops, kernels, host syncs, graphs.

The CPU proxies of issue 44's GPU properties (a batch-1 step is bound by kernel launches; a host sync
stalls the launch queue; every recompile is compile time), deterministic and exact:
  * ATen ops and kernels (non-view ops: one launch each on a GPU) per step of `generate`, counted with
    `tools/op_counter.py`'s `OpCounter` around a whole generation (its first forward builds the sink
    cache: that is left out by a warm-up call) and divided by the forwards it ran; host syncs per step
    from the difference to the same generation in half the steps (what a call syncs once, checking its
    prompt, is left out and listed apart); for no cache, `prefix` and `dual`;
  * graphs that `compile=True` (backend `aot_eager`) compiles for one generation of 4 blocks, read
    from `torch._dynamo.utils.counters`.
Setting: the `tiny` preset + 1 sink, fp32, batch 1, a 16-token prompt, 64 tokens in blocks of 16,
one token per step (issue 44's table).

    .venv/bin/python benchmarks/bench_decode_ops.py [--src DIR --src-label LABEL]   # --src: count another tree too

Writes benchmarks/results/bench_decode_ops.json (or --out); docs/benchmarks.md's table is generated from it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "bench_decode_ops.json"
PROMPT, GEN, BLOCK = 16, 64, 16
MODES = {"no cache": None, "prefix": "prefix", "dual": "dual"}


def count() -> dict:
    import torch

    from op_counter import OpCounter  # tools/ (on sys.path: see main)
    from sinkdlm import DiffusionLM, ModelConfig, generate

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig.from_preset("tiny", num_sink_tokens=1)).eval()
    prompt = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    kw = dict(gen_length=GEN, steps=GEN, block_length=BLOCK, return_dict=True)
    rows = {}
    for name, cache in MODES.items():
        generate(model, prompt, cache=cache, **kw)  # warm-up: the sink cache
        with OpCounter() as ops:
            steps = generate(model, prompt, cache=cache, **kw).steps_taken
        with OpCounter() as half:  # half the steps: the syncs that grow with them are the per-step ones
            half_steps = generate(model, prompt, cache=cache, **{**kw, "steps": GEN // 2}).steps_taken
        per_step = (sum(ops.syncs.values()) - sum(half.syncs.values())) / (steps - half_steps)
        rows[name] = {"steps": steps, "ops_per_step": ops.total / steps, "kernels_per_step": ops.kernels / steps,
                      "syncs_per_step": per_step, "syncs_per_call": sum(ops.syncs.values()) - per_step * steps,
                      "syncs": dict(ops.syncs)}
    base = rows["no cache"]
    for row in rows.values():
        row["ops_ratio"] = row["ops_per_step"] / base["ops_per_step"]
    graphs = {}
    import torch._dynamo

    for cache in ("prefix", "dual"):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        generate(model, prompt, cache=cache, compile=True, compile_backend="aot_eager", **kw)
        graphs[cache] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return {"modes": rows, "compiled_graphs": graphs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, help="also count this source tree (its src/), e.g. the code before a change")
    ap.add_argument("--src-label", help="what --src is, for the record (e.g. its commit)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    if args.child:  # a fresh interpreter whose sys.path starts at --src
        print(json.dumps(count()))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import torch

    result = {"benchmark": "bench_decode_ops", "preset": "tiny + 1 sink", "batch": 1, "prompt_length": PROMPT,
              "gen_length": GEN, "block_length": BLOCK, "steps": GEN, "torch": torch.__version__, **count()}
    if args.src is not None:
        # The counter comes from this tree's tools/; the model code from --src (first on sys.path).
        here = Path(__file__).resolve()
        code = (f"import sys; sys.path[:0] = [{str(args.src / 'src')!r}]; sys.argv = ['x', '--child']; "
                f"sys.path.insert(0, {str(here.parent)!r}); import bench_decode_ops; bench_decode_ops.main()")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        result["before"] = {"source": args.src_label or str(args.src), **json.loads(out.stdout.strip().splitlines()[-1])}
    for label, res in (("before", result.get("before")), ("now", result)):
        if res is None:
            continue
        print(f"\n{label}: {res.get('source', 'this tree')}")
        print("| mode | ATen ops / step | / no cache | kernels / step | host syncs / step | graphs, compile=True |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, r in res["modes"].items():
            g = res["compiled_graphs"].get(MODES[name], "–")
            print(f"| {name} | {r['ops_per_step']:.1f} | {r['ops_ratio']:.2f} | {r['kernels_per_step']:.1f} | "
                  f"{r['syncs_per_step']:.2f} (+ {r['syncs_per_call']:.0f} per call) | {g} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
