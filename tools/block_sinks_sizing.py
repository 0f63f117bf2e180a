"""Size the `block-sinks` study (docs/method.md §15) from its pilot, `block-sinks-pilot` (exploratory).

The study's primary is the content sink-set change rate (§6, mean over layers, from each seed's analysis) of
vanilla in blocks of 4 minus vanilla on the whole sequence, paired by seed. The pilot ran exactly that pair on
3 fresh seeds with the study's recipe; its per-seed differences give the spread, and from it the paired t test's
minimum detectable effect (80 % power, two-sided 5 %: `stats.minimum_detectable_effect`) at each
number of seeds, and the seeds the declared exact Wilcoxon test needs for the t test's power (`rank_test_seeds`,
Pitman's ARE 3/π). Each arm's measured compute per run (training, evaluation, analysis, validation, from its
runs' timing.json) prices a seed of the study's six arms (a block of 16 priced as a block of 4: an upper bound).

    python tools/block_sinks_sizing.py [--pilot docs/results/block-sinks-pilot] [--out docs/results/block-sinks-sizing]

Writes OUT/sizing.json and OUT/README.md. The study's report restates its MDE from its own spread.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from sinkdlm.experiment.metrics import seed_scalars
from sinkdlm.experiment.summary import rank_test_seeds, seeds_for_mde
from sinkdlm.stats import minimum_detectable_effect
from sinkdlm.io.atomic import atomic_write_bytes, atomic_write_json

METRIC = "content_sink_set_change_rate"
PAIR = ("block4", "vanilla")
SEEDS_CONSIDERED = (6, 8, 10, 12, 16)
TARGETS = (0.02, 0.03, 0.05)  # absolute change in the rate (a share of (step, row, head) pairs)


def sizing(pilot: Path) -> dict:
    results = json.loads((pilot / "results.json").read_text())
    a, b = (seed_scalars(results["variants"][name], METRIC) for name in PAIR)
    d = {s: a[s] - b[s] for s in sorted(a, key=int) if s in b}
    sd = statistics.stdev(d.values())
    mde = {n: minimum_detectable_effect(sd / math.sqrt(n), n - 1) for n in SEEDS_CONSIDERED}
    need = {t: seeds_for_mde(sd, t) for t in TARGETS}
    cost = {}
    for name in PAIR:
        runs = [json.loads(p.read_text()) for p in sorted((pilot / "runs").glob(f"{name}-s*/timing.json"))]
        cost[name] = statistics.mean(sum(r.values()) for r in runs) / 3600 if runs else None
    per_seed = None if None in cost.values() else 2 * cost["vanilla"] + 4 * cost["block4"]
    return {"pilot": str(pilot), "metric": METRIC, "pair": list(PAIR), "rates": {"block4": a, "vanilla": b},
            "differences": d, "mean_difference": statistics.mean(d.values()), "sd": sd, "mde_t_by_seeds": mde,
            "t_seeds_for_target": need,
            "wilcoxon_seeds_for_target": {t: rank_test_seeds(n, "wilcoxon") for t, n in need.items()},
            "core_hours_per_run": cost, "core_hours_per_seed_of_six_arms": per_seed}


def write(out: Path, s: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "sizing.json", s)
    per_seed = s["core_hours_per_seed_of_six_arms"]
    lines = ["# Sizing of the `block-sinks` study (from its pilot; exploratory)", "",
             f"Pilot: `{s['pilot']}`, the per-seed {s['pair'][0]} − {s['pair'][1]} difference in the content sink-set "
             "change rate (mean over layers; the study's primary), paired by seed. The pilot decides nothing; its "
             "seeds are not the study's.", "",
             "| seed | block 4 | whole sequence | difference |", "|---:|---:|---:|---:|",
             *(f"| {k} | {s['rates']['block4'][k]:.4f} | {s['rates']['vanilla'][k]:.4f} | {v:+.4f} |"
               for k, v in s["differences"].items()), "",
             f"Mean difference {s['mean_difference']:+.4f}; spread over seeds sd = {s['sd']:.4f} "
             f"({len(s['differences'])} seeds).", "",
             "| seeds | MDE of the paired t test (80 % power, two-sided 5 %) |", "|---:|---:|",
             *(f"| {n} | {v:.4f} |" for n, v in s["mde_t_by_seeds"].items()), "",
             "| target MDE | seeds, paired t | seeds, exact Wilcoxon (ARE 3/π) |", "|---:|---:|---:|",
             *(f"| {t} | {n} | {(s['wilcoxon_seeds_for_target'][t] or {}).get('seeds')} |"
               for t, n in s["t_seeds_for_target"].items()), "",
             "Compute per run on this machine (one thread a run, two runs at once; training, evaluation, analysis "
             "and validation): " + ", ".join(f"{k} {v:.2f} core-h" for k, v in s["core_hours_per_run"].items() if v)
             + ("" if per_seed is None else f"; a seed of the study's six arms about {per_seed:.1f} core-h "
                                            "(blocks of 16 priced as blocks of 4).")]
    atomic_write_bytes(out / "README.md", ("\n".join(lines) + "\n").encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pilot", type=Path, default=Path("docs/results/block-sinks-pilot"))
    ap.add_argument("--out", type=Path, default=Path("docs/results/block-sinks-sizing"))
    args = ap.parse_args()
    write(args.out, sizing(args.pilot))
    print((args.out / "README.md").read_text())


if __name__ == "__main__":
    main()
