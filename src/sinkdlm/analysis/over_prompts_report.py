"""Rendering of `analyze_over_prompts`: figures and report.md / report.html from intervals.json.

Computation lives in `sinkdlm.analysis.over_prompts`; this module only draws and writes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from sinkdlm.analysis.figures import integer_ticks, save_figure
from sinkdlm.reporting import Document


def array_of(intervals, key: str = "mean") -> np.ndarray:
    return np.asarray([np.nan if iv is None or iv.get(key) is None else iv[key] for iv in intervals], dtype=float)


def _band(ax, x, ivs, label, color, scale=1.0):
    mean, low, high = (array_of(ivs, k) * scale for k in ("mean", "low", "high"))
    ax.plot(x, mean, color=color, marker="o", ms=3, label=label)
    ax.fill_between(x, low, high, color=color, alpha=0.25, linewidth=0)


def plot_layers(summary: dict, path: Path, title: str) -> Path:
    """Per layer: attention mass on detected sinks, and value norms of sinks vs other tokens (95 % CI bands)."""
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    layers = np.arange(len(summary["sink_mass_per_layer"]))
    _band(ax1, layers, summary["sink_mass_per_layer"], "attention on detected sinks", "C0", 100)
    ax1.set(xlabel="layer", ylabel="% of attention", ylim=(0, 100), title="attention mass on sinks")
    vn = summary["value_norm_per_layer"]
    _band(ax2, layers, [e["sink"] for e in vn], "sinks", "C3")
    _band(ax2, layers, [e["normal"] for e in vn], "other tokens", "C2")
    ax2.set(xlabel="layer", ylabel="‖v‖ (mean over heads)", title="value norms")
    ax2.legend(frameon=False)
    for ax in (ax1, ax2):
        integer_ticks(ax)
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_masking_curve(summary: dict, path: Path, title: str, metric: str) -> Path:
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    ab = summary["ablation"]
    ks = [int(k) for k in ab]
    deltas = [ab[str(k)]["delta"] if k else {"mean": 0.0, "low": 0.0, "high": 0.0} for k in ks]
    mean, low, high = (array_of(deltas, key) for key in ("mean", "low", "high"))
    ax.errorbar(ks, mean, yerr=[mean - low, high - mean], marker="o", capsize=4)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="K (top sinks masked per head)", ylabel=f"Δ {metric}", title=title)
    integer_ticks(ax)
    return save_figure(fig, path)


def plot_epsilon_sweep(summary: dict, path: Path, title: str) -> Path:
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    sweep = summary["non_sink_fraction_by_epsilon"]
    eps = [float(e) for e in sweep]
    _band(ax, eps, list(sweep.values()), "non-sink fraction", "C0", 100)
    ax.set(xlabel="ϵ", ylabel="% of (row, head) keys that are not sinks", title=title)
    return save_figure(fig, path)


def fmt_interval(iv: dict | None, scale: float = 1.0, digits: int = 2) -> str:
    if iv is None or iv.get("mean") is None:
        return "n/a (fewer than 2 prompts)"
    if iv.get("degenerate"):
        return f"{iv['mean'] * scale:.{digits}f} (no variance estimate)"
    return f"{iv['mean'] * scale:.{digits}f} [{iv['low'] * scale:.{digits}f}, {iv['high'] * scale:.{digits}f}]"


def write_report(result: dict, out_dir: Path) -> None:
    s, setup, model = result["summary"], result["setup"], result["model"]
    label = model.get("label", "model")
    figs = out_dir / "figures"
    doc = Document(f"Attention sinks of {label}, with intervals over prompts")
    doc.paragraph(
        f"{model['kind']} model, {model['num_hidden_layers']} layers × {model['num_attention_heads']} heads. "
        f"{setup['num_prompts']} prompts of {setup['prompt_tokens']['mean']:.0f} tokens, each analysed on its own while "
        f"generating {setup['gen_length']} tokens; sinks at ϵ = {setup['epsilon']:g} (Rulli et al. eq. 3). Every number is "
        "a mean over prompts with its 95 % Student-t interval (shares clipped to [0, 1]); comparisons are paired within "
        "prompt.")
    doc.heading("Where attention goes")
    doc.image(plot_layers(s, figs / "layers.png", label), "Per layer: attention on detected sinks (left) and value norms "
              "of sinks vs other tokens (right); bands are 95 % intervals over prompts.")
    top = s.get("sink_mass_argmax")
    if top:
        doc.paragraph(_argmax_label(top).removeprefix("attention on detected sinks in ").removesuffix(" (%)").capitalize()
                      + ": the layer with the largest mean attention on its sinks, tested against the runner-up.")
    doc.table(["ϵ", "non-sink fraction %"], [[e, fmt_interval(iv, 100)] for e, iv in s["non_sink_fraction_by_epsilon"].items()])
    doc.image(plot_epsilon_sweep(s, figs / "epsilon_sweep.png", label), "Share of keys that are not sinks, by ϵ.")
    v = s["value_norm_verdict"]
    doc.heading("Value norms: sinks vs other tokens (per layer, paired within prompt)")
    doc.paragraph(
        f"Of {v['layers_tested']} layers with sinks in ≥ 2 prompts, sinks' value norm is lower in {len(v['sinks_lower'])} "
        f"and higher in {len(v['sinks_higher'])} after the Benjamini-Hochberg adjustment over {v['family'].split(' (')[0]}; "
        f"the others: no difference detected. Lower: layers {v['sinks_lower'] or '—'}; higher: {v['sinks_higher'] or '—'}.")
    doc.table(["layer", "attention on sinks %", "‖v‖ sinks", "‖v‖ others", "sinks − others", "BH p"],
              [[e["layer"], fmt_interval(s["sink_mass_per_layer"][e["layer"]], 100, 1), fmt_interval(e["sink"]), fmt_interval(e["normal"]),
                fmt_interval(e["difference"]), f"{e['difference']['p_bh']:.2g}" if e["difference"] and "p_bh" in e["difference"]
                else "n/a"] for e in s["value_norm_per_layer"]])
    doc.heading("Moving sinks across decoding steps")
    doc.table(["metric", "mean over prompts [95 % CI]"], [[k, fmt_interval(iv, 1, 4)] for k, iv in s["moving"].items()])
    doc.heading("Sink token types")
    doc.table(["type", "share of sink occurrences %"], [[k, fmt_interval(iv, 100, 1)] for k, iv in s["token_type_shares"].items()])
    if s.get("ablation"):
        metric = "continuation log-prob / token" if model.get("causal") else "continuation ELBO / token"
        doc.heading("Masking the top-K sinks (Rulli et al. Table 1)")
        doc.image(plot_masking_curve(s, figs / "masking_curve.png", label, metric),
                  f"Δ {metric} when the top-K sinks of every head are masked, paired over prompts (95 % CI).")
        doc.table(["K", "score", "Δ vs K = 0", "masked keys / head"],
                  [[k, fmt_interval(e["score"], 1, 3), fmt_interval(e["delta"], 1, 3) if e["delta"] else "—",
                    fmt_interval(e["masked_keys_per_head"], 1, 2)] for k, e in s["ablation"].items()])
    doc.paragraph(f"Per-prompt analyses (figures and analysis.json of each prompt): `prompts/pNN/`. "
                  f"Wall time {result['timing']['seconds'] / 60:.1f} min.")
    doc.write(out_dir)


def _argmax_label(top: dict) -> str:
    """The headline's layer of most attention on sinks, with the interval that decides whether it is the most."""
    from sinkdlm.stats import signed

    d = top["difference"]
    gap = (f"layer {top['layer']} − layer {top['runner_up']}: {signed(100 * d['mean'], 1)} "
           f"[{signed(100 * d['low'], 1)}, {signed(100 * d['high'], 1)}] points, paired within prompt")
    if top["established"]:
        return f"attention on detected sinks in layer {top['layer']}, the most ({gap}) (%)"
    return (f"attention on detected sinks in layer {top['layer']}, the largest mean; not established as the most "
            f"({gap}) (%)")


def markdown_headline(result: dict) -> str:
    """At most five rows for a README: the numbers a reader of Rulli et al. looks for first."""
    s, setup, model = result["summary"], result["setup"], result["model"]
    mass = s["sink_mass_per_layer"]
    top = s.get("sink_mass_argmax")  # an older intervals.json: re-summarise it (over_prompts.write_summary)
    v = s["value_norm_verdict"]
    moving = s["moving"].get("content_sink_set_change_rate") or s["moving"].get("sink_set_change_rate")
    rows = [
        ("non-sink fraction at ϵ = 3 (%)", fmt_interval(s["non_sink_fraction"], 100)),
        (_argmax_label(top), fmt_interval(mass[top["layer"]], 100, 1)) if top else
        ("layer of most attention on detected sinks", "not computed for this file: re-summarise it (write_summary)"),
        ("layers where sinks' value norm is lower / higher than other tokens' (BH over layers)",
         f"{len(v['sinks_lower'])} / {len(v['sinks_higher'])} of {v['layers_tested']}"),
        ("sink-set change rate between consecutive decoding steps", fmt_interval(moving, 1, 4)),
    ]
    if s.get("ablation") and "1" in s["ablation"]:
        metric = "log-prob / token" if model.get("causal") else "ELBO / token"
        rows.append((f"Δ continuation {metric}, top-1 sink masked in every head",
                     fmt_interval(s["ablation"]["1"]["delta"], 1, 3)))
    lines = [f"{model.get('label', 'model')}: {setup['num_prompts']} Shakespeare prompts, each analysed alone; "
             "mean over prompts [95 % CI].", "", "| measure | value |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines) + "\n"
