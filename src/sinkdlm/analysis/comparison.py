"""`compare`: several `analyze` outputs side by side — a diffusion LM beside an autoregressive one
(Rulli et al. Table 1), or the variants of the sink study.

Reads each directory's analysis.json and analysis_arrays.npz and writes one report (report.md,
report.html, compare.json) with combined figures: the non-sink fraction vs ϵ, detected sinks per
layer, value norms, largest-sink positions (moving sinks), attention maps and, when the runs have
the sink-masking ablation, the masking curve (Δ score vs K, docs/method.md §10).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sinkdlm.analysis.report import (
    ANALYSIS_KEYS, ARRAYS_NAME, FIGURE_CAPTIONS, FIGURES, HEAD_CHOICE, _ablation_section, _floats, _map_marks, _num,
    _pct, _setup_text, plot_detected_sink_bars,
)
from sinkdlm.atomic import atomic_write_json
from sinkdlm.reporting import Document


def plot_ablation_curve(ablations: Mapping[str, dict], path, *, title: str | None = None) -> Path:
    """Δ score vs K, one line per model (with ±1 s.e. bars when the ablation has them)."""
    from matplotlib.figure import Figure

    from sinkdlm.analysis.figures import save_figure

    fig = Figure(figsize=(6, 3.8), layout="constrained")
    ax = fig.subplots()
    for label, ab in ablations.items():
        ks = [int(k) for k in ab["k"]]
        delta = _floats([(ab["delta"] or {}).get(str(k)) for k in ks])
        se = _floats([((ab.get("delta_stderr") or {}).get(str(k))) for k in ks])
        ax.errorbar(ks, delta, yerr=np.nan_to_num(se), marker="o", capsize=3, label=f"{label} ({ab['metric']})")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set(xlabel="K (top-K sinks masked per layer and head)", ylabel="Δ score vs K = 0")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return save_figure(fig, path)



def _read_run(path: Path) -> tuple[dict, dict | None]:
    import json

    path = Path(path)
    file = path / "analysis.json"
    if not file.is_file():
        raise ValueError(f"{file} is missing; run `sinkdlm analyze ... --out {path}` first")
    try:
        a = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from e
    missing = [k for k in ANALYSIS_KEYS if k not in a]
    if missing:
        raise ValueError(f"{file} lacks the keys {missing}; was it written by `sinkdlm analyze`?")
    arrays = None
    npz = path / a.get("arrays", ARRAYS_NAME)
    if npz.is_file():
        with np.load(npz, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    return a, arrays


def compare(dirs: Mapping[str, Path] | Sequence[Path], out_dir) -> dict:
    """Put several `analyze` outputs side by side: one report (report.md, report.html) and combined
    figures in `out_dir`. `dirs`: `{label: dir}` or a list of dirs (labelled by folder name).
    Returns `{"models": [labels], "figures": {...}, "runs": {label: dir}}` (also written as compare.json)."""
    if isinstance(dirs, (str, Path)) or len(dirs) < 2:
        raise ValueError("compare needs a list or dict of at least two analysis directories")
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not a directory")
    if isinstance(dirs, Mapping):
        runs = {str(label): _read_run(Path(d)) for label, d in dirs.items()}
    else:  # label = the model label of each run; the folder name when those collide
        loaded = [_read_run(Path(d)) for d in dirs]
        labels = [a["model"]["label"] for a, _ in loaded]
        if len(set(labels)) < len(labels):
            labels = [Path(d).resolve().name for d in dirs]
            labels = [f"{n} ({i})" if labels.count(n) > 1 else n for i, n in enumerate(labels)]
        runs = dict(zip(labels, loaded))
        dirs = dict(zip(labels, dirs))
    scales = {a["scale"] for a, _ in runs.values()}
    if len(scales) > 1:
        raise ValueError(f"the runs use different scales {sorted(scales)}; analyse them with the same --scale")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from sinkdlm.analysis import figures as F

    figs = {}
    analyses = {k: a for k, (a, _) in runs.items()}
    versus = " vs ".join(analyses)  # every comparison figure's title names the models
    curves = {k: {float(e): v for e, v in a["non_sink_fraction_by_epsilon"].items()} for k, a in analyses.items()}
    F.plot_non_sink_fraction(curves, out_dir / FIGURES["non_sink_fraction"], scale=scales.pop(),
                             mark_epsilon=next(iter(analyses.values()))["epsilon"], title=f"{versus}: non-sink fraction vs ϵ")
    figs["non_sink_fraction"] = FIGURES["non_sink_fraction"]
    plot_detected_sink_bars(analyses, out_dir / "sink_mass_layers.png", title=f"{versus}: detected sinks per layer")
    figs["sink_mass_layers"] = "sink_mass_layers.png"
    extra = {k: a["extra_sink"] for k, a in analyses.items() if a["extra_sink"] is not None}
    if extra:
        F.plot_layer_bars({k: _floats(e["value_norm"]) for k, e in extra.items()},
                          {k: _floats(e["others_value_norm"]) for k, e in extra.items()},
                          {k: _floats(e["attention_mass"]) for k, e in extra.items()}, out_dir / FIGURES["layer_bars"],
                          title=f"{versus}: the extra sink token per layer")
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
            title=f"{versus}: largest sink over denoising steps")
        figs["largest_sink_positions"] = FIGURES["largest_sink_positions"]
        if all("attention_maps" in v for v in arrays.values()):
            maps = [v["attention_maps"] for v in arrays.values()]
            titles = [[f"L{int(v['attention_map_layer_head'][0])} H{int(v['attention_map_layer_head'][1])} "
                       f"step {int(s)}" for s in v["attention_map_steps"]] for v in arrays.values()]
            marks = [_map_marks(analyses[k], v["attention_maps"].shape[-1]) for k, v in arrays.items()]
            F.plot_attention_maps(maps, titles, out_dir / FIGURES["attention_maps"], row_labels=list(arrays),
                                  sink_positions=[m[0] for m in marks], prompt_end=[m[1] for m in marks],
                                  note=HEAD_CHOICE, title=f"{versus}: attention maps")
            figs["attention_maps"] = FIGURES["attention_maps"]
    ablations = {k: a["ablation"] for k, a in analyses.items() if a["ablation"] is not None}
    if ablations:
        plot_ablation_curve(ablations, out_dir / "ablation_curve.png", title=f"{versus}: sink-masking curve")
        figs["ablation_curve"] = "ablation_curve.png"
    _compare_doc(analyses, figs, out_dir).write(out_dir)
    result = {"models": list(analyses), "figures": figs, "runs": {k: str(Path(d)) for k, d in dirs.items()}}
    atomic_write_json(out_dir / "compare.json", result)
    return result


def _compare_doc(analyses: dict[str, dict], figs: dict[str, str], out_dir: Path) -> Document:
    labels = list(analyses)
    doc = Document("Attention-sink analysis: " + " vs ".join(labels))
    for label, a in analyses.items():
        doc.paragraph(f"**{label}**: " + _setup_text(a))
    doc.heading("Side by side")
    get = {
        "model kind": lambda a: a["model"].get("kind", "diffusion (bidirectional)"),
        "extra sink tokens": lambda a: str(a["model"]["num_sink_tokens"]),
        "non-sink fraction at ϵ": lambda a: _pct(a["non_sink_fraction"]),
        "attention on detected sinks (mean over layers)": lambda a: _pct(_mean(a["sink_attention_mass"])),
        "value norm, sink tokens": lambda a: _num(a["value_norm"]["sink_mean"], 3),
        "value norm, normal tokens": lambda a: _num(a["value_norm"]["normal_mean"], 3),
        "largest sink moves": lambda a: _pct(a["moving"]["mean"]["largest_sink_change_rate"]),
        "sink set changes (content keys)": lambda a: _pct(a["moving"]["mean"].get("content_sink_set_change_rate")),
        "Jaccard of consecutive sink sets (content keys)": lambda a: _num(a["moving"]["mean"].get("content_sink_set_jaccard"), 3),
        "sink set changes (every key)": lambda a: _pct(a["moving"]["mean"]["sink_set_change_rate"]),
        "Jaccard of consecutive sink sets (every key)": lambda a: _num(a["moving"]["mean"]["sink_set_jaccard"], 3),
        "attention on the extra sink": lambda a: _pct((a["extra_sink"] or {}).get("mean_attention_mass")),
        "heads whose largest sink is the extra sink": lambda a: _pct(a["moving"]["mean"].get("extra_sink_share")),
        "attention on the virtual sink column": lambda a: _pct((a.get("virtual_sink") or {}).get("mean_attention_mass")),
        "sinks on [MASK] tokens": lambda a: _pct(a["sink_token_types"]["shares"].get("mask")),
    }
    doc.table(["quantity", *labels], [[name, *(f(analyses[k]) for k in labels)] for name, f in get.items()])
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
        _ablation_section(doc, ablations)
        ks = sorted({int(k) for ab in ablations.values() for k in ab["k"]} - {0})
        doc.heading("Masking curve: Δ score vs K")
        doc.paragraph("Δ = score(K) − score(0) of each model's own metric (per-token continuation ELBO for a "
                      "diffusion model, exact per-token log-likelihood for an autoregressive one; Rulli et al. "
                      "Table 1: masking sinks cripples an AR model and barely hurts a DLM).")
        doc.table(["model", "metric", *(f"K = {k}" for k in ks)],
                  [[label, ab["metric"], *(_num((ab["delta"] or {}).get(str(k))) for k in ks)]
                   for label, ab in ablations.items()])
    doc.heading("Figures")
    captions = {**FIGURE_CAPTIONS, "sink_mass_layers": "Per layer, every model: value norm of detected sinks vs "
                "normal tokens, and the share of attention on detected sinks.",
                "layer_bars": "Models with an extra sink token: its value norm vs the other tokens and its share "
                "of attention per layer (One-Token Fig. 3).",
                "ablation_curve": "Sink-masking ablation: change of each model's score when the top-K sinks of "
                "the previous step are masked in every layer and head (Rulli et al. Table 1)."}
    for name, file in figs.items():
        doc.image(out_dir / file, captions[name])
    return doc


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None
