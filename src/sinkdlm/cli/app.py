"""The typer application every command module registers on, and the entry point.

Commands only parse arguments and call library functions. A `ValueError` raised by the library
(the user's error) is printed as one line `error: ...` with exit code 2, not as a traceback, with
the library's parameter names re-spelled as the command's flags (`seq_len` -> `--seq-len`).
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
    # Plain click help: rich's table truncates long option names (`--attention-anneal-s…`)
    # on an 80-column terminal and hides the default column; plain help wraps instead.
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Masked diffusion language models with a stable attention sink."""


def main(argv: list[str] | None = None) -> None:
    import sinkdlm.cli  # noqa: F401  (registers every command)

    try:
        app(args=argv, standalone_mode=True)
    except ValueError as e:
        from sinkdlm.validation import cli_message

        message = cli_message(str(e), _command_flags(argv if argv is not None else sys.argv[1:]))
        typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
        sys.exit(2)


def _command_flags(argv: list[str]) -> list[str]:
    """Long option names of the command named in `argv` (to re-spell library names in errors)."""
    import typer.main

    group = typer.main.get_command(app)
    cmd, flags = group, []
    for word in argv:
        sub = getattr(cmd, "commands", {}).get(word) if not word.startswith("-") else None
        if sub is None:
            continue
        cmd = sub
    for param in getattr(cmd, "params", []):
        flags += [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
    return flags
