"""`sinkdlm eval`: score a checkpoint on offline tasks (`sinkdlm.evaluation.evaluate_dir`), print a
table and write the scores as JSON. `sinkdlm lm-eval ARGS`: lm-eval's own command line with the
`sinkdlm` model registered (lm-eval 0.4.x does not load model entry points by itself)."""

from __future__ import annotations

from pathlib import Path

import typer

from sinkdlm.cli.app import app
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import EvalConfig
from sinkdlm.validation import check_writable_ancestor


def check_output_path(out: Path) -> Path:
    """Fail before any work when `out` cannot be written: a directory, or under a non-directory or an
    unwritable directory. Missing parent directories are created at write time."""
    out = Path(out).expanduser()
    if out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a directory; give a file path such as {str(out / 'scores.json')!r}")
    check_writable_ancestor(out.parent, repr(str(out)))
    return out


@app.command("eval")
@config_options(EvalConfig, required=("model",))
def eval_command(cfg: EvalConfig) -> None:
    """Evaluate a checkpoint on offline tasks; print task, metric, value ± stderr, n."""
    from sinkdlm.evaluation import evaluate_dir, format_table
    from sinkdlm.atomic import atomic_write_json

    model, tasks = cfg.model, cfg.tasks  # --model: required by the command line
    out = check_output_path(cfg.out)
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise ValueError(f"--tasks {tasks!r} names no task; give comma-separated names, e.g. shakespeare_cloze,arithmetic")
    if any(n.startswith("gsm8k:") and not n[len("gsm8k:"):].strip() for n in names):
        raise ValueError("--tasks gsm8k: needs the file after the colon: gsm8k:PATH (a local GSM8K JSONL)")
    scores = evaluate_dir(
        model, names, device=cfg.device, dtype=cfg.dtype, limit=cfg.limit, seed=cfg.seed, mc_num=cfg.mc_num,
        gen_steps=cfg.gen_steps, batch_size=cfg.batch_size, progress=cfg.progress, gen_cache=cfg.cache,
        gen_threshold=cfg.threshold,
    )
    typer.echo(format_table(scores))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, {
        "model": str(model), "tasks": names, "limit": cfg.limit, "seed": cfg.seed, "mc_num": cfg.mc_num,
        "gen_steps": cfg.gen_steps, "cache": cfg.cache, "threshold": cfg.threshold, "scores": scores,
    })
    typer.echo(f"wrote {out}")


@app.command(
    "lm-eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def lm_eval_command(ctx: typer.Context) -> None:
    """lm-evaluation-harness's command line with `--model sinkdlm` registered; every argument is passed
    on, e.g. `sinkdlm lm-eval --model sinkdlm --model_args pretrained=DIR,mc_num=128 --tasks arc_easy`."""
    try:
        from sinkdlm.evaluation.lm_eval_model import main as lm_eval_main
    except ImportError as e:
        raise ValueError(f"`sinkdlm lm-eval` needs lm-eval: pip install 'sinkdlm[eval]' ({e})") from e
    lm_eval_main(list(ctx.args))
