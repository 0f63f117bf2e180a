"""`sinkdlm experiment`: train every variant under one budget and seeds, evaluate, analyse, report.

    OUT/runs/<variant>-s<seed>/train/     training run (metrics.jsonl, checkpoints/), DONE.json when finished
    OUT/runs/<variant>-s<seed>/sft/       (presets with SFT) fine-tuning run on `arithmetic`
    OUT/runs/<variant>-s<seed>/eval.json  task scores with standard errors
    OUT/runs/<variant>-s0/analysis/       attention-sink analysis of the first seed's model
    OUT/compare/                          side-by-side analysis report
    OUT/runs/<variant>-s<seed>/timing.json  seconds of each stage of the run, measured once
    OUT/STARTED.json                      when the experiment first started (its real elapsed time)
    OUT/results.json, OUT/report.md, OUT/report.html

Running the same command again resumes: a finished stage (its marker file exists) is skipped,
and an interrupted training run continues from its newest checkpoint (exact resume). One model is
finished before the next starts (docs/method.md §7), so a study directory committed without its
weights resumes on a new machine, retraining (bitwise, checked) only a run with measurements to make.

`run_experiment` is the list of the stages: the input checks and what --out holds first, before any work;
then the plan (`experiment/plan.py`) drives the measuring stages (`experiment/stages.py`: conversion and
step-0 controls, each run's train -> validate -> evaluate -> analyse, the pages) and the records, summary
and report (`experiment/records.py`). What is done to one model is in `experiment/units.py`.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from sinkdlm.config.commands import ExperimentConfig
from sinkdlm.experiment.endpoints import ENDPOINTS
from sinkdlm.experiment.plan import ExperimentPlan, log, make_plan
from sinkdlm.experiment.presets import ExperimentPreset
from sinkdlm.experiment.records import (collect_records, compare_analyses, mark_started, results_header,
                                        summarise_results, write_results)
from sinkdlm.experiment.stages import (Session, measure_controls, measure_runs, prepare_units, run_measured,
                                      train_base, train_run)
from sinkdlm.experiment.variance import VAL
from sinkdlm.io.files import ensure_writable_dir
from sinkdlm.training.rundir import TrainingStopped


# what each option a preset may need (`ExperimentPreset.needs`) is, for a plan that names the missing ones
NEEDED = {"init_from": "--init-from PATH (an autoregressive checkpoint)", "data": "--data (local FineWeb files)",
          "gsm8k": "--gsm8k DIR (GSM8K's train.jsonl and test.jsonl)"}


def missing_inputs(preset: ExperimentPreset, init_from: str | None, data: str | None, gsm8k: str | None) -> list[str]:
    """The options the preset needs that were not given, in its order (`check_inputs` refuses each)."""
    given = {"init_from": init_from, "data": data, "gsm8k": gsm8k}
    return [name for name in preset.needs if not given[name]]


def check_inputs(preset: ExperimentPreset, out: Path, init_from: str | None, data: str | None,
                 gsm8k: str | None = None) -> None:
    """Every user error, before any work."""
    ensure_writable_dir(out)
    missing = missing_inputs(preset, init_from, data, gsm8k)
    if "init_from" in missing:
        raise ValueError(
            f"preset {preset.name!r} starts from an autoregressive checkpoint: pass --init-from PATH, a local "
            "Hugging Face Qwen2.5-0.5B directory (config.json + *.safetensors) or a .gguf; nothing is downloaded here"
        )
    if init_from:
        from sinkdlm.checkpoint.manager import open_source

        source = open_source(init_from, flag="init_from")  # a missing or unreadable model: one line, now
        if preset.base is not None:  # a sink added after pretraining: the user's DLM stands for the base
            if source.is_autoregressive:
                raise ValueError(f"--init-from {init_from} is an autoregressive model; preset {preset.name!r} continues "
                                 "a diffusion LM (sinkdlm, LLaDA or Dream): convert it first (`sinkdlm convert`), or "
                                 "leave --init-from out to train the preset's own base")
        elif not source.is_autoregressive and source.fmt != "sinkdlm":
            raise ValueError(f"--init-from {init_from} is a {source.fmt!r} diffusion model; expected an "
                             "autoregressive Qwen2/LLaMA checkpoint (a directory or a .gguf)")
    if "data" in preset.needs:
        if "data" in missing:
            raise ValueError(
                f"preset {preset.name!r} trains on FineWeb: pass --data with local FineWeb files (.parquet/.jsonl "
                "or a folder of them), or hf:HuggingFaceFW/fineweb:sample-10BT where the hub is reachable"
            )
        if not data.startswith("hf:") and not Path(data).exists():
            raise ValueError(f"--data {data} does not exist")
    if "gsm8k" in preset.needs:
        if "gsm8k" in missing:
            raise ValueError(
                f"preset {preset.name!r} fine-tunes and scores on GSM8K (the paper's Table 2): pass --gsm8k DIR, a local "
                "folder with the published train.jsonl and test.jsonl (question/answer per line)"
            )
        for split in ("train", "test"):
            if not (Path(gsm8k) / f"{split}.jsonl").is_file():
                raise ValueError(f"--gsm8k {gsm8k}: {split}.jsonl is missing; the folder must hold train.jsonl and test.jsonl")


def run_experiment(config: ExperimentConfig, *, skip_analysis: bool = False,
                   resume_command: str | None = None) -> dict[str, Any]:
    """Run the experiment an `ExperimentConfig` describes (its preset, out, seeds, ...: the settings of
    `sinkdlm experiment`); re-running the same config resumes.

    `resume_command`: what an interrupted training stage tells the user to run (the CLI's command).
    `config.variants`/`config.seeds`: run only these of the preset's variants and seeds, e.g. one job's run;
    a last call without them finds every stage done and writes the report. `config.launcher` local or slurm:
    each run, control and the report become submitit jobs (`experiment/launch.py`), each calling this with
    its `config.part`: base (the base model), train (every rank of a multi-process run: training only), runs,
    controls, or report (from what is on disk, naming the runs that are missing)."""
    config.check()  # the launch settings (config/launch.py), --part among them: one line each
    if config.launched() and not config.dry_run:  # sbatch on the PATH, the sbatch keys, the GPUs: before --out
        from sinkdlm.experiment.launch import check_launch

        check_launch(config)
    plan = make_plan(config, skip_analysis=skip_analysis)  # every input check that reads no file
    for endpoint in ENDPOINTS:  # what a declared endpoint needs here (torchao for the quantized scorings)
        endpoint.check(plan.preset, plan.device)
    if config.dry_run:  # the plan only (`describe_experiment`): nothing trained or written
        return {"dry_run": True, "plan": describe_experiment(config)}
    from sinkdlm.io.out_dir import check_out, writing_out

    # what --out holds, before any work: the same preset's experiment is resumed, anything else refused
    mode = check_out(plan.out, "experiment", overwrite=config.overwrite, resumable=True, preset=plan.preset.name,
                     inputs=(plan.init_from, plan.data, plan.gsm8k))
    if mode == "replace":  # the old one set aside while the new one runs, put back if it fails
        stopped = None
        with writing_out(plan.out, mode, "experiment", lock=False, in_place=True):
            try:
                result = run_experiment(dataclasses.replace(config, overwrite=False), skip_analysis=skip_analysis,
                                        resume_command=resume_command)
            except TrainingStopped as e:  # resumable where it is: kept
                stopped = e
        if stopped is not None:
            raise stopped
        return result
    plan = checked_inputs(plan)
    if config.launched():  # every run a submitit job (local or Slurm), each calling this with its part
        from sinkdlm.experiment.launch import launch_experiment

        return launch_experiment(config, run_experiment)
    with writing_out(plan.out, mode, "experiment", lock=False):  # --out keeps its record of what it wrote
        return _run_part(plan, resume_command, config.part)


def _run_part(plan: ExperimentPlan, resume_command: str | None, part: str) -> dict[str, Any]:
    """The stages of `run_experiment` that `part` names, in order (all of them for "all")."""
    plan = train_base(plan, resume_command)  # stage 0: the base model every arm continues from (presets with one)
    if part == "base":
        return {}
    missing: list[str] = []
    if part == "report":  # a launched study's last job: the report over the runs that ended measured
        plan, missing = measured_only(plan)
    results = results_header(plan)
    session = Session(plan, resume_command, tty=sys.stderr.isatty(), started=mark_started(plan))
    units = prepare_units(plan)  # stage 1: conversion and the step-0 controls
    if part == "train":  # every rank of one run on several processes: FSDP2/DDP training (rank 0 scores)
        for unit in units.ordered:
            train_run(session, unit, distributed=True)
        return {}
    # the report's call finds its seeds measured: these stages only read each run's record back
    if part in ("all", "runs", "report"):
        measure_runs(session, units)  # stage 2: each run trained, fine-tuned, evaluated, analysed, validated
    if part in ("all", "controls", "report"):
        measure_controls(session, units)  # stage 3: the step-0 controls
    if part in ("runs", "controls"):
        return {}
    if missing:  # never dropped silently: results.json and the report name them (docs/method.md §14)
        results["missing_runs"] = missing
    analysis_dirs = collect_records(plan, units, results)  # the records, read back from disk
    compare_analyses(session, analysis_dirs, results)
    summarise_results(session, results)
    write_results(plan, results)  # results.json, report.md, report.html
    return results


def describe_experiment(config: ExperimentConfig) -> str:
    """`sinkdlm experiment --dry-run`: the plan `run_experiment(config)` would carry out, with what its --out holds
    already (runs whose measurements are all on disk, and the measured seconds of its runs that the estimate
    uses); nothing is trained or written."""
    import json

    from sinkdlm.experiment.plan import run_seconds

    plan = make_plan(config)
    finished = sum(run_measured(plan, v.name, s) for s in plan.seeds for v in plan.preset.variants)
    timings = [json.loads(t.read_text()) for t in plan.out.glob("runs/*/timing.json")]
    measured = tuple(x for t in timings if (x := run_seconds(t)) is not None)
    lines = [plan.describe(measured, finished)]
    if plan.init_from is None and plan.preset.default_init_from == "example":
        lines.append("starts from: the example model (SmolLM2-135M-Instruct GGUF, fetched and sha256-checked on the "
                     "first run unless it is cached)")
    missing = missing_inputs(plan.preset, plan.init_from, plan.data, plan.gsm8k)
    if missing:
        lines.append(f"needs: {'; '.join(NEEDED[n] for n in missing)}: the run refuses to start without "
                     f"{'it' if len(missing) == 1 else 'them'}")
    return "\n".join(lines)


def checked_inputs(plan: ExperimentPlan) -> ExperimentPlan:
    """The plan with the preset's default model in place of a missing --init-from, once every input that
    names a file has been checked (`check_inputs`) and the device too; denormals flushed before any work."""
    init_from = plan.init_from
    if init_from is None and plan.preset.default_init_from == "example":
        from sinkdlm.checkpoint.example_model import fetch_example_model

        init_from = str(fetch_example_model())  # cached after the first call; one clear line when offline
    check_inputs(plan.preset, plan.out, init_from, plan.data, plan.gsm8k)
    from sinkdlm.config.fields import check_device

    check_device(plan.device)  # "auto" is resolved where each stage places its model
    from sinkdlm.training.cpu import flush_denormals

    flush_denormals()  # before the first parallel op (conversion, validation, training): training/cpu.py
    return dataclasses.replace(plan, init_from=init_from)


def measured_only(plan: ExperimentPlan) -> tuple[ExperimentPlan, list[str]]:
    """The plan restricted to the seeds whose every run and step-0 control is measured (a comparison stays
    paired), and the runs and controls left out (a job that failed for good); none measured: one line."""
    def control_measured(name: str) -> bool:
        return (plan.out / "step0" / name / VAL).is_file()

    missing = [f"{v.name}-s{s}" for s in plan.seeds for v in plan.preset.variants if not run_measured(plan, v.name, s)]
    missing += [f"step0/{n}" for n in plan.step0_names() if not control_measured(n)]
    complete = [s for s in plan.seeds if all(run_measured(plan, v.name, s) for v in plan.preset.variants)
                and all(control_measured(n) for n in plan.step0_names(seeds=[s]))]
    if not complete:
        raise ValueError(f"no seed of {plan.out} has every run measured (missing: {', '.join(missing)}): see "
                         f"`sinkdlm experiment --status --out {plan.out}` for their logs, then submit again to resume them")
    if missing:
        log(f"the report leaves out seed(s) {', '.join(str(s) for s in plan.seeds if s not in complete)}: not every "
            f"run of them was measured ({', '.join(missing)})")
    return dataclasses.replace(plan, seeds=tuple(complete)), missing

