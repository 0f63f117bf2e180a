"""ATen ops per training step of every sink variant, and host syncs per loss step: deterministic, CPU.

On a GPU each non-view ATen op is a kernel launch, and a small model's training step is bound by
launches rather than FLOPs; a host-syncing op (`nonzero`, boolean indexing, `item`) stalls the
pipeline. Both are counted here exactly, with `tools/op_counter.py`'s `OpCounter` (a
`TorchDispatchMode` below autograd, so backward is included), on the `tiny` preset (4 layers;
counts scale with the layer count, not with the sizes): one forward + backward with a cross-entropy
over every position, and one `masked_loss` step (eq. 3-4 from a host-planned `MaskPlan`) + backward.

    .venv/bin/python benchmarks/bench_ops.py [--src DIR]   # --src: count another tree's code (e.g. a worktree of an older commit)

Writes benchmarks/results/bench_ops.json (or --out); docs/benchmarks.md's table is generated from it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "bench_ops.json"
VARIANTS = {
    "vanilla": {},
    "1 sink (front)": {"num_sink_tokens": 1},
    "1 sink (end)": {"num_sink_tokens": 1, "sink_position": "end"},
    "2 sinks": {"num_sink_tokens": 2},
    "4 sinks": {"num_sink_tokens": 4},
    "zero-value sink": {"num_sink_tokens": 1, "sink_zero_value": True},
    "sink_logit (per-head)": {"sink_logit": True},
    "softmax_one": {"softmax_one": True},
    "gated attention": {"gated_attention": True},
}


def count(batch: int, seq_len: int) -> dict:
    import torch
    import torch.nn.functional as F

    from op_counter import OpCounter  # tools/ (on sys.path: see main)
    from sinkdlm import DiffusionLM, ModelConfig

    torch.set_num_threads(1)
    rows = {}
    for name, switches in VARIANTS.items():
        torch.manual_seed(0)
        model = DiffusionLM(ModelConfig.from_preset("tiny", **switches)).train()
        ids = torch.randint(0, 100, (batch, seq_len), generator=torch.Generator().manual_seed(0))
        with OpCounter() as ops:
            logits = model(ids).logits
            F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
        row = {"ops": ops.total, "kernels": ops.kernels}
        try:  # the loss step (this tree's API; older trees have no MaskPlan)
            from sinkdlm.diffusion.loss import masked_loss, plan_masks
            from sinkdlm.diffusion.noise import MaskNoise

            plan = plan_masks(ids, MaskNoise(generator=torch.Generator().manual_seed(0)), mask_id=model.config.mask_token_id)
            with OpCounter() as step:
                masked_loss(model, plan).loss.backward()
        except ImportError:
            from sinkdlm.diffusion.loss import diffusion_loss
            from sinkdlm.diffusion.noise import MaskNoise

            with OpCounter() as step:
                diffusion_loss(model, ids, MaskNoise(generator=torch.Generator().manual_seed(0))).loss.backward()
        row["loss_step_syncs"] = sum(step.syncs.values())
        rows[name] = row
    base = rows["vanilla"]
    for row in rows.values():
        row["ops_ratio"] = row["ops"] / base["ops"]
        row["kernels_ratio"] = row["kernels"] / base["kernels"]
    return {"layers": ModelConfig.from_preset("tiny").num_hidden_layers, "variants": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--src", type=Path, help="also count this source tree (its src/), e.g. the code before a change")
    ap.add_argument("--src-label", help="what --src is, for the record (e.g. its commit)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    if args.child:  # a fresh interpreter whose sys.path starts at --src
        print(json.dumps(count(args.batch, args.seq_len)))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import torch

    result = {"benchmark": "bench_ops", "batch": args.batch, "seq_len": args.seq_len, "preset": "tiny",
              "torch": torch.__version__, **count(args.batch, args.seq_len)}
    if args.src is not None:
        # The counter comes from this tree's tools/; the model code from --src (first on sys.path).
        here = Path(__file__).resolve()
        code = (f"import sys; sys.path[:0] = [{str(args.src / 'src')!r}]; "
                f"sys.argv = ['x', '--child', '--batch', '{args.batch}', '--seq-len', '{args.seq_len}']; "
                f"sys.path.insert(0, {str(here.parent)!r}); import bench_ops; bench_ops.main()")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        result["before"] = {"source": args.src_label or str(args.src), **json.loads(out.stdout.strip().splitlines()[-1])}
    print(f"| variant | ops (fwd+bwd) | / vanilla | kernels | / vanilla | host syncs per loss step |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in result["variants"].items():
        print(f"| {name} | {r['ops']} | {r['ops_ratio']:.2f} | {r['kernels']} | {r['kernels_ratio']:.2f} | "
              f"{r['loss_step_syncs']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
