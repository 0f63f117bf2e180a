"""`sinkdlm experiment`: the paper's comparison end to end (train variants, evaluate, analyse, report)."""

from __future__ import annotations

from pathlib import Path

import typer

from sinkdlm.cli.app import app, typed_command
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import ExperimentConfig


@app.command()
@config_options(ExperimentConfig)
def experiment(ctx: typer.Context, cfg: ExperimentConfig) -> None:
    """Train the preset's variants under one budget, evaluate, analyse and write report.md/.html."""
    from sinkdlm.io.out_dir import check_out

    cfg.check()  # the launch settings, one line each, before anything else
    if cfg.status:  # a launched study's jobs: pending, running, done or failed (experiment/launch.py)
        from sinkdlm.experiment.launch import status_lines

        typer.echo("\n".join(status_lines(Path(cfg.out))))
        return
    # what --out holds (another preset's experiment, unrelated files), said before the seconds of imports
    # the experiment needs; run_experiment checks it again for callers from Python
    check_out(cfg.out, "experiment", overwrite=cfg.overwrite, resumable=True, preset=cfg.preset,
              inputs=(cfg.init_from, cfg.data, cfg.gsm8k))
    if cfg.dry_run:
        from sinkdlm.experiment.runner import describe_experiment

        typer.echo(describe_experiment(cfg))
        return
    from sinkdlm.experiment import run_experiment
    from sinkdlm.training.rundir import TrainingStopped

    new_out = not Path(cfg.out).exists()
    try:  # re-running the command resumes
        run_experiment(cfg, resume_command=typed_command(ctx, drop=("overwrite",)))
    except TrainingStopped as stopped:  # Ctrl-C/SIGTERM in a training stage: saved, command printed
        raise typer.Exit(stopped.exit_code) from None
    except ValueError:
        if new_out:  # the input checks made --out (to prove it writable): a refused run leaves none
            _remove_unstarted(Path(cfg.out))
        raise


def _remove_unstarted(path: Path) -> None:
    """Remove `path` if it holds nothing but empty folders, the runner's STARTED.json and the record of
    them (a first stage refused its input: nothing ran); else leave all of it."""
    import os

    from sinkdlm.io.out_dir import RECORD

    started = (path / "STARTED.json", path / RECORD)
    files = [Path(d, f) for d, _, names in os.walk(path) for f in names]
    if not path.is_dir() or any(f not in started for f in files):
        return
    for f in started:
        f.unlink(missing_ok=True)
    try:
        for dirpath, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
            Path(dirpath).rmdir()
    except OSError:  # something appeared meanwhile: keep it
        pass
