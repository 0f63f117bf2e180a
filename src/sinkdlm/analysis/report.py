"""Rendering of the sink analysis: the figures and report.md / report.html of `analyze` and `compare`.

Computation lives in `sinkdlm.analysis.analyze` (one run) and `sinkdlm.analysis.comparison` (several
runs side by side); this module only draws and writes, from the analysis.json dicts and arrays they
hand it. The PNG names are stable (`FIGURES`) because analysis.json lists them and `compare` reads
them back. Matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from sinkdlm.analysis import outliers_report
from sinkdlm.reporting import Document

# One file per figure of an `analyze` run; analysis.json lists the ones written under "figures".
FIGURES = {
    "attention_maps": "attention_maps.png",
    "value_norm_scatter": "value_norm_histogram.png",  # a histogram of the norms (the key kept for old runs)
    "layer_bars": "layer_bars.png",
    "non_sink_fraction": "non_sink_fraction.png",
    "largest_sink_positions": "largest_sink_positions.png",
}


def _floats(values) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in values], dtype=float)


def _extra_positions(analysis: dict) -> list[int]:
    """Layout positions of the extra sinks in the largest-sink figure (front: 0..n-1; end: only
    when every row has the same length, else the rows disagree)."""
    m = analysis["model"]
    n = m["num_sink_tokens"]
    if not n:
        return []
    if m["sink_position"] == "front":
        return list(range(n))
    p = analysis["setup"]["prompt_tokens"]
    if p["min"] != p["max"]:
        return []
    size = p["max"] + analysis["setup"]["gen_length"] + n
    return list(range(size - n, size))


HEAD_CHOICE = "head shown: the one of this layer with the largest received attention (strongest sink)"


def step_name(analysis: dict) -> str:
    """What one step of the analysed generation is: an autoregressive model has no denoising steps; it
    decodes one token per step (docs/method.md §10)."""
    return "decoding step (one token each)" if analysis["model"].get("causal") else "denoising step"


def _map_marks(analysis: dict, size: int) -> tuple[list[int], int | None]:
    """(extra-sink positions, first generated position) inside the figure row's `[S', S']` map."""
    m, setup = analysis["model"], analysis["setup"]
    n, p = m["num_sink_tokens"], setup.get("figure_prompt_tokens")
    front = m["sink_position"] == "front"
    sinks = list(range(n)) if front else list(range(size - n, size))
    return sinks, None if p is None else p + (n if front else 0)


def write_figures(out_dir: Path, analysis: dict, arrays: dict) -> dict[str, str]:
    from sinkdlm.analysis import figures as F

    label = analysis["model"]["label"]
    written = {}
    if "attention_maps" in arrays:
        layer, head = (int(x) for x in arrays["attention_map_layer_head"])
        step = step_name(analysis).split(" (")[0]
        titles = [f"layer {layer}, head {head}, {step} {int(s)}" for s in arrays["attention_map_steps"]]
        sinks, prompt_end = _map_marks(analysis, arrays["attention_maps"].shape[-1])
        F.plot_attention_maps(list(arrays["attention_maps"]), titles, out_dir / FIGURES["attention_maps"],
                              sink_positions=sinks, prompt_end=prompt_end, note=HEAD_CHOICE,
                              title=f"{label}: attention maps")
        written["attention_maps"] = FIGURES["attention_maps"]
    F.plot_value_norm_scatter(arrays["sink_norm_sample"], arrays["normal_norm_sample"],
                              out_dir / FIGURES["value_norm_scatter"], title=f"{label}: value norms, sinks vs normal tokens")
    written["value_norm_scatter"] = FIGURES["value_norm_scatter"]
    extra = analysis["extra_sink"]
    if extra is not None:
        F.plot_layer_bars(_floats(extra["value_norm"]), _floats(extra["others_value_norm"]),
                          _floats(extra["attention_mass"]), out_dir / FIGURES["layer_bars"],
                          title=f"{label}: the extra sink token's value norm and share of attention per layer")
    else:
        plot_detected_sink_bars({label: analysis}, out_dir / FIGURES["layer_bars"],
                                title=f"{label}: value norms and attention of the detected sinks (ϵ = "
                                      f"{analysis['epsilon']:g}) per layer")
    written["layer_bars"] = FIGURES["layer_bars"]
    curve = {float(e): v for e, v in analysis["non_sink_fraction_by_epsilon"].items()}
    F.plot_non_sink_fraction({label: curve}, out_dir / FIGURES["non_sink_fraction"], scale=analysis["scale"],
                             mark_epsilon=analysis["epsilon"], title=f"{label}: non-sink fraction vs ϵ")
    written["non_sink_fraction"] = FIGURES["non_sink_fraction"]
    F.plot_largest_sink_positions(arrays["largest_sink_positions"], out_dir / FIGURES["largest_sink_positions"],
                                  num_positions=analysis["setup"]["max_sequence_positions"],
                                  extra_sink_positions=_extra_positions(analysis),
                                  title=f"{label}: largest sink over {step_name(analysis).split(' (')[0]}s",
                                  step_label=step_name(analysis))
    written["largest_sink_positions"] = FIGURES["largest_sink_positions"]
    if analysis.get("outliers"):  # runs analysed before the outlier measurement have none
        outliers_report.plot_outliers({label: analysis["outliers"]}, out_dir / outliers_report.FIGURE,
                                      title=f"{label}: activation outliers per layer")
        written["outliers"] = outliers_report.FIGURE
    return written


def plot_detected_sink_bars(analyses: Mapping[str, dict], path, *, title: str | None = None) -> Path:
    """Per-layer bars of the *detected* sinks (any model): value norm of sink vs normal tokens and
    the share of attention on sinks, one row per model (the `plot_layer_bars` layout, with labels
    that do not claim an extra sink token)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    from sinkdlm.analysis.figures import integer_ticks, save_figure, say_empty

    fig = Figure(figsize=(11, 3.2 * len(analyses)), layout="constrained")
    axes = fig.subplots(len(analyses), 2, squeeze=False, sharey="col")  # rows compare on one scale
    for (ax_norm, ax_mass), (label, a) in zip(axes, analyses.items()):
        per = a["value_norm"]["per_layer"]
        sink, normal, mass = _floats(per["sink_mean"]), _floats(per["normal_mean"]), _floats(a["sink_attention_mass"])
        layers = np.arange(len(mass))
        ax_norm.bar(layers - 0.2, sink, width=0.4, color="tab:red", label=f"sinks at ϵ={a['epsilon']:g}")
        ax_norm.bar(layers + 0.2, normal, width=0.4, color="tab:blue", label="normal tokens")
        # One model: its name is in the figure's title; several: each row's titles name theirs (wrapped,
        # as a long run name would be clipped at the panel's width).
        name = f"{label}: " if len(analyses) > 1 else ""
        ax_norm.set_title(textwrap.fill(f"{name}value norm per layer, sinks vs normal tokens", 60), fontsize=10)
        ax_norm.set(xlabel="layer", ylabel="mean value L2 norm")
        ax_norm.legend(fontsize=8)
        virtual = a.get("virtual_sink")
        if virtual is None:
            ax_mass.bar(layers, mass, width=0.7, color="tab:purple")
        else:  # sink_logit / softmax_one: the virtual column's share beside the detected sinks'
            ax_mass.bar(layers - 0.2, mass, width=0.4, color="tab:purple", label=f"sinks at ϵ={a['epsilon']:g}")
            ax_mass.bar(layers + 0.2, _floats(virtual["attention_mass"]), width=0.4, color="tab:orange",
                        label=virtual["label"])
            ax_mass.legend(fontsize=8)
        for ax in (ax_norm, ax_mass):
            integer_ticks(ax)
            if not np.nan_to_num(mass).any():
                say_empty(ax)
        ax_mass.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax_mass.set_title(textwrap.fill(f"{name}share of attention on the detected sinks per layer", 60), fontsize=10)
        ax_mass.set(xlabel="layer", ylabel="attention mass on sinks")
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=12)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- report documents
def _text(text: str) -> str:
    """A decoded token or sample as one safe table/list cell: Python-escaped, `|` and backticks too."""
    return repr(text).replace("|", "\\x7c").replace("`", "\\x60")


def _num(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


FIGURE_CAPTIONS = {
    "attention_maps": "Attention map of one head at two {step}s (One-Token Fig. 1): bright columns are "
                      "sinks; a moving sink changes column between steps.",
    "value_norm_scatter": "Distribution of the value-space L2 norm (eq. 16, x-axis) of sink tokens vs normal tokens "
                          "(One-Token Fig. 1): the share of each population per bin, from a uniform sample of each over "
                          "steps, layers and prompts; dashed lines: the means. Pooled over layers (docs/method.md §6: "
                          "compare per layer, as the tables do).",
    "layer_bars": "Per layer: mean value norm of the sink vs the other tokens, and the share of attention "
                  "on the sink (One-Token Fig. 3; detected sinks when the model has no extra sink token).",
    "non_sink_fraction": "Share of (step, layer, head, key) that are not sinks, as a function of ϵ "
                         "(Rulli et al. Fig. 10).",
    "largest_sink_positions": "Position of the largest sink at every {step}: the colour is the share of (row, "
                              "layer, head) whose largest sink sits at that position (white: none); the red line "
                              "(right axis) is the share with no sink at ϵ.",
    "outliers": outliers_report.CAPTION,
}


def _setup_text(a: dict) -> str:
    s, m = a["setup"], a["model"]
    sinks = (f"{m['num_sink_tokens']} extra sink token(s) ({m['sink_position']})" if m["num_sink_tokens"]
             else "no extra sink token")
    return (f"Measured on the attention maps of every layer and head at every {step_name(a)} of "
            f"{s['num_prompts']} generations ({s['prompt_tokens']['mean']:.0f} prompt tokens on average, "
            f"{s['gen_length']} generated tokens, {s['steps_taken']} steps, block length {s['block_length']}) "
            f"of `{m['label']}` ({m['num_hidden_layers']} layers × {m['num_attention_heads']} heads, {sinks}). "
            f"Key j is a sink of a (step, layer, head) when its received attention c_j > mean_(k≠j) c_k + ϵ "
            f"(Rulli et al. eq. 3) with ϵ = {a['epsilon']:g} on the column-**{a['scale']}** scale (docs/method.md §6)."
            + (f" The model ran quantized: `--quantize {m['quantization']}` (torchao; the sink rows, embeddings, norms "
               "and head in their own dtype)." if m.get("quantization") else ""))


def write_analysis_report(analysis: dict, out_dir: Path, sinks_per_head: float | None) -> tuple[Path, Path]:
    """report.md and report.html of one `analyze` run (its figures already written); `sinks_per_head`:
    the mean over layers."""
    return _analysis_doc(analysis, sinks_per_head, Path(out_dir)).write(out_dir)


def _analysis_doc(a: dict, sinks_per_head: float | None, out_dir: Path) -> Document:
    doc = Document(f"Attention-sink analysis: {a['model']['label']}")
    doc.paragraph(_setup_text(a))
    doc.heading("Summary")
    vn = a["value_norm"]
    rows = [
        ["non-sink fraction at ϵ", _pct(a["non_sink_fraction"])],
        ["sinks per head (mean)", _num(sinks_per_head, 3)],
        ["value norm: sink / normal tokens", f"{_num(vn['sink_mean'], 3)} / {_num(vn['normal_mean'], 3)}"],
        ["largest sink moves (consecutive steps)", _pct(a["moving"]["mean"]["largest_sink_change_rate"])],
        ["sink set changes (consecutive steps), content keys", _pct(a["moving"]["mean"].get("content_sink_set_change_rate"))],
        ["Jaccard of consecutive sink sets, content keys", _num(a["moving"]["mean"].get("content_sink_set_jaccard"), 3)],
        # every key, the extra sinks' included: the alternative definition (docs/method.md §6)
        ["sink set changes, every key", _pct(a["moving"]["mean"]["sink_set_change_rate"])],
        ["Jaccard of consecutive sink sets, every key", _num(a["moving"]["mean"]["sink_set_jaccard"], 3)],
    ]
    if a["extra_sink"] is not None:
        rows.append(["attention on the extra sink (all layers)", _pct(a["extra_sink"]["mean_attention_mass"])])
        rows.append(["heads whose largest sink is the extra sink", _pct(a["moving"]["mean"]["extra_sink_share"])])
    if a.get("virtual_sink") is not None:
        v = a["virtual_sink"]
        rows.append([f"attention on the {v['label']} (all layers)", _pct(v["mean_attention_mass"])])
        rows.append([f"non-sink fraction at ϵ, {v['label']} as one more key", _pct(v["mean_non_sink_fraction_with_virtual"])])
    doc.table(["quantity", "value"], rows)
    doc.heading("Non-sink fraction vs ϵ")
    curve = a["non_sink_fraction_by_epsilon"]
    doc.table(["ϵ", *curve], [["non-sink", *(_pct(v) for v in curve.values())]])
    doc.heading("Per layer")
    mv = a["moving"]
    header = ["layer", "non-sink", "sinks/head", "attn on sinks", "norm sink", "norm normal", "largest moves",
              "set changes (content keys)", "Jaccard (content keys)"]
    per = vn["per_layer"]
    layers = range(len(a["sinks_per_head"]))
    content_change = mv.get("content_sink_set_change_rate") or [None for _ in layers]  # absent in older files
    content_jaccard = mv.get("content_sink_set_jaccard") or [None for _ in layers]
    rows = [[i, _pct(a["non_sink_fraction_per_layer"][i]), _num(a["sinks_per_head"][i], 3),
             _pct(a["sink_attention_mass"][i]), _num(per["sink_mean"][i], 3), _num(per["normal_mean"][i], 3),
             _pct(mv["largest_sink_change_rate"][i]), _pct(content_change[i]),
             _num(content_jaccard[i], 3)] for i in layers]
    doc.table(header, rows)
    if a["extra_sink"] is not None:
        e = a["extra_sink"]
        doc.heading("Extra sink token (One-Token Fig. 3)")
        doc.table(["layer", "attention mass", "sink value norm", "others value norm", "largest-sink share"],
                  [[i, _pct(e["attention_mass"][i]), _num(e["value_norm"][i], 3), _num(e["others_value_norm"][i], 3),
                    _pct(e["largest_sink_share"][i])] for i in range(len(e["attention_mass"]))])
    doc.heading("Tokens under the sinks (Rulli et al. Table 2)")
    types = a["sink_token_types"]
    doc.table(["type", "count", "share"], [[t, c, _pct(types["shares"][t])] for t, c in types["counts"].items()])
    if types["top_tokens"]:
        doc.table(["top sink token", "id", "count"], [[_text(t["text"]), t["id"], t["count"]] for t in types["top_tokens"]])
    if a["ablation"] is not None:
        _ablation_section(doc, {a["model"]["label"]: a["ablation"]}, {a["model"]["label"]: a["model"]["num_sink_tokens"]})
    if a.get("outliers"):
        outliers_report.outlier_section(doc, {a["model"]["label"]: a["outliers"]})
    doc.heading("Figures")
    for name, file in a["figures"].items():
        doc.image(out_dir / file, FIGURE_CAPTIONS[name].format(step=step_name(a).split(" (")[0]))
    if a["samples"]:
        doc.heading("Sample generations")
        doc.bullets([f"`{_text(s)}`" for s in a["samples"][:3]])
    return doc


def ablation_settings(ab: dict) -> list[dict]:
    """The ablation's scored settings of the extra sink, the headline first: each a dict with
    `include_extra_sink`, `scores`, `delta`, `masked_keys_per_head` (and `delta_stderr` for the ELBO).
    Files from before both settings were scored hold only the headline one."""
    head = {**ab, "include_extra_sink": bool(ab.get("include_extra_sink"))}
    return [head] + ([ab["alternative"]] if ab.get("alternative") else [])


def _extra_sink_setting(include_extra_sink: bool, has_extra_sink: bool) -> str:
    if not has_extra_sink:
        return "– (no extra sink)"
    return "masked when among the top K" if include_extra_sink else "never masked"


def _ablation_section(doc: Document, ablations: Mapping[str, dict], extra_sinks: Mapping[str, int]) -> None:
    first = next(iter(ablations.values()))
    doc.heading("Sink-masking ablation (Rulli et al. Table 1)")
    doc.paragraph(f"Score: `{first['metric']}` (higher is better). Protocol: {first['protocol']}; the top-K sinks at "
                  f"ϵ = {first['epsilon']:g} of every (layer, head) get -inf pre-softmax logits (fewer than K sinks: "
                  "only the sinks; the column \"masked keys / head\" says how many were masked per (row, layer, head) "
                  "on average). A model with an extra sink token is scored twice, with the extra sink never masked and "
                  "with it a candidate like any key. Δ = score(K) − score(0), paired over the same inputs; ± s.e. over "
                  "this run's requests (one model: no interval over training seeds).")
    header = ["model", "extra sink", "K", "score", "Δ", "± s.e. of Δ", "masked keys / head"]
    rows = []
    for label, ab in ablations.items():
        has_extra = bool(extra_sinks.get(label))
        settings = ablation_settings(ab)
        for setting in settings:
            for k in ab["k"]:
                se = (setting.get("delta_stderr") or {}).get(str(k))
                rows.append([label, _extra_sink_setting(setting["include_extra_sink"], has_extra), k,
                             _num(setting["scores"][str(k)]),
                             _num(setting["delta"][str(k)]), _num(se, 2),
                             _num(setting["masked_keys_per_head"][str(k)], 3)])
        if has_extra and len(settings) == 1:  # an older file: the other setting was not scored
            rows.append([label, _extra_sink_setting(not settings[0]["include_extra_sink"], True), "–",
                         "not measured in this run", "–", "–", "–"])
    doc.table(header, rows)


# ----------------------------------------------------------------------------- compare
def plot_ablation_curve(ablations: Mapping[str, dict], path, *, title: str | None = None,
                        extra_sinks: Mapping[str, int] | None = None) -> Path:
    """Δ score vs K, one line per model and scored setting of its extra sink (`extra_sinks`: label ->
    number of extra sink tokens, to name the setting), with ±1 s.e. bars when the ablation has them.
    The legend sits under the axes (a study compares nine models) and the title is wrapped."""

    from matplotlib.figure import Figure

    from sinkdlm.analysis.figures import save_figure

    lines = [(label, ab, setting) for label, ab in ablations.items() for setting in ablation_settings(ab)]
    metrics = sorted({ab["metric"] for ab in ablations.values()})
    fig = Figure(figsize=(7.5, 4.0 + 0.22 * len(lines)), layout="constrained")
    ax = fig.subplots()
    for label, ab, setting in lines:
        ks = [int(k) for k in ab["k"]]
        delta = _floats([(setting["delta"] or {}).get(str(k)) for k in ks])
        se = _floats([((setting.get("delta_stderr") or {}).get(str(k))) for k in ks])
        which = "" if not (extra_sinks or {}).get(label) else (
            ", extra sink masked" if setting["include_extra_sink"] else ", extra sink never masked")
        metric = f" ({ab['metric']})" if len(metrics) > 1 else ""
        ax.errorbar(ks, delta, yerr=np.nan_to_num(se), marker="o", capsize=3,
                    linestyle="--" if setting["include_extra_sink"] else "-", label=f"{label}{which}{metric}")
    ax.axhline(0.0, color="grey", lw=0.8)
    score = metrics[0] if len(metrics) == 1 else "score"
    ax.set(xlabel="K (top-K sinks masked per layer and head)", ylabel=f"Δ {score} vs K = 0\n(± 1 s.e. over requests)")
    fig.legend(loc="outside lower center", fontsize=7, ncols=2)
    if title:
        ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    return save_figure(fig, path)


def _without_extra_sink(analyses: Mapping[str, dict], extra: Mapping[str, dict]) -> str:
    """Why a comparison's extra-sink panel leaves models out: they have no extra sink token (their detected
    sinks are side by side in sink_mass_layers.png); "" when every model has one."""
    others = [k for k in analyses if k not in extra]
    if not others:
        return ""
    return (f"\n({', '.join(others)} {'has' if len(others) == 1 else 'have'} no extra sink token: "
            "the detected sinks of every model are side by side in sink_mass_layers.png)")


def write_comparison_figures(runs: Mapping[str, tuple[dict, dict | None]], out_dir: Path, scale: str) -> dict[str, str]:
    """The combined figures of `compare` into `out_dir`: `runs` is {label: (analysis, arrays or None)};
    the figures that need arrays are drawn only when every run has them. Returns {name: file}."""
    from sinkdlm.analysis import figures as F

    figs = {}
    analyses = {k: a for k, (a, _) in runs.items()}
    versus = " vs ".join(analyses)  # every comparison figure's title names the models
    curves = {k: {float(e): v for e, v in a["non_sink_fraction_by_epsilon"].items()} for k, a in analyses.items()}
    F.plot_non_sink_fraction(curves, out_dir / FIGURES["non_sink_fraction"], scale=scale,
                             mark_epsilon=next(iter(analyses.values()))["epsilon"], title=f"{versus}: non-sink fraction vs ϵ")
    figs["non_sink_fraction"] = FIGURES["non_sink_fraction"]
    plot_detected_sink_bars(analyses, out_dir / "sink_mass_layers.png",
                            title=f"{versus}: value norms and attention of the detected sinks per layer")
    figs["sink_mass_layers"] = "sink_mass_layers.png"
    extra = {k: a["extra_sink"] for k, a in analyses.items() if a["extra_sink"] is not None}
    if extra:
        F.plot_layer_bars({k: _floats(e["value_norm"]) for k, e in extra.items()},
                          {k: _floats(e["others_value_norm"]) for k, e in extra.items()},
                          {k: _floats(e["attention_mass"]) for k, e in extra.items()}, out_dir / FIGURES["layer_bars"],
                          title=f"{', '.join(extra)} (with an extra sink token): its value norm and share of "
                                "attention per layer" + _without_extra_sink(analyses, extra))
        figs["layer_bars"] = FIGURES["layer_bars"]
    arrays = {k: arr for k, (_, arr) in runs.items() if arr is not None}
    if len(arrays) == len(runs):
        F.plot_value_norm_scatter({k: v["sink_norm_sample"] for k, v in arrays.items()},
                                  {k: v["normal_norm_sample"] for k, v in arrays.items()},
                                  out_dir / FIGURES["value_norm_scatter"],
                                  title=f"{versus}: value norms, sinks vs normal tokens")
        figs["value_norm_scatter"] = FIGURES["value_norm_scatter"]
        F.plot_largest_sink_positions(
            {k: v["largest_sink_positions"] for k, v in arrays.items()}, out_dir / FIGURES["largest_sink_positions"],
            num_positions=max(a["setup"]["max_sequence_positions"] for a in analyses.values()),
            title=f"{versus}: largest sink over the steps of each generation",
            step_label={k: step_name(a) for k, a in analyses.items()})
        figs["largest_sink_positions"] = FIGURES["largest_sink_positions"]
        if all("attention_maps" in v for v in arrays.values()):
            maps = [v["attention_maps"] for v in arrays.values()]
            titles = [[f"L{int(v['attention_map_layer_head'][0])} H{int(v['attention_map_layer_head'][1])} "
                       f"{step_name(analyses[k]).split(' (')[0]} {int(s)}" for s in v["attention_map_steps"]]
                      for k, v in arrays.items()]
            marks = [_map_marks(analyses[k], v["attention_maps"].shape[-1]) for k, v in arrays.items()]
            F.plot_attention_maps(maps, titles, out_dir / FIGURES["attention_maps"], row_labels=list(arrays),
                                  sink_positions=[m[0] for m in marks], prompt_end=[m[1] for m in marks],
                                  note=HEAD_CHOICE, title=f"{versus}: attention maps")
            figs["attention_maps"] = FIGURES["attention_maps"]
    ablations = {k: a["ablation"] for k, a in analyses.items() if a["ablation"] is not None}
    if ablations:
        plot_ablation_curve(ablations, out_dir / "ablation_curve.png", title=f"{versus}: sink-masking curve",
                            extra_sinks={k: a["model"]["num_sink_tokens"] for k, a in analyses.items()})
        figs["ablation_curve"] = "ablation_curve.png"
    outliers = {k: a["outliers"] for k, a in analyses.items() if a.get("outliers")}
    if outliers:
        outliers_report.plot_outliers(outliers, out_dir / outliers_report.FIGURE,
                                      title=f"{' vs '.join(outliers)}: activation outliers per layer")
        figs["outliers"] = outliers_report.FIGURE
    return figs


def write_comparison_report(analyses: dict[str, dict], sink_mass: dict[str, float | None], figs: dict[str, str],
                            out_dir: Path) -> tuple[Path, Path]:
    """report.md and report.html of `compare` (its figures already written); `sink_mass`: each run's
    attention on detected sinks, mean over layers."""
    return _compare_doc(analyses, sink_mass, figs, Path(out_dir)).write(out_dir)


def _compare_doc(analyses: dict[str, dict], sink_mass: dict[str, float | None], figs: dict[str, str],
                 out_dir: Path) -> Document:
    labels = list(analyses)
    doc = Document("Attention-sink analysis: " + " vs ".join(labels))
    for label, a in analyses.items():
        doc.paragraph(f"**{label}**: " + _setup_text(a))
    doc.heading("Side by side")
    get = {
        "model kind": lambda k, a: a["model"].get("kind", "diffusion (bidirectional)"),
        "extra sink tokens": lambda k, a: str(a["model"]["num_sink_tokens"]),
        "non-sink fraction at ϵ": lambda k, a: _pct(a["non_sink_fraction"]),
        "attention on detected sinks (mean over layers)": lambda k, a: _pct(sink_mass[k]),
        "value norm, sink tokens": lambda k, a: _num(a["value_norm"]["sink_mean"], 3),
        "value norm, normal tokens": lambda k, a: _num(a["value_norm"]["normal_mean"], 3),
        "largest sink moves": lambda k, a: _pct(a["moving"]["mean"]["largest_sink_change_rate"]),
        "sink set changes (content keys)": lambda k, a: _pct(a["moving"]["mean"].get("content_sink_set_change_rate")),
        "Jaccard of consecutive sink sets (content keys)": lambda k, a: _num(a["moving"]["mean"].get("content_sink_set_jaccard"), 3),
        "sink set changes (every key)": lambda k, a: _pct(a["moving"]["mean"]["sink_set_change_rate"]),
        "Jaccard of consecutive sink sets (every key)": lambda k, a: _num(a["moving"]["mean"]["sink_set_jaccard"], 3),
        "attention on the extra sink": lambda k, a: _pct((a["extra_sink"] or {}).get("mean_attention_mass")),
        "heads whose largest sink is the extra sink": lambda k, a: _pct(a["moving"]["mean"].get("extra_sink_share")),
        "attention on the virtual sink column": lambda k, a: _pct((a.get("virtual_sink") or {}).get("mean_attention_mass")),
        "sinks on [MASK] tokens": lambda k, a: _pct(a["sink_token_types"]["shares"].get("mask")),
        **{f"max ‖{outliers_report.TITLES[kind]}‖∞ over layers, {group}": (
            lambda k, a, kind=kind, group=group: _num(outliers_report.max_over_layers(a["outliers"], kind, group), 3)
            if a.get("outliers") else "–") for kind in ("ffn", "residual") for group in ("content", "sink")},
    }
    doc.table(["quantity", *labels], [[name, *(f(k, analyses[k]) for k in labels)] for name, f in get.items()])
    doc.heading("Non-sink fraction vs ϵ")
    eps = list(next(iter(analyses.values()))["non_sink_fraction_by_epsilon"])
    doc.table(["model", *eps], [[k, *(_pct(a["non_sink_fraction_by_epsilon"].get(e)) for e in eps)]
                                for k, a in analyses.items()])
    doc.heading("Attention on detected sinks per layer")
    n_layers = max(len(a["sink_attention_mass"]) for a in analyses.values())
    doc.table(["layer", *labels], [[i, *(_pct(a["sink_attention_mass"][i]) if i < len(a["sink_attention_mass"])
                                         else "–" for a in analyses.values())] for i in range(n_layers)])
    ablations = {k: a["ablation"] for k, a in analyses.items() if a["ablation"] is not None}
    if ablations:
        _ablation_section(doc, ablations, {k: a["model"]["num_sink_tokens"] for k, a in analyses.items()})
        ks = sorted({int(k) for ab in ablations.values() for k in ab["k"]} - {0})
        doc.heading("Masking curve: Δ score vs K")
        doc.paragraph("Δ = score(K) − score(0) of each model's own metric, paired over the same requests (per-token "
                      "continuation ELBO for a diffusion model, exact per-token log-likelihood for an autoregressive "
                      "one: different units, so models of different kinds are not compared by these numbers). Each "
                      "row is one model's run; the ± s.e. in the table above is over its requests, with no interval "
                      "over training seeds (the experiment report has those).")
        doc.table(["model", "metric", "extra sink", *(f"K = {k}" for k in ks)],
                  [[label, ab["metric"], _extra_sink_setting(setting["include_extra_sink"], bool(analyses[label]["model"]["num_sink_tokens"])),
                    *(_num((setting["delta"] or {}).get(str(k))) for k in ks)]
                   for label, ab in ablations.items() for setting in ablation_settings(ab)])
    outliers = {k: a["outliers"] for k, a in analyses.items() if a.get("outliers")}
    if outliers:
        outliers_report.outlier_section(doc, outliers)
    doc.heading("Figures")
    captions = {**FIGURE_CAPTIONS, "sink_mass_layers": "Per layer, every model: value norm of detected sinks vs "
                "normal tokens, and the share of attention on detected sinks.",
                "layer_bars": "Models with an extra sink token: its value norm vs the other tokens and its share "
                "of attention per layer (One-Token Fig. 3).",
                "ablation_curve": "Sink-masking ablation (Rulli et al. Table 1): Δ score = score(K) − score(K = 0) "
                "of each model's own metric when its top-K sinks are masked in every layer and head, one line per "
                "model (and per extra-sink setting); error bars ± 1 s.e. over that run's requests, not an interval "
                "over training seeds. An AR model's log-likelihood and a DLM's ELBO are different units."}
    for name, file in figs.items():
        doc.image(out_dir / file, captions[name].format(step="step"))
    return doc
