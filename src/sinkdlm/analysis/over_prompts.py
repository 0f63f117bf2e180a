"""The sink analysis with an interval on every number: each prompt analysed on its own, prompts as the unit.

`analyze` pools every prompt into one set of counts, so its numbers carry no interval. Here each
prompt gets its own `analyze` run (same settings, `prompts/pNN/analysis.json`), and every summary
number becomes a mean over prompts with a 95 % Student-t interval (`sinkdlm.stats`; shares stay in
[0, 1]). Comparisons are paired within prompt: sinks' value norm against the other tokens' per layer
(Rulli et al. / One-Token Fig. 3), and each K of the masking curve against K = 0 (Rulli Table 1).
The per-layer sink-vs-other verdicts are Benjamini-Hochberg adjusted over the layers (docs/method.md §6-7).

Writes `intervals.json` and `report.md`/`report.html` with figures into `out_dir`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.config.commands import AnalyzeConfig
from sinkdlm.stats import benjamini_hochberg, mean_interval, paired_difference

SHARE = (0.0, 1.0)
METHOD = "Student t over prompts"
PAIRED = "paired t over prompts (within prompt)"


def _iv(values, bounds=None) -> dict | None:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(values) < 2:
        return None
    return {**mean_interval(values, bounds=bounds).to_dict(), "method": METHOD}


def _paired(a, b) -> dict:
    return {**paired_difference(a, b).to_dict(), "method": PAIRED}


def per_prompt_record(analysis: dict) -> dict:
    """The per-prompt numbers the summary is built from (one prompt's analysis.json)."""
    vn = analysis["value_norm"].get("per_layer") or {}
    moving = analysis.get("moving") or {}
    abl = analysis.get("ablation") or {}
    return {
        "non_sink_fraction": analysis["non_sink_fraction"],
        "non_sink_fraction_by_epsilon": analysis["non_sink_fraction_by_epsilon"],
        "sink_mass_per_layer": analysis["sink_attention_mass"],
        "sinks_per_head": analysis["sinks_per_head"],
        "value_norm_sink": vn.get("sink_mean"),
        "value_norm_normal": vn.get("normal_mean"),
        "token_type_shares": (analysis.get("sink_token_types") or {}).get("shares"),
        "moving": dict(moving.get("mean") or {}),
        "ablation_score": abl.get("scores"),
        "ablation_masked_keys_per_head": abl.get("masked_keys_per_head"),
        "samples": analysis.get("samples", [])[:1],
    }


def sink_mass_argmax(records: Sequence[dict]) -> dict | None:
    """Which layer puts the most attention on detected sinks, with an interval (docs/method.md §6): the layer with
    the largest mean over prompts, the runner-up, and their paired difference within prompt (top −
    runner-up, Student t over prompts). `established` only when that interval excludes 0; both layers
    are picked on the same prompts, so the test leans towards finding a gap: a gap that it does not find
    is not there at this sample size. None with fewer than 2 layers or prompts."""
    n_layers = len(records[0]["sink_mass_per_layer"]) if records else 0
    means = []
    for i in range(n_layers):
        vals = [r["sink_mass_per_layer"][i] for r in records]
        means.append(None if any(v is None for v in vals) else sum(vals) / len(vals))
    ranked = sorted((i for i in range(n_layers) if means[i] is not None), key=lambda i: -means[i])
    if len(ranked) < 2 or len(records) < 2:
        return None
    top, second = ranked[:2]
    diff = _paired([r["sink_mass_per_layer"][top] for r in records], [r["sink_mass_per_layer"][second] for r in records])
    return {"layer": top, "runner_up": second, "difference": diff, "established": bool(diff["excludes_zero"])}


def summarise_prompts(records: Sequence[dict]) -> dict:
    """Intervals over prompts for every number of `per_prompt_record` (see the module docstring)."""
    n_layers = len(records[0]["sink_mass_per_layer"])
    out: dict = {"num_prompts": len(records)}
    out["non_sink_fraction"] = _iv([r["non_sink_fraction"] for r in records], SHARE)
    out["non_sink_fraction_by_epsilon"] = {
        eps: _iv([r["non_sink_fraction_by_epsilon"][eps] for r in records], SHARE)
        for eps in records[0]["non_sink_fraction_by_epsilon"]}
    out["sink_mass_per_layer"] = [_iv([r["sink_mass_per_layer"][i] for r in records], SHARE) for i in range(n_layers)]
    out["sink_mass_argmax"] = sink_mass_argmax(records)
    out["sinks_per_head_per_layer"] = [_iv([r["sinks_per_head"][i] for r in records]) for i in range(n_layers)]
    # Value norms per layer, sinks against the other tokens of the same prompt and layer (paired).
    layers = []
    for i in range(n_layers):
        pairs = [(r["value_norm_sink"][i], r["value_norm_normal"][i]) for r in records
                 if r["value_norm_sink"] and r["value_norm_sink"][i] is not None and r["value_norm_normal"][i] is not None]
        entry = {"layer": i, "prompts_with_sinks": len(pairs),
                 "sink": _iv([a for a, _ in pairs]), "normal": _iv([b for _, b in pairs]), "difference": None}
        if len(pairs) >= 2:
            entry["difference"] = _paired([a for a, _ in pairs], [b for _, b in pairs])
        layers.append(entry)
    p = [e["difference"]["p"] if e["difference"] and e["difference"].get("p") is not None else None for e in layers]
    tested = [i for i, v in enumerate(p) if v is not None]
    adjusted = benjamini_hochberg([p[i] for i in tested]) if tested else []
    for i, q in zip(tested, adjusted):
        layers[i]["difference"]["p_bh"] = q
    out["value_norm_per_layer"] = layers
    below = [e["layer"] for e in layers if e["difference"] and e["difference"].get("p_bh", 1) < 0.05
             and e["difference"]["mean"] < 0]
    above = [e["layer"] for e in layers if e["difference"] and e["difference"].get("p_bh", 1) < 0.05
             and e["difference"]["mean"] > 0]
    out["value_norm_verdict"] = {"layers_tested": len(tested), "sinks_lower": below, "sinks_higher": above,
                                 "family": "the layers (Benjamini-Hochberg, q = 0.05)"}
    types = records[0]["token_type_shares"] or {}
    out["token_type_shares"] = {k: _iv([(r["token_type_shares"] or {}).get(k) for r in records], SHARE) for k in types}
    moving_keys = sorted(set().union(*(r["moving"] for r in records)))
    out["moving"] = {k: _iv([r["moving"].get(k) for r in records],
                            SHARE if ("rate" in k or "jaccard" in k) else None) for k in moving_keys}
    if records[0]["ablation_score"]:
        ks = list(records[0]["ablation_score"])
        base = [r["ablation_score"]["0"] for r in records]
        out["ablation"] = {k: {"score": _iv([r["ablation_score"][k] for r in records]),
                               "delta": _paired([r["ablation_score"][k] for r in records], base) if k != "0" else None,
                               "masked_keys_per_head": _iv([r["ablation_masked_keys_per_head"][k] for r in records])}
                           for k in ks}
    return out


def analyze_over_prompts(model, tokenizer, prompts: Sequence[str], config: AnalyzeConfig) -> dict:
    """Analyse every prompt on its own (`analyze`, the same `AnalyzeConfig`, each prompt's files under
    `config.out/prompts/pNN`) and summarise over prompts in `config.out`."""
    import dataclasses

    from tqdm.auto import tqdm

    from sinkdlm.analysis.analyzer import analyze

    if len(prompts) < 2:
        raise ValueError("intervals over prompts need at least 2 prompts; give more (e.g. --num-prompts 16)")
    out_dir = Path(config.out)
    start = time.perf_counter()
    records = []
    for i, prompt in enumerate(tqdm(prompts, desc="sink analysis per prompt", disable=config.quiet)):
        pdir = out_dir / "prompts" / f"p{i:02d}"
        if (pdir / "analysis.json").is_file():  # resumable: a finished prompt is not run again
            analysis = json.loads((pdir / "analysis.json").read_text())
        else:
            analysis = analyze(model, tokenizer, [prompt], dataclasses.replace(config, out=pdir, quiet=True))
        records.append(per_prompt_record(analysis))
    first = json.loads((out_dir / "prompts" / "p00" / "analysis.json").read_text())
    result = {
        "model": first["model"], "setup": {**first["setup"], "num_prompts": len(prompts), "epsilon": first["epsilon"],
                                           "unit": "prompt (each analysed on its own)"},
        "summary": summarise_prompts(records), "per_prompt": records,
        "timing": {"seconds": time.perf_counter() - start},
    }
    return write_summary(result, out_dir)


def write_summary(result: dict, out_dir: str | Path) -> dict:
    """(Re)build `summary` from the stored per-prompt records and write intervals.json and the report:
    a finished analysis is re-summarised with the current statistics without running the model."""
    from sinkdlm.analysis.over_prompts_report import write_report

    result = {**result, "summary": summarise_prompts(result["per_prompt"])}
    atomic_write_json(Path(out_dir) / "intervals.json", result)
    write_report(result, Path(out_dir))
    return result
