"""Size the `late-sink` study (issue 52) from a committed continued-training study (a proxy, labelled as one).

The late-sink study continues one shared base model under five arms and compares each pair's fixed validation
loss at the last step, paired over seeds (the seed draws the data order, the sink's initial embedding and the
LoRA initialisation). No study here has continued a tiny model yet, so its spread is stood in for by the closest
design committed: `docs/results/smollm2/dlm` (round 4), where SmolLM2-135M was converted once and continued with
and without one sink, six seeds, the same data order in both arms of a seed. Its per-seed end differences give
the spread; from it, the paired t test's minimum detectable effect (80 % power, two-sided 5 %:
`stats.minimum_detectable_effect`) at each number of seeds, and the seeds the declared exact
Wilcoxon test needs for the t test's power (`rank_test_seeds`, Pitman's ARE 3/π).

    python tools/late_sink_sizing.py [--proxy docs/results/smollm2/dlm] [--out docs/results/late-sink-sizing]

Writes OUT/sizing.json and OUT/README.md. The late-sink report restates its MDE from its own spread.
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

SEEDS_CONSIDERED = (6, 8, 10, 12, 16)
TARGETS = (0.02, 0.03, 0.05)  # nats: the end differences of the proxy were -0.07 to -0.11


def paired_differences(results: dict, pair: tuple[str, str]) -> dict[str, float]:
    """{seed: val_loss(pair[0]) - val_loss(pair[1])} over the seeds both arms finished."""
    a, b = (results["variants"][name]["seeds"] for name in pair)
    return {s: a[s]["val_loss"] - b[s]["val_loss"] for s in sorted(a, key=int) if s in b
            and a[s].get("val_loss") is not None and b[s].get("val_loss") is not None}


def sizing(results: dict, pair: tuple[str, str]) -> dict:
    d = paired_differences(results, pair)
    sd = statistics.stdev(d.values())
    mde = {n: minimum_detectable_effect(sd / math.sqrt(n), n - 1) for n in SEEDS_CONSIDERED}
    need = {t: seeds_for_mde(sd, t) for t in TARGETS}
    return {"proxy": results.get("preset"), "pair": list(pair), "differences": d, "sd": sd,
            "mde_t_by_seeds": mde, "t_seeds_for_target": need,
            "wilcoxon_seeds_for_target": {t: rank_test_seeds(n, "wilcoxon") for t, n in need.items()}}


def write(out: Path, s: dict, source: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "sizing.json", s)
    lines = ["# Sizing of the `late-sink` study (a proxy; exploratory)", "",
             f"Proxy: `{source}` ({s['proxy']}), the per-seed end difference {s['pair'][0]} − {s['pair'][1]} of the "
             "fixed validation loss, one conversion continued with and without a sink, paired by seed. The tiny "
             "model's own spread is not known before its runs; the study's report restates the MDE from it.", "",
             "| seed | difference (nats) |", "|---:|---:|",
             *(f"| {k} | {v:+.4f} |" for k, v in s["differences"].items()), "",
             f"Spread over seeds: sd = {s['sd']:.4f} nats ({len(s['differences'])} seeds).", "",
             "| seeds | MDE of the paired t test (80 % power, two-sided 5 %) |", "|---:|---:|",
             *(f"| {n} | {v:.4f} |" for n, v in s["mde_t_by_seeds"].items()), "",
             "| target MDE (nats) | seeds, paired t | seeds, exact Wilcoxon (ARE 3/π) |", "|---:|---:|---:|",
             *(f"| {t} | {n} | {(s['wilcoxon_seeds_for_target'][t] or {}).get('seeds')} |"
               for t, n in s["t_seeds_for_target"].items())]
    atomic_write_bytes(out / "README.md", ("\n".join(lines) + "\n").encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--proxy", type=Path, default=Path("docs/results/smollm2/dlm"))
    ap.add_argument("--pair", default="sink1-front,vanilla")
    ap.add_argument("--out", type=Path, default=Path("docs/results/late-sink-sizing"))
    args = ap.parse_args()
    results = json.loads((args.proxy / "results.json").read_text())
    s = sizing(results, tuple(args.pair.split(",")))
    write(args.out, s, args.proxy)
    print((args.out / "README.md").read_text())


if __name__ == "__main__":
    main()
