"""Size the `quant` study (docs/method.md §16) from its pilot, `quant-pilot` (exploratory).

The study's primary is + 1 sink's Δ_quant minus vanilla's under int8-dynamic (W8A8), paired by seed, where a run's
Δ_quant is its quantized minus unquantized `val_loss` on the fixed validation (the same masked inputs). The pilot
ran the study's three arms and recipe on 3 fresh seeds; its per-seed differences give the spread, and from it the
paired t test's minimum detectable effect (80 % power, two-sided 5 %: `stats.minimum_detectable_effect`)
at each number of seeds, and the seeds the declared exact Wilcoxon test needs for the t test's power
(`rank_test_seeds`, Pitman's ARE 3/π). The same for gated − vanilla (a secondary) and for int8-weight, and each arm's
measured compute per run (training, evaluation, analysis, validation and the quantized scorings, from its runs'
timing.json) prices the study.

    python tools/quant_sizing.py [--pilot docs/results/quant-pilot] [--out docs/results/quant-sizing]

Writes OUT/sizing.json and OUT/README.md. The study's report restates its MDE from its own spread.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from sinkdlm.experiment.summary import rank_test_seeds, seeds_for_mde
from sinkdlm.stats import minimum_detectable_effect
from sinkdlm.io.atomic import atomic_write_bytes, atomic_write_json

ARMS = ("vanilla", "sink1-front", "gated")
PAIRS = (("sink1-front", "vanilla"), ("gated", "vanilla"))  # the primary first
SCHEMES = ("int8-dynamic", "int8-weight")  # the primary scheme first
SEEDS_CONSIDERED = (6, 8, 10, 12, 16)
STUDY_SEEDS = 10


def _deltas(results: dict, arm: str, scheme: str) -> dict[str, float]:
    """{seed: Δ_quant} of one arm under one scheme, over the runs scored quantized."""
    seeds = results["variants"].get(arm, {}).get("seeds", {})
    return {s: r["quant"]["schemes"][scheme]["delta"] for s, r in seeds.items()
            if r.get("quant") and scheme in r["quant"]["schemes"]}


def _pair(results: dict, pair: tuple[str, str], scheme: str) -> dict:
    a, b = (_deltas(results, name, scheme) for name in pair)
    d = {s: a[s] - b[s] for s in sorted(a, key=int) if s in b}
    sd = statistics.stdev(d.values()) if len(d) >= 2 else None
    out = {"pair": list(pair), "scheme": scheme, "deltas": {pair[0]: a, pair[1]: b}, "differences": d,
           "mean_difference": statistics.mean(d.values()) if d else None, "sd": sd}
    if sd:  # a zero or missing spread sizes nothing
        out["mde_t_by_seeds"] = {n: minimum_detectable_effect(sd / math.sqrt(n), n - 1) for n in SEEDS_CONSIDERED}
    return out


def sizing(pilot: Path) -> dict:
    results = json.loads((pilot / "results.json").read_text())
    pairs = [_pair(results, pair, scheme) for scheme in SCHEMES for pair in PAIRS]
    cost = {}
    for arm in ARMS:
        runs = [json.loads(p.read_text()) for p in sorted((pilot / "runs").glob(f"{arm}-s*/timing.json"))]
        cost[arm] = statistics.mean(sum(r.values()) for r in runs) / 3600 if runs else None
    primary = pairs[0]
    mde = (primary.get("mde_t_by_seeds") or {}).get(STUDY_SEEDS)
    return {"pilot": str(pilot), "pairs": pairs, "study_seeds": STUDY_SEEDS, "primary_mde_t_at_study_seeds": mde,
            "wilcoxon_seeds_for_that_mde": (rank_test_seeds(seeds_for_mde(primary["sd"], mde), "wilcoxon")
                                            if mde else None),
            "core_hours_per_run": cost,
            "core_hours_of_the_study": (None if None in cost.values() else STUDY_SEEDS * sum(cost.values()))}


def write(out: Path, s: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "sizing.json", s)
    lines = ["# Sizing of the `quant` study (from its pilot; exploratory)", "",
             f"Pilot: `{s['pilot']}`. Δ_quant of a run = its quantized − unquantized `val_loss` (nats) on the fixed "
             "validation, the same masked inputs; the pairs' differences of Δ_quant are paired by seed. The pilot "
             "decides nothing; its seeds are not the study's.", ""]
    for p in s["pairs"]:
        a, b = p["pair"]
        lines += [f"## {a} − {b}, {p['scheme']}", "", f"| seed | Δ_quant {a} | Δ_quant {b} | difference |",
                  "|---:|---:|---:|---:|",
                  *(f"| {k} | {p['deltas'][a][k]:+.5f} | {p['deltas'][b][k]:+.5f} | {v:+.5f} |"
                    for k, v in p["differences"].items()), ""]
        if p["sd"]:
            lines += [f"Mean difference {p['mean_difference']:+.5f}; sd over seeds {p['sd']:.5f} "
                      f"({len(p['differences'])} seeds). MDE of the paired t test (80 % power, two-sided 5 %): "
                      + ", ".join(f"{v:.5f} at {n} seeds" for n, v in p["mde_t_by_seeds"].items()) + ".", ""]
        else:
            lines += ["Too few seeds or no spread: no MDE from this pair.", ""]
    cost = ", ".join(f"{k} {v:.2f} core-h" for k, v in s["core_hours_per_run"].items() if v)
    lines += ["## Cost", "", f"Compute per run on this machine (training, evaluation, analysis, validation and the "
              f"quantized scorings): {cost}"
              + ("" if s["core_hours_of_the_study"] is None else
                 f"; the study ({s['study_seeds']} seeds of the three arms) about {s['core_hours_of_the_study']:.1f} core-h.")]
    if s["primary_mde_t_at_study_seeds"] is not None:
        lines += ["", f"The primary's MDE at the study's {s['study_seeds']} seeds: "
                      f"{s['primary_mde_t_at_study_seeds']:.5f} nats (paired t, the pilot's spread)."]
    atomic_write_bytes(out / "README.md", ("\n".join(lines) + "\n").encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pilot", type=Path, default=Path("docs/results/quant-pilot"))
    ap.add_argument("--out", type=Path, default=Path("docs/results/quant-sizing"))
    args = ap.parse_args()
    write(args.out, sizing(args.pilot))
    print((args.out / "README.md").read_text())


if __name__ == "__main__":
    main()
