"""`compare`: several `analyze` outputs side by side — a diffusion LM beside an autoregressive one
(Rulli et al. Table 1), or the variants of the sink study.

Reads each directory's analysis.json and analysis_arrays.npz and writes one report (report.md,
report.html, compare.json) with combined figures: the non-sink fraction vs ϵ, detected sinks per
layer, value norms, largest-sink positions (moving sinks), attention maps and, when the runs have
the sink-masking ablation, the masking curve (Δ score vs K, docs/method.md §10). This module reads
and checks the runs; `sinkdlm.analysis.report` draws the figures and writes the document.
`redraw` draws one stored analysis again (its figures and report) from the same two files: a study
commits a run's analysis.json and arrays, and `make reports` draws the rest (CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sinkdlm.analysis.analyzer import ANALYSIS_KEYS, ARRAYS_NAME, mean_over_layers
from sinkdlm.analysis.report import write_analysis_report, write_comparison_figures, write_comparison_report, write_figures
from sinkdlm.io.atomic import atomic_write_json


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


def redraw(path: str | Path) -> Path:
    """Draw a stored `analyze` output again: its figures and report.md / report.html, from its analysis.json
    and analysis_arrays.npz (nothing is run; analysis.json is left as it is). Returns report.md's path."""
    path = Path(path)
    analysis, arrays = _read_run(path)
    if arrays is None:
        raise ValueError(f"{path / analysis.get('arrays', ARRAYS_NAME)} is missing; the figures are drawn from it")
    analysis["figures"] = write_figures(path, analysis, arrays)
    return write_analysis_report(analysis, path, sinks_per_head=mean_over_layers(analysis["sinks_per_head"]))[0]


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
    analyses = {k: a for k, (a, _) in runs.items()}
    figs = write_comparison_figures(runs, out_dir, scales.pop())
    sink_mass = {k: mean_over_layers(a["sink_attention_mass"]) for k, a in analyses.items()}
    write_comparison_report(analyses, sink_mass, figs, out_dir)
    result = {"models": list(analyses), "figures": figs, "runs": {k: str(Path(d)) for k, d in dirs.items()}}
    atomic_write_json(out_dir / "compare.json", result)
    return result
