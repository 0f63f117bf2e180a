"""`sinkdlm eval`: score a checkpoint on offline tasks (`sinkdlm.evaluation.evaluate_dir`), print a
table and write the scores as JSON. `sinkdlm lm-eval ARGS`: lm-eval's own command line with the
`sinkdlm` model registered (lm-eval 0.4.x does not load model entry points by itself)."""

from __future__ import annotations

from pathlib import Path

import typer

from sinkdlm.cli.app import app
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
def eval_command(
    model: Path = typer.Option(
        ..., "--model", help="Model: a directory (sinkdlm checkpoint, LLaDA, Dream, autoregressive Qwen2/LLaMA) or a llama/qwen2 .gguf file."
    ),
    tasks: str = typer.Option(
        ..., "--tasks", help="Comma-separated: shakespeare_cloze, shakespeare_next_line, shakespeare_word_order, arithmetic, gsm8k:PATH."
    ),
    out: Path = typer.Option(..., "--out", help="Write the scores here as JSON."),
    limit: int = typer.Option(None, "--limit", help="Items per task (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Chooses the items and seeds the Monte-Carlo ELBO."),
    mc_num: int = typer.Option(16, "--mc-num", help="ELBO samples per candidate (cloze words: at most 4)."),
    gen_steps: int = typer.Option(None, "--gen-steps", help="Denoising steps per generation (default: one per token)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Model rows per forward."),
    cache: str = typer.Option(None, "--cache", help="Fast-dLLM KV cache for generation tasks: prefix | dual."),
    threshold: float = typer.Option(None, "--threshold", help="Confidence-threshold decoding for generation tasks (e.g. 0.9)."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """Evaluate a checkpoint on offline tasks; print task, metric, value ± stderr, n."""
    from sinkdlm.evaluation import evaluate_dir, format_table
    from sinkdlm.atomic import atomic_write_json

    out = check_output_path(out)
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise ValueError(f"--tasks {tasks!r} names no task; give comma-separated names, e.g. shakespeare_cloze,arithmetic")
    if any(n.startswith("gsm8k:") and not n[len("gsm8k:"):].strip() for n in names):
        raise ValueError("--tasks gsm8k: needs the file after the colon: gsm8k:PATH (a local GSM8K JSONL)")
    scores = evaluate_dir(
        model, names, device=device, limit=limit, seed=seed, mc_num=mc_num, gen_steps=gen_steps,
        batch_size=batch_size, progress=progress, gen_cache=cache, gen_threshold=threshold,
    )
    typer.echo(format_table(scores))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, {
        "model": str(model), "tasks": names, "limit": limit, "seed": seed, "mc_num": mc_num,
        "gen_steps": gen_steps, "cache": cache, "threshold": threshold, "scores": scores,
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
