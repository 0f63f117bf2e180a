"""What bf16 autocast does to a study's fixed validation: the step-0 controls re-scored in fp32.

A `real-bf16` study scores every model under bf16 autocast. This tool scores the first `--sequences`
sequences of each step-0 control again in fp32, with the study's own noise (the same draws: a sequence's
noise depends on its index and the noise seed only), and compares value by value:
  * per model, bf16 − fp32 of the per-sequence ELBO (mean over draws), t interval over sequences;
  * per compared pair (a − b), the paired difference's change, (a − b)_bf16 − (a − b)_fp32, per sequence:
    the precision's bias on what the study compares, with its t interval over sequences.
The step-0 controls are used because their weights are rebuilt from the AR checkpoint in seconds (the
trained runs' weights are gone once their measurements are on disk).

    .venv/bin/python tools/precision_check.py --study docs/results/smollm2/dlm --preset real-bf16 \
        --sequences 32 --out docs/results/smollm2/dlm/precision_check.json \
        --work docs/results/smollm2/dlm/precision_check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from sinkdlm.experiment import units
from sinkdlm.experiment.presets import ExperimentPreset, get_preset
from sinkdlm.experiment.variance import VAL
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.stats import mean_interval


def per_sequence(values: list[list[float]]) -> list[float]:
    return [statistics.fmean(row) for row in values]


def check(study: Path, preset: ExperimentPreset, sequences: int, work: Path) -> dict:
    """fp32 against the study's bf16 values on the first `sequences` sequences of every step-0 control."""
    if not preset.validation.bf16:
        raise SystemExit(f"error: preset {preset.name!r} scores in fp32 already; nothing to compare")
    kwargs = {"data": preset.train.data, "seq_len": preset.train.seq_len, "shift_logits": preset.train.shift_logits}
    fp32 = dataclasses.replace(preset.validation, tokens=sequences * preset.train.seq_len, bf16=False)
    # fp32 first (kept in `work`, so a call cut off resumes), the study's bf16 values then
    fp32_values = {v.name: units.fixed_validation(work / v.name, str(study / "converted" / v.name), kwargs,
                                                  fp32)["values"] for v in preset.variants}
    models: dict[str, dict] = {}
    for v in preset.variants:
        stored = study / "step0" / v.name / VAL
        if not stored.is_file():
            raise SystemExit(f"error: {stored} is missing: run the study's step-0 controls first")
        bf16_values = json.loads(stored.read_text())["values"][:sequences]
        b, f = per_sequence(bf16_values), per_sequence(fp32_values[v.name])
        models[v.name] = {"bf16": b, "fp32": f,
                          "bf16_minus_fp32": mean_interval([x - y for x, y in zip(b, f)]).to_dict()}
    pairs = []
    for a, b in preset.comparisons:
        ma, mb = models[a], models[b]
        change = [(ab - bb) - (af - bf) for ab, bb, af, bf in zip(ma["bf16"], mb["bf16"], ma["fp32"], mb["fp32"])]
        pairs.append({"pair": [a, b], "difference_bf16": statistics.fmean(ma["bf16"]) - statistics.fmean(mb["bf16"]),
                      "difference_fp32": statistics.fmean(ma["fp32"]) - statistics.fmean(mb["fp32"]),
                      "change": mean_interval(change).to_dict()})
    return {"study": str(study), "preset": preset.name, "sequences": sequences, "draws": fp32.draws,
            "noise_seed": fp32.noise_seed, "models": models, "pairs": pairs,
            "note": "step-0 controls; bf16 values from the study's val.json, fp32 re-scored with the same noise; "
                    "intervals: t over sequences"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", type=Path, required=True)
    p.add_argument("--preset", default="real-bf16")
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, help="keep the fp32 scoring here (resumable); default: a temporary folder")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = check(args.study, get_preset(args.preset), args.sequences, args.work or Path(tmp))
    for name, m in result["models"].items():
        d = m["bf16_minus_fp32"]
        print(f"{name}: bf16 - fp32 {d['mean']:+.5f} [{d['low']:+.5f}, {d['high']:+.5f}] nats/token")
    for pr in result["pairs"]:
        c = pr["change"]
        print(f"{pr['pair'][0]} - {pr['pair'][1]}: bf16 {pr['difference_bf16']:+.5f}, fp32 {pr['difference_fp32']:+.5f}; "
              f"change {c['mean']:+.5f} [{c['low']:+.5f}, {c['high']:+.5f}]")
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
