"""`sinkdlm generate`: sample text from a checkpoint directory with `sinkdlm.generate` (docs/method.md §2)."""

from __future__ import annotations

import json
import sys
import time

import typer

from sinkdlm.cli.app import app
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
@config_options(GenerateConfig, required=("model",))
def generate(cfg: GenerateConfig) -> None:
    """Generate a continuation of a prompt with a masked diffusion LM (or, left to right, an autoregressive one)."""
    from sinkdlm.diffusion.sampling import generate as sample
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.config.checks import check_prompt_size, check_seed

    prompt, prompt_file, gen_length, steps, threshold = cfg.prompt, cfg.prompt_file, cfg.gen_length, cfg.steps, cfg.threshold
    model = cfg.model  # required by the command line
    if (prompt is None) == (prompt_file is None):
        raise ValueError("give exactly one of --prompt TEXT or --prompt-file FILE")
    check_seed(cfg.seed, "--seed")
    if prompt_file is not None:
        from sinkdlm.config.checks import read_text_file

        prompt = read_text_file(prompt_file, "--prompt-file")
    net, tokenizer = load_model_and_tokenizer(model, device=cfg.device, dtype=cfg.dtype)
    check_prompt_size(prompt, tokenizer, net.config, "--prompt-file" if prompt_file is not None else "--prompt")
    ids = tokenizer(prompt)["input_ids"]
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give a non-empty prompt")

    if threshold is None and steps is not None and steps > gen_length:
        # The schedule commits at least one token per step; the surplus steps would commit nothing.
        typer.echo(f"note: --steps {steps} > --gen-length {gen_length}: at most one token is committed per "
                   f"step, so {gen_length} steps run", err=True)
    callback = None
    if cfg.show_steps:
        out_stream = sys.stderr if cfg.as_json else sys.stdout
        p = len(ids)

        def callback(state) -> None:
            gen = state.x[0, p:].tolist()
            still = (state.masked[0, p:] & ~state.committed[0, p:]).tolist()
            text = render_partial(tokenizer, gen, still)
            print(f"[step {state.step:>4} block {state.block}] {text!r}", file=out_stream, flush=True)

    start = time.perf_counter()
    out = sample(net, ids, cfg, callback=callback, return_dict=True)  # a GenerateConfig is a SampleConfig
    seconds = time.perf_counter() - start
    tokens = out.sequences[0, out.prompt_length:].tolist()
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if cfg.as_json:
        typer.echo(json.dumps({"text": text, "tokens": tokens, "steps_taken": out.steps_taken, "seconds": seconds}))
    else:
        typer.echo(text)
