"""`sinkdlm chat MODEL`: talk to a model through its chat template (`sinkdlm.diffusion.text.Conversation`).

One line from stdin is one message; each reply is printed on stdout, and the conversation so far is the
next prompt. End-of-file (Ctrl-D, or the end of a piped transcript) ends it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sinkdlm.cli.app import app, said_when_slow
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import ChatConfig, SampleConfig


@app.command()
@config_options(ChatConfig, exclude=("model",))
def chat(model: Path = typer.Argument(..., metavar="MODEL", help="The model: a directory or a .gguf file with a chat template."),
         cfg: ChatConfig = None) -> None:
    """Chat with a model: one line from you, one reply, the whole conversation kept; Ctrl-D ends it."""
    import dataclasses

    from sinkdlm.checkpoint.kind import model_kind
    from sinkdlm.config.checks import check_dtype, check_sample_settings, check_sampler_values, check_seed

    check_seed(cfg.seed, "--seed")
    check_dtype(cfg.dtype)
    check_sampler_values(cfg)
    kind = model_kind(model)  # the header only: refusals before any weight
    if kind is not None and not kind.chat_template:
        raise ValueError(f"{model} has no chat template; use `sinkdlm generate --model {model} --prompt TEXT`")
    causal = kind is not None and kind.autoregressive
    if not causal and cfg.steps is None and cfg.threshold is None:
        cfg = dataclasses.replace(cfg, steps=cfg.gen_length)  # one token per step
    check_sample_settings(cfg, autoregressive=None if kind is None else causal,
                          block_model=None if kind is None else kind.block_size is not None,
                          block_size=None if kind is None else kind.block_size)
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.diffusion.text import Conversation

    with said_when_slow(f"loading {model} (its weights and tokenizer) ..."):
        net, tokenizer = load_model_and_tokenizer(model, device=cfg.device, dtype=cfg.dtype, quantize=cfg.quantize)
    sample = SampleConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(SampleConfig)})
    talk = Conversation(net, tokenizer, sample, system=cfg.system)
    interactive = sys.stdin.isatty()
    if interactive:
        typer.echo("(one line per message; Ctrl-D ends the conversation)", err=True)
    try:
        while True:
            if interactive:
                typer.echo("you> ", nl=False, err=True)
            line = sys.stdin.readline()
            if not line:  # end of input: Ctrl-D or the end of a transcript
                break
            if line.strip():
                typer.echo(talk.reply(line.rstrip("\n")).text, nl=True)
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(130) from None
    if interactive:
        typer.echo("", err=True)
