"""`sinkdlm merge`: a `--trainable lora` checkpoint's adapters and sinks (or a `--trainable sink` checkpoint's
sinks over its base) -> a plain sinkdlm checkpoint, with merged_from.json."""

from __future__ import annotations

import typer

from sinkdlm.cli.app import app, said_when_slow
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import MergeConfig


@app.command()
@config_options(MergeConfig)
def merge(cfg: MergeConfig) -> None:
    """Fold a --trainable lora checkpoint's LoRA adapters and sinks, or a --trainable sink checkpoint, into a plain checkpoint."""
    from sinkdlm.io.out_dir import check_out, writing_out

    mode = check_out(cfg.out, "merge", overwrite=cfg.overwrite, inputs=(cfg.adapter, cfg.base))  # before any work
    from sinkdlm.training.merge import merge_adapter

    with said_when_slow(f"merging {cfg.adapter}: building its base, then writing {cfg.out} ..."), \
            writing_out(cfg.out, mode, "merge") as where:
        model = merge_adapter(cfg.adapter, where, base=cfg.base)
    folded = "sinks over their base" if (cfg.adapter / "sink_base.json").is_file() else "LoRA merged"
    typer.echo(f"wrote {cfg.out}: {model.num_parameters() / 1e6:.1f}M parameters, "
               f"{model.config.num_sink_tokens} sink token(s), {folded}")
