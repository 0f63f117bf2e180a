"""The experiment's plan and pace lines (issue 53): runs x steps, an estimate from measured seconds, "run k
of N" with the time left; the reference is the arithmetic written out here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sinkdlm.experiment.plan import pace_line, plan_line, reference_seconds_per_step, run_seconds

PROGRESS = Path("runs/demo/progress.md")


def test_plan_names_runs_steps_estimate_and_progress(tmp_path):
    line = plan_line(variants=2, seeds=3, steps=600, controls=0, measured=[], per_step=0.3, progress=PROGRESS)
    # 6 runs x 600 steps x 0.3 s = 1080 s = 18 min
    assert line == ("plan: 6 runs (2 variants x 3 seeds) x 600 training steps; about 18 min on a 2-core CPU (the "
                    "preset's reference run; a faster machine takes less); progress: runs/demo/progress.md "
                    "(rewritten after every stage)")
    measured = plan_line(variants=2, seeds=3, steps=600, controls=2, measured=[100.0, 140.0, 120.0], per_step=0.3,
                         progress=PROGRESS)
    assert "then 2 step-0 controls" in measured and "about 12 min in all (one process, shards side by side divide it; measured: 3 runs here)" in measured
    unknown = plan_line(variants=1, seeds=1, steps=5, controls=0, measured=[], per_step=None, progress=PROGRESS)
    assert "1 run (1 variant x 1 seed) x 5 training steps; the time is estimated after the first run" in unknown


def test_pace_after_each_run():
    now = time.time()
    line = pace_line(2, 6, [300.0, 360.0], PROGRESS, now=now)
    end = time.strftime("%H:%M", time.localtime(now + 4 * 330))
    assert line == f"run 2 of 6 done; about 22 min left (ends about {end}); progress: runs/demo/progress.md"
    assert pace_line(6, 6, [300.0], PROGRESS) == "run 6 of 6 done; progress: runs/demo/progress.md"


def test_a_resumed_plan_counts_only_the_runs_still_to_measure():
    """A resumed (or reporting) call whose runs are measured already says so, and estimates only what is left:
    not hours for runs that take seconds to pass over."""
    now = time.time()
    resumed = plan_line(variants=3, seeds=4, steps=6000, controls=0, measured=[800.0] * 9, per_step=0.1,
                        progress=PROGRESS, finished=9)
    assert "12 runs (3 variants x 4 seeds) x 6,000 training steps; 9 measured already, 3 to go; about 40 min left (one process" in resumed
    done = plan_line(variants=3, seeds=4, steps=6000, controls=0, measured=[800.0] * 12, per_step=0.1,
                     progress=PROGRESS, finished=12)
    assert "12 measured already, 0 to go; nothing left to train" in done
    # run 2 of 12 passed over, one run still to measure after it: 800 s left, not 10 x 800
    end = time.strftime("%H:%M", time.localtime(now + 800))
    assert pace_line(2, 12, [800.0], PROGRESS, now=now, left=1) == (
        f"run 2 of 12 done; about 13 min left (ends about {end}); progress: runs/demo/progress.md")
    assert pace_line(11, 12, [800.0], PROGRESS, left=0) == "run 11 of 12 done; progress: runs/demo/progress.md"


def test_seconds_from_timing_and_reference(tmp_path):
    assert run_seconds({"train": 10, "validation": 2.5, "eval": 1}) == 13.5
    assert run_seconds({"validation": 2.5}) is None  # not yet trained here
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "results.json").write_text(json.dumps(
        {"seeds": [0, 1, 2], "variants": {"a": {}, "b": {}}, "elapsed_s": 1080.0, "train": {"max_steps": 600}}))
    assert reference_seconds_per_step("demo", tmp_path) == 1080.0 / (6 * 600)
    assert reference_seconds_per_step("none", tmp_path) is None
    assert reference_seconds_per_step("demo") is not None  # the committed demo run, in a source checkout


def _wait_for(lines: list[str], stage: str, timeout: float = 20.0) -> None:
    """Block until `stage`'s "still running" line was logged (the slow stage: it ends only after its heartbeat)."""
    deadline = time.monotonic() + timeout
    while not any(stage in ln and "still running" in ln for ln in lines):
        assert time.monotonic() < deadline, f"no {stage!r} still-running line within {timeout} s: {lines}"
        time.sleep(0.01)


def test_heartbeat_logs_while_the_body_runs_and_stops_with_it():
    from sinkdlm.experiment.plan import HEARTBEAT_S, heartbeat

    assert HEARTBEAT_S < 60  # a stage is never silent for a minute
    lines: list[str] = []
    with heartbeat("run 1: evaluation", lines.append, every=0.01):
        _wait_for(lines, "run 1: evaluation")
        while len(lines) < 2:
            time.sleep(0.01)
    after = len(lines)
    time.sleep(0.1)
    assert len(lines) == after  # the thread stopped with the body
    assert lines[0] == "run 1: evaluation: still running (1 s so far)"  # _duration: at least "1 s"
    fast: list[str] = []
    with heartbeat("quick", fast.append, every=10.0):
        pass
    assert fast == []  # a stage shorter than the period prints nothing extra


@pytest.mark.slow  # ~14 s; make test-slow
def test_an_experiments_slow_stages_print_before_their_minute_is_up(tmp_path, monkeypatch, capsys):
    """Validation, evaluation and analysis print no line of their own without a terminal: each one, made slow
    here (it returns only once its heartbeat line was printed), says it is still running, through the
    runner's log (stderr, `[experiment]`)."""
    import dataclasses

    import sinkdlm.analysis
    import sinkdlm.evaluation
    from sinkdlm.config import ExperimentConfig
    from sinkdlm.experiment import get_preset, plan, run_experiment, stages
    from sinkdlm.experiment.presets import VANILLA

    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(plan, "HEARTBEAT_S", 0.02)  # the default is read at each call: seconds become 20 ms
    logged: list[str] = []
    real_log = stages.log  # the stages' console, which their heartbeats write to
    monkeypatch.setattr(stages, "log", lambda msg: (logged.append(msg), real_log(msg)))

    def slow(module, name: str, stage: str) -> None:
        fn = getattr(module, name)

        def wrapped(*a, **k):
            _wait_for(logged, stage)
            return fn(*a, **k)
        monkeypatch.setattr(module, name, wrapped)

    slow(stages, "fixed_validation", "fixed validation")
    slow(sinkdlm.evaluation, "evaluate", "evaluation")
    slow(sinkdlm.analysis, "analyze", "attention-sink analysis")
    smoke = get_preset("smoke")
    preset = dataclasses.replace(smoke, variants=(VANILLA,), seeds=(0,), comparisons=())
    run_experiment(ExperimentConfig(preset=preset, out=str(tmp_path / "exp")))
    out = capsys.readouterr().err  # progress: stderr
    for stage in ("fixed validation", "evaluation", "attention-sink analysis"):
        assert f"[experiment] (1/1) DLM, seed 0: {stage}: still running (" in out


def test_the_plan_of_a_shard_says_what_runs_and_checks_its_inputs_before_any_file(tmp_path):
    """`make_plan`: one typed plan from the config and preset, printable (`describe`): variants x seeds x steps,
    this call's shard, the sampler rule, the validation, the declared endpoints and the cost; a bad --variants
    is refused before --out exists."""
    import pytest

    from sinkdlm.config import ExperimentConfig
    from sinkdlm.experiment.plan import make_plan

    out = tmp_path / "exp"
    plan = make_plan(ExperimentConfig(preset="smoke", out=str(out), variants="vanilla,gated", seeds="1",
                                      max_steps=5, remasking="random"))
    assert [v.name for v in plan.preset.variants] == ["vanilla", "gated"] and len(plan.study.variants) == 3
    assert plan.preset.comparisons == (("gated", "vanilla"),)  # only the pairs within the shard
    assert plan.seeds == (1,) and plan.study_seeds == [0, 1] and plan.steps == 5
    assert plan.rule == {"remasking": "random"} and plan.preset.evaluation.remasking == "random"
    assert plan.preset.analysis.sample.remasking == "random"
    assert plan.compared == [("gated", "vanilla")] and len(plan.study_compared) == 3
    assert plan.step0_names() == [] and len(plan.study_dirs()) == 3 * 2  # no AR checkpoint: no controls
    lines = plan.describe().splitlines()
    assert lines[1] == "runs: vanilla, gated x seeds 1 x 5 steps"
    assert lines[2] == "shard: variants vanilla, gated of 3; seeds 1 of the study's 2"
    assert lines[3] == "sampler rule: remasking=random"
    assert lines[4] == "fixed validation: 8 sequences x 2 draws, noise seed 0"
    assert lines[5] == "declared endpoints: escape"
    assert lines[-1].startswith("plan: 2 runs (2 variants x 1 seed) x 5 training steps")
    whole = make_plan(ExperimentConfig(preset="smoke", out=str(out)))
    assert "shard: the whole study" in whole.describe() and "sampler rule: as the preset sets it" in whole.describe()
    with pytest.raises(ValueError, match="--variants nope: not in preset 'smoke'"):
        make_plan(ExperimentConfig(preset="smoke", out=str(out), variants="nope"))
    assert not out.exists()


@pytest.mark.slow  # ~12 s; make test-slow
def test_dry_run_prints_the_plan_with_what_is_on_disk_and_writes_nothing(tmp_path):
    """`experiment --dry-run` (and `run_experiment` with dry_run): the plan, the runs whose measurements are all on
    disk counted as measured, the estimate from their timing.json; no file or folder is made."""
    import subprocess
    import sys

    from sinkdlm.config import ExperimentConfig
    from sinkdlm.experiment import run_experiment
    from sinkdlm.experiment.plan import make_plan
    from sinkdlm.experiment.stages import run_products

    out = tmp_path / "exp"
    fresh = run_experiment(ExperimentConfig(preset="smoke", out=str(out), dry_run=True))
    assert fresh["dry_run"] and not out.exists()
    assert "plan: 6 runs (3 variants x 2 seeds)" in fresh["plan"] and "measured already" not in fresh["plan"]
    # one run measured (every product on disk), another only trained: 1 measured, its 120 s the estimate
    plan = make_plan(ExperimentConfig(preset="smoke", out=str(out)))
    for name, complete in (("vanilla-s0", True), ("gated-s1", False)):
        run = out / "runs" / name
        products = run_products(plan, run, int(name[-1]))
        for f in products if complete else products[:1]:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("{}")
        (run / "timing.json").write_text(json.dumps({"train": 100.0, "validation": 20.0}))
    (out / "STARTED.json").write_text(json.dumps({"time": time.time(), "preset": "smoke"}))  # as mark_started
    before = sorted(p for p in out.rglob("*"))
    text = subprocess.run([sys.executable, "-m", "sinkdlm", "experiment", "--preset", "smoke", "--out", str(out),
                           "--dry-run"], capture_output=True, text=True, check=True).stdout
    assert "6 runs (3 variants x 2 seeds) x 3 training steps; 1 measured already, 5 to go; about 10 min left" in text
    assert text.splitlines()[0] == f"experiment 'smoke' -> {out}" and sorted(out.rglob("*")) == before
    # what a preset needs and was not given is said, as the run would refuse it
    paper = run_experiment(ExperimentConfig(preset="paper-0.5b", out=str(tmp_path / "p"), dry_run=True))["plan"]
    assert paper.splitlines()[-1] == ("needs: --init-from PATH (an autoregressive checkpoint); --data (local FineWeb "
                                      "files); --gsm8k DIR (GSM8K's train.jsonl and test.jsonl): the run refuses to "
                                      "start without them")
    # each of them, given, leaves the list, as check_inputs accepts it
    from sinkdlm.experiment.presets import get_preset
    from sinkdlm.experiment.runner import missing_inputs

    assert missing_inputs(get_preset("paper-0.5b"), "m.gguf", None, "g") == ["data"]
    assert missing_inputs(get_preset("smoke"), None, None, None) == []
    assert not (tmp_path / "p").exists()


def test_a_preset_that_states_a_time_says_it_was_measured():
    """A preset's description (what `--help` and the plan show) states no time it did not measure: one that names
    seconds, minutes or hours says "measured" and gives a number."""
    import re

    from sinkdlm.experiment.presets import PRESETS

    for name, recipe in PRESETS.items():
        text = recipe().description
        if re.search(r"\d[\d,.]*\s*(s|seconds?|min|minutes?|h|hours?)\b|\b(in|a|an) (seconds|minutes?|hours?)\b", text):
            assert "measured" in text and re.search(r"\d", text), (name, text)
