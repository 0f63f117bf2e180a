"""`sinkdlm merge`: a `--trainable lora` checkpoint's adapters and sinks -> a plain sinkdlm checkpoint."""

from __future__ import annotations

import typer

from sinkdlm.cli.app import app, said_when_slow
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import MergeConfig


@app.command()
@config_options(MergeConfig)
def merge(cfg: MergeConfig) -> None:
    """Fold a --trainable lora checkpoint's LoRA adapters and sink parameters into a plain sinkdlm checkpoint."""
    from sinkdlm.training.merge import merge_adapter

    with said_when_slow(f"merging {cfg.adapter}: building its base, then writing {cfg.out} ..."):
        model = merge_adapter(cfg.adapter, cfg.out, base=cfg.base)
    typer.echo(f"wrote {cfg.out}: {model.num_parameters() / 1e6:.1f}M parameters, "
               f"{model.config.num_sink_tokens} sink token(s), LoRA merged")
