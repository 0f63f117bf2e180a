"""The last stages of `sinkdlm experiment`: results.json from what each model left on disk, then the report.

`results_header` is what the run is, written down before any work (the machine as it starts); `collect_records`
reads every variant's and run's record back from its directory (val.json, eval.json, analysis/, the metrics
log: no checkpoint needed, so a study committed without its weights reports on any machine);
`compare_analyses` puts the first seed's analyses side by side; `summarise_results` adds the timing and the
statistics (`summary.summarise`); `write_results` writes results.json, report.md and report.html.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from sinkdlm.config.fields import non_default_fields
from sinkdlm.experiment.endpoints import ENDPOINTS
from sinkdlm.experiment.endpoints.sinks.stats import analysis_record
from sinkdlm.experiment.plan import ExperimentPlan, draws_at_conversion, log, step0_name
from sinkdlm.experiment.presets import Variant
from sinkdlm.experiment.stages import Session, Units
from sinkdlm.experiment.units import Unit
from sinkdlm.experiment.variance import VAL, val_loss_splits
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.machine import machine_info
from sinkdlm.training.rundir import grad_norm_peaks, read_metrics


def mark_started(plan: ExperimentPlan) -> Path:
    """OUT/STARTED.json: the experiment's first start, kept on disk, since a resumed experiment's real elapsed
    time spans several invocations (docs/method.md §7: a report states what the experiment cost)."""
    started = plan.out / "STARTED.json"
    if not started.is_file():
        atomic_write_json(started, {"time": time.time(), "preset": plan.preset.name})  # another preset is refused
    return started


def results_header(plan: ExperimentPlan) -> dict[str, Any]:
    """results.json before any record: the preset, seeds, machine, shared settings and the declared endpoints."""
    from sinkdlm.diffusion.likelihood import VALIDATION_ESTIMATOR

    preset = plan.preset
    return {
        "preset": preset.name, "description": preset.description, "seeds": list(plan.seeds), "variants": {},
        "machine": machine_info(),
        "train": {**non_default_fields(preset.train), **({"max_steps": plan.max_steps} if plan.max_steps else {})},
        "eval_tasks": preset.eval_tasks + list(preset.lm_eval_tasks), "eval_limit": preset.evaluation.limit,
        # the resolved analysis settings, recorded for every run
        "analysis_settings": {"num_prompts": preset.analysis.num_prompts, **preset.analysis.settings()},
        "validation": {"tokens": None, "draws": preset.validation.draws, "noise_seed": preset.validation.noise_seed,
                       "estimator": VALIDATION_ESTIMATOR, "bf16": preset.validation.bf16},
        "declared": preset.declared(),  # the endpoints fixed before the run (experiment/endpoints/)
        "analysis_prompts": {"extractor": "sinkdlm.analysis.prompts_from_documents", "corpus": "shakespeare validation",
                             "prompt_length": preset.analysis.prompt_length, "seed": 0},
        # a sink added after pretraining: the model every arm continued from, and what each arm trained
        **({"base": {"train": non_default_fields(preset.base.train), "checkpoint": plan.init_from}}
           if preset.base is not None else {}),
        **({"variant_train": {v.name: v.train for v in preset.variants if v.train}}
           if any(v.train for v in preset.variants) else {}),
    }


def collect_records(plan: ExperimentPlan, units: Units, results: dict[str, Any]) -> dict[str, Path]:
    """Every variant's record into `results["variants"]` and the comparisons' variance splits; returns the
    first seed's analysis directory of each analysed variant, by label."""
    analysis_dirs: dict[str, Path] = {}
    for variant in plan.preset.variants:
        step0 = control_record(plan, units, variant)
        per_seed: dict[str, Any] = {}
        for unit in units.runs[variant.name]:
            per_seed[str(unit.seed)] = record = run_record(plan, unit)
            if "analysis_dir" in record and unit.seed == plan.first_seed:
                analysis_dirs[variant.label] = Path(record["analysis_dir"])
            results["validation"]["tokens"] = json.loads((unit.dir / VAL).read_text())["tokens"]
        results["variants"][variant.name] = {"label": variant.label, "switches": variant.switches, "seeds": per_seed}
        if variant.train:  # what this arm trains (`trainable`), for the report's cost line
            results["variants"][variant.name]["train"] = variant.train
        if step0 is not None:
            results["variants"][variant.name]["step0"] = step0
    results["val_loss_splits"] = val_loss_splits(plan.out, plan.compared, list(plan.seeds), plan.preset.validation)
    return analysis_dirs


def control_record(plan: ExperimentPlan, units: Units, variant: Variant) -> dict[str, Any] | None:
    """A variant's step-0 record (from an AR checkpoint): the first seed's control, which is the analysed one."""
    if not plan.init_from:
        return None
    u0 = units.controls[step0_name(variant, plan.first_seed)]
    val0 = json.loads((u0.dir / VAL).read_text())
    step0 = {"checkpoint": u0.ckpt, "val_loss": val0["val_loss"], "val_loss_se": val0["val_loss_se"],
             "per_seed": draws_at_conversion(variant)}
    adir0 = u0.dir / "analysis"
    if not plan.skip_analysis:
        step0["analysis_dir"] = str(adir0)
        step0["analysis"] = analysis_record(json.loads((adir0 / "analysis.json").read_text()))
    return step0


def run_record(plan: ExperimentPlan, unit: Unit) -> dict[str, Any]:
    """One run's record: its fixed validation and curve, training, escape, fine-tuning, scores and analysis."""
    run, summary = unit.dir, unit.summary
    curve = read_val_curve(run / "train")
    train_val_loss = summary["last"].get("val_loss")
    if train_val_loss is None and curve:  # a run resumed at its last step logs no new validation
        train_val_loss = curve[-1][1]
    val = json.loads((run / VAL).read_text())
    record: dict[str, Any] = {
        "checkpoint": unit.ckpt, "val_loss": val["val_loss"], "val_loss_se": val["val_loss_se"],
        "train_val_loss": train_val_loss,
        "train_tokens_per_s": summary["last"].get("tokens_per_s"), "train_seconds": summary.get("seconds"),
        "curve": curve,
        # the largest pre-clip gradient norm of the whole run: the moving sink's spikes (docs/method.md §5)
        "train_grad_norm_peak": max((g for _, g in grad_norm_peaks(read_metrics(run / "train"))), default=None),
    }
    for endpoint in ENDPOINTS:  # what an endpoint measured as the run trained (the escape probe)
        measured = endpoint.record(plan.preset, run)
        if measured is not None:
            record[endpoint.name] = measured
    if summary.get("retrained"):
        record["retrained"] = summary["retrained"]
    if unit.sft is not None:
        record["sft_checkpoint"] = unit.sft["checkpoint"]
        record["sft_val_loss"] = unit.sft["last"].get("val_loss")
    record["eval"] = json.loads((run / "eval.json").read_text())
    if plan.analysed(unit.seed):
        record["analysis_dir"] = str(run / "analysis")
        record["analysis"] = analysis_record(json.loads((run / "analysis" / "analysis.json").read_text()))
    if plan.init_from:
        val0 = json.loads((plan.out / "step0" / step0_name(unit.variant, unit.seed) / VAL).read_text())
        record["step0"] = {"val_loss": val0["val_loss"], "val_loss_se": val0["val_loss_se"]}
        # the run's change from its own start: what training did, apart from where it started
        record["val_loss_change"] = val["val_loss"] - val0["val_loss"]
    record["val_curve"] = val_curve(plan, unit, val, record.get("step0"))
    record["seconds"] = unit.timing
    return record


def val_curve(plan: ExperimentPlan, unit: Unit, val: dict[str, Any], step0: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fixed validation at the declared steps (`Validation.checkpoints`), the step-0 control first (from an
    AR checkpoint), the run's last step (`val`) last."""
    curve = [{"step": 0, **step0}] if step0 is not None else []
    for s in plan.preset.validation.curve_steps(plan.steps)[:-1]:
        path = unit.dir / "curve" / f"step-{s}" / VAL
        if path.is_file():
            v = json.loads(path.read_text())
            curve.append({"step": s, "val_loss": v["val_loss"], "val_loss_se": v["val_loss_se"]})
    curve.append({"step": plan.steps, "val_loss": val["val_loss"], "val_loss_se": val["val_loss_se"]})
    return curve


def compare_analyses(s: Session, analysis_dirs: dict[str, Path], results: dict[str, Any]) -> None:
    """The side-by-side analysis report of the first seed's models (OUT/compare/), where two or more were analysed."""
    if len(analysis_dirs) <= 1:
        return
    from sinkdlm.analysis import compare

    t0 = time.perf_counter()
    compare(analysis_dirs, s.plan.out / "compare")
    s.stage_seconds["analysis"] += time.perf_counter() - t0
    results["compare_dir"] = str(s.plan.out / "compare")


def summarise_results(s: Session, results: dict[str, Any]) -> None:
    """The timing, then the statistics (`summary.summarise`, every endpoint's among them)."""
    from sinkdlm.experiment.summary import summarise

    plan = s.plan
    results["comparison_pairs"] = [list(p) for p in plan.compared]
    results["stage_seconds"] = s.stage_seconds
    results["elapsed_s"] = time.perf_counter() - s.t_start
    results["timing"] = run_timing_summary(results, time.time() - json.loads(s.started.read_text())["time"])
    # after the timing: the report's sizing prices seeds at the measured compute per run
    summarise(results, plan.pairs, seeds_declared=list(plan.study.seeds))


def write_results(plan: ExperimentPlan, results: dict[str, Any]) -> None:
    """OUT/results.json, then report.md and report.html from it."""
    from sinkdlm.experiment.report import write_report

    atomic_write_json(plan.out / "results.json", results)
    write_report(results, plan.out)
    log(f"done in {results['elapsed_s'] / 60:.1f} min: report at {plan.out / 'report.md'} and {plan.out / 'report.html'}")


def run_timing_summary(results: dict[str, Any], since_start_s: float) -> dict[str, Any]:
    """Compute (every run's measured stage seconds summed, whichever invocation measured them) and
    the real elapsed time since the experiment's first start, as results.json records them."""
    recs = [rec for v in results["variants"].values() for rec in v["seeds"].values()]
    secs = [rec.get("seconds") or {} for rec in recs]
    train = [t["train"] for t in secs if isinstance(t.get("train"), (int, float))]
    parts = [k for k in ("train", "sft", "validation", "eval", "analysis") if any(isinstance(t.get(k), (int, float)) for t in secs)]
    return {
        "compute_s": sum(v for t in secs for v in t.values() if isinstance(v, (int, float))),
        "compute_parts": parts, "runs": len(recs), "runs_timed": sum(bool(t) for t in secs),
        "run_train_s": {"min": min(train, default=None), "median": statistics.median(train) if train else None,
                        "max": max(train, default=None)},
        "elapsed_s": since_start_s, "last_invocation_s": results["elapsed_s"],
        "note": None if all(secs) else "some runs' stage seconds were not recorded (finished before timing was kept)",
    }


def read_val_curve(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["val_loss"]) for r in read_metrics(run_dir) if "val_loss" in r]
