"""`sinkdlm serve MODEL`: an OpenAI-compatible server of a model (`sinkdlm.serving.server.serve`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from sinkdlm.cli.app import app
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import ServeConfig


@app.command()
@config_options(ServeConfig, exclude=("model",))
def serve(model: Path = typer.Argument(..., metavar="MODEL", help="The model: a directory or a .gguf file."),
          cfg: ServeConfig = None) -> None:
    """Serve a model over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions), batching concurrent requests."""
    from sinkdlm.serving.server import serve as run

    run(dataclasses.replace(cfg, model=model))
