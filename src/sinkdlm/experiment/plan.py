"""The length of an experiment, said on its console: the plan at the start (runs x steps, the estimated
time), after each run, "run k of N" with the time left and the expected end, and, while a stage with no log
line of its own runs (the fixed validation, evaluation, analysis: their progress bars show on a terminal only),
"still running" every `HEARTBEAT_S` seconds (`heartbeat`), so the console is never silent for a minute.

Every estimate comes from measured seconds: the runs' own `timing.json` (this directory's, kept across
resumed invocations), else the preset's committed reference run (`docs/results/<preset>/results.json`,
scaled by runs and steps), else none yet ("after the first run"). Nothing here trains or writes.

`ExperimentPlan` is what one invocation of `sinkdlm experiment` will do, built once from its `ExperimentConfig`
and preset before any work (`make_plan`, which makes every input check that needs no file): the variants x
seeds x steps, this call's shard of the study (`--variants`, `--seeds`), the sampler rule, the fixed validation,
the declared endpoints and the expected cost (`ExperimentPlan.describe`). The stages (`experiment/stages.py`)
read it and nothing else of the configuration.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sinkdlm.config.commands import ExperimentConfig
    from sinkdlm.experiment.presets import ExperimentPreset, Variant

HEARTBEAT_S = 30.0  # seconds between "still running" lines: well inside the minute a console may stay silent
REFERENCE_RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"  # a source checkout's measured runs


def run_seconds(timing: dict) -> float | None:
    """A run's seconds (training, validation, evaluation, analysis) from its timing.json record; None
    before its training was timed."""
    return sum(float(v) for v in timing.values()) if "train" in timing else None


def reference_seconds_per_step(preset: str, results_dir: Path = REFERENCE_RESULTS) -> float | None:
    """Seconds per training step of one run of `preset`'s committed reference (its elapsed time over its
    runs and steps, evaluation and analysis included); None without one."""
    try:
        results = json.loads((results_dir / preset / "results.json").read_text())
        runs = len(results["seeds"]) * len(results["variants"])
        return float(results["elapsed_s"]) / (runs * int(results["train"]["max_steps"]))
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{round(seconds / 60)} min"


def plan_line(*, variants: int, seeds: int, steps: int, controls: int, measured: list[float],
              per_step: float | None, progress: Path, finished: int = 0) -> str:
    """The plan: runs x steps, the estimated time of the runs still to measure (`finished`: those whose
    measurements are all on disk, from an earlier call) and where progress is written."""
    runs = variants * seeds
    what = f"{runs} run{'s' if runs != 1 else ''} ({variants} variant{'s' if variants != 1 else ''} x {seeds} " \
           f"seed{'s' if seeds != 1 else ''}) x {steps:,} training steps"
    if controls:
        what += f", then {controls} step-0 control{'s' if controls != 1 else ''} (validated, no training)"
    todo = runs - finished
    if finished:
        what += f"; {finished} measured already, {todo} to go"
    if not todo:
        estimate = "nothing left to train: the report is written from what is on disk"
    elif measured:
        estimate = f"about {_duration(statistics.median(measured) * todo)} {'left' if finished else 'in all'} " \
                   f"(one process, shards side by side divide it; measured: {len(measured)} " \
                   f"run{'s' if len(measured) != 1 else ''} here)"
    elif per_step is not None:
        estimate = f"about {_duration(per_step * steps * todo)} on a 2-core CPU (the preset's reference run; " \
                   "a faster machine takes less)"
    else:
        estimate = "the time is estimated after the first run"
    return f"plan: {what}; {estimate}; progress: {progress} (rewritten after every stage)"


def pace_line(done: int, total: int, measured: list[float], progress: Path, now: float | None = None,
              left: int | None = None) -> str:
    """After run `done` of `total`: the time left at the median measured run for the `left` runs still to measure
    (default: the runs after this one) and the expected end."""
    line = f"run {done} of {total} done"
    left = total - done if left is None else left
    if left > 0 and measured:
        left = statistics.median(measured) * left
        end = time.strftime("%H:%M", time.localtime((time.time() if now is None else now) + left))
        line += f"; about {_duration(left)} left (ends about {end})"
    return f"{line}; progress: {progress}"


@contextmanager
def heartbeat(what: str, log: Callable[[str], None], every: float | None = None) -> Iterator[None]:
    """While the body runs, `log("WHAT: still running (N s so far)")` every `every` seconds (default `HEARTBEAT_S`,
    read at the call) from a daemon thread; the thread stops, and says nothing more, when the body ends."""
    every = HEARTBEAT_S if every is None else every
    stop, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            log(f"{what}: still running ({_duration(time.monotonic() - start)} so far)")

    thread = threading.Thread(target=beat, name="sinkdlm-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def log(msg: str) -> None:
    """One line of the experiment's console, `[experiment] ...` on stderr (progress; stdout is for results)."""
    from tqdm import tqdm

    tqdm.write(f"[experiment] {msg}", file=sys.stderr)  # above a stage's progress bar on a terminal, never through it
    sys.stderr.flush()


def draws_at_conversion(variant: Variant) -> bool:
    """Whether converting an AR checkpoint to this variant draws new parameters from the seed (sink
    embeddings, sink logits; `model.hf.convert_hf_model`): then each seed gets its own conversion and its
    own step-0 control, so the seeds' spread covers the initialisation too. A gate starts at W_g = 0 and
    softmax-off-by-one has no parameter: such a conversion is the same for every seed (one shared control)."""
    return variant.switches.get("num_sink_tokens", 0) > 0 or bool(variant.switches.get("sink_logit"))


def step0_name(variant: Variant, seed: int) -> str:
    """The directory name of a seed's converted checkpoint and step-0 control (shared when deterministic, and
    with the arm named by `variant.step0`, whose switches are the same)."""
    name = variant.step0 or variant.name
    return f"{name}-s{seed}" if draws_at_conversion(variant) else name


@dataclass(frozen=True)
class ExperimentPlan:
    """What one invocation of `sinkdlm experiment` does, fixed before any work (`make_plan`).

    `preset` is this call's shard of the study (`--variants`: its variants and the comparisons among them; the
    sampler rule of the command line applied); `study` is the whole preset, which the progress page and
    interim.json show whichever shard writes them. A resumed or sharded call has the same plan as a fresh one:
    what is already on disk only makes its stages return early."""

    preset: ExperimentPreset
    study: ExperimentPreset
    out: Path
    seeds: tuple[int, ...]  # this call's seeds: --seeds, else the preset's
    max_steps: int | None  # --max-steps; None: the preset's budget
    init_from: str | None  # the AR checkpoint every variant is converted from (None: trained from scratch)
    data: str | None
    device: str | None
    gsm8k: str | None
    rule: dict[str, Any]  # the sampler settings the command line set (empty: the preset's)
    skip_analysis: bool = False
    analysed_seed: int | None = None  # ExperimentConfig.analysed_seed: a launched job's study's first seed

    @property
    def first_seed(self) -> int:
        """The seed analysed where the preset analyses one: the study's first (a launched job's own config carries
        it), else this call's first."""
        return self.seeds[0] if self.analysed_seed is None else self.analysed_seed

    @property
    def steps(self) -> int:
        """Each run's training steps: --max-steps, else the preset's."""
        return self.max_steps or self.preset.train.max_steps

    @property
    def study_seeds(self) -> list[int]:
        """The seeds the study's pages show: the preset's and any asked for (a --seeds shard, or seeds added)."""
        return sorted(set(self.seeds) | set(self.preset.seeds))

    @property
    def set_sequences(self) -> int:
        """The fixed validation's sequences (whole sequences of the run's seq_len)."""
        return -(-self.preset.validation.tokens // self.preset.train.seq_len)

    @property
    def pairs(self) -> list[tuple[str, str]] | None:
        """The preset's declared comparisons among this call's variants; None: none declared."""
        return [(a, b) for a, b in self.preset.comparisons] or None

    @property
    def compared(self) -> list[tuple[str, str]]:
        """The pairs compared: the declared ones, else every variant against the first."""
        return self.pairs or [(v.name, self.preset.variants[0].name) for v in self.preset.variants[1:]]

    @property
    def study_compared(self) -> list[tuple[str, str]]:
        """`compared` over the whole study: every shard (--variants) writes the same study-wide pages."""
        return list(self.study.comparisons) or [(v.name, self.study.variants[0].name) for v in self.study.variants[1:]]

    def step0_names(self, variants: tuple[Variant, ...] | None = None, seeds: list[int] | None = None) -> list[str]:
        """The step-0 controls (from an AR checkpoint) of these variants and seeds, in order, each once."""
        if not self.init_from:
            return []
        return list(dict.fromkeys(step0_name(v, s) for v in (variants or self.preset.variants)
                                  for s in (seeds or self.seeds)))

    def study_dirs(self) -> list[Path]:
        """Every model directory of the whole study: the runs, then the step-0 controls."""
        return [*(self.out / "runs" / f"{v.name}-s{s}" for v in self.study.variants for s in self.study_seeds),
                *(self.out / "step0" / n for n in self.step0_names(self.study.variants, self.study_seeds))]

    def analysed(self, seed: int) -> bool:
        """Whether a run of this seed is analysed: the first seed always, every seed where the preset asks."""
        return (seed == self.first_seed or self.preset.analyse_every_seed) and not self.skip_analysis

    def analysed_controls(self) -> dict[str, Variant]:
        """The step-0 controls this call analyses, each with its variant (the first, where `Variant.step0` shares
        one): each variant's first seed's (`first_seed`), where this call measures it."""
        if self.skip_analysis:
            return {}
        controls: dict[str, Variant] = {}
        for variant in self.preset.variants:  # none without --init-from (or a base)
            if (name := step0_name(variant, self.first_seed)) in self.step0_names((variant,)):
                controls.setdefault(name, variant)
        return controls

    def cost_line(self, measured: list[float], finished: int = 0) -> str:
        """The plan's console line: runs x steps and the expected time (`plan_line`)."""
        return plan_line(variants=len(self.preset.variants), seeds=len(self.seeds), steps=self.steps,
                         controls=len(self.step0_names()), measured=measured,
                         per_step=reference_seconds_per_step(self.preset.name), progress=self.out / "progress.md",
                         finished=finished)

    def describe(self, measured: tuple[float, ...] = (), finished: int = 0) -> str:
        """The plan as text, one line per part: what runs, this call's shard, the sampler rule, the fixed
        validation, the declared endpoints and the expected cost (`finished`: runs measured already)."""
        p, v = self.preset, self.preset.validation
        shard = [f"variants {', '.join(x.name for x in p.variants)} of {len(self.study.variants)}"
                 if len(p.variants) < len(self.study.variants) else "",
                 f"seeds {', '.join(map(str, self.seeds))} of the study's {len(self.study_seeds)}"
                 if len(self.seeds) < len(self.study_seeds) else ""]
        declared = [k for k, d in p.declared().items() if d is not None]
        return "\n".join([
            f"experiment {p.name!r} -> {self.out}",
            f"runs: {', '.join(x.name for x in p.variants)} x seeds {', '.join(map(str, self.seeds))} x "
            f"{self.steps:,} steps" + (f", from {self.init_from}" if self.init_from else "")
            + (f", from a base trained first ({p.base.train.max_steps:,} steps, seed {p.base.train.seed}) into "
               f"{self.out / 'base'}" if p.base is not None and not self.init_from else ""),
            f"shard: {'; '.join(s for s in shard if s) or 'the whole study'}",
            f"sampler rule: {', '.join(f'{k}={x}' for k, x in self.rule.items()) or 'as the preset sets it'}",
            f"fixed validation: {self.set_sequences} sequences x {v.draws} draws, noise seed {v.noise_seed}"
            + (", bf16" if v.bf16 else ""),
            f"declared endpoints: {', '.join(declared) or 'none'}",
            f"compared: {', '.join(f'{a} - {b}' for a, b in self.compared) or 'nothing (one variant)'}",
            self.cost_line(list(measured), finished),
            *([self.gpu_line()] if p.gpu_model else []),
        ])

    def gpu_line(self) -> str:
        """A GPU-scale preset's cost in GPU-hours per run and for this call's runs, and its MDE."""
        from sinkdlm.experiment.gpu_cost import cost_line, study_cost

        train = dataclasses.replace(self.preset.train, max_steps=self.steps)
        runs = len(self.preset.variants) * len(self.seeds)
        return cost_line(study_cost(self.preset.gpu_model, train, self.preset.sft, runs), self.preset.paper_mde or "unknown")


def make_plan(config: ExperimentConfig, *, skip_analysis: bool = False) -> ExperimentPlan:
    """The plan of `config`, with every input check that reads no file (seeds, --max-steps, --variants, the
    sampler rule): a user error is one line before --out is touched. `init_from` is the config's; the
    runner fills in the preset's default model once --out is accepted."""
    from sinkdlm.config.checks import check_optional_int, check_seed, parse_int_list
    from sinkdlm.config.commands import RemaskingOptions
    from sinkdlm.config.fields import non_default_fields
    from sinkdlm.experiment.presets import get_preset

    seeds = parse_int_list(config.seeds, "--seeds")
    for s in seeds or ():
        check_seed(s, "--seeds")
    check_optional_int("--max-steps", config.max_steps, 1, none_means="the preset's budget")
    preset = get_preset(config.preset) if isinstance(config.preset, str) else config.preset
    study = preset  # the whole study, whichever shard this call runs: progress.md and interim.json show it all
    variants = [v.strip() for v in config.variants.split(",") if v.strip()] if config.variants else None
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
    return ExperimentPlan(preset=preset, study=study, out=Path(config.out), seeds=tuple(seeds or preset.seeds),
                          max_steps=config.max_steps, init_from=config.init_from, data=config.data,
                          device=config.device, gsm8k=config.gsm8k, rule=rule, skip_analysis=skip_analysis,
                          analysed_seed=config.analysed_seed)
