"""Does `convert --shift-logits` reach a lower loss in the Quick start's budget? Measured paired over seeds.

For each seed, the example SmolLM2-135M-Instruct GGUF is converted twice (+ 1 sink token, the same
sink draw: `--seed`), once with the AR head's shift kept (`--shift-logits`, Dream's recipe: position
i-1 predicts token i) and once without (position i predicts itself, LLaDA's layout), then trained
exactly as the Quick start does (`--max-steps` steps of 4 x 64 Shakespeare tokens, the same data order
and masks for both heads). The endpoint is the trainer's validation loss at the last step (the same
fixed validation batches and noise for both), compared paired over seeds with a t interval
(`sinkdlm.stats.paired_difference`) and the printed verdict rule of the reports (`stats.verdict`).

Run: `.venv/bin/python benchmarks/bench_shift_logits.py [--seeds 3] [--max-steps 30]` (about 10 min on
2 cores). Needs `make example-model`. Writes `benchmarks/results/bench_shift_logits.json`; the README's
sentence about the head comes from it (`make readme-results`, block `bench/shift-logits`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "bench_shift_logits.json"


def run_pair(gguf: Path, seed: int, args, tmp: Path) -> dict:
    """Validation loss after training, with and without the shift, for one seed (the same sink draw)."""
    from sinkdlm.model.hf import convert_hf_checkpoint
    from sinkdlm.training import TrainConfig, train

    row = {"seed": seed}
    for shift in (True, False):
        name = "shift" if shift else "no_shift"
        init, out = tmp / f"{name}-init", tmp / f"{name}-train"
        start = time.perf_counter()
        convert_hf_checkpoint(gguf, init, seed=seed, shift_logits=shift, num_sink_tokens=1)
        cfg = TrainConfig.resolve(init_from=str(init), data="shakespeare", out=str(out), max_steps=args.max_steps,
                                  batch_size=4, seq_len=64, seed=seed, eval_every=args.max_steps,
                                  save_every=args.max_steps, eval_batches=args.eval_batches, tensorboard=False,
                                  cache_dir=str(tmp / "cache"))
        summary = train(cfg)
        row[name] = summary["last"]["val_loss"]
        row[f"{name}_s"] = round(time.perf_counter() - start, 1)
        shutil.rmtree(init)
        shutil.rmtree(out)  # a 135M checkpoint with its optimizer state: 1.6 GB each
    print(f"seed {seed}: val_loss with the shift {row['shift']:.3f}, without {row['no_shift']:.3f}", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--eval-batches", type=int, default=16)
    args = p.parse_args()

    from sinkdlm.checkpoint.example_model import example_model_path
    from sinkdlm.stats import minimum_detectable_effect
    from sinkdlm.stats import paired_difference, verdict

    gguf = example_model_path()
    rows = []
    with tempfile.TemporaryDirectory(prefix="shift-logits-") as tmp:
        for seed in range(args.seeds):
            rows.append(run_pair(gguf, seed, args, Path(tmp)))
    diff = paired_difference([r["shift"] for r in rows], [r["no_shift"] for r in rows])
    # the study's minimum detectable effect (80 % power) at the observed spread of the paired differences
    d = [r["shift"] - r["no_shift"] for r in rows]
    se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
    record = {"benchmark": "bench_shift_logits", "max_steps": args.max_steps, "batch_size": 4, "seq_len": 64,
              "eval_batches": args.eval_batches, "num_sink_tokens": 1, "rows": rows,
              "shift_minus_no_shift": diff.to_dict(), "mde": minimum_detectable_effect(se, len(d) - 1),
              "verdict": verdict(diff, lower_is_better=True)}
    print(f"shift - no shift: {diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}] over {diff.n} seeds: {record['verdict']}")
    tmp_out = OUT.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(record, indent=1) + "\n")
    tmp_out.replace(OUT)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
