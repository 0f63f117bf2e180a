"""Formatting of an experiment's stored numbers: an interval, a paired difference, a verdict word, the tables of
paired comparisons, a Markdown table. Nothing here computes a statistic (`sinkdlm.experiment.summary` and the
endpoints do); the report and every endpoint (`experiment.endpoints`) share these so every table prints numbers
the same way."""

from __future__ import annotations

import dataclasses
from typing import Any

from sinkdlm.stats import signed


def fmt_interval(s: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    if not s or s.get("mean") is None:
        return "–"
    text = f"{scale * s['mean']:.{digits}f}"
    text = text[1:] if text.startswith("-") and float(text) == 0 else text  # never "-0.0"
    if s.get("degenerate"):
        return text + " (no spread)"
    if s.get("low") is not None and s.get("high") is not None:
        low, high = (signed(scale * s[k], digits).lstrip("+") for k in ("low", "high"))
        text += f" [{low}, {high}]"
    elif s.get("n", 2) < 2:  # one seed: no interval (not the whole range)
        text += " [–]"
    return text


def fmt_diff(c: dict, bold: bool = True) -> str:
    """"Δ [low, high]" of a comparison, and its direction in bold when it survives the adjustment."""
    if c.get("missing"):
        return c["verdict"].removeprefix("missing: ")
    if c.get("different_bounds"):  # two block sizes' bounds: no difference to state (endpoints.block_sizes)
        return "not compared (different bounds)"
    scale = c.get("scale", 1.0)
    digits = 1 if scale != 1.0 else 3
    cell = signed(scale * c["mean"], digits)
    if c.get("degenerate"):
        return cell + " (no variance)"
    if c["low"] is not None:
        cell += f" [{signed(scale * c['low'], digits)}, {signed(scale * c['high'], digits)}]"
    if bold and c.get("survives"):
        cell += f" **{c['verdict'].split(' ')[0]}**" + unconverted_note(c)
    return cell


def unconverted_note(c: dict) -> str:
    """What a Δ_train (`val_loss_change`) direction means when an arm of the pair had no conversion
    (`metrics.unconverted`): the step-0 gap closing, not a benefit of the change."""
    if not c.get("unconverted"):
        return ""
    return (f" (= the end gap − the step-0 gap, since {' and '.join(c['unconverted'])} had no conversion, one step-0 "
            "model for every seed: how the converted arm's step-0 gap changed, not by itself what the change bought)")


def short_verdict(c: dict) -> str:
    if c.get("missing"):
        return "missing"
    if c.get("different_bounds"):  # "not compared: different bounds (blocks of 4 vs the whole sequence)"
        return c["verdict"]
    if c.get("declared_primary"):  # tested once by its declared test, outside the family
        if c.get("survives"):
            return c["verdict"].split(" by ")[0] + " (declared primary test)"
        return f"no difference detected (declared primary test, {c['n']} seeds)"
    if not c.get("in_family", True):
        return "not tested (alternative)"
    if c.get("degenerate"):
        return "no variance estimate"
    if c.get("survives"):
        return c["verdict"].split(" (")[0].split(" by ")[0] + unconverted_note(c)
    if c.get("excludes_zero"):
        return f"inconclusive after BH (adjusted p = {c['p_adjusted']:.2g})" if c.get("p_adjusted") is not None else "inconclusive"
    return f"no difference detected ({c['n']} seeds)"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def train_setting(results: dict[str, Any], key: str) -> Any:
    """A training setting of the experiment: results.json keeps only what the preset set, the rest are
    TrainConfig's defaults (so a report never prints "None sequences" or "? training steps")."""
    from sinkdlm.config import TrainConfig
    from sinkdlm.config.fields import field_default

    value = results["train"].get(key)
    if value is None:
        field = next(f for f in dataclasses.fields(TrainConfig) if f.name == key)
        value = field_default(field)
    return value


def fmt_ci(d: dict[str, Any] | None, digits: int = 3) -> str:
    """"+0.170 [+0.018, +0.318]" of a stored interval (no bounds: the mean alone, and why)."""
    if not d or d.get("mean") is None:
        return "–"
    text = signed(d["mean"], digits)
    if d.get("degenerate"):
        return text + " (no spread: no interval)"
    if d.get("low") is not None and d.get("high") is not None:
        text += f" [{signed(d['low'], digits)}, {signed(d['high'], digits)}]"
    return text


def fmt_p(p: float | None) -> str:
    return "– (one seed: no test)" if p is None else f"{p:.3g}"


def fmt_level(rank: dict[str, Any]) -> str:
    """"exact 96.9 %" of a rank interval: its exact coverage, not the nominal level (a discrete test)."""
    exact = rank.get("exact_confidence")
    return f"exact {100 * exact:.1f} %" if exact is not None else f"nominal {100 * rank.get('confidence', 0.95):g} %"


def is_percent(metric: str) -> bool:
    return "/" in metric


def comparisons_table(results: dict[str, Any], metrics: set[str] | None = None) -> tuple[list[str], list[list[str]]]:
    rows = []
    for c in results["comparisons"]:
        if metrics is not None and c["metric"] not in metrics:
            continue
        scale = c.get("scale", 1.0)
        digits = 1 if scale != 1.0 else 3
        ci = "–" if c.get("low") is None else f"[{signed(scale * c['low'], digits)}, {signed(scale * c['high'], digits)}]"
        mean = "–" if c.get("mean") is None else signed(scale * c["mean"], digits)
        adj = "–" if c.get("p_adjusted") is None else f"{c['p_adjusted']:.2g}"
        mde = "–" if c.get("mde") is None else f"{scale * c['mde']:.{digits}f}"
        rows.append([f"{c['variant']} − {c['baseline']}", f"`{c['metric']}`", mean, ci, mde, adj,
                     c.get("method_label", "–"), short_verdict(c)])
    return ["difference", "metric", "Δ", "95 % CI (raw)", "MDE (80 % power)", "BH-adjusted p", "interval",
            "verdict"], rows


def pivot_comparisons(results: dict[str, Any], metrics: list[str]) -> tuple[list[str], list[list[str]]] | None:
    """One row per compared pair, one column per metric: "Δ [raw CI]", with the verdict's direction in
    bold only when the comparison survives the multiplicity adjustment (compact enough for the README)."""
    by_pair: dict[tuple[str, str], dict[str, dict]] = {}
    labels: dict[tuple[str, str], str] = {}
    for c in results["comparisons"]:
        key = tuple(c.get("pair") or (c["variant"], c["baseline"]))
        by_pair.setdefault(key, {})[c["metric"]] = c
        labels[key] = f"{c['variant']} − {c['baseline']}"
    metrics = [m for m in metrics if any(m in per for per in by_pair.values())]
    if not by_pair or not metrics:
        return None
    rows = [[labels[key]] + [fmt_diff(per[m]) if m in per else "–" for m in metrics] for key, per in by_pair.items()]
    header = ["difference"] + [f"`{m}`" + (" (points)" if is_percent(m) else "") for m in metrics]
    return header, rows
