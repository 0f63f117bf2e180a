"""One model of an experiment, a trained run or a step-0 control (`Unit`), and what is done to it: training
(`train_stage`), the study's fixed validation (`fixed_validation`), the attention-sink analysis
(`analyse_checkpoint`) and, from an AR checkpoint, the conversion (`convert_for_variant`).

Each keeps what it made on disk and returns it on a second call, so an interrupted experiment resumes where it
stopped: a finished training run has `train/DONE.json`, a finished validation `val.json` (chunks in
`val.partial.json` before), a finished analysis `analysis/analysis.json`. The stages (`experiment/stages.py`)
decide which of these a model needs and in what order.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from sinkdlm.checkpoint.manager import load_model_and_tokenizer
from sinkdlm.experiment.fixed_set import score_set, validation_inputs
from sinkdlm.experiment.plan import draws_at_conversion, log, step0_name
from sinkdlm.experiment.presets import ExperimentPreset, Validation, Variant
from sinkdlm.experiment.variance import VAL, VAL_PARTIAL, same_validation, validation_key
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.machine import machine_info
from sinkdlm.io.out_dir import hold
from sinkdlm.training.rundir import METRICS_NAME, local_checkpoint, read_metrics

DONE = "DONE.json"
DONE_PREVIOUS = "DONE.previous.json"  # a retrained run's first summary, until it is reproduced
METRICS_PREVIOUS = "metrics.previous.jsonl"  # and its first metrics log
VAL_CHUNK = 16  # sequences per saved chunk
TARGET_SE = 0.01  # nats: the Monte-Carlo standard error a run's val_loss should reach (docs/method.md §7)


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
    `probe` (every, fn): handed to `train` (the escape probe, experiment/endpoints/escape/probe.py)."""
    from sinkdlm.training import TrainConfig, train

    done, previous_done = run_dir / DONE, run_dir / DONE_PREVIOUS
    metrics, previous_metrics = run_dir / METRICS_NAME, run_dir / METRICS_PREVIOUS
    if done.is_file():
        summary = json.loads(done.read_text())
        summary["checkpoint"] = str(local_checkpoint(run_dir, summary))
        if not need_weights or Path(summary["checkpoint"]).is_dir():
            return summary
        log(f"{run_dir}: finished, but its checkpoint is gone (a run directory without its weights): training "
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
    # where it finished: a study spans sessions, and float32 rounding differs between CPUs (docs/method.md §11)
    summary["machine"] = {k: v for k, v in machine_info().items()
                          if k in ("cpu", "cpu_flags", "cpu_capability", "torch_threads", "torch", "cuda")}
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
    from sinkdlm.diffusion.likelihood import VALIDATION_ESTIMATOR

    model, x0 = validation_inputs(ckpt, cfg_kwargs, validation, device)
    rows = len(x0)
    t0 = time.perf_counter()
    # Scored in chunks of sequences, each kept in val.partial.json: an interrupted validation (hours on
    # a CPU) resumes where it stopped; every sequence's noise depends on its index only, so it is the same.
    key = {"tokens": int(x0.numel()), **validation_key(validation)}
    run_dir.mkdir(parents=True, exist_ok=True)
    while len(done) < rows:
        lo = len(done)
        hi = min(rows, lo + VAL_CHUNK)
        done += score_set(model, x0[lo:hi], validation, first_sequence=lo).tolist()
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


def analyse_checkpoint(ckpt: str, adir: Path, label: str, preset: ExperimentPreset, device: str | None, tty: bool,
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


def convert_for_variant(init_from: str, variant: Variant, out: Path, seed: int) -> str:
    """AR checkpoint (or a DLM, which gains the variant's switches) -> the converted checkpoint of a variant and
    seed (`step0_name`: one per seed when the conversion draws new parameters from the seed). A DLM that has
    the variant's switches already is its own conversion (the arm that adds nothing to the base)."""
    from sinkdlm.model.hf import convert_hf_checkpoint

    target = out / "converted" / step0_name(variant, seed)
    if (target / "config.json").is_file():
        return str(target)
    if _adds_nothing(str(init_from), tuple(sorted(variant.switches.items()))):
        return str(init_from)
    # shards share the deterministic conversions: one converts at a time (the lock is on the folder above,
    # which no conversion replaces), and a shard that waited finds the other's checkpoint
    with hold(out / "converted", wait=True, on_wait=lambda: log(f"waiting for another process converting into "
                                                                  f"{out / 'converted'}")):
        if not (target / "config.json").is_file():
            convert_hf_checkpoint(init_from, target, seed=seed if draws_at_conversion(variant) else 0,
                                  **variant.switches)  # unset switches: registry defaults
    return str(target)


@functools.lru_cache(maxsize=None)
def _adds_nothing(init_from: str, switches: tuple) -> bool:
    """Whether `init_from` is a DLM that has these switches already (its own conversion). Asked for every arm and
    seed, twice (control and run), where no converted directory marks the answer: one header read each (a GGUF's
    takes seconds)."""
    from sinkdlm.checkpoint.manager import open_source
    from sinkdlm.model.hf import switches_to_add

    source = open_source(init_from, flag="init_from")
    return not source.config.causal and not switches_to_add(source, dict(switches))


@dataclasses.dataclass
class Unit:
    """One model the experiment scores: a trained run (`seed` set) or a variant's step-0 control."""

    label: str  # for log lines
    dir: Path  # its directory: val.json, eval.json, analysis/, timing.json
    ckpt: str
    kwargs: dict[str, Any]  # the TrainConfig fields it was (or would be) trained with
    seed: int | None = None
    variant: Variant | None = None  # a run's variant (its label goes on the analysis figures)
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

