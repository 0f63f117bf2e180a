"""Command-line interface: `sinkdlm COMMAND ...`. Each module registers its commands on `app`."""

from sinkdlm.cli import analyze_cmd  # noqa: F401
from sinkdlm.cli import chat_cmd  # noqa: F401
from sinkdlm.cli import convert_cmd  # noqa: F401
from sinkdlm.cli import eval_cmd  # noqa: F401
from sinkdlm.cli import experiment_cmd  # noqa: F401
from sinkdlm.cli import generate_cmd  # noqa: F401
from sinkdlm.cli import merge_cmd  # noqa: F401
from sinkdlm.cli import serve_cmd  # noqa: F401
from sinkdlm.cli import train_cmd  # noqa: F401
from sinkdlm.cli.app import app, main

__all__ = ["app", "main"]
