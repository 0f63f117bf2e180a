"""`LaunchConfig`: where the runs of `sinkdlm experiment` execute (docs/method.md §14), declared once.

`none` (the default) trains every run in this process, one after another. `local` and `slurm` hand each run
(variant x seed), each step-0 control and the report to submitit as jobs: `local` on this machine, `--jobs` at
once; `slurm` as sbatch jobs, the report depending on every run. The fields below are the command's flags
(`sinkdlm experiment --launcher slurm --partition gpu --gpus-per-run 8 ...`); their checks that need no
library are here, the rest (the sbatch keys, `sbatch` on the PATH) in `experiment/launch.py`. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LAUNCHERS = ("none", "local", "slurm")
# What one process of a study runs (`run_experiment`): all of it, or one launched job's part: the base model, the
# training of a run on several processes (every rank), the runs or the step-0 controls measured, or the report.
PARTS = ("all", "base", "train", "runs", "controls", "report")
_MEM = re.compile(r"^\d+[KMGT]?$")
_TIME = re.compile(r"^(\d+-)?\d+(:\d{2}){0,2}$")


@dataclass(kw_only=True)
class LaunchConfig:
    """How the experiment's runs are executed: in this process, as local jobs, or as Slurm jobs (submitit)."""

    launcher: str = "none"
    """none (every run in this process, in turn) | local (each run a job on this machine, --jobs at once) | slurm (each run an sbatch job; returns once submitted)."""
    jobs: int = 1
    """--launcher local: how many jobs run at once (each takes --gpus-per-run devices, or one CPU process per task)."""
    status: bool = False
    """Show each run of --out as pending, running, done or failed, with its job id and log, and exit."""
    partition: str | None = None
    """Slurm partition (sbatch --partition)."""
    account: str | None = None
    """Slurm account (sbatch --account)."""
    qos: str | None = None
    """Slurm quality of service (sbatch --qos)."""
    time_limit: str = "24:00:00"
    """Time limit of each job, [D-]HH:MM:SS or minutes; a run still training near it is checkpointed and requeued."""
    nodes: int = 1
    """Nodes per run (training across them with FSDP2)."""
    gpus_per_run: int = 0
    """GPUs per node of each run (0: none, CPU jobs); above 1 (or with --nodes > 1) the run trains with FSDP2 (DDP for --trainable lora), one process per GPU."""
    tasks_per_node: int | None = None
    """Processes per node of each run (default: --gpus-per-run, at least 1); on CPUs, N gloo processes train one run."""
    cpus_per_task: int | None = None
    """CPU cores per process (sbatch --cpus-per-task)."""
    mem: str | None = None
    """Memory per node, e.g. 64G (sbatch --mem)."""
    constraint: str | None = None
    """Node features (sbatch --constraint), e.g. h100."""
    sbatch: str | None = None
    """Further sbatch settings, KEY=VALUE separated by ';' (e.g. 'mail-type=END;exclude=node7')."""
    pin_commit: str | None = None
    """Run the jobs on the code of this git commit (a worktree beside the checkout), e.g. a study's declared code (docs/method.md §11)."""
    part: str = "all"
    """all | base | train | runs | controls | report: the part of the study this process runs, as a launched job does (the launcher passes it; `--part report` writes the report over the seeds measured whole, naming the runs missing)."""

    def launched(self) -> bool:
        """The runs go to submitit (local or Slurm jobs), not through this process."""
        return self.launcher != "none"

    def processes_per_node(self) -> int:
        """Processes (ranks) per node of one run."""
        return self.tasks_per_node or max(self.gpus_per_run, 1)

    def world_size(self) -> int:
        """Processes (ranks) of one run over all its nodes."""
        return self.nodes * self.processes_per_node()

    def timeout_minutes(self) -> int:
        """`time_limit` in minutes (submitit's `timeout_min`)."""
        text = self.time_limit.strip()
        days, _, clock = text.rpartition("-")
        parts = [int(p) for p in clock.split(":")]
        if len(parts) == 1:  # sbatch's plain number is minutes
            minutes = parts[0]
        else:
            parts += [0] * (3 - len(parts))
            minutes = parts[0] * 60 + parts[1] + (1 if parts[2] else 0)
        return (int(days) if days else 0) * 24 * 60 + minutes

    def sbatch_settings(self) -> dict[str, str]:
        """--sbatch as {key: value}, the keys spelt as sbatch spells them (dashes)."""
        out: dict[str, str] = {}
        for item in (self.sbatch or "").split(";"):
            if not item.strip():
                continue
            key, eq, value = item.strip().partition("=")
            if not eq or not key.strip():
                raise ValueError(f"--sbatch takes KEY=VALUE items separated by ';', got {item.strip()!r}")
            out[key.strip().lstrip("-")] = value.strip()
        return out

    def check(self) -> None:
        """Every value that can be judged without submitit or the machine: one line each, before any work."""
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"--launcher must be one of {' | '.join(LAUNCHERS)}, got {self.launcher!r}")
        for name in ("jobs", "nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        for name in ("gpus_per_run", "tasks_per_node", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "gpus_per_run" else 1):
                raise ValueError(f"--{name.replace('_', '-')} must be at least {0 if name == 'gpus_per_run' else 1}, "
                                 f"got {value}")
        if not _TIME.match(self.time_limit.strip()) or self.timeout_minutes() < 1:
            raise ValueError(f"--time-limit takes [D-]HH:MM:SS or minutes (at least 1), got {self.time_limit!r}")
        if self.mem is not None and not _MEM.match(self.mem):
            raise ValueError(f"--mem takes a size such as 64G or 512000M, got {self.mem!r}")
        self.sbatch_settings()
        if self.part not in PARTS:
            raise ValueError(f"--part must be one of {' | '.join(PARTS)}, got {self.part!r}")
        if self.launched() and self.part != "all":
            raise ValueError(f"--part {self.part} is one job's share of a launched study, and --launcher {self.launcher} "
                             "submits every part: leave --part out")
        if self.launcher == "none" and self.world_size() > 1:
            raise ValueError("--gpus-per-run/--tasks-per-node/--nodes above 1 need a launcher that starts the "
                             "processes: add --launcher local (this machine) or --launcher slurm")
        if self.launcher != "slurm":
            slurm_only = [f"--{n.replace('_', '-')}" for n in ("partition", "account", "qos", "constraint", "sbatch")
                          if getattr(self, n) is not None]
            if slurm_only:
                raise ValueError(f"{', '.join(slurm_only)} {'is a Slurm setting' if len(slurm_only) == 1 else 'are Slurm settings'}: "
                                 f"add --launcher slurm, or leave {'it' if len(slurm_only) == 1 else 'them'} out")
        if self.launcher == "local" and self.nodes > 1:
            raise ValueError("--nodes above 1 needs --launcher slurm (a local job runs on this machine)")
