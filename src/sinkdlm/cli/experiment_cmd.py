"""`sinkdlm experiment`: the paper's comparison end to end (train variants, evaluate, analyse, report)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from sinkdlm.cli.app import app, typed_command


@app.command()
def experiment(
    ctx: typer.Context,
    preset: str = typer.Option("demo", "--preset", help="smoke | demo | study | study-gpu | real | real-gpu | ablation | paper-0.5b"),
    out: str = typer.Option("runs/demo", "--out", help="Experiment directory (re-run the same command to resume)."),
    init_from: Optional[str] = typer.Option(None, "--init-from", help="Local AR checkpoint, a directory or a .gguf (paper-0.5b; real: default the example model)."),
    data: Optional[str] = typer.Option(None, "--data", help="Override the preset's corpus."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Comma-separated seeds (default: the preset's)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Override the training budget."),
    device: Optional[str] = typer.Option(None, "--device", help="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N."),
    gsm8k: Optional[str] = typer.Option(None, "--gsm8k", help="Folder with GSM8K train.jsonl/test.jsonl (paper-0.5b)."),
    variants: Optional[str] = typer.Option(
        None, "--variants", help="Comma-separated variant names to run (a shard; default: all the preset's)."),
) -> None:
    """Train the preset's variants under one budget, evaluate, analyse and write report.md/.html."""
    from sinkdlm.experiment import run_experiment
    from sinkdlm.training.rundir import TrainingStopped
    from sinkdlm.validation import check_optional_int, check_seed, parse_int_list

    seed_list = parse_int_list(seeds, "--seeds")
    for s in seed_list or ():
        check_seed(s, "--seeds")
    check_optional_int("--max-steps", max_steps, 1, none_means="the preset's budget")
    new_out = not Path(out).exists()
    try:
        run_experiment(preset, out, init_from=init_from, data=data, seeds=seed_list, max_steps=max_steps, device=device,
                       gsm8k=gsm8k, resume_command=typed_command(ctx),
                       variants=[v.strip() for v in variants.split(",") if v.strip()] if variants else None)  # re-running the command resumes
    except TrainingStopped as stopped:  # Ctrl-C/SIGTERM in a training stage: saved, command printed
        raise typer.Exit(stopped.exit_code) from None
    except ValueError:
        if new_out:  # the input checks made --out (to prove it writable): a refused run leaves none
            _remove_unstarted(Path(out))
        raise


def _remove_unstarted(path: Path) -> None:
    """Remove `path` if it holds nothing but empty folders and the runner's STARTED.json (a first
    stage refused its input: nothing ran); else leave all of it."""
    import os

    files = [Path(d, f) for d, _, names in os.walk(path) for f in names]
    if not path.is_dir() or any(f != path / "STARTED.json" for f in files):
        return
    (path / "STARTED.json").unlink(missing_ok=True)
    try:
        for dirpath, _, _ in sorted(os.walk(path), key=lambda entry: -len(entry[0])):
            Path(dirpath).rmdir()
    except OSError:  # something appeared meanwhile: keep it
        pass
