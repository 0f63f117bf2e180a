"""The measuring stages of `sinkdlm experiment`, in the order the runner calls them (docs/method.md §7):

0. `train_base` (presets with a `base`, and no --init-from): the DLM every arm continues from, trained once.
1. `prepare_units`: from an AR checkpoint (or a DLM: a sink added after pretraining), each variant's converted
   checkpoint and step-0 control; the runs, each with its own training fields (`Variant.train`).
2. `measure_runs`: one model at a time, each finished before the next starts, seed by seed (every pair
   completes early): `train_run` (the fixed validation at the declared steps and the escape probe on the
   way), `fine_tune_run` (presets with SFT), `evaluate_run`, `analyse_run`, `validate`, `measure_endpoints`
   (what an endpoint scores on the final checkpoint: the quantized scorings). A run's checkpoint is
   needed only while it is the current one: a study whose directory is committed as it goes (the weights
   left out) loses at most the current run's training when the machine goes away, and a run whose
   measurements are all on disk is never trained again.
3. `measure_controls`: the step-0 controls' analysis and validation, last: their converted checkpoints are
   rebuilt in seconds, so cutting them off costs nothing but the chunk being scored.

Every stage returns early where its product is on disk, so a resumed or sharded call (`--variants`, `--seeds`)
runs the same stages as a fresh one. `Progress` rewrites progress.md and interim.json between them. The
stages after these (records, summary, report) are in `experiment/records.py`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from sinkdlm.config.fields import non_default_fields
from sinkdlm.experiment.endpoints import ENDPOINTS
from sinkdlm.experiment.plan import ExperimentPlan, heartbeat, log, pace_line, run_seconds, step0_name
from sinkdlm.experiment.progress import write_progress
from sinkdlm.experiment import units as unit_ops
from sinkdlm.experiment.units import DONE, Unit, analyse_checkpoint, convert_for_variant, fixed_validation, train_stage
from sinkdlm.experiment.variance import (VAL, VAL_PARTIAL, head_start_splits, val_loss_splits,
                                         validation_values)
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.out_dir import hold
from sinkdlm.training.rundir import MERGED_DIR


class Progress:
    """`DIR/progress.md` and `DIR/interim.json`: what the whole study has measured so far (a study on a CPU
    runs for hours). Every shard (--variants) writes the same study-wide pages from what is on disk, so the
    last writer's page shows every shard's runs and every pair (atomic writes: a page is never half of each)."""

    def __init__(self, plan: ExperimentPlan) -> None:
        self.plan = plan
        self._logged: dict[tuple, int] = {}  # (pair, seeds) -> sequences: each interim interval logged once

    def page(self) -> None:
        p = self.plan
        write_progress(p.out, f"sinkdlm experiment `{p.preset.name}`", {v.name: v.label for v in p.study.variants},
                       p.study_seeds, p.steps, p.set_sequences, escape=p.preset.escape)

    def interim(self) -> None:
        """interim.json (each pair's comparison over the sequences scored so far), its new lines, the page."""
        p, validation = self.plan, self.plan.preset.validation
        interim = {"sequences_scored": min(len(validation_values(d, validation)) for d in p.study_dirs()),
                   "val_loss_splits": val_loss_splits(p.out, p.study_compared, p.study_seeds, validation,
                                                      p.set_sequences)}
        if p.init_from:  # the head start and what training did with it, so far (the report's primary decides)
            step0_dirs = {(v.name, s): p.out / "step0" / step0_name(v, s) for v in p.study.variants
                          for s in p.study_seeds}
            interim["head_start"] = head_start_splits(p.out, p.study_compared, p.study_seeds, validation, step0_dirs)
        atomic_write_json(p.out / "interim.json", interim)
        for sp in interim["val_loss_splits"]:
            if self._logged.get((*sp["pair"], sp["seeds"])) == sp["sequences"]:
                continue
            self._logged[(*sp["pair"], sp["seeds"])] = sp["sequences"]
            d = sp["difference"]
            ci = "no interval" if d["low"] is None else f"[{d['low']:+.4f}, {d['high']:+.4f}]"
            log(f"interim ({sp['seeds']} seeds x {sp['sequences']} sequences): {sp['pair'][0]} - {sp['pair'][1]} "
                f"val_loss {d['mean']:+.4f} {ci}, validation SE of the difference {sp['validation_se_diff']:.4f}")
        self.page()


@dataclass
class Session:
    """What the stages of one invocation share: its plan, its pages, and the seconds it measured per stage
    (`stage_seconds`: this invocation's only; each run's own are in its timing.json)."""

    plan: ExperimentPlan
    resume_command: str | None  # what an interrupted training stage tells the user to run
    tty: bool  # progress bars on a terminal, plain log lines otherwise
    started: Path  # OUT/STARTED.json: the experiment's first start
    t_start: float = field(default_factory=time.perf_counter)
    stage_seconds: dict[str, float] = field(
        default_factory=lambda: {"train": 0.0, "sft": 0.0, "eval": 0.0, "analysis": 0.0})
    progress: Progress = field(init=False)

    def __post_init__(self) -> None:
        self.progress = Progress(self.plan)


@dataclass
class Units:
    """Every model this call measures: the step-0 controls by `step0_name`, the runs by variant name."""

    controls: dict[str, Unit]
    runs: dict[str, list[Unit]]

    @property
    def ordered(self) -> list[Unit]:
        """The runs seed-major: every pair completes early."""
        return [u for us in zip(*self.runs.values()) for u in us]

    def measured(self) -> list[float]:
        """Each run's seconds, as its timing.json holds them (resumes included)."""
        return [t for u in self.ordered if (t := run_seconds(u.timing)) is not None]


def train_base(plan: ExperimentPlan, resume_command: str | None) -> ExperimentPlan:
    """Stage 0, for a preset with a `base` (a sink added after pretraining, docs/method.md §12): the DLM every arm continues
    from, trained once into OUT/base (resumed like any run), whose last checkpoint then stands where --init-from
    would. A --init-from given on the command line is the user's own DLM: it replaces the base, which is not
    trained."""
    base = plan.preset.base
    if base is None or plan.init_from:
        return plan
    kwargs = {**non_default_fields(base.train), **({"data": plan.data} if plan.data else {}),
              **({"device": plan.device} if plan.device else {})}
    where = plan.out / "base"
    with hold(where, wait=True, on_wait=lambda: log(f"waiting for the other process training the base ({where})")):
        if not (where / DONE).is_file():  # shards share it: the first trains it, the others wait, then read it
            log(f"the base model every arm continues from ({base.train.max_steps} steps, seed {base.train.seed}): "
                f"training -> {where}")
        summary = train_stage(where, kwargs, resume_command)
    return dataclasses.replace(plan, init_from=summary["checkpoint"])


def prepare_units(plan: ExperimentPlan) -> Units:
    """Stage 1: the step-0 controls (the converted model before training, scored with the same protocol: one
    per seed, or one per variant when its conversion is deterministic), then every run's unit."""
    shared_train = non_default_fields(plan.preset.train)  # what the recipe sets; the rest are TrainConfig defaults
    controls: dict[str, Unit] = {}
    for variant in plan.preset.variants if plan.init_from else ():
        for seed in plan.seeds:
            name = step0_name(variant, seed)
            if name in controls:
                continue
            converted = convert_for_variant(plan.init_from, variant, plan.out, seed)
            label = f"{variant.label}, step-0 control" + (f" (seed {seed})" if name != variant.name else "")
            controls[name] = Unit(label, plan.out / "step0" / name, converted,
                                  {**shared_train, **({"data": plan.data} if plan.data else {})})
    runs: dict[str, list[Unit]] = {v.name: [] for v in plan.preset.variants}
    total, k = len(plan.preset.variants) * len(plan.seeds), 0
    for seed in plan.seeds:
        for variant in plan.preset.variants:
            k += 1
            kwargs = {**shared_train, **variant.switches, **variant.train, "seed": seed}
            if plan.max_steps:
                kwargs["max_steps"] = plan.max_steps
            if plan.data:
                kwargs["data"] = plan.data
            if plan.device:
                kwargs["device"] = plan.device
            if plan.init_from:
                kwargs["init_from"] = convert_for_variant(plan.init_from, variant, plan.out, seed)
                for key in variant.switches:  # already baked into the converted checkpoint
                    kwargs.pop(key, None)
            runs[variant.name].append(Unit(f"({k}/{total}) {variant.label}, seed {seed}",
                                           plan.out / "runs" / f"{variant.name}-s{seed}", "", kwargs, seed=seed,
                                           variant=variant))
    return Units(controls, runs)


def claimed(units: list[Unit]) -> Iterator[Unit]:
    """Each unit while this process holds its directory (`io.out_dir.hold`), so that shards of one study on one
    OUT (--seeds, --variants) that share a unit (a step-0 control; an overlapping shard) never measure it at
    once: a unit another process holds is left for later, then waited for once nothing else is left (its
    stages then find their products on disk)."""
    pending = list(units)
    for wait in (False, True):
        left = []
        for unit in pending:
            with hold(unit.dir, wait=wait, on_wait=lambda: log(f"{unit.label}: waiting for the other process "
                                                              f"measuring it ({unit.dir})")) as held:
                if held:
                    yield unit
                else:
                    left.append(unit)
        pending = left


def measure_runs(s: Session, units: Units) -> None:
    """Stage 2: every run, one at a time: trained, fine-tuned, evaluated, analysed and validated in turn."""
    todo = {u.dir for u in units.ordered if not all(f.is_file() for f in run_products(s.plan, u.dir, u.seed))}
    log(s.plan.cost_line(units.measured(), finished=len(units.ordered) - len(todo)))
    for done, unit in enumerate(claimed(units.ordered), 1):
        train_run(s, unit)
        fine_tune_run(s, unit)
        evaluate_run(s, unit)
        analyse_run(s, unit)
        validate(s, unit)
        measure_endpoints(s, unit)
        todo.discard(unit.dir)
        log(pace_line(done, len(units.ordered), units.measured(), s.plan.out / "progress.md", left=len(todo)))


def measure_controls(s: Session, units: Units) -> None:
    """Stage 3: the step-0 controls: each variant's first (its first seed's) analysed, every one validated."""
    p = s.plan
    analysed_as = p.analysed_controls()
    for u0 in claimed([units.controls[name] for name in p.step0_names()]):  # each once (`Variant.step0` shares)
        variant = analysed_as.get(u0.dir.name)
        if variant and not (u0.dir / "analysis" / "analysis.json").is_file():
            t0 = time.perf_counter()
            with heartbeat(f"{u0.label}: attention-sink analysis", log):
                analyse_checkpoint(u0.ckpt, u0.dir / "analysis", f"{variant.label} (step 0)", p.preset, p.device,
                                   s.tty, shift_logits=p.preset.train.shift_logits)
            s.stage_seconds["analysis"] += time.perf_counter() - t0
        validate(s, u0)


def train_run(s: Session, unit: Unit, *, distributed: bool = False) -> None:
    """A run's training, once: with the fixed validation at each declared step before the last (scored as
    training passes it) and the escape probe; trained again only when its weights are gone and a
    measurement still needs them. `distributed`: this process is one rank of the run (a launched job on
    several processes, docs/method.md §14): FSDP2 (DDP for LoRA), rank 0 alone scoring the curve steps."""
    p, run = s.plan, unit.dir
    curve_dirs = _curve_dirs(p, run)
    main = not distributed or os.environ.get("RANK", "0") == "0"
    kwargs = {**unit.kwargs, "fsdp": unit.kwargs.get("trainable") != "lora"} if distributed else unit.kwargs
    products = run_products(p, run, unit.seed)
    # an endpoint that probes the run as it trains (the escape probe, every `escape.every` steps); one at the most
    probes = [pr for endpoint in ENDPOINTS if (pr := endpoint.probe(p.preset, run, unit.kwargs)) is not None]
    assert len(probes) <= 1, "the trainer takes one probe"
    prober = probes[0] if probes else None
    if not (run / "train" / DONE).is_file():
        log(f"{unit.label}: training -> {run / 'train'}")
    t0 = time.perf_counter()
    # every rank stops at the curve steps; rank 0 scores there while the others wait at the next rendezvous
    summary = train_stage(run / "train", kwargs, s.resume_command,
                          need_weights=not all(f.is_file() for f in products),
                          on_retrained=lambda record: discard_if_other_weights(unit, record),
                          at_steps={st: _scorer(s, unit, d, st) if main else _no_score
                                    for st, d in curve_dirs.items() if not (d / VAL).is_file()},
                          probe=prober)
    if not main:
        return
    s.stage_seconds["train"] += time.perf_counter() - t0
    unit.timing["train"] = summary.get("seconds")
    # a LoRA arm is scored on its adapters folded in (`TrainConfig.merge`: OUT/merged), like any checkpoint
    unit.ckpt = str(run / "train" / MERGED_DIR) if summary.get("merged") else summary["checkpoint"]
    unit.summary = summary
    unit.save_timing()
    s.progress.page()


def _no_score(ckpt: str) -> None:
    """A curve step on a rank other than 0: rank 0 scores it."""


def _curve_dirs(p: ExperimentPlan, run: Path) -> dict[int, Path]:
    """Where a run's fixed validation at each declared step before the last is kept."""
    return {st: run / "curve" / f"step-{st}" for st in p.preset.validation.curve_steps(p.steps)[:-1]}


def run_measured(p: ExperimentPlan, variant: str, seed: int) -> bool:
    """Whether the run of `variant` and `seed` has every product on disk (`run_products`)."""
    return all(f.is_file() for f in run_products(p, p.out / "runs" / f"{variant}-s{seed}", seed))


def run_products(p: ExperimentPlan, run: Path, seed: int) -> list[Path]:
    """What the stages leave in a run's directory `run`: its validation (and at each declared curve step), task
    scores, analysis (the analysed seeds) and escape probes. A run with all of them is measured: it is not
    trained again."""
    products = [run / VAL, run / "eval.json", *((run / "analysis" / "analysis.json",) if p.analysed(seed) else ()),
                *(d / VAL for d in _curve_dirs(p, run).values())]
    return products + [f for endpoint in ENDPOINTS for f in endpoint.products(p.preset, run)]


def discard_if_other_weights(unit: Unit, record: dict[str, Any]) -> None:
    """After a retraining that did not log its first training's losses: what was measured on the old
    weights no longer applies, so it is removed and made again."""
    if record["reproduced"]:
        return
    log(f"{unit.label}: the retrained run did not log its first training's losses: its earlier "
        "measurements are discarded and made again on the new weights")
    for stale in (unit.dir / VAL, unit.dir / VAL_PARTIAL, unit.dir / "eval.json"):
        stale.unlink(missing_ok=True)
    shutil.rmtree(unit.dir / "analysis", ignore_errors=True)
    shutil.rmtree(unit.dir / "curve", ignore_errors=True)


def _scorer(s: Session, unit: Unit, d: Path, step: int) -> Callable[[str], None]:
    """The fixed validation of the checkpoint at a declared step (`Validation.checkpoints`), into `d`."""
    validation = s.plan.preset.validation

    def score(ckpt: str) -> None:
        log(f"{unit.label}: fixed validation at step {step} ({s.plan.set_sequences} sequences x {validation.draws} draws)")
        t1 = time.perf_counter()
        with heartbeat(f"{unit.label}: fixed validation at step {step}", log):
            fixed_validation(d, ckpt, unit.kwargs, validation, s.plan.device, on_chunk=s.progress.page)
        unit.timing["validation"] = (unit.timing.get("validation") or 0.0) + time.perf_counter() - t1
    return score


def fine_tune_run(s: Session, unit: Unit) -> None:
    """Presets with SFT: the run's fine-tuning (on `arithmetic` or GSM8K), once."""
    p, run = s.plan, unit.dir
    if p.preset.sft is None:
        return
    t0 = time.perf_counter()
    sft_kwargs = {**non_default_fields(p.preset.sft), "sft": True, "init_from": unit.ckpt, "seed": unit.seed,
                  **({"device": p.device} if p.device else {})}
    if sft_kwargs["data"] == "gsm8k":
        sft_kwargs["data"] = f"gsm8k:{Path(p.gsm8k) / 'train.jsonl'}"
    if not (run / "sft" / DONE).is_file():
        log(f"{unit.label}: SFT on {p.preset.sft.data}")
    unit.sft = train_stage(run / "sft", sft_kwargs, s.resume_command, need_weights=not (run / "eval.json").is_file())
    s.stage_seconds["sft"] += time.perf_counter() - t0
    unit.timing["sft"] = unit.sft.get("seconds")


def evaluate_run(s: Session, unit: Unit) -> None:
    """The run's task scores, once, into eval.json."""
    eval_path = unit.dir / "eval.json"
    if eval_path.is_file():
        return
    log(f"{unit.label}: evaluating {', '.join(s.plan.preset.eval_tasks)}")
    t0 = time.perf_counter()
    with heartbeat(f"{unit.label}: evaluation", log):
        scores = _task_scores(s, unit)
    atomic_write_json(eval_path, scores)
    s.stage_seconds["eval"] += time.perf_counter() - t0
    unit.timing["eval"] = time.perf_counter() - t0
    unit.save_timing()


def _task_scores(s: Session, unit: Unit) -> dict[str, Any]:
    """Every task of the preset: the offline tasks and lm-eval's on the pre-trained model, the arithmetic and
    GSM8K tasks on the fine-tuned one; the preset's evaluation settings, seed 0."""
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.evaluation import evaluate

    p = s.plan
    preset, device = p.preset, p.device

    def eval_config(tasks: list[str]):
        return dataclasses.replace(preset.evaluation, tasks=",".join(tasks), seed=0, progress=s.tty)

    scores: dict[str, Any] = {}
    sft_tasks = {"arithmetic", "gsm8k"}  # scored on the fine-tuned model
    lm_tasks = [t for t in preset.eval_tasks if t not in sft_tasks]
    if lm_tasks:
        model, tok = load_model_and_tokenizer(unit.ckpt, device=device)
        scores.update(evaluate(model, tok, eval_config(lm_tasks)))
    if preset.lm_eval_tasks:
        from sinkdlm.evaluation.harness import evaluate_harness

        scores.update(evaluate_harness(unit.ckpt, preset.lm_eval_tasks, limit=preset.evaluation.limit,
                                       mc_num=preset.evaluation.mc_num, seed=0, device=device))
    sft_eval = [t if t != "gsm8k" else f"gsm8k:{Path(p.gsm8k) / 'test.jsonl'}"
                for t in preset.eval_tasks if t in sft_tasks]
    if sft_eval and preset.sft is not None:
        sft_model, sft_tok = load_model_and_tokenizer(unit.sft["checkpoint"], device=device)
        scores.update(evaluate(sft_model, sft_tok, eval_config(sft_eval)))
    return scores


def analyse_run(s: Session, unit: Unit) -> None:
    """The run's attention-sink analysis, once, where its seed is analysed (`ExperimentPlan.analysed`)."""
    adir = unit.dir / "analysis"
    if not s.plan.analysed(unit.seed) or (adir / "analysis.json").is_file():
        return
    log(f"{unit.label}: attention-sink analysis -> {adir}")
    t0 = time.perf_counter()
    with heartbeat(f"{unit.label}: attention-sink analysis", log):
        analyse_checkpoint(unit.ckpt, adir, unit.variant.label, s.plan.preset, s.plan.device, s.tty)
    s.stage_seconds["analysis"] += time.perf_counter() - t0
    unit.timing["analysis"] = time.perf_counter() - t0
    unit.save_timing()


def measure_endpoints(s: Session, unit: Unit) -> None:
    """What an endpoint measures on the run's final checkpoint after training (the quantized scorings), once."""
    p = s.plan
    for endpoint in ENDPOINTS:
        if all(f.is_file() for f in endpoint.products(p.preset, unit.dir)):
            continue
        t0 = time.perf_counter()
        with heartbeat(f"{unit.label}: {endpoint.name}", log):
            endpoint.measure(p.preset, unit.dir, unit.ckpt, unit.kwargs, p.device)
        unit.timing[endpoint.name] = time.perf_counter() - t0
        unit.save_timing()


def validate(s: Session, u: Unit) -> None:
    """The model's fixed validation, once (saved in chunks, the pages rewritten after each), then interim.json."""
    if (u.dir / VAL).is_file():
        return
    validation = s.plan.preset.validation
    log(f"{u.label}: fixed validation, {s.plan.set_sequences} sequences x {validation.draws} draws "
        f"(saved every {unit_ops.VAL_CHUNK} sequences)")  # read now: a test sets smaller chunks
    t0 = time.perf_counter()
    with heartbeat(f"{u.label}: fixed validation", log):
        fixed_validation(u.dir, u.ckpt, u.kwargs, validation, s.plan.device, on_chunk=s.progress.page)
    dt = time.perf_counter() - t0
    s.stage_seconds["eval"] += dt
    u.timing["validation"] = (u.timing.get("validation") or 0.0) + dt
    u.save_timing()
    s.progress.interim()
