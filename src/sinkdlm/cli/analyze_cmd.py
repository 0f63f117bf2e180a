"""`sinkdlm analyze`: the attention-sink analysis of a checkpoint (docs/method.md §6), or `--compare` of two runs.

Parses arguments and calls `sinkdlm.analysis.analyze` / `compare`; every check of a value that the
library also checks runs before the model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sinkdlm.cli.app import app
from sinkdlm.cli.options import config_options
from sinkdlm.config.run import AnalyzeConfig
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
@config_options(AnalyzeConfig)
def analyze(cfg: AnalyzeConfig) -> None:
    """Attention sinks of a masked diffusion LM (or an autoregressive one): analysis.json, figures, report.md/html."""
    from sinkdlm.analysis.report import check_options
    from sinkdlm.validation import check_output_dir

    model, prompts, data, num_prompts, out = cfg.model, cfg.prompts, cfg.data, cfg.num_prompts, cfg.out
    gen_length, steps, seed, epsilon = cfg.gen_length, cfg.steps, cfg.seed, cfg.epsilon
    check_output_dir(out)
    check_seed(seed, "--seed")
    if cfg.compare_dirs is not None:
        if model is not None:
            raise ValueError("give either --model (analyse one model) or --compare DIR_A DIR_B, not both")
        from sinkdlm.analysis.comparison import compare

        with exclusive_out(out, "analyze"):  # a second analyze on this --out at once is refused
            result = compare(list(cfg.compare_dirs), out)
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
    ks = parse_int_list(cfg.ablation_k, "--ablation-k")
    fig_steps = parse_int_list(cfg.figure_steps, "--figure-steps")
    if fig_steps is not None and len(fig_steps) != 2:
        raise ValueError(f"--figure-steps takes two steps like 0,31, got {cfg.figure_steps!r}")
    check_options(epsilon=epsilon, scale=cfg.scale, gen_length=gen_length, steps=steps, block_length=cfg.block_length,
                  ablation_k=ks, figure_steps=tuple(fig_steps) if fig_steps else None, out_dir=out, mc_num=cfg.mc_num,
                  batch_size=cfg.batch_size)
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    texts = read_prompts(prompts)[:num_prompts] if prompts is not None else None

    from sinkdlm.analysis.report import analyze as run, prompts_from_documents
    from sinkdlm.data import load_documents
    from sinkdlm.loading import load_model_and_tokenizer
    from sinkdlm.reporting import run_label

    with exclusive_out(out, "analyze"):  # one analyze per --out at a time: no mixed files
        net, tokenizer = load_model_and_tokenizer(model, device=cfg.device, dtype=cfg.dtype)
        for text in texts or ():
            check_prompt_size(text, tokenizer, net.config, f"a prompt in --prompts {prompts}")
        if texts is None:
            texts = prompts_from_documents(load_documents(data, "validation"), tokenizer, num_prompts, cfg.prompt_length, seed)
        if cfg.per_prompt:
            from sinkdlm.analysis.over_prompts import analyze_over_prompts

            if len(texts) < 2:
                raise ValueError("--per-prompt needs at least 2 prompts (intervals over prompts); raise --num-prompts")
            res = analyze_over_prompts(
                net, tokenizer, texts, out, gen_length=gen_length, steps=steps, block_length=cfg.block_length,
                epsilon=epsilon, scale=cfg.scale, ablation_k=ks, include_extra_sink=cfg.include_extra_sink, seed=seed,
                figure_steps=tuple(fig_steps) if fig_steps else None, batch_size=1, mc_num=cfg.mc_num,
                label=cfg.label or run_label(model), progress=not cfg.quiet)
            nsf = res["summary"]["non_sink_fraction"]
            typer.echo(f"wrote {out / 'intervals.json'} and {out / 'report.html'}; non-sink fraction at ϵ={epsilon:g}: "
                       f"{100 * nsf['mean']:.2f} % over {len(texts)} prompts")
            return
        result = run(
            net, tokenizer, texts, gen_length=gen_length, steps=steps, block_length=cfg.block_length, epsilon=epsilon,
            scale=cfg.scale, ablation_k=ks, include_extra_sink=cfg.include_extra_sink, out_dir=out, seed=seed,
            figure_steps=tuple(fig_steps) if fig_steps else None, batch_size=cfg.batch_size, mc_num=cfg.mc_num,
            label=cfg.label or run_label(model), progress=not cfg.quiet,
        )
    summary = f"non-sink fraction at ϵ={epsilon:g}: {100 * result['non_sink_fraction']:.2f} %"
    if result["ablation"] is not None:
        scores = ", ".join(f"K={k}: {v:.4g}" for k, v in result["ablation"]["scores"].items())
        summary += f"; ablation ({result['ablation']['metric']}) {scores}"
    typer.echo(f"wrote {out / 'analysis.json'} and {out / 'report.html'}; {summary}")
