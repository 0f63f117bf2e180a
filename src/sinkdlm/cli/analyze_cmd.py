"""`sinkdlm analyze`: the attention-sink analysis of a checkpoint (docs/method.md §6), or `--compare` of two or more runs.

Parses arguments and calls `sinkdlm.analysis.analyze` / `compare`; every check of a value that the
library also checks runs before the model is loaded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from sinkdlm.cli.app import app, said_when_slow
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import AnalyzeConfig
from sinkdlm.config.checks import check_dtype, check_prompt_size, check_sampler_values, check_seed


def read_prompts(path: Path, flag: str = "--prompts") -> list[str]:
    """One prompt per non-empty line; a `.jsonl` file holds one object per line with "prompt" or "text".
    `flag`: the option that named the file, in every error (`generate --prompt-file` reads its prompts so too)."""
    from sinkdlm.config.checks import read_text_file
    from sinkdlm.io.jsonl import iter_jsonl

    text = read_text_file(path, flag)  # exists, readable, UTF-8: said with the flag
    if path.suffix != ".jsonl":
        prompts = [line for line in text.splitlines() if line.strip()]
    else:
        prompts = []
        try:
            for i, record in iter_jsonl(path):
                text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{i} needs a string field \"prompt\" or \"text\"")
                prompts.append(text)
        except ValueError as e:
            raise ValueError(f"{flag} {e}") from e
    if not prompts:
        raise ValueError(f"{flag} file {str(path)!r} holds no prompt")
    return prompts


@app.command()
@config_options(AnalyzeConfig)
def analyze(cfg: AnalyzeConfig) -> None:
    """Attention sinks of a masked diffusion LM (or an autoregressive one): analysis.json, figures, report.md/html."""
    from sinkdlm.io.out_dir import check_out, writing_out

    out = cfg.out
    inputs = (cfg.model, cfg.prompts, *(cfg.compare_dirs or ()))
    mode = check_out(out, "analyze", overwrite=cfg.overwrite, inputs=inputs)  # what --out holds, before any import
    from sinkdlm.analysis import check_options

    check_seed(cfg.seed, "--seed")
    if cfg.compare_dirs:
        if len(cfg.compare_dirs) < 2:
            raise ValueError(f"--compare needs two or more directories, got one ({cfg.compare_dirs[0]}): "
                             f"the analysis directories (of `analyze --out`) to put side by side")
        if cfg.model is not None:
            raise ValueError("give either --model (analyse one model) or --compare DIR_A DIR_B ..., not both")
        from sinkdlm.analysis.comparison import compare

        # in place (an --overwrite sets the old aside): every path said is the final one
        with writing_out(out, mode, "analyze", in_place=True) as where:  # a second analyze at once is refused
            result = compare(list(cfg.compare_dirs), where)
        typer.echo(f"wrote {out / 'report.html'} comparing {', '.join(result['models'])}")
        return
    if cfg.model is None:
        raise ValueError("--model DIR is required (or --compare DIR_A DIR_B ...)")
    cfg.settings()  # --gen-length required (the held SampleConfig), K lists parsed
    if (cfg.prompts is None) == (cfg.data is None):
        raise ValueError("give exactly one of --prompts FILE or --data NAME")
    check_options(cfg)
    check_dtype(cfg.dtype)
    check_sampler_values(cfg.sample)
    from sinkdlm.checkpoint.kind import model_kind
    from sinkdlm.config.checks import check_sample_settings

    kind = model_kind(cfg.model)  # the header only: an autoregressive model refuses diffusion-only flags
    if kind is not None and kind.autoregressive:
        check_sample_settings(cfg.sample, autoregressive=True)
    if cfg.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {cfg.num_prompts}")
    texts = read_prompts(cfg.prompts)[:cfg.num_prompts] if cfg.prompts is not None else None

    from sinkdlm.analysis import analyze as run, prompts_from_documents
    from sinkdlm.data import load_documents
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.training.checkpointing import run_label

    cfg = dataclasses.replace(cfg, label=cfg.label or run_label(cfg.model))
    # one analyze per --out at a time (no mixed files), written in place: the paths it says are the final ones
    with writing_out(out, mode, "analyze", in_place=True) as where:
        cfg = dataclasses.replace(cfg, out=where)
        with said_when_slow(f"loading {cfg.model} (its weights and tokenizer) ..."):
            net, tokenizer = load_model_and_tokenizer(cfg.model, device=cfg.device, dtype=cfg.dtype,
                                                      quantize=cfg.quantize)
        for text in texts or ():
            check_prompt_size(text, tokenizer, net.config, f"a prompt in --prompts {cfg.prompts}")
        if texts is None:
            texts = prompts_from_documents(load_documents(cfg.data, "validation"), tokenizer, cfg.num_prompts,
                                           cfg.prompt_length, cfg.seed)
        if cfg.per_prompt:
            from sinkdlm.analysis.over_prompts import analyze_over_prompts

            if len(texts) < 2:
                raise ValueError("--per-prompt needs at least 2 prompts (intervals over prompts); raise --num-prompts")
            res = analyze_over_prompts(net, tokenizer, texts, dataclasses.replace(cfg, batch_size=1))
            nsf = res["summary"]["non_sink_fraction"]
            typer.echo(f"wrote {out / 'intervals.json'} and {out / 'report.html'}; non-sink fraction at "
                       f"ϵ={cfg.epsilon:g}: {100 * nsf['mean']:.2f} % over {len(texts)} prompts")
            return
        result = run(net, tokenizer, texts, cfg)
    summary = f"non-sink fraction at ϵ={cfg.epsilon:g}: {100 * result['non_sink_fraction']:.2f} %"
    if result["ablation"] is not None:
        scores = ", ".join(f"K={k}: {v:.4g}" for k, v in result["ablation"]["scores"].items())
        summary += f"; ablation ({result['ablation']['metric']}) {scores}"
    typer.echo(f"wrote {out / 'analysis.json'} and {out / 'report.html'}; {summary}")
