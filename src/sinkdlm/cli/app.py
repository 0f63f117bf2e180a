"""The typer application every command module registers on, and the entry point.

Commands only parse arguments and call library functions. A `ValueError` raised by the library
(the user's error) is printed as one line `error: ...` with exit code 2, not as a traceback.
"""

from __future__ import annotations

import sys

import typer

app = typer.Typer(
    name="sinkdlm",
    help="Masked diffusion language models with a stable attention sink: "
    "train, sample, evaluate, analyse.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Masked diffusion language models with a stable attention sink."""


def main(argv: list[str] | None = None) -> None:
    import sinkdlm.cli  # noqa: F401  (registers every command)

    try:
        app(args=argv, standalone_mode=True)
    except ValueError as e:
        typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
        sys.exit(2)
