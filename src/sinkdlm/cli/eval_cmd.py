"""`sinkdlm eval`: score a checkpoint on offline tasks (`sinkdlm.evaluation.evaluate_dir`), print a
table and write the scores as JSON. `sinkdlm lm-eval ARGS`: lm-eval's own command line with the
`sinkdlm` model registered (lm-eval 0.4.x does not load model entry points by itself)."""

from __future__ import annotations

from pathlib import Path

import typer

from sinkdlm.cli.app import app
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import EvalConfig


@app.command("eval")
@config_options(EvalConfig, required=("model",))
def eval_command(cfg: EvalConfig) -> None:
    """Evaluate a checkpoint on offline tasks; print task, metric, value ± stderr, n."""
    from sinkdlm.config.checks import check_dtype, check_sampler_values
    from sinkdlm.io.out_dir import check_out

    check_dtype(cfg.dtype)
    check_sampler_values(cfg)  # before the model is read
    out = Path(cfg.out).expanduser()
    check_out(out, "eval", overwrite=cfg.overwrite, is_file=True)  # an existing file is replaced only when asked
    from sinkdlm.evaluation import evaluate_dir, format_table
    from sinkdlm.evaluation.evaluator import task_names
    from sinkdlm.io.atomic import atomic_write_json

    names = task_names(cfg.tasks)
    scores = evaluate_dir(cfg)  # --model: required by the command line
    typer.echo(format_table(scores))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, {
        "model": str(cfg.model), "tasks": names, "limit": cfg.limit, "seed": cfg.seed, "mc_num": cfg.mc_num,
        "gen_steps": cfg.gen_steps, "cache": cfg.cache, "threshold": cfg.threshold, **cfg.remasking_options(),
        "quantize": cfg.quantize, "kv_cache_dtype": cfg.kv_cache_dtype,
        "scores": scores,
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
        hint = f"`sinkdlm lm-eval` needs lm-eval: pip install 'sinkdlm[eval]' ({e})"
        if {"--help", "-h"} & set(ctx.args):  # help without the extra: what the command is, and how to get it
            typer.echo(ctx.get_help())
            typer.echo(f"\n{hint}; lm-eval's own options are listed by `sinkdlm lm-eval --help` once it is installed.")
            raise typer.Exit(0) from e
        raise ValueError(hint) from e
    lm_eval_main(list(ctx.args))
