"""`sinkdlm generate`: sample text from a checkpoint directory with `sinkdlm.generate` (docs/method.md §2)."""

from __future__ import annotations

import json
import sys

import typer

from sinkdlm.cli.app import app, progress_when_slow, said_when_slow
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import GenerateConfig


def render_partial(tokenizer, ids: list[int], masked: list[bool], mask_text: str = "_") -> str:
    """Decode the generated tokens, each still-masked position shown as `mask_text`."""
    pieces, run = [], []
    for tok, m in zip(ids, masked):
        if m:
            if run:
                pieces.append(tokenizer.decode(run, skip_special_tokens=False))
                run = []
            pieces.append(mask_text)
        else:
            run.append(tok)
    if run:
        pieces.append(tokenizer.decode(run, skip_special_tokens=False))
    return "".join(pieces)


@app.command()
@config_options(GenerateConfig, required=("model",), first=("model", "prompt", "prompt_file"))
def generate(cfg: GenerateConfig) -> None:
    """Continue a prompt with a diffusion LM (or, left to right, an autoregressive one)."""
    from sinkdlm.checkpoint.kind import model_kind
    from sinkdlm.config.checks import check_dtype, check_int, check_sample_settings, check_sampler_values, check_seed

    if (cfg.prompt is None) == (cfg.prompt_file is None):
        raise ValueError("give exactly one of --prompt TEXT or --prompt-file FILE")
    check_seed(cfg.seed, "--seed")
    if cfg.system is not None and not cfg.chat:
        raise ValueError("--system is a message of the model's chat template: add --chat")
    check_dtype(cfg.dtype)
    check_sampler_values(cfg)  # temperature, top-p, top-k, ...: each value on its own, before the model's header
    check_int("--batch-size", cfg.batch_size, 1)
    prompts = [cfg.prompt]
    if cfg.prompt_file is not None:
        from sinkdlm.cli.analyze_cmd import read_prompts

        prompts = read_prompts(cfg.prompt_file, "--prompt-file")  # one a line, or .jsonl
    # Every check that needs only the model's header, before a weight is read (a GGUF's take ~0.1 s).
    kind = model_kind(cfg.model)
    check_sample_settings(cfg, autoregressive=None if kind is None else kind.autoregressive,
                          block_model=None if kind is None else kind.block_size is not None,
                          block_size=None if kind is None else kind.block_size)
    if cfg.chat and kind is not None and not kind.chat_template:
        raise ValueError(f"--chat needs the model's chat template and {cfg.model} has none; drop --chat")
    if kind is not None and not kind.autoregressive:
        from sinkdlm.diffusion.remasking import check_rule, resolve_rule

        schedule, remasking = resolve_rule(kind.family, cfg.schedule, cfg.remasking, cfg.threshold)
        check_rule(schedule, remasking, threshold=cfg.threshold, temperature=cfg.temperature, alg_temp=cfg.alg_temp,
                   top_p=cfg.top_p, top_k=cfg.top_k, eps=cfg.eps)
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.config.checks import check_prompt_size
    from sinkdlm.diffusion.text import generate_texts

    with said_when_slow(f"loading {cfg.model} (its weights and tokenizer) ..."):
        net, tokenizer = load_model_and_tokenizer(cfg.model, device=cfg.device, dtype=cfg.dtype, quantize=cfg.quantize)
    for prompt in prompts:
        check_prompt_size(prompt, tokenizer, net.config, "--prompt-file" if cfg.prompt_file is not None else "--prompt")
    several = len(prompts) > 1
    callback = None
    if cfg.show_steps:
        out_stream = sys.stderr if cfg.as_json else sys.stdout

        def callback(state) -> None:
            p = state.prompt_length
            for row in range(state.x.shape[0]):
                gen = state.x[row, p:].tolist()
                still = (state.masked[row, p:] & ~state.committed[row, p:]).tolist()
                text = render_partial(tokenizer, gen, still)
                which = f" prompt {first + row + 1}" if several else ""
                print(f"[step {state.step:>4} block {state.block}{which}] {text!r}", file=out_stream, flush=True)

    length, flag = _length(cfg)
    steps = length if net.config.causal or cfg.steps is None else min(cfg.steps, length)
    for first in range(0, len(prompts), cfg.batch_size):
        batch = prompts[first:first + cfg.batch_size]
        with progress_when_slow(lambda s: f"generating {length} tokens ({steps} steps) for {len(batch)} "
                                          f"prompt(s): {s:.0f} s so far ..."):
            outs = generate_texts(net, tokenizer, batch, cfg, text=cfg, callback=callback)
        for i, out in enumerate(outs, first + 1):
            _print_answer(out, cfg, f"prompt {i}: " if several else "", several)
    if cfg.steps is not None and cfg.threshold is None and cfg.steps > length:
        # The schedule commits at least one token per step; the surplus steps would commit nothing. Said
        # after the run, so that no note comes before an error.
        typer.echo(f"note: --steps {cfg.steps} > {flag} {length}: at most one token is committed per "
                   f"step, so {length} steps ran", err=True)


def _length(cfg: GenerateConfig) -> tuple[int, str]:
    """How many tokens are generated at most, and the flag that said so (a block model's --max-new-tokens)."""
    return (cfg.gen_length, "--gen-length") if cfg.max_new_tokens is None else (cfg.max_new_tokens, "--max-new-tokens")


def _print_answer(out, cfg: GenerateConfig, which: str, several: bool) -> None:
    """One prompt's answer: its notes on stderr (`which` names the prompt among several), then its text or JSON
    object on stdout; among several prompts one a line, a text's newlines written as \\n."""
    if out.blank:
        typer.echo(f"note: {which}the output has no letter or digit (only whitespace, punctuation or special tokens "
                   "such as <|im_end|>): the model writes no text at these settings; a diffusion LM adapted on a small "
                   "budget often cannot yet (see README, Quick start), and `sinkdlm analyze` shows what its attention "
                   "does", err=True)
    elif out.truncated:
        length, flag = _length(cfg)
        typer.echo(f"note: {which}the text was cut at {flag} {length} tokens, before the model ended it; "
                   f"raise {flag} for the whole answer", err=True)
    if cfg.as_json:
        typer.echo(json.dumps({"text": out.text, "tokens": out.tokens, "steps_taken": out.steps_taken,
                               "seconds": out.seconds}))
    else:
        typer.echo(out.text.replace("\\", "\\\\").replace("\n", "\\n") if several else out.text)
