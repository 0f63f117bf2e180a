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
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from sinkdlm.config.commands import ExperimentConfig, RemaskingOptions
from sinkdlm.config.fields import non_default_fields
from sinkdlm.experiment.presets import ExperimentPreset, Validation, Variant, get_preset
from sinkdlm.experiment.summary import analysis_record
from sinkdlm.experiment.variance import (VAL, VAL_PARTIAL, head_start_splits, same_validation, val_loss_splits,
                                         validation_key, validation_values)
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.files import ensure_writable_dir
from sinkdlm.checkpoint.manager import load_model_and_tokenizer
from sinkdlm.experiment.plan import heartbeat
from sinkdlm.training.rundir import METRICS_NAME, TrainingStopped, grad_norm_peaks, local_checkpoint, read_metrics

DONE = "DONE.json"
DONE_PREVIOUS = "DONE.previous.json"  # a retrained run's first summary, until it is reproduced
METRICS_PREVIOUS = "metrics.previous.jsonl"  # and its first metrics log
VAL_CHUNK = 16  # sequences per saved chunk
TARGET_SE = 0.01  # nats: the Monte-Carlo standard error a run's val_loss should reach (issue 30)


def _log(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(f"[experiment] {msg}")  # above a stage's progress bar on a terminal, never through it
    sys.stdout.flush()


def check_inputs(preset: ExperimentPreset, out: Path, init_from: str | None, data: str | None,
                 gsm8k: str | None = None) -> None:
    """Every user error, before any work."""
    ensure_writable_dir(out)
    if "init_from" in preset.needs and not init_from:
        raise ValueError(
            f"preset {preset.name!r} starts from an autoregressive checkpoint: pass --init-from PATH, a local "
            "Hugging Face Qwen2.5-0.5B directory (config.json + *.safetensors) or a .gguf; nothing is downloaded here"
        )
    if init_from:
        from sinkdlm.checkpoint.manager import open_source

        source = open_source(init_from, flag="init_from")  # a missing or unreadable model: one line, now
        if not source.is_autoregressive and source.fmt != "sinkdlm":
            raise ValueError(f"--init-from {init_from} is a {source.fmt!r} diffusion model; expected an "
                             "autoregressive Qwen2/LLaMA checkpoint (a directory or a .gguf)")
    if "data" in preset.needs:
        if not data:
            raise ValueError(
                f"preset {preset.name!r} trains on FineWeb: pass --data with local FineWeb files (.parquet/.jsonl "
                "or a folder of them), or hf:HuggingFaceFW/fineweb:sample-10BT where the hub is reachable"
            )
        if not data.startswith("hf:") and not Path(data).exists():
            raise ValueError(f"--data {data} does not exist")
    if "gsm8k" in preset.needs:
        if not gsm8k:
            raise ValueError(
                f"preset {preset.name!r} fine-tunes and scores on GSM8K (the paper's Table 2): pass --gsm8k DIR, a local "
                "folder with the published train.jsonl and test.jsonl (question/answer per line)"
            )
        for split in ("train", "test"):
            if not (Path(gsm8k) / f"{split}.jsonl").is_file():
                raise ValueError(f"--gsm8k {gsm8k}: {split}.jsonl is missing; the folder must hold train.jsonl and test.jsonl")


def train_stage(run_dir: Path, cfg_kwargs: dict[str, Any], resume_command: str | None = None, *,
                need_weights: bool = True,
                on_retrained: Callable[[dict[str, Any]], None] | None = None,
                at_steps: dict[int, Callable[[str], None]] | None = None,
                probe: tuple[int, Callable[[Any, int], None]] | None = None) -> dict[str, Any]:
    """Train `TrainConfig(**cfg_kwargs)` into `run_dir` once: the summary (with `seconds`) is kept in
    `run_dir/DONE.json`, and a second call returns it; an interrupted run resumes from its checkpoint.

    A finished run whose checkpoint is gone (a study committed without its weights, read on a new machine)
    is trained again when `need_weights`: the same seed and data order give the same weights on the same
    software (the trainer is bitwise reproducible), which the summary's `retrained` record checks on every
    logged loss. `on_retrained(record)` is called once, when this call's retraining has finished:
    `record["reproduced"]` False means what was measured on the old weights no longer applies.

    `at_steps` {step: score(checkpoint)}: training stops at each such step before `max_steps` (the schedule
    unchanged), the callback scores that checkpoint, and training goes on; the callbacks' time is not
    training time. Pass only the steps still to score: a resumed run past a step cannot score it.
    `probe` (every, fn): handed to `train` (the escape probe, experiment/escape.py)."""
    from sinkdlm.training import TrainConfig, train

    done, previous_done = run_dir / DONE, run_dir / DONE_PREVIOUS
    metrics, previous_metrics = run_dir / METRICS_NAME, run_dir / METRICS_PREVIOUS
    if done.is_file():
        summary = json.loads(done.read_text())
        summary["checkpoint"] = str(local_checkpoint(run_dir, summary))
        if not need_weights or Path(summary["checkpoint"]).is_dir():
            return summary
        _log(f"{run_dir}: finished, but its checkpoint is gone (a run directory without its weights): training "
             "it again with the same seed and data order, then checking the logged losses match")
        if metrics.is_file():
            os.replace(metrics, previous_metrics)
        os.replace(done, previous_done)  # last: an interrupted retraining is recognised by this file
    cfg = TrainConfig.resolve(**cfg_kwargs, out=str(run_dir), resume=True)
    t0, scoring = time.perf_counter(), 0.0
    for step, score in sorted((at_steps or {}).items()):
        if step < cfg.max_steps:
            part = train(cfg, resume_command=resume_command, stop_at=step, probe=probe)
            t1 = time.perf_counter()
            score(part["checkpoint"])
            scoring += time.perf_counter() - t1
    summary = train(cfg, resume_command=resume_command, probe=probe)  # Ctrl-C: saves, raises TrainingStopped (no DONE)
    # A resumed run's wall time covers only its last part; the metrics log keeps every interval's rate
    # (rows past a resumed checkpoint are dropped), so the steps before the interruption count too.
    summary["seconds"] = max(time.perf_counter() - t0 - scoring,
                             logged_training_seconds(run_dir, cfg.batch_size * cfg.seq_len))
    if previous_done.is_file():
        summary["retrained"] = reproduction(read_metrics(run_dir, previous_metrics.name), read_metrics(run_dir))
        summary["retrained"]["first_seconds"] = json.loads(previous_done.read_text()).get("seconds")
        if on_retrained is not None:  # before DONE.json: an interruption here retrains and calls it again
            on_retrained(summary["retrained"])
    atomic_write_json(done, summary)
    if summary.get("retrained", {}).get("reproduced"):  # the same run: the old log adds nothing
        previous_metrics.unlink(missing_ok=True)
        previous_done.unlink(missing_ok=True)
    return summary


def reproduction(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether a retrained run logged exactly the losses of its first training (every logged step both have)."""
    old = {r["step"]: r for r in before if "loss" in r}
    rows = [(old[r["step"]], r) for r in after if r.get("step") in old and "loss" in r]
    same = all(a["loss"] == b["loss"] and a.get("val_loss") == b.get("val_loss") for a, b in rows)
    return {"reproduced": bool(rows) and same, "rows_compared": len(rows)}


def logged_training_seconds(run_dir: Path, tokens_per_step: int) -> float:
    """The training time the metrics log measured: per logged row, the steps since the previous row times
    tokens per step over the row's tokens/s (each row's rate spans everything since the previous row)."""
    rows = sorted(read_metrics(run_dir), key=lambda r: r["step"])
    total, prev = 0.0, 0
    for r in rows:
        if r.get("tokens_per_s"):
            total += (r["step"] - prev) * tokens_per_step / r["tokens_per_s"]
            prev = r["step"]
    return total


def draws_for_se(draw_variance: float, sequences: int, target_se: float) -> int:
    """The smallest even number of draws D with sqrt(σ²_draw / (N D)) <= target_se (docs/method.md §1)."""
    need = math.ceil(draw_variance / (sequences * target_se**2))
    return max(2, need + need % 2)


def fixed_validation(run_dir: Path, ckpt: str, cfg_kwargs: dict[str, Any], validation: Validation,
                     device: str | None = None, *, on_chunk: Callable[[], None] | None = None) -> dict[str, Any]:
    """The study's fixed validation of one checkpoint (docs/method.md §1), once: kept in `run_dir/val.json`.

    The sequences are the first `validation.tokens` tokens (whole rows) of the packed validation split
    of the run's corpus; the noise comes from `validation.noise_seed` only, so every run and variant of
    the study is scored on the same masked inputs. The sequences are scored in chunks, each kept in
    `val.partial.json` (`on_chunk` is called after each): an interrupted validation resumes there."""
    path = run_dir / VAL
    if path.is_file():
        record = json.loads(path.read_text())
        if not same_validation(record, validation):
            raise ValueError(f"{path} was scored with draws={record.get('draws')}, noise_seed={record.get('noise_seed')}, "
                             f"not this study's {validation_key(validation)}: move it aside or use a new --out")
        return record
    partial_path = run_dir / VAL_PARTIAL
    done: list[list[float]] = []
    spent = 0.0  # seconds of the earlier calls that scored `done` (an interrupted validation)
    if partial_path.is_file():
        partial = json.loads(partial_path.read_text())
        if same_validation(partial.get("key", {}), validation):
            done, spent = partial["values"], partial.get("seconds", 0.0)
    from sinkdlm.config import TrainConfig
    from sinkdlm.diffusion.likelihood import VALIDATION_ESTIMATOR, validation_elbo
    from sinkdlm.training.trainer import bf16_autocast, load_batches

    cfg = TrainConfig(**{k: v for k, v in cfg_kwargs.items() if k != "init_from"})
    model, tok = load_model_and_tokenizer(ckpt, device=device)
    if cfg.shift_logits is not None:  # the step-0 control: the converted model as training will run it
        model.config.shift_logits = bool(cfg.shift_logits)
    val = load_batches(cfg, tok, model.config.max_content_length, "validation")
    rows = min(len(val), -(-validation.tokens // cfg.seq_len))
    x0, _ = val.get(list(range(rows)))  # [N, L]
    t0 = time.perf_counter()
    # Scored in chunks of sequences, each kept in val.partial.json: an interrupted validation (hours on
    # a CPU) resumes where it stopped; every sequence's noise depends on its index only, so it is the same.
    key = {"tokens": int(x0.numel()), **validation_key(validation)}
    run_dir.mkdir(parents=True, exist_ok=True)
    while len(done) < rows:
        lo = len(done)
        hi = min(rows, lo + VAL_CHUNK)
        with torch.inference_mode(), bf16_autocast(validation.bf16, model.device):
            part = validation_elbo(model, x0[lo:hi], validation.draws, validation.noise_seed,
                                   batch_size=validation.batch_size, first_sequence=lo)
        done += part.values.tolist()
        atomic_write_json(partial_path, {"key": key, "values": done, "seconds": spent + time.perf_counter() - t0})
        if on_chunk is not None:
            on_chunk()
    from sinkdlm.diffusion.likelihood import ValidationELBO, stratified_se

    values = torch.tensor(done, dtype=torch.float64)  # [N, D]
    r = ValidationELBO(values=values, val_loss=float(values.mean()), val_loss_se=stratified_se(values))
    pair_diff = r.values[:, 0::2] - r.values[:, 1::2]  # [N, D/2], the collapsed strata of stratified_se
    draw_var = float((pair_diff**2).sum(-1).mean() / validation.draws)  # σ²_draw: one (sequence, draw) unit
    record = {"val_loss": r.val_loss, "val_loss_se": r.val_loss_se, "tokens": int(x0.numel()),
              "draws": validation.draws, "noise_seed": validation.noise_seed, "estimator": VALIDATION_ESTIMATOR,
              "bf16": validation.bf16, "per_sequence": r.values.mean(1).tolist(), "draw_variance": draw_var,
              # the draws this model needs for a standard error of TARGET_SE at this set (docs/method.md §1)
              "draws_for_target_se": draws_for_se(draw_var, len(x0), TARGET_SE), "target_se": TARGET_SE,
              "seconds": spent + time.perf_counter() - t0,  # every call's scoring time, not only this one's
              # every (sequence, draw) value: paired with another run's, they split a comparison's
              # variance into training seed and validation noise (experiment/variance.py)
              "values": done}
    atomic_write_json(path, record)
    partial_path.unlink(missing_ok=True)
    return record


def _analyse(ckpt: str, adir: Path, label: str, preset: ExperimentPreset, device: str | None, tty: bool,
             shift_logits: bool | None = None) -> None:
    """The attention-sink analysis of one checkpoint on the study's prompts, into `adir`
    (`shift_logits`: the run's setting, for the step-0 control's converted checkpoint)."""
    from sinkdlm.analysis import analyze, prompts_from_documents
    from sinkdlm.data import load_documents

    model, tok = load_model_and_tokenizer(ckpt, device=device)
    if shift_logits is not None:
        model.config.shift_logits = bool(shift_logits)
    prompts = prompts_from_documents(load_documents("shakespeare", "validation"), tok, preset.analysis.num_prompts,
                                     preset.analysis.prompt_length, seed=0)
    analyze(model, tok, prompts, dataclasses.replace(preset.analysis, out=adir, seed=0, quiet=not tty, label=label))


def draws_at_conversion(variant: Variant) -> bool:
    """Whether converting an AR checkpoint to this variant draws new parameters from the seed (sink
    embeddings, sink logits; `model.hf.convert_hf_model`): then each seed gets its own conversion and its
    own step-0 control, so the seeds' spread covers the initialisation too. A gate starts at W_g = 0 and
    softmax-off-by-one has no parameter: such a conversion is the same for every seed (one shared control)."""
    return variant.switches.get("num_sink_tokens", 0) > 0 or bool(variant.switches.get("sink_logit"))


def step0_name(variant: Variant, seed: int) -> str:
    """The directory name of a seed's converted checkpoint and step-0 control (shared when deterministic)."""
    return f"{variant.name}-s{seed}" if draws_at_conversion(variant) else variant.name


def _convert_for_variant(init_from: str, variant: Variant, out: Path, seed: int) -> str:
    """AR checkpoint -> the converted checkpoint of a variant and seed (`step0_name`: one per seed when the
    conversion draws new parameters from the seed)."""
    from sinkdlm.model.hf import convert_hf_checkpoint

    target = out / "converted" / step0_name(variant, seed)
    if not (target / "config.json").is_file():
        convert_hf_checkpoint(init_from, target, seed=seed if draws_at_conversion(variant) else 0,
                              **variant.switches)  # unset switches: registry defaults
    return str(target)


@dataclasses.dataclass
class _Unit:
    """One model the experiment scores: a trained run (`seed` set) or a variant's step-0 control."""

    label: str  # for log lines
    dir: Path  # its directory: val.json, eval.json, analysis/, timing.json
    ckpt: str
    kwargs: dict[str, Any]  # the TrainConfig fields it was (or would be) trained with
    seed: int | None = None
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    sft: dict[str, Any] | None = None  # its fine-tuning run's summary (presets with SFT)
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        path = self.dir / "timing.json"  # each stage's seconds, measured once and kept on disk
        if path.is_file():
            self.timing = json.loads(path.read_text())

    def save_timing(self) -> None:
        if self.seed is not None:  # the step-0 controls' time is in the study's stage_seconds only
            atomic_write_json(self.dir / "timing.json", self.timing)


def run_experiment(config: ExperimentConfig, *, skip_analysis: bool = False,
                   resume_command: str | None = None) -> dict[str, Any]:
    """Run the experiment an `ExperimentConfig` describes (its preset, out, seeds, ...: the settings of
    `sinkdlm experiment`); re-running the same config resumes.

    `resume_command`: what an interrupted training stage tells the user to run (the CLI's command).
    `config.variants`: run only these of the preset's variants (by name), e.g. to split an experiment over
    two processes on the same `out`; a last call without it finds every stage done and writes the report."""
    from sinkdlm.config.checks import check_optional_int, check_seed, parse_int_list

    seeds = parse_int_list(config.seeds, "--seeds")
    for s in seeds or ():
        check_seed(s, "--seeds")
    check_optional_int("--max-steps", config.max_steps, 1, none_means="the preset's budget")
    preset, out, init_from, data = config.preset, config.out, config.init_from, config.data
    max_steps, device, gsm8k = config.max_steps, config.device, config.gsm8k
    variants = [v.strip() for v in config.variants.split(",") if v.strip()] if config.variants else None
    preset = get_preset(preset) if isinstance(preset, str) else preset
    study = preset  # the whole study, whichever shard this call runs: progress.md and interim.json show it all
    if variants:
        known = {v.name: v for v in preset.variants}
        unknown = sorted(set(variants) - set(known))
        if unknown:
            raise ValueError(f"--variants {','.join(unknown)}: not in preset {preset.name!r}; choose from {sorted(known)}")
        preset = dataclasses.replace(preset, variants=tuple(known[n] for n in variants),
                                     comparisons=tuple(p for p in preset.comparisons if set(p) <= set(variants)))
    rule = non_default_fields(RemaskingOptions(**config.remasking_options()))  # what the command line set
    if rule:  # the sampler of the analysis and of the generation tasks (docs/method.md §2)
        from sinkdlm.diffusion.remasking import check_rule, resolve_rule

        # every model an experiment trains is of the llada family (sinkdlm's own, or converted from an AR LM)
        check_rule(*resolve_rule("llada", config.schedule, config.remasking, preset.evaluation.threshold),
                   threshold=preset.evaluation.threshold, temperature=0.0, alg_temp=config.alg_temp,
                   top_p=config.top_p, top_k=config.top_k, eps=config.eps)
        sample = preset.analysis.sample and dataclasses.replace(preset.analysis.sample, **rule)
        preset = dataclasses.replace(preset, analysis=dataclasses.replace(preset.analysis, sample=sample),
                                     evaluation=dataclasses.replace(preset.evaluation, **rule))
    out = Path(out)
    from sinkdlm.io.out_dir import check_out, writing_out

    # what --out holds, before any work: the same preset's experiment is resumed, anything else refused
    mode = check_out(out, "experiment", overwrite=config.overwrite, resumable=True, preset=preset.name,
                     inputs=(init_from, data, gsm8k))
    if mode == "replace":  # the old one set aside while the new one runs, put back if it fails
        stopped = None
        with writing_out(out, mode, "experiment", lock=False, in_place=True):
            try:
                result = run_experiment(dataclasses.replace(config, overwrite=False), skip_analysis=skip_analysis,
                                        resume_command=resume_command)
            except TrainingStopped as e:  # resumable where it is: kept
                stopped = e
        if stopped is not None:
            raise stopped
        return result
    if init_from is None and preset.default_init_from == "example":
        from sinkdlm.checkpoint.example_model import fetch_example_model

        init_from = str(fetch_example_model())  # cached after the first call; one clear line when offline
    check_inputs(preset, out, init_from, data, gsm8k)
    from sinkdlm.config.fields import check_device

    check_device(device)  # "auto" is resolved where each stage places its model
    from sinkdlm.training.cpu import flush_denormals

    flush_denormals()  # before the first parallel op (conversion, validation, training): training/cpu.py
    seeds = list(seeds) if seeds else list(preset.seeds)
    # the study the progress page and interim.json show: the preset's seeds and any asked for (a --seeds
    # shard of it, or more seeds added), whichever shard this call runs
    study_seeds = sorted(set(seeds) | set(preset.seeds))
    shared_train = non_default_fields(preset.train)  # what the recipe sets; the rest are TrainConfig defaults
    analysis_settings = preset.analysis.settings()  # the resolved analysis settings, recorded for every run
    # The real elapsed time of an experiment that is resumed spans several invocations: the first
    # start is kept on disk (docs/method.md §7: a report states what the experiment cost).
    started = out / "STARTED.json"
    if not started.is_file():
        atomic_write_json(started, {"time": time.time(), "preset": preset.name})  # another preset is refused
    t_start = time.perf_counter()
    tty = sys.stderr.isatty()  # progress bars on a terminal, plain log lines otherwise
    from sinkdlm.analysis import compare
    from sinkdlm.diffusion.likelihood import VALIDATION_ESTIMATOR
    from sinkdlm.evaluation import evaluate

    def eval_config(tasks: list[str]):  # the preset's evaluation settings on these tasks, seed 0
        return dataclasses.replace(preset.evaluation, tasks=",".join(tasks), seed=0, progress=tty)

    results: dict[str, Any] = {
        "preset": preset.name, "description": preset.description, "seeds": seeds, "variants": {},
        "machine": machine_info(), "train": {**shared_train, **({"max_steps": max_steps} if max_steps else {})},
        "eval_tasks": preset.eval_tasks + list(preset.lm_eval_tasks), "eval_limit": preset.evaluation.limit,
        "analysis_settings": {"num_prompts": preset.analysis.num_prompts, **analysis_settings},
        "validation": {"tokens": None, "draws": preset.validation.draws, "noise_seed": preset.validation.noise_seed,
                       "estimator": VALIDATION_ESTIMATOR, "bf16": preset.validation.bf16},
        "declared": preset.declared(),  # the endpoints fixed before the run (experiment/endpoints.py)
        "analysis_prompts": {"extractor": "sinkdlm.analysis.prompts_from_documents", "corpus": "shakespeare validation",
                             "prompt_length": preset.analysis.prompt_length, "seed": 0},
    }
    stage_seconds: dict[str, float] = {"train": 0.0, "sft": 0.0, "eval": 0.0, "analysis": 0.0}
    analysis_dirs: dict[str, Path] = {}
    pairs = [(a, b) for a, b in preset.comparisons] or None
    compared = pairs or [(v.name, preset.variants[0].name) for v in preset.variants[1:]]
    # Every shard (--variants) writes the same study-wide pages from what is on disk, so the last writer's
    # page shows every shard's runs and every pair (atomic writes: a page is never half of each).
    study_compared = (list(study.comparisons)
                      or [(v.name, study.variants[0].name) for v in study.variants[1:]])
    total = len(preset.variants) * len(seeds)

    # Stage 1: each variant's converted checkpoint and its step-0 control (from an AR checkpoint).
    # Stage 2: one model at a time, each finished before the next starts: the runs seed by seed (every
    # pair completes early), then the step-0 controls. A run is trained, evaluated, analysed and validated
    # in turn, so its checkpoint is needed only while it is the current one: a study whose directory is
    # committed as it goes (the weights left out) loses at most the current run's training when the
    # machine goes away, and a run whose measurements are all on disk is never trained again. The step-0
    # controls come last: their converted checkpoints are rebuilt in seconds, so cutting them off costs
    # nothing but the chunk being scored.
    step0_units: dict[str, _Unit] = {}  # by step0_name: one per seed, or one per variant when deterministic
    runs: dict[str, list[_Unit]] = {v.name: [] for v in preset.variants}
    from sinkdlm.experiment.progress import write_progress

    set_sequences = -(-preset.validation.tokens // preset.train.seq_len)  # the whole set, for interim sizing

    def progress() -> None:  # DIR/progress.md: what is measured so far (a study on a CPU runs for hours)
        write_progress(out, f"sinkdlm experiment `{preset.name}`", {v.name: v.label for v in study.variants}, study_seeds,
                       max_steps or preset.train.max_steps, set_sequences)
    for variant in preset.variants:
        if init_from:  # the step-0 control: the converted model before training, same protocol
            for seed in seeds:
                name = step0_name(variant, seed)
                if name in step0_units:
                    continue
                converted = _convert_for_variant(init_from, variant, out, seed)
                label = f"{variant.label}, step-0 control" + (f" (seed {seed})" if name != variant.name else "")
                step0_units[name] = _Unit(label, out / "step0" / name,
                                              converted, {**shared_train, **({"data": data} if data else {})})
    k = 0
    for seed in seeds:
        for variant in preset.variants:
            k += 1
            train_kwargs = {**shared_train, **variant.switches, "seed": seed}
            if max_steps:
                train_kwargs["max_steps"] = max_steps
            if data:
                train_kwargs["data"] = data
            if device:
                train_kwargs["device"] = device
            if init_from:
                train_kwargs["init_from"] = _convert_for_variant(init_from, variant, out, seed)
                for key in variant.switches:  # already baked into the converted checkpoint
                    train_kwargs.pop(key, None)
            runs[variant.name].append(_Unit(f"({k}/{total}) {variant.label}, seed {seed}",
                                            out / "runs" / f"{variant.name}-s{seed}", "", train_kwargs, seed=seed))
    variant_of = {id(u): v for v in preset.variants for u in runs[v.name]}
    logged: dict[tuple, int] = {}

    def write_interim() -> None:
        interim = {"sequences_scored": min(len(validation_values(d, preset.validation)) for d in study_dirs),
                   "val_loss_splits": val_loss_splits(out, study_compared, study_seeds, preset.validation, set_sequences)}
        if init_from:  # the head start and what training did with it, so far (the report's primary decides)
            step0_dirs = {(v.name, s): out / "step0" / step0_name(v, s) for v in study.variants for s in study_seeds}
            interim["head_start"] = head_start_splits(out, study_compared, study_seeds, preset.validation, step0_dirs)
        atomic_write_json(out / "interim.json", interim)
        for sp in interim["val_loss_splits"]:
            if logged.get((*sp["pair"], sp["seeds"])) == sp["sequences"]:
                continue
            logged[(*sp["pair"], sp["seeds"])] = sp["sequences"]
            d = sp["difference"]
            ci = "no interval" if d["low"] is None else f"[{d['low']:+.4f}, {d['high']:+.4f}]"
            _log(f"interim ({sp['seeds']} seeds x {sp['sequences']} sequences): {sp['pair'][0]} - {sp['pair'][1]} "
                 f"val_loss {d['mean']:+.4f} {ci}, validation SE of the difference {sp['validation_se_diff']:.4f}")
        progress()

    study_dirs = [*(out / "runs" / f"{v.name}-s{s}" for v in study.variants for s in study_seeds),
                  *((out / "step0" / n for n in dict.fromkeys(step0_name(v, s) for v in study.variants for s in study_seeds))
                    if init_from else ())]

    def validate(u: _Unit) -> None:
        if (u.dir / VAL).is_file():
            return
        _log(f"{u.label}: fixed validation, {set_sequences} sequences x {preset.validation.draws} draws "
             f"(saved every {VAL_CHUNK} sequences)")
        t0 = time.perf_counter()
        with heartbeat(f"{u.label}: fixed validation", _log):
            fixed_validation(u.dir, u.ckpt, u.kwargs, preset.validation, device, on_chunk=progress)
        dt = time.perf_counter() - t0
        stage_seconds["eval"] += dt
        u.timing["validation"] = (u.timing.get("validation") or 0.0) + dt
        u.save_timing()
        write_interim()

    def run_steps_of(unit: _Unit) -> int:  # the run's training steps: --max-steps, else the preset's
        return unit.kwargs.get("max_steps", preset.train.max_steps)

    def analysed_seed(seed: int) -> bool:  # the first seed always; every seed where the preset asks
        return (seed == seeds[0] or preset.analyse_every_seed) and not skip_analysis

    from sinkdlm.experiment.plan import pace_line, plan_line, reference_seconds_per_step, run_seconds

    ordered = [u for us in zip(*runs.values()) for u in us]  # seed-major: pairs complete early

    def measured() -> list[float]:  # each run's seconds, as its timing.json holds them (resumes included)
        return [t for u in ordered if (t := run_seconds(u.timing)) is not None]

    _log(plan_line(variants=len(preset.variants), seeds=len(seeds), steps=max_steps or preset.train.max_steps,
                   controls=len(step0_units), measured=measured(), per_step=reference_seconds_per_step(preset.name),
                   progress=out / "progress.md"))
    for done, unit in enumerate(ordered, 1):
        variant, seed, run = variant_of[id(unit)], unit.seed, unit.dir
        analysed = analysed_seed(seed)
        run_steps = run_steps_of(unit)
        curve_dirs = {s: run / "curve" / f"step-{s}" for s in preset.validation.curve_steps(run_steps)[:-1]}
        products = [run / VAL, run / "eval.json", *((run / "analysis" / "analysis.json",) if analysed else ()),
                    *(d / VAL for d in curve_dirs.values())]
        prober = None
        if preset.escape is not None:  # the escape probe, every `escape.every` steps as the run trains
            from sinkdlm.experiment.escape import PROBES, make_prober

            products.append(run / "escape" / PROBES)
            prober = (preset.escape.every, make_prober(run / "escape" / PROBES, unit.kwargs, preset.escape))
        needed = not all(p.is_file() for p in products)
        if not (run / "train" / DONE).is_file():
            _log(f"{unit.label}: training -> {run / 'train'}")
        t0 = time.perf_counter()

        def discard_if_other_weights(record: dict[str, Any], run: Path = run, label: str = unit.label) -> None:
            if record["reproduced"]:
                return
            _log(f"{label}: the retrained run did not log its first training's losses: its earlier "
                 "measurements are discarded and made again on the new weights")
            for stale in (run / VAL, run / VAL_PARTIAL, run / "eval.json"):
                stale.unlink(missing_ok=True)
            shutil.rmtree(run / "analysis", ignore_errors=True)
            shutil.rmtree(run / "curve", ignore_errors=True)

        def scorer(d: Path, step: int, u: _Unit = unit) -> Callable[[str], None]:
            def score(ckpt: str) -> None:  # the fixed validation at a declared step (`Validation.checkpoints`)
                _log(f"{u.label}: fixed validation at step {step} ({set_sequences} sequences x {preset.validation.draws} draws)")
                t1 = time.perf_counter()
                with heartbeat(f"{u.label}: fixed validation at step {step}", _log):
                    fixed_validation(d, ckpt, u.kwargs, preset.validation, device, on_chunk=progress)
                u.timing["validation"] = (u.timing.get("validation") or 0.0) + time.perf_counter() - t1
            return score

        summary = train_stage(run / "train", unit.kwargs, resume_command, need_weights=needed,
                              on_retrained=discard_if_other_weights,
                              at_steps={s: scorer(d, s) for s, d in curve_dirs.items() if not (d / VAL).is_file()},
                              probe=prober)
        stage_seconds["train"] += time.perf_counter() - t0
        unit.timing["train"] = summary.get("seconds")
        unit.ckpt, unit.summary = summary["checkpoint"], summary
        unit.save_timing()
        progress()
        if preset.sft is not None:
            t0 = time.perf_counter()
            sft_kwargs = {**non_default_fields(preset.sft), "sft": True, "init_from": unit.ckpt, "seed": seed,
                          **({"device": device} if device else {})}
            if sft_kwargs["data"] == "gsm8k":
                sft_kwargs["data"] = f"gsm8k:{Path(gsm8k) / 'train.jsonl'}"
            if not (run / "sft" / DONE).is_file():
                _log(f"{unit.label}: SFT on {preset.sft.data}")
            unit.sft = train_stage(run / "sft", sft_kwargs, resume_command,
                                   need_weights=not (run / "eval.json").is_file())
            stage_seconds["sft"] += time.perf_counter() - t0
            unit.timing["sft"] = unit.sft.get("seconds")
        eval_path = run / "eval.json"
        if not eval_path.is_file():
            _log(f"{unit.label}: evaluating {', '.join(preset.eval_tasks)}")
            t0 = time.perf_counter()
            with heartbeat(f"{unit.label}: evaluation", _log):
                scores = {}
                sft_tasks = {"arithmetic", "gsm8k"}  # scored on the fine-tuned model
                lm_tasks = [t for t in preset.eval_tasks if t not in sft_tasks]
                if lm_tasks:
                    model, tok = load_model_and_tokenizer(unit.ckpt, device=device)
                    scores.update(evaluate(model, tok, eval_config(lm_tasks)))
                if preset.lm_eval_tasks:
                    from sinkdlm.evaluation.harness import evaluate_harness

                    scores.update(evaluate_harness(unit.ckpt, preset.lm_eval_tasks, limit=preset.evaluation.limit,
                                                   mc_num=preset.evaluation.mc_num, seed=0, device=device))
                sft_eval = [t if t != "gsm8k" else f"gsm8k:{Path(gsm8k) / 'test.jsonl'}"
                            for t in preset.eval_tasks if t in sft_tasks]
                if sft_eval and preset.sft is not None:
                    sft_model, sft_tok = load_model_and_tokenizer(unit.sft["checkpoint"], device=device)
                    scores.update(evaluate(sft_model, sft_tok, eval_config(sft_eval)))
            atomic_write_json(eval_path, scores)
            stage_seconds["eval"] += time.perf_counter() - t0
            unit.timing["eval"] = time.perf_counter() - t0
            unit.save_timing()
        if analysed and not (run / "analysis" / "analysis.json").is_file():
            _log(f"{unit.label}: attention-sink analysis -> {run / 'analysis'}")
            t0 = time.perf_counter()
            with heartbeat(f"{unit.label}: attention-sink analysis", _log):
                _analyse(unit.ckpt, run / "analysis", variant.label, preset, device, tty)
            stage_seconds["analysis"] += time.perf_counter() - t0
            unit.timing["analysis"] = time.perf_counter() - t0
            unit.save_timing()
        validate(unit)
        _log(pace_line(done, len(ordered), measured(), out / "progress.md"))

    for variant in preset.variants:  # the step-0 controls: the first seed's analysed, every one validated
        for i, name in enumerate(dict.fromkeys(step0_name(variant, s) for s in seeds) if init_from else ()):
            u0 = step0_units[name]
            if i == 0 and not skip_analysis and not (u0.dir / "analysis" / "analysis.json").is_file():
                t0 = time.perf_counter()
                with heartbeat(f"{u0.label}: attention-sink analysis", _log):
                    _analyse(u0.ckpt, u0.dir / "analysis", f"{variant.label} (step 0)", preset, device, tty,
                             shift_logits=preset.train.shift_logits)
                stage_seconds["analysis"] += time.perf_counter() - t0
            validate(u0)


    # Stage 3: the records, read back from what each model left on disk (no checkpoint needed).
    for variant in preset.variants:
        per_seed: dict[str, Any] = {}
        step0 = None
        if init_from:  # the variant's record: the first seed's control, which is the analysed one
            u0 = step0_units[step0_name(variant, seeds[0])]
            val0 = json.loads((u0.dir / VAL).read_text())
            step0 = {"checkpoint": u0.ckpt, "val_loss": val0["val_loss"], "val_loss_se": val0["val_loss_se"],
                     "per_seed": draws_at_conversion(variant)}
            adir0 = u0.dir / "analysis"
            if not skip_analysis:
                step0["analysis_dir"] = str(adir0)
                step0["analysis"] = analysis_record(json.loads((adir0 / "analysis.json").read_text()))
        for unit in runs[variant.name]:
            seed, run, summary = unit.seed, unit.dir, unit.summary
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
            if preset.escape is not None:
                from sinkdlm.experiment.escape import PROBES, escape_record

                record["escape"] = escape_record(run / "escape" / PROBES, read_metrics(run / "train"), preset.escape)
            if summary.get("retrained"):
                record["retrained"] = summary["retrained"]
            if unit.sft is not None:
                record["sft_checkpoint"] = unit.sft["checkpoint"]
                record["sft_val_loss"] = unit.sft["last"].get("val_loss")
            record["eval"] = json.loads((run / "eval.json").read_text())
            if analysed_seed(seed):
                adir = run / "analysis"
                if seed == seeds[0]:
                    analysis_dirs[variant.label] = adir
                record["analysis_dir"] = str(adir)
                record["analysis"] = analysis_record(json.loads((adir / "analysis.json").read_text()))
            run_steps = run_steps_of(unit)
            val_curve = []  # the fixed validation at the declared steps (Validation.checkpoints), step 0 first
            if init_from:
                val0 = json.loads((out / "step0" / step0_name(variant, seed) / VAL).read_text())
                record["step0"] = {"val_loss": val0["val_loss"], "val_loss_se": val0["val_loss_se"]}
                # the run's change from its own start: what training did, apart from where it started
                record["val_loss_change"] = val["val_loss"] - val0["val_loss"]
                val_curve.append({"step": 0, **record["step0"]})
            for s in preset.validation.curve_steps(run_steps)[:-1]:
                path = run / "curve" / f"step-{s}" / VAL
                if path.is_file():
                    v = json.loads(path.read_text())
                    val_curve.append({"step": s, "val_loss": v["val_loss"], "val_loss_se": v["val_loss_se"]})
            val_curve.append({"step": run_steps, "val_loss": val["val_loss"], "val_loss_se": val["val_loss_se"]})
            record["val_curve"] = val_curve
            record["seconds"] = unit.timing
            per_seed[str(seed)] = record
            results["validation"]["tokens"] = val["tokens"]
        results["variants"][variant.name] = {"label": variant.label, "switches": variant.switches, "seeds": per_seed}
        if step0 is not None:
            results["variants"][variant.name]["step0"] = step0
    results["val_loss_splits"] = val_loss_splits(out, compared, seeds, preset.validation)

    if analysis_dirs and len(analysis_dirs) > 1:
        t0 = time.perf_counter()
        compare(analysis_dirs, out / "compare")
        stage_seconds["analysis"] += time.perf_counter() - t0
        results["compare_dir"] = str(out / "compare")

    from sinkdlm.experiment.report import write_report
    from sinkdlm.experiment.summary import summarise

    results["comparison_pairs"] = [list(p) for p in compared]
    results["stage_seconds"] = stage_seconds
    results["elapsed_s"] = time.perf_counter() - t_start
    results["timing"] = run_timing_summary(results, time.time() - json.loads(started.read_text())["time"])
    summarise(results, pairs)  # after the timing: the report's sizing prices seeds at the measured compute per run
    if preset.escape is not None:
        from sinkdlm.experiment.escape_summary import escape_summary

        results["escape"] = escape_summary(results, seeds_declared=list(study.seeds))
    atomic_write_json(out / "results.json", results)
    write_report(results, out)
    _log(f"done in {results['elapsed_s'] / 60:.1f} min: report at {out / 'report.md'} and {out / 'report.html'}")
    return results


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


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "cuda": torch.cuda.is_available(), "python": platform.python_version(),
        # other work on the machine as this invocation starts (a busy CPU slows every stage; the report says so)
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
