"""`sinkdlm experiment --launcher local|slurm` (experiment/launch.py): every run a submitit job.

Slurm is checked up to the sbatch script (a fake `sbatch` on the PATH records what it is given); the local
launcher runs a smoke run on two gloo processes with FSDP2 and its report, and a job sent Slurm's pre-limit
signal is requeued and resumes to a checkpoint bitwise equal to an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import sinkdlm.cli  # noqa: F401  (registers the commands)
from sinkdlm.cli.app import app, main
from sinkdlm.config import ExperimentConfig
from sinkdlm.experiment import get_preset, run_experiment
from numerics import fp_tolerance

submitit = pytest.importorskip("submitit")

FAKE_SBATCH = """#!/usr/bin/env bash
# a fake sbatch: keeps the script it was given, answers with the next job id
n=$(( $(ls "$FAKE_SLURM_LOG" | wc -l) + 100 ))
cp "${@: -1}" "$FAKE_SLURM_LOG/$n.sh"
echo "Submitted batch job $n"
"""


def _fake_slurm(tmp_path: Path, monkeypatch) -> Path:
    """sbatch, srun, squeue, sacct and scancel on the PATH: sbatch records, the others answer nothing."""
    bin_dir, log = tmp_path / "bin", tmp_path / "sbatch-log"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in {"sbatch": FAKE_SBATCH, "srun": "#!/bin/sh\n", "squeue": "#!/bin/sh\n",
                       "sacct": "#!/bin/sh\n", "scancel": "#!/bin/sh\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    return log


def _sbatch_lines(script: str) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=?(.*)$", script, flags=re.M))


def test_slurm_scripts_carry_the_resources_and_the_report_depends_on_every_run(tmp_path, monkeypatch):
    log = _fake_slurm(tmp_path, monkeypatch)
    out = tmp_path / "study"
    cfg = ExperimentConfig(preset="smoke", out=str(out), launcher="slurm", partition="gpu", account="lab",
                           qos="high", time_limit="02:30:00", gpus_per_run=2, cpus_per_task=8, mem="64G",
                           constraint="h100", sbatch="exclude=node7;mail-type=END")
    record = run_experiment(cfg)
    scripts = {int(p.stem): p.read_text() for p in log.glob("*.sh")}
    assert sorted(scripts) == [100, 101]  # one array (6 runs), then the report
    runs, report = _sbatch_lines(scripts[100]), _sbatch_lines(scripts[101])
    for lines in (runs, report):
        assert lines["partition"] == "gpu" and lines["account"] == "lab" and lines["qos"] == "high"
        assert lines["time"] == "150" and lines["nodes"] == "1"
        assert lines["ntasks-per-node"] == "2" and lines["gpus-per-node"] == "2"  # one process per GPU
        assert lines["cpus-per-task"] == "8" and lines["mem"] == "64G" and lines["constraint"] == "h100"
        assert lines["exclude"] == "node7" and lines["mail-type"] == "END"
        assert lines["signal"].startswith("USR2@")  # the warning before the limit: checkpoint and requeue
    assert runs["array"].startswith("0-5")  # the smoke preset's 3 variants x 2 seeds
    assert report["dependency"] == "afterany:100"  # the whole array, whatever each run's fate
    assert "dependency" not in runs
    jobs = json.loads((out / ".sinkdlm-launch" / "jobs.json").read_text())["jobs"]
    assert [j["name"] for j in jobs] == [f"{v.name}-s{s}" for s in (0, 1) for v in get_preset("smoke").variants] + ["report"]
    assert [j["job_id"] for j in jobs] == [f"100_{i}" for i in range(6)] + ["101"] == [j["job_id"] for j in record["jobs"]]
    status = CliRunner().invoke(app, ["experiment", "--status", "--out", str(out)])
    assert status.exit_code == 0, status.output
    assert status.output.count(" pending ") == 7 and "7 pending" in status.output  # submitted, nothing ran


@pytest.mark.parametrize("args, says", [
    (["--jobs", "0", "--launcher", "local"], "--jobs must be at least 1"),
    (["--gpus-per-run", "2"], "need a launcher that starts the processes"),
    (["--launcher", "slurm"], "needs Slurm's sbatch and srun on the PATH"),
    (["--launcher", "local", "--partition", "gpu"], "--partition is a Slurm setting"),
    (["--launcher", "slurm", "--time-limit", "soon"], "--time-limit takes"),
    (["--part", "everything"], "--part must be one of all | base | train | runs | controls | report"),
    (["--launcher", "local", "--part", "runs"], "--part runs is one job's share of a launched study"),
])
def test_bad_launch_settings_are_one_line_before_anything(tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    out = tmp_path / "study"
    err = _refused(capsys, ["experiment", "--preset", "smoke", "--out", str(out), *args])
    assert says in err, err
    assert not out.exists()


def test_an_unknown_pinned_commit_is_one_line_before_anything(tmp_path, capsys):
    out = tmp_path / "study"
    err = _refused(capsys, ["experiment", "--preset", "smoke", "--out", str(out), "--launcher", "local",
                            "--pin-commit", "no-such-commit"])
    assert "--pin-commit no-such-commit: no such commit" in err and not out.exists(), err


@pytest.mark.parametrize("knows_part", [True, False])
def test_a_pinned_job_runs_its_own_part_where_the_pinned_code_takes_part(tmp_path, monkeypatch, knows_part):
    """--pin-commit: each job is the pinned code's command line for its run, with the part an unpinned job runs
    (`job_config`), so no job but the report's writes a report; code from before --part gets none."""
    from sinkdlm.experiment import launch

    tree = tmp_path / "pinned"
    monkeypatch.setattr(launch, "pinned_tree", lambda commit: tree)
    monkeypatch.setattr(launch, "pinned_knows_part", lambda t: knows_part)
    cfg = ExperimentConfig(preset="smoke", out=str(tmp_path / "study"), launcher="local", pin_commit="abc1234")
    jobs = launch.study_jobs(launch.make_plan(cfg))
    for job in jobs:
        command = launch._callable(cfg, job, run_experiment).command
        part = command[command.index("--part") + 1] if "--part" in command else None
        assert part == (launch.job_config(cfg, job).part if knows_part else None), (job, command)
        assert ("--variants" in command) == (job.kind == "run"), command
    assert {launch.job_config(cfg, j).part for j in jobs} == {"runs", "report"}


def test_a_pinned_trees_help_says_whether_it_takes_part():
    """`pinned_knows_part` reads the pinned code's own --help: this checkout's code takes --part."""
    from sinkdlm.experiment.launch import pinned_knows_part

    assert pinned_knows_part(Path(__file__).resolve().parents[2])


def _refused(capsys, argv: list[str]) -> str:
    """`sinkdlm ARGV` exits 2 with one line on stderr and nothing on stdout; that line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    captured = capsys.readouterr()
    assert exc.value.code == 2 and captured.out == "" and len(captured.err.strip().splitlines()) == 1, captured
    return captured.err


def test_an_unknown_sbatch_key_is_refused_before_anything_is_submitted(tmp_path, monkeypatch, capsys):
    log = _fake_slurm(tmp_path, monkeypatch)
    out = tmp_path / "study"
    err = _refused(capsys, ["experiment", "--preset", "smoke", "--out", str(out), "--launcher", "slurm",
                            "--sbatch", "exclude=node7;colour=blue"])
    assert "--sbatch" in err and "colour" in err, err
    assert not list(log.iterdir()) and not out.exists()


def _smoke_tolerance() -> dict[str, float]:
    """The smoke golden file's rule (tests/experiment/test_experiment.py): a run's val_loss after 3 steps."""
    micro = get_preset("smoke").train
    layers = micro.model_overrides["num_hidden_layers"] + 1
    golden = json.loads((Path(__file__).parent / "data" / "smoke_results_golden.json").read_text())
    return golden, fp_tolerance(torch.float32, n=micro.batch_size * micro.seq_len * micro.model_overrides["vocab_size"],
                                depth=micro.max_steps * 2 * layers + layers,
                                scale=max(r["val_loss"] for v in golden["variants"].values() for r in v["seeds"].values()))


@pytest.mark.slow  # two jobs, one of two processes: about a minute on 2 quiet cores
def test_local_launcher_runs_a_two_process_fsdp_run_and_its_report(tmp_path, monkeypatch):
    """One smoke run as a local job of 2 gloo processes (FSDP2), then the report job: the run directory is a
    one-process run's (val_loss as the in-process golden run's, under the numerics rule) and every job is done."""
    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "study"
    cfg = ExperimentConfig(preset="smoke", out=str(out), variants="vanilla", seeds="0", launcher="local",
                           tasks_per_node=2)
    record = run_experiment(cfg)
    assert record["failed"] == []
    results = json.loads((out / "results.json").read_text())
    got = results["variants"]["vanilla"]["seeds"]["0"]["val_loss"]
    golden, tol = _smoke_tolerance()
    want = golden["variants"]["vanilla"]["seeds"]["0"]["val_loss"]
    assert abs(got - want) <= tol["atol"] + tol["rtol"] * abs(want), (got, want, tol)
    timed = {"seconds", "train_seconds", "train_tokens_per_s"}  # what the golden file leaves out (it times the machine)
    assert set(results["variants"]["vanilla"]["seeds"]["0"]) - timed == set(golden["variants"]["vanilla"]["seeds"]["0"])
    train_cfg = json.loads((out / "runs" / "vanilla-s0" / "train" / "train_config.json").read_text())
    assert train_cfg["fsdp"] is True
    status = CliRunner().invoke(app, ["experiment", "--status", "--out", str(out)])
    assert "2 done" in status.output and "vanilla-s0" in status.output, status.output


@pytest.mark.slow  # a 24-step run launched, signalled and resumed, then trained again uninterrupted
def test_a_signalled_job_requeues_and_resumes_bitwise(tmp_path, monkeypatch):
    """Slurm's pre-limit signal (USR2) to a running local job: the trainer saves at the end of its step, submitit
    requeues the job, and the resumed run ends on the checkpoint an uninterrupted run ends on, byte for byte."""
    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "cache"))
    steps = 24
    common = dict(preset="smoke", variants="vanilla", seeds="0", max_steps=steps)
    out = tmp_path / "launched"
    cfg = ExperimentConfig(out=str(out), launcher="local", **common)
    launched: dict = {}
    thread = threading.Thread(target=lambda: launched.update(run_experiment(cfg)))
    thread.start()
    state, metrics = out / ".sinkdlm-launch" / "state" / "vanilla-s0.json", out / "runs" / "vanilla-s0" / "train" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 4):
        time.sleep(0.05)
    assert metrics.is_file(), "the job never started training"
    os.kill(json.loads(state.read_text())["pid"], signal.SIGUSR2)
    thread.join(timeout=300)
    assert not thread.is_alive() and launched["failed"] == []
    log = Path(launched["jobs"][0]["stderr"]).read_text()
    assert "SIGUSR2 received" in log and "this job is preempted" in log, log[-2000:]  # ours, then submitit's
    assert re.search(r"resuming from .*checkpoints/step-\d+", log), log[-2000:]  # the requeued job's second start
    assert not state.exists()  # done: the job removed its record
    reference = tmp_path / "uninterrupted"
    run_experiment(ExperimentConfig(out=str(reference), part="runs", **common))
    final = f"runs/vanilla-s0/train/checkpoints/step-{steps}"
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert (out / final / name).read_bytes() == (reference / final / name).read_bytes(), name


@pytest.mark.slow  # the whole smoke study as 7 jobs, 2 at a time
def test_the_launched_smoke_study_reports_what_the_in_process_one_does(tmp_path, monkeypatch):
    """--launcher local --jobs 2 over the smoke preset: results.json is the committed in-process golden file's,
    keys, strings and integers exactly and floats under its numerics rule."""
    from test_experiment import GOLDEN, _golden_mismatches, _without_time

    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "study"
    assert run_experiment(ExperimentConfig(preset="smoke", out=str(out), launcher="local", jobs=2))["failed"] == []
    got = _without_time(json.loads((out / "results.json").read_text()), str(out))
    _, tol = _smoke_tolerance()
    mismatches = _golden_mismatches(got, json.loads(GOLDEN.read_text()), tol["rtol"], tol["atol"])
    assert not mismatches, mismatches[:10]


def test_the_report_keeps_the_seeds_measured_whole_and_names_the_missing_runs(tmp_path):
    """A job that failed for good: `measured_only` keeps the seeds whose every run is on disk (pairs stay paired)
    and names the runs left out; the report says so in words; no seed measured whole is one line."""
    from sinkdlm.experiment.plan import make_plan
    from sinkdlm.experiment.report import missing_line
    from sinkdlm.experiment.runner import measured_only
    from sinkdlm.experiment.stages import run_products

    plan = make_plan(ExperimentConfig(preset="smoke", out=str(tmp_path / "study")))
    for s in plan.seeds:
        for v in plan.preset.variants:
            if (v.name, s) == ("gated", 1):
                continue  # its job failed
            for f in run_products(plan, plan.out / "runs" / f"{v.name}-s{s}", s):
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text("{}")
    kept, missing = measured_only(plan)
    assert kept.seeds == (0,) and missing == ["gated-s1"]
    line = missing_line({"missing_runs": missing, "seeds": list(kept.seeds)})
    assert "gated-s1" in line and "seeds 0," in line
    (plan.out / "runs" / "vanilla-s0" / "val.json").unlink()
    with pytest.raises(ValueError, match="no seed of .* has every run measured .*vanilla-s0, gated-s1"):
        measured_only(plan)


def test_a_control_jobs_status_reads_its_own_directory(tmp_path):
    """`--status` has no --init-from, so its plan lists no step-0 controls: a control job is done when its own
    directory holds its validation, and not before."""
    from sinkdlm.experiment.launch import Job, job_config, part_done

    cfg = ExperimentConfig(preset="late-sink", out=str(tmp_path / "study"))
    job = Job("step0-sink-all-s300", "control", "sink-all", 300)
    assert not part_done(job_config(cfg, job), job)
    (tmp_path / "study" / "step0" / "sink-all-s300").mkdir(parents=True)
    (tmp_path / "study" / "step0" / "sink-all-s300" / "val.json").write_text("{}")
    assert part_done(job_config(cfg, job), job)


def test_a_launched_job_analyses_what_the_in_process_study_analyses(tmp_path):
    """A preset that analyses its first seed only: each job runs one seed, yet analyses a run or a step-0 control
    exactly where the whole study's in-process plan does (the study's first seed), not every job's own first."""
    import dataclasses

    from sinkdlm.experiment.launch import job_config, study_jobs
    from sinkdlm.experiment.plan import make_plan

    preset = dataclasses.replace(get_preset("late-sink"), analyse_every_seed=False)
    cfg = ExperimentConfig(preset=preset, out=str(tmp_path / "study"), init_from=str(tmp_path / "base"),
                           seeds="302,300,301")
    plan = make_plan(cfg)
    assert plan.first_seed == 302 and {s for s in plan.seeds if plan.analysed(s)} == {302}
    runs = controls = 0
    analysed_controls: dict[str, str] = {}
    for job in study_jobs(plan):
        jp = make_plan(job_config(cfg, job))
        if job.kind == "run":
            runs += 1
            assert jp.seeds == (job.seed,) and jp.analysed(job.seed) == (job.seed == 302), job.name
        elif job.kind == "control":
            controls += 1
            analysed_controls |= {n: v.name for n, v in jp.analysed_controls().items()}
    assert runs == 15 and controls > 0
    assert analysed_controls == {n: v.name for n, v in plan.analysed_controls().items()} != {}
    assert all(n.endswith("-s302") or "-s3" not in n for n in analysed_controls)  # a shared control has no seed
