"""tools/quant_sizing.py: the quant study's sizing from planted pilot records (no training)."""

from __future__ import annotations

import json
import math
import statistics

from helpers import _load_tool
from sinkdlm.stats import minimum_detectable_effect


def _pilot(tmp_path, deltas):
    """A pilot directory whose results.json holds `deltas` {arm: {seed: {scheme: Δ}}} and one timing.json per run."""
    variants = {arm: {"seeds": {s: {"quant": {"schemes": {k: {"delta": v} for k, v in by_scheme.items()}}}
                                for s, by_scheme in seeds.items()}} for arm, seeds in deltas.items()}
    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "results.json").write_text(json.dumps({"variants": variants}))
    for arm, seeds in deltas.items():
        for s in seeds:
            run = tmp_path / "pilot" / "runs" / f"{arm}-s{s}"
            run.mkdir(parents=True)
            (run / "timing.json").write_text(json.dumps({"train_s": 1800.0, "quant_s": 1800.0}))
    return tmp_path / "pilot"


def test_sizing_reads_the_paired_differences_and_states_the_mde(tmp_path):
    tool = _load_tool("quant_sizing")
    # binary fractions: gated - vanilla is exactly +0.125 on every seed
    d = {"vanilla": {"510": 0.5, "511": 0.25, "512": 0.375},
         "sink1-front": {"510": 0.25, "511": 0.1875, "512": 0.0625},
         "gated": {"510": 0.625, "511": 0.375, "512": 0.5}}
    deltas = {arm: {s: {"int8-dynamic": v, "int8-weight": v / 10} for s, v in seeds.items()} for arm, seeds in d.items()}
    s = tool.sizing(_pilot(tmp_path, deltas))
    primary = s["pairs"][0]
    assert primary["pair"] == ["sink1-front", "vanilla"] and primary["scheme"] == "int8-dynamic"
    diffs = [d["sink1-front"][k] - d["vanilla"][k] for k in ("510", "511", "512")]
    assert primary["differences"] == dict(zip(("510", "511", "512"), diffs))
    sd = statistics.stdev(diffs)
    assert math.isclose(primary["sd"], sd)
    assert math.isclose(s["primary_mde_t_at_study_seeds"], minimum_detectable_effect(sd / math.sqrt(10), 9))
    assert s["core_hours_per_run"] == {"vanilla": 1.0, "sink1-front": 1.0, "gated": 1.0}
    assert s["core_hours_of_the_study"] == 30.0
    gated = s["pairs"][1]  # gated - vanilla: a constant +0.125 difference has no spread and sizes nothing
    assert gated["pair"] == ["gated", "vanilla"] and "mde_t_by_seeds" not in gated
    tool.write(tmp_path / "out", s)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "sink1-front − vanilla, int8-dynamic" in readme and "No MDE from this pair" in readme.replace("no MDE", "No MDE")
