"""The variance split of a paired `val_loss` difference: training seed vs validation noise (docs/method.md §7).

Every run of a study is scored on the same sequences with the same masks (the fixed validation), so the
difference of two runs on one seed, `d_s = mean_{n,d} (a_snd - b_snd)`, carries the Monte-Carlo noise of
the *difference* only: its standard error is `stratified_se(a_s - b_s)`, small when the two models err
alike on the same masked inputs. Over seeds,

    Var(d_s) = σ²_train + SE²_val,      SE²_val = mean_s stratified_se(a_s - b_s)²,

so `σ²_train = Var(d_s) - SE²_val` is what training seeds (data order, noise, new parameters) add. The
sample variance of S seeds has S - 1 degrees of freedom; its 95 % interval is the chi-square one,
(S - 1) s² / χ²_{S-1}. Sizing for the whole validation set scales the noise term by the sequences
scored: `Var_full = σ²_train + SE²_val · N_scored / N_full` (the noise of independent sequences).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from sinkdlm.diffusion.likelihood import stratified_se
from sinkdlm.experiment.packed import read_run_json
from sinkdlm.experiment.presets import Validation
from sinkdlm.experiment.summary import TARGET_MDE, seeds_for_mde
from sinkdlm.stats import MDE_POWER, minimum_detectable_effect
from sinkdlm.stats import mean_interval, paired_difference

VAL = "val.json"  # a run's fixed validation (docs/method.md §1)
VAL_PARTIAL = "val.partial.json"  # the sequences scored so far, while it runs


def variance_split(a: Mapping[str, Sequence], b: Mapping[str, Sequence], *, full_sequences: int | None = None,
                   target: float = TARGET_MDE, confidence: float = 0.95) -> dict[str, Any]:
    """Split the per-seed spread of `mean(a - b)` into training seed and validation noise.

    `a`, `b`: `{seed: values [N, D]}` of two variants (the fixed validation's per-sequence, per-draw
    values), the same seeds and the same N x D on both sides (the first N sequences of the set).
    `full_sequences`: the sequences of the whole validation set, for the projected sizing (default N).
    Returns the paired difference (interval over seeds, its MDE), the variance components with the
    chi-square interval of the total, and the seeds the `target` MDE needs at the point estimate and at
    the interval's upper end.
    """
    seeds = sorted(a, key=str)
    if sorted(b, key=str) != seeds:
        raise ValueError(f"variance_split needs the same seeds on both sides, got {sorted(a)} and {sorted(b)}")
    va = {s: torch.as_tensor(a[s], dtype=torch.float64) for s in seeds}
    vb = {s: torch.as_tensor(b[s], dtype=torch.float64) for s in seeds}
    shapes = {tuple(v.shape) for v in (*va.values(), *vb.values())}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"variance_split needs [N, D] values of one shape for every run, got {sorted(shapes)}")
    n_seq, draws = next(iter(shapes))
    full = n_seq if full_sequences is None else int(full_sequences)
    diffs = [float((va[s] - vb[s]).mean()) for s in seeds]
    se_diff = [stratified_se(va[s] - vb[s]) for s in seeds]  # MC error of each seed's difference (shared noise)
    se_run = [stratified_se(v) for v in (*va.values(), *vb.values())]  # each run's own MC error, for reference
    interval = paired_difference(diffs, [0.0] * len(diffs), confidence)
    n = len(seeds)
    out: dict[str, Any] = {
        "seeds": n, "sequences": n_seq, "full_sequences": full, "draws": draws, "target": target, "power": MDE_POWER,
        "per_seed": dict(zip(map(str, seeds), diffs)), "difference": interval.to_dict(),
        "validation_se_diff": math.sqrt(sum(x * x for x in se_diff) / n),
        "validation_se_run_max": max(se_run),
    }
    if n < 2:
        return out
    from scipy import stats as st

    var_total = float(torch.tensor(diffs, dtype=torch.float64).var())  # ddof 1
    var_val = out["validation_se_diff"] ** 2
    alpha = 1 - confidence
    var_low = (n - 1) * var_total / float(st.chi2.ppf(1 - alpha / 2, n - 1))
    var_high = (n - 1) * var_total / float(st.chi2.ppf(alpha / 2, n - 1))
    scale = n_seq / full  # the noise term at the whole set

    def sd_full(v: float) -> float:
        return math.sqrt(max(v - var_val, 0.0) + var_val * scale)

    mde = minimum_detectable_effect(math.sqrt(var_total / n), n - 1) if var_total > 0 else None
    out.update({
        "var_total": var_total, "var_total_interval": [var_low, var_high], "var_validation": var_val,
        "var_train": max(var_total - var_val, 0.0),
        "sd_train_interval": [math.sqrt(max(var_low - var_val, 0.0)), math.sqrt(max(var_high - var_val, 0.0))],
        "mde": mde if mde is not None and math.isfinite(mde) else None,
        "sd_full": sd_full(var_total),
        "seeds_for_target": seeds_for_mde(sd_full(var_total), target, alpha=alpha),
        "seeds_for_target_upper": seeds_for_mde(sd_full(var_high), target, alpha=alpha),
    })
    return out


def validation_key(validation: Validation) -> dict[str, int | bool]:
    """What two fixed validations must share to be paired: the draws, the noise seed and the precision."""
    return {"draws": validation.draws, "noise_seed": validation.noise_seed, "bf16": validation.bf16}


def same_validation(key: Mapping[str, Any], validation: Validation) -> bool:
    """Whether a stored validation (its record, or a partial file's key) was scored with `validation`'s noise
    and precision (a record without `bf16` predates the field: fp32)."""
    stored = {k: key.get(k) for k in validation_key(validation)}
    stored["bf16"] = bool(stored["bf16"])
    return stored == validation_key(validation)


def validation_values(run_dir: Path, validation: Validation | None = None) -> list[list[float]]:
    """The fixed validation's per-sequence, per-draw values scored so far in `run_dir` ([N][D]; [] when none):
    the finished `val.json`'s, else the interrupted `val.partial.json`'s (`validation`: only when scored
    with its draws and noise_seed)."""
    for name in (VAL, VAL_PARTIAL):
        path = run_dir / name
        if path.is_file():
            record = read_run_json(path) if name == VAL else json.loads(path.read_text())  # a packed study's too
            key = record if name == VAL else record.get("key", {})
            if validation is not None and not same_validation(key, validation):
                return []
            return record.get("values") or []
    return []


def validation_seconds(run_dir: Path) -> float | None:
    """The scoring time spent on the fixed validation in `run_dir` so far (the finished `val.json`'s, else the
    interrupted `val.partial.json`'s; None when neither says)."""
    for name in (VAL, VAL_PARTIAL):
        if (run_dir / name).is_file():
            return json.loads((run_dir / name).read_text()).get("seconds")
    return None


def _scored_in_common(scored: Mapping[int, int]) -> tuple[int, list[int]]:
    """(N, seeds): the most sequences that every model of a seed has scored, and the seeds at N. A study scores
    one model at a time, so the seeds ahead are compared on their N sequences and the rest wait."""
    common = max(scored.values(), default=0)
    return common, [s for s, n in scored.items() if n == common]


def val_loss_splits(out: Path, pairs: list[tuple[str, str]], seeds: list[int], validation: Validation,
                    full_sequences: int | None = None) -> list[dict[str, Any]]:
    """Per compared pair, `variance_split` of the paired val_loss difference, read from
    `out/runs/<variant>-s<seed>/`: on the seeds whose two runs have scored the most sequences in common so
    far, over those sequences (the whole set once any seed's pair is finished, as a study that finishes one
    model at a time has it; none scored: the pair is left out). `full_sequences`: the whole validation
    set's sequences, for the projected sizing (default: those scored)."""
    splits = []
    for a, b in pairs:
        vals = {(v, s): validation_values(out / "runs" / f"{v}-s{s}", validation) for v in (a, b) for s in seeds}
        common, used = _scored_in_common({s: min(len(vals[a, s]), len(vals[b, s])) for s in seeds})
        if common == 0:
            continue
        split = variance_split({str(s): vals[a, s][:common] for s in used}, {str(s): vals[b, s][:common] for s in used},
                               full_sequences=full_sequences or common)
        splits.append({"pair": [a, b], **split})
    return splits


def head_start_splits(out: Path, pairs: list[tuple[str, str]], seeds: list[int], validation: Validation | None,
                      step0_dirs: Mapping[tuple[str, int], Path]) -> list[dict[str, Any]]:
    """From an AR initialisation, per compared pair and on the sequences scored so far: the step-0 gap
    `mean(a0 - b0)` (the converted models before training) and the training effect
    Δ_train = `mean((aT - a0) - (bT - b0))`, per seed and as a raw t interval over seeds (no verdict: the
    report's `primary` decides). Read from `out/runs/<variant>-s<seed>/` and `step0_dirs[(variant, seed)]`
    (the seed's step-0 control, `plan.step0_name`): on the seeds where all four have scored the most
    sequences in common (a pair with none is left out), as `val_loss_splits` does for the end values."""
    splits = []
    for a, b in pairs:
        vals = {}
        for s in seeds:
            for v in (a, b):
                vals[v, "T", s] = validation_values(out / "runs" / f"{v}-s{s}", validation)
                vals[v, 0, s] = validation_values(step0_dirs[v, s], validation) if (v, s) in step0_dirs else []
        common, used = _scored_in_common({s: min(len(vals[v, k, s]) for v in (a, b) for k in ("T", 0)) for s in seeds})
        if common == 0:
            continue
        t = {key: torch.as_tensor(x[:common], dtype=torch.float64) for key, x in vals.items() if key[2] in used}
        gap0 = {str(s): float((t[a, 0, s] - t[b, 0, s]).mean()) for s in used}
        change = {str(s): float(((t[a, "T", s] - t[a, 0, s]) - (t[b, "T", s] - t[b, 0, s])).mean()) for s in used}
        splits.append({"pair": [a, b], "seeds": len(used), "sequences": common,
                       "step0_gap": {"per_seed": gap0, **mean_interval(list(gap0.values())).to_dict()},
                       "training_effect": {"per_seed": change, **mean_interval(list(change.values())).to_dict()}})
    return splits
