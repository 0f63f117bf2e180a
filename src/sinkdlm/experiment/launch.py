"""`sinkdlm experiment --launcher local|slurm`: every run of a study a job, through submitit (docs/method.md §14).

    OUT/.sinkdlm-launch/jobs.json         what was submitted: each job's name, kind, id and log paths
    OUT/.sinkdlm-launch/state/<job>.json  what a job says of itself: running (host, attempt), requeued, failed
    OUT/.sinkdlm-launch/logs/<job id>/    submitit's folder: each job's stdout/stderr and its submission

A study is a list of `Job`s: the base model (presets with one), one job per run (variant x seed) and per step-0
control, and the report, which reads every run from disk once they have ended (a Slurm `afterany` dependency;
locally, a wait). A job calls `run_experiment` on its own part of the study (`--part`), so its run directory is
the one an in-process run writes and the report cannot tell them apart. A run on several processes
(`--gpus-per-run` above 1, `--tasks-per-node`, `--nodes`) trains on every rank with FSDP2 (DDP for
`--trainable lora`), submitit's `TorchDistributedEnvironment` giving the ranks; rank 0 then validates,
evaluates and analyses it.

Slurm's signal before the time limit (and on preemption) reaches the trainer's stop request: the step
finishes, a checkpoint is saved, and submitit requeues the job (`Checkpointable`), which resumes bitwise from
that checkpoint. A job that fails for good is recorded as failed with its log; the report names its run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import submitit

from sinkdlm.config.commands import ExperimentConfig
from sinkdlm.config.launch import LaunchConfig
from sinkdlm.experiment.plan import ExperimentPlan, log, make_plan, step0_name
from sinkdlm.experiment.stages import run_measured
from sinkdlm.experiment.units import DONE
from sinkdlm.experiment.variance import VAL
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.out_dir import LAUNCH_DIR

STATES = ("pending", "running", "done", "failed")
CONTROL_PREFIX = "step0-"  # a step-0 control's job name: the prefix, then its directory under OUT/step0
JOB_PARTS = {"base": "base", "run": "runs", "control": "controls", "report": "report"}  # a job's `--part`


@dataclass(frozen=True)
class Job:
    """One job of a study: `kind` base | run | control | report; `variant` and `seed` name its run or control."""

    name: str
    kind: str
    variant: str | None = None
    seed: int | None = None


def study_jobs(plan: ExperimentPlan) -> list[Job]:
    """The base (presets with one, without --init-from), every run seed-major, every step-0 control, the report."""
    jobs = [Job("base", "base")] if plan.preset.base is not None and not plan.init_from else []
    jobs += [Job(f"{v.name}-s{s}", "run", v.name, s) for s in plan.seeds for v in plan.preset.variants]
    if plan.init_from or plan.preset.base is not None:
        seen: set[str] = set()
        for v in plan.preset.variants:
            for s in plan.seeds:
                name = step0_name(v, s)
                if name not in seen:
                    seen.add(name)
                    jobs.append(Job(CONTROL_PREFIX + name, "control", v.name, s))
    return jobs + [Job("report", "report")]


def job_config(config: ExperimentConfig, job: Job) -> ExperimentConfig:
    """The in-process config of a job: its own variant and seed and its part of the study, no launcher of its own."""
    inline = {f.name: f.default for f in dataclasses.fields(LaunchConfig)}
    shard = {"variants": job.variant, "seeds": str(job.seed)} if job.variant is not None else {}
    # the job runs one seed, but analyses what the whole study's in-process run analyses (`ExperimentPlan.analysed`)
    first = make_plan(config).first_seed
    return dataclasses.replace(config, **{**inline, "part": JOB_PARTS[job.kind]}, **shard, analysed_seed=first,
                               overwrite=False, dry_run=False)


def _state_path(out: Path, name: str) -> Path:
    return out / LAUNCH_DIR / "state" / f"{name}.json"


def _logs(out: Path) -> Path:
    """submitit's folder of a study's jobs: one folder per job id (its stdout, stderr and submission)."""
    return out / LAUNCH_DIR / "logs" / "%j"


def _preempt_signal() -> int:
    """The signal submitit asks Slurm to send before a time limit (SUBMITIT_PREEMPT_SIGNAL, USR2 by default)."""
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


class ExperimentJob(submitit.helpers.Checkpointable):
    """What one submitit job runs: its part of the study, in-process. Checkpointable: on Slurm's signal the
    trainer saves at the end of its step, then submitit requeues this same job, which resumes from there."""

    def __init__(self, config: ExperimentConfig, job: Job, world_size: int, run: Callable[..., Any]) -> None:
        # `run`: runner.run_experiment, handed in (pickled by reference): the runner imports this module
        self.config, self.job, self.world_size, self.run = config, job, world_size, run

    def __call__(self) -> str:
        from sinkdlm.training.rundir import TrainingStopped

        env = submitit.JobEnvironment()
        state = _state_path(Path(self.config.out), self.job.name)
        if self.world_size > 1:  # RANK, WORLD_SIZE, MASTER_ADDR/PORT for the trainer's process group
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        main = env.global_rank == 0
        if self.config.cpus_per_task:  # a local job's share of the cores (one thread: the kernels a study pins)
            import torch

            torch.set_num_threads(self.config.cpus_per_task)
        attempt = (json.loads(state.read_text()).get("attempt", 0) + 1) if state.is_file() else 1
        if main:
            atomic_write_json(state, {"state": "running", "job_id": env.job_id, "host": socket.gethostname(),
                                      "pid": os.getpid(), "attempt": attempt, "time": time.time()})
        cfg = job_config(self.config, self.job)
        try:
            if self.job.kind == "run" and self.world_size > 1:  # every rank trains; rank 0 measures the rest
                self.run(dataclasses.replace(cfg, part="train"))
                if not main:
                    return "trained"
            self.run(cfg)
        except TrainingStopped as stopped:
            if stopped.signum == _preempt_signal():  # saved at the end of its step: requeue (the handler exits)
                if main:
                    atomic_write_json(state, {"state": "requeued", "job_id": env.job_id, "attempt": attempt,
                                              "checkpoint": str(stopped.checkpoint), "time": time.time()})
                os.kill(os.getpid(), stopped.signum)  # submitit's handler, restored by the trainer: checkpoint()
                time.sleep(60)  # the handler exits this process (requeue); never reached in practice
            if main:
                self._failed(state, env, attempt, f"stopped by signal {stopped.signum}")
            raise
        except BaseException as e:
            if main:
                self._failed(state, env, attempt, "".join(traceback.format_exception_only(type(e), e)).strip())
            raise
        if main:
            state.unlink(missing_ok=True)  # done: its products on disk say so
        return "done"

    def _failed(self, state: Path, env: Any, attempt: int, error: str) -> None:
        atomic_write_json(state, {"state": "failed", "job_id": env.job_id, "attempt": attempt, "error": error[-2000:],
                                  "time": time.time()})


# ----------------------------------------------------------------------------- executors
def check_launch(config: ExperimentConfig) -> None:
    """Every launch setting that needs submitit or the machine (`LaunchConfig.check` has the rest), before anything
    is submitted: one line each."""
    if config.launcher == "slurm":
        missing = [c for c in ("sbatch", "srun") if shutil.which(c) is None]
        if missing:
            raise ValueError(f"--launcher slurm needs Slurm's {' and '.join(missing)} on the PATH (run it on a login "
                             "node of the cluster), or use --launcher local on this machine")
        _slurm_executor(config)  # an unknown sbatch key: submitit's own list says so
    if config.launcher == "local" and config.gpus_per_run:
        import torch

        have, need = torch.cuda.device_count(), config.gpus_per_run * config.jobs
        if have < need:
            raise ValueError(f"--launcher local with --gpus-per-run {config.gpus_per_run} x --jobs {config.jobs} needs "
                             f"{need} GPUs; this machine has {have}: lower --jobs or --gpus-per-run (0 trains on CPUs)")
    if config.pin_commit:
        found = subprocess.run(["git", "rev-parse", "--verify", f"{config.pin_commit}^{{commit}}"],
                               capture_output=True, cwd=Path(__file__).resolve().parent)
        if found.returncode:
            raise ValueError(f"--pin-commit {config.pin_commit}: no such commit in this checkout's repository; give a "
                             "commit hash or tag it has (git log), or leave --pin-commit out")


def _slurm_parameters(config: LaunchConfig) -> dict[str, Any]:
    """The executor's slurm_* settings from the launch config and --sbatch, checked by submitit."""
    params: dict[str, Any] = {"nodes": config.nodes, "ntasks_per_node": config.processes_per_node(),
                              "gpus_per_node": config.gpus_per_run or None, "cpus_per_task": config.cpus_per_task,
                              "partition": config.partition, "account": config.account, "qos": config.qos,
                              "mem": config.mem, "constraint": config.constraint,
                              "time": config.timeout_minutes()}
    params = {k: v for k, v in params.items() if v is not None}
    extra = {k.replace("-", "_"): v for k, v in config.sbatch_settings().items()}
    return {**params, **extra}


def _slurm_executor(config: ExperimentConfig) -> submitit.SlurmExecutor:
    """A Slurm executor with the launch settings; submitit's own check refuses a key sbatch does not know."""
    executor = submitit.SlurmExecutor(folder=_logs(Path(config.out)), max_num_timeout=10)
    try:
        executor.update_parameters(**_slurm_parameters(config))
    except ValueError as e:  # submitit lists the valid keys: say which one is wrong, in one line
        given = sorted(config.sbatch_settings())
        raise ValueError(f"--sbatch: a setting submitit's Slurm executor does not know among {', '.join(given)} "
                         f"({str(e).splitlines()[0][:300]})") from None
    return executor


def make_executor(config: ExperimentConfig) -> submitit.Executor:
    """The submitit executor of the launch config: local or Slurm, each job's resources and time limit."""
    if config.launcher == "slurm":
        executor = _slurm_executor(config)
        if config.pin_commit:
            executor.update_parameters(setup=[f"export PYTHONPATH={pinned_tree(config.pin_commit)}/src"])
    else:
        executor = submitit.LocalExecutor(folder=_logs(Path(config.out)))
        executor.update_parameters(timeout_min=config.timeout_minutes(), tasks_per_node=config.processes_per_node(),
                                   gpus_per_node=config.gpus_per_run)
    return executor


def pinned_tree(commit: str) -> Path:
    """A git worktree of `commit` beside this checkout (made once), whose src/ the jobs import (docs/method.md §11)."""
    root = Path(__file__).resolve().parents[3]
    tree = root.parent / "wt" / f"sinkdlm-{commit}"
    if not (tree / "src" / "sinkdlm").is_dir():
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), commit], check=True,
                       capture_output=True)
    return tree


@functools.cache
def pinned_knows_part(tree: Path) -> bool:
    """Whether the pinned code's `sinkdlm experiment` takes --part (code before it runs a job's shard whole)."""
    found = subprocess.run([sys.executable, "-m", "sinkdlm", "experiment", "--help"], cwd=str(tree), capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(tree / "src"), "COLUMNS": "200"})
    return "--part" in found.stdout


def _callable(config: ExperimentConfig, job: Job, run: Callable[..., Any]) -> Any:
    """What the job runs: this checkout's `ExperimentJob`, or for --pin-commit the pinned code's own command line."""
    if not config.pin_commit:
        return ExperimentJob(config, job, config.world_size(), run)
    tree = pinned_tree(config.pin_commit)
    cmd = [sys.executable, "-m", "sinkdlm", "experiment", "--preset", config.preset, "--out",
           str(Path(config.out).resolve())]
    if job.variant is not None:
        cmd += ["--variants", job.variant, "--seeds", str(job.seed)]
    if pinned_knows_part(tree):  # else the job runs its shard whole, and writes a report over it (see launch_experiment)
        cmd += ["--part", JOB_PARTS[job.kind]]
    threads = {"OMP_NUM_THREADS": str(config.cpus_per_task)} if config.cpus_per_task else {}
    return submitit.helpers.CommandFunction(cmd, cwd=str(tree),
                                            env={**os.environ, "PYTHONPATH": str(tree / "src"), **threads})


# ----------------------------------------------------------------------------- submit, wait, status
def launch_experiment(config: ExperimentConfig, run: Callable[..., Any]) -> dict[str, Any]:
    """Submit the study as jobs (`run_experiment` has checked the launch settings and --out): Slurm returns
    once they are queued; local runs `--jobs` at once and waits. Each job calls `run` (`run_experiment`)."""
    plan = make_plan(job_config(config, Job("report", "report")))
    plan.out.mkdir(parents=True, exist_ok=True)
    if config.pin_commit and not pinned_knows_part(pinned_tree(config.pin_commit)):
        log(f"--pin-commit {config.pin_commit} predates --part: each job runs its shard whole and writes a report over "
            "its own runs, which the report job's replaces; a run missing then is retrained by the report job")
    submit = _submit_slurm if config.launcher == "slurm" else _run_local
    return submit(config, make_executor(config), study_jobs(plan), run)


def _job_entry(job: Job, submitted: Any) -> dict[str, Any]:
    return {"name": job.name, "kind": job.kind, "variant": job.variant, "seed": job.seed, "job_id": submitted.job_id,
            "stdout": str(submitted.paths.stdout), "stderr": str(submitted.paths.stderr)}


def _write_jobs(config: ExperimentConfig, entries: list[dict[str, Any]]) -> Path:
    path = Path(config.out) / LAUNCH_DIR / "jobs.json"
    atomic_write_json(path, {"launcher": config.launcher, "preset": config.preset, "jobs": entries,
                             "submitted": time.time()})
    return path


def _submit_slurm(config: ExperimentConfig, executor: Any, jobs: list[Job], run: Callable[..., Any]) -> dict[str, Any]:
    """base -> runs and controls (afterok on the base) -> the report (afterany on every one of them)."""
    entries, after = [], []
    base = [j for j in jobs if j.kind == "base"]
    middle = [j for j in jobs if j.kind in ("run", "control")]
    if base:
        submitted = executor.submit(_callable(config, base[0], run))
        entries.append(_job_entry(base[0], submitted))
        executor.update_parameters(dependency=f"afterok:{submitted.job_id}")
    with executor.batch():  # one array: the runs and controls
        pending = [executor.submit(_callable(config, j, run)) for j in middle]
    for j, submitted in zip(middle, pending):
        entries.append(_job_entry(j, submitted))
        after.append(submitted.job_id)
    # the report waits for every run and control however it ended (it names the ones that failed); an array
    # is named by its job id, which covers its tasks
    ids = list(dict.fromkeys(i.split("_")[0] for i in (after or [e["job_id"] for e in entries])))
    executor.update_parameters(dependency="afterany:" + ":".join(ids))
    report = executor.submit(_callable(config, jobs[-1], run))
    entries.append(_job_entry(jobs[-1], report))
    path = _write_jobs(config, entries)
    log(f"submitted {len(entries)} Slurm jobs ({len(middle)} runs and controls, "
        f"{'a base, ' if base else ''}the report after them); job ids {entries[0]['job_id']} .. {report.job_id}")
    log(f"logs: {Path(config.out) / LAUNCH_DIR / 'logs'} (one folder per job id); jobs: {path}")
    log(f"status: sinkdlm experiment --status --out {config.out}")
    return {"launcher": "slurm", "jobs": entries}


def _run_local(config: ExperimentConfig, executor: Any, jobs: list[Job], run: Callable[..., Any]) -> dict[str, Any]:
    """The base first, then the runs and controls `--jobs` at a time (each its own GPUs), then the report."""
    entries: list[dict[str, Any]] = []
    stages = [[j for j in jobs if j.kind == "base"], [j for j in jobs if j.kind in ("run", "control")], jobs[-1:]]
    failed: list[str] = []
    for stage in stages:
        queue, running = list(stage), {}
        while queue or running:
            while queue and len(running) < (config.jobs if stage is stages[1] else 1):
                slot = next(i for i in range(config.jobs) if i not in {s for s, _ in running.values()})
                if config.gpus_per_run:
                    gpus = range(slot * config.gpus_per_run, (slot + 1) * config.gpus_per_run)
                    executor.update_parameters(visible_gpus=tuple(gpus))
                job = queue.pop(0)
                submitted = executor.submit(_callable(config, job, run))
                entries.append(_job_entry(job, submitted))
                _write_jobs(config, entries)
                running[job.name] = (slot, submitted)
                log(f"job {job.name} started (id {submitted.job_id}; log {submitted.paths.stderr})")
            time.sleep(0.5)
            for name, (slot, submitted) in list(running.items()):
                if submitted.done():
                    del running[name]
                    if submitted.exception() is not None:
                        failed.append(name)
                        log(f"job {name} failed: {_error(Path(config.out), name)} (log {submitted.paths.stderr})")
                    else:
                        log(f"job {name} done")
        if stage is stages[0] and failed:
            raise RuntimeError(f"the base model's job failed (log {entries[0]['stderr']}): nothing else was started")
    return {"launcher": "local", "jobs": entries, "failed": failed}


def _error(out: Path, name: str) -> str:
    """The last line of the error a failed job recorded of itself."""
    state = _state_path(out, name)
    said = json.loads(state.read_text()) if state.is_file() else {}
    return (said.get("error") or "no error recorded (killed?)").strip().splitlines()[-1]


def job_states(out: Path) -> list[dict[str, Any]]:
    """Each submitted job of `out` with its state (pending | running | done | failed), id and logs."""
    path = out / LAUNCH_DIR / "jobs.json"
    if not path.is_file():
        raise ValueError(f"{out} has no submitted jobs ({path} is missing): start it with --launcher local or slurm")
    record = json.loads(path.read_text())
    config = ExperimentConfig(preset=record["preset"], out=str(out))
    rows = []
    for e in record["jobs"]:
        job = Job(e["name"], e["kind"], e.get("variant"), e.get("seed"))
        state_file = _state_path(out, job.name)
        said = json.loads(state_file.read_text()) if state_file.is_file() else {}
        if part_done(job_config(config, job), job):
            state = "done"
        elif said.get("state") == "failed":
            state = "failed"
        elif said.get("state") in ("running", "requeued"):
            state = "running" if said["state"] == "running" else "pending"
            if record["launcher"] == "slurm" and _slurm_ended(out, e["job_id"]):
                state = "failed"
        else:
            state = "pending"
        rows.append({**e, "state": state, **({"error": said["error"]} if state == "failed" and "error" in said else {})})
    return rows


def part_done(config: ExperimentConfig, job: Job) -> bool:
    """Whether a job's part of the study is on disk: the base trained, its run or control measured, the report.
    A control is read from its own directory: a status call has no --init-from, so its plan lists no controls."""
    plan = make_plan(config)
    if job.kind == "base":
        return (plan.out / "base" / DONE).is_file()
    if job.kind == "report":
        return (plan.out / "report.md").is_file()
    if job.kind == "control":
        return (plan.out / "step0" / job.name.removeprefix(CONTROL_PREFIX) / VAL).is_file()
    return run_measured(plan, job.variant, job.seed)


def _slurm_ended(out: Path, job_id: str) -> bool:
    """Slurm says the job ended without finishing (failed, cancelled, out of time or memory)."""
    try:
        state = submitit.SlurmJob(folder=_logs(out), job_id=job_id).state
    except Exception:  # no sacct here: the job's own record is all there is
        return False
    return state.split()[0] in ("FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL")


def status_lines(out: Path) -> list[str]:
    """`sinkdlm experiment --status`: a line per job, then the count in each state."""
    rows = job_states(out)
    width = max(len(r["name"]) for r in rows)
    lines = [f"{r['name']:<{width}}  {r['state']:<8} job {r['job_id']:<12} log {r['stderr']}"
             + (f"\n{'':<{width}}  error: {r['error'].splitlines()[-1]}" if r.get("error") else "") for r in rows]
    counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return lines
