"""`sinkdlm analyze`: the attention-sink analysis of a checkpoint (docs/method.md §6), or `--compare` of two runs.

Parses arguments and calls `sinkdlm.analysis.analyze` / `compare`; every check of a value that the
library also checks runs before the model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from sinkdlm.cli.app import app
from sinkdlm.cli.out_lock import exclusive_out
from sinkdlm.validation import check_prompt_size, check_seed, parse_int_list


def read_prompts(path: Path) -> list[str]:
    """One prompt per non-empty line; a `.jsonl` file holds one object per line with "prompt" or "text"."""
    from sinkdlm.validation import read_text_file

    lines = read_text_file(path, "--prompts").splitlines()
    if path.suffix != ".jsonl":
        prompts = [line for line in lines if line.strip()]
    else:
        prompts = []
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--prompts {path}:{i} is not valid JSON: {e}") from e
            text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"--prompts {path}:{i} needs a string field \"prompt\" or \"text\"")
            prompts.append(text)
    if not prompts:
        raise ValueError(f"--prompts file {str(path)!r} holds no prompt")
    return prompts


@app.command()
def analyze(
    model: Path = typer.Option(None, "--model", help="Model: a directory (sinkdlm checkpoint, LLaDA, Dream, autoregressive Qwen2/LLaMA) or a llama/qwen2 .gguf file."),
    prompts: Path = typer.Option(None, "--prompts", help="Prompts file: one per line, or .jsonl with \"prompt\"/\"text\"."),
    data: str = typer.Option(None, "--data", help="Corpus for prompts (validation split), e.g. shakespeare."),
    num_prompts: int = typer.Option(8, "--num-prompts", help="Prompts to use (first N of --prompts; windows of --data)."),
    prompt_length: int = typer.Option(64, "--prompt-length", help="Tokens per prompt taken from --data."),
    gen_length: int = typer.Option(None, "--gen-length", help="Tokens to generate per prompt."),
    steps: int = typer.Option(
        None, "--steps", help="Denoising steps (default: --gen-length, one token per step; an autoregressive model "
        "always takes one step per token)."),
    block_length: int = typer.Option(None, "--block-length", help="Semi-autoregressive block length (default: one block)."),
    epsilon: float = typer.Option(3.0, "--epsilon", help="Sink threshold ϵ (Rulli et al. eq. 3)."),
    scale: str = typer.Option("sum", "--scale", help="Received-attention scale: sum (default) | mean."),
    ablation_k: str = typer.Option(None, "--ablation-k", help="Sink-masking ablation for these K, e.g. 1,5,10."),
    include_extra_sink: bool = typer.Option(False, "--include-extra-sink", help="Let the ablation mask the extra sink token."),
    mc_num: int = typer.Option(16, "--mc-num", help="Monte-Carlo samples of the ablation's continuation ELBO."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts per generation batch."),
    figure_steps: str = typer.Option(None, "--figure-steps", help="Two steps for the attention-map figure, e.g. 0,31."),
    seed: int = typer.Option(0, "--seed", help="Random seed (prompt windows, ELBO noise, sampling)."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N."),
    dtype: str = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 (default: as stored)."),
    label: str = typer.Option(None, "--label", help="Model name in the report (default: the run name and step, e.g. 'base (step 30)')."),
    compare_dirs: Optional[tuple[Path, Path]] = typer.Option(  # noqa: UP007 (typer reads the annotation)
        None, "--compare", help="Two analysis directories (of `analyze --out`) to put side by side."),
    out: Path = typer.Option(..., "--out", help="Output directory."),
    per_prompt: bool = typer.Option(
        False, "--per-prompt",
        help="Analyse each prompt on its own and give every number a 95 % interval over prompts (intervals.json)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Attention sinks of a masked diffusion LM (or an autoregressive one): analysis.json, figures, report.md/html."""
    from sinkdlm.analysis import check_options
    from sinkdlm.validation import check_output_dir

    check_output_dir(out)
    check_seed(seed, "--seed")
    if compare_dirs is not None:
        if model is not None:
            raise ValueError("give either --model (analyse one model) or --compare DIR_A DIR_B, not both")
        from sinkdlm.analysis.comparison import compare

        with exclusive_out(out, "analyze"):  # a second analyze on this --out at once is refused
            result = compare(list(compare_dirs), out)
        typer.echo(f"wrote {out / 'report.html'} comparing {', '.join(result['models'])}")
        return
    if model is None:
        raise ValueError("--model DIR is required (or --compare DIR_A DIR_B)")
    if gen_length is None:
        raise ValueError("--gen-length is required")
    if steps is None:  # an AR model generates one token per step: --steps would mean nothing to it
        steps = gen_length
    if (prompts is None) == (data is None):
        raise ValueError("give exactly one of --prompts FILE or --data NAME")
    ks = parse_int_list(ablation_k, "--ablation-k")
    fig_steps = parse_int_list(figure_steps, "--figure-steps")
    if fig_steps is not None and len(fig_steps) != 2:
        raise ValueError(f"--figure-steps takes two steps like 0,31, got {figure_steps!r}")
    check_options(epsilon=epsilon, scale=scale, gen_length=gen_length, steps=steps, block_length=block_length,
                  ablation_k=ks, figure_steps=tuple(fig_steps) if fig_steps else None, out_dir=out, mc_num=mc_num,
                  batch_size=batch_size)
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    texts = read_prompts(prompts)[:num_prompts] if prompts is not None else None

    from sinkdlm.analysis import analyze as run, prompts_from_documents
    from sinkdlm.data import load_documents
    from sinkdlm.loading import load_model_and_tokenizer
    from sinkdlm.training.checkpointing import run_label

    with exclusive_out(out, "analyze"):  # one analyze per --out at a time: no mixed files
        net, tokenizer = load_model_and_tokenizer(model, device=device, dtype=dtype)
        for text in texts or ():
            check_prompt_size(text, tokenizer, net.config, f"a prompt in --prompts {prompts}")
        if texts is None:
            texts = prompts_from_documents(load_documents(data, "validation"), tokenizer, num_prompts, prompt_length, seed)
        if per_prompt:
            from sinkdlm.analysis.over_prompts import analyze_over_prompts

            if len(texts) < 2:
                raise ValueError("--per-prompt needs at least 2 prompts (intervals over prompts); raise --num-prompts")
            res = analyze_over_prompts(
                net, tokenizer, texts, out, gen_length=gen_length, steps=steps, block_length=block_length,
                epsilon=epsilon, scale=scale, ablation_k=ks, include_extra_sink=include_extra_sink, seed=seed,
                figure_steps=tuple(fig_steps) if fig_steps else None, batch_size=1, mc_num=mc_num,
                label=label or run_label(model), progress=not quiet)
            nsf = res["summary"]["non_sink_fraction"]
            typer.echo(f"wrote {out / 'intervals.json'} and {out / 'report.html'}; non-sink fraction at ϵ={epsilon:g}: "
                       f"{100 * nsf['mean']:.2f} % over {len(texts)} prompts")
            return
        result = run(
            net, tokenizer, texts, gen_length=gen_length, steps=steps, block_length=block_length, epsilon=epsilon,
            scale=scale, ablation_k=ks, include_extra_sink=include_extra_sink, out_dir=out, seed=seed,
            figure_steps=tuple(fig_steps) if fig_steps else None, batch_size=batch_size, mc_num=mc_num,
            label=label or run_label(model), progress=not quiet,
        )
    summary = f"non-sink fraction at ϵ={epsilon:g}: {100 * result['non_sink_fraction']:.2f} %"
    if result["ablation"] is not None:
        scores = ", ".join(f"K={k}: {v:.4g}" for k, v in result["ablation"]["scores"].items())
        summary += f"; ablation ({result['ablation']['metric']}) {scores}"
    typer.echo(f"wrote {out / 'analysis.json'} and {out / 'report.html'}; {summary}")
