"""The typer application every command module registers on, and the entry point.

Commands only parse arguments and call library functions. A `ValueError` raised by the library
(the user's error) is printed as one line `error: ...` with exit code 2, not as a traceback, with
the library's parameter names re-spelled as the command's flags (`seq_len` -> `--seq-len`).
"""

from __future__ import annotations

import sys

import typer
import typer.main

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

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        group = typer.main.get_command(app)
        if "--help" in args:
            _show_config_defaults(group)
        group.main(args=args, prog_name="sinkdlm", standalone_mode=True)
    except ValueError as e:
        from sinkdlm.validation import cli_message

        message = cli_message(str(e), _command_flags(args))
        typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
        sys.exit(2)


def _show_config_defaults(group) -> None:
    """`train`/`sft` options default to None (so a `--config` file is only overridden by flags the
    user typed); show in `--help` the `TrainConfig` default each one resolves to."""
    import dataclasses

    from sinkdlm.training.config import TrainConfig

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    for name in ("train", "sft"):
        for param in getattr(group, "commands", {}).get(name, group).params:
            value = defaults.get(param.name)
            if param.default is not None or value is None or "[default" in (param.help or ""):
                continue
            if isinstance(value, bool):  # name the switch, not "True"
                flags = param.opts if value else param.secondary_opts
                value = flags[0] if flags else value
            param.help = f"{param.help or ''}  [default: {value}]".strip()


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


def typed_command(ctx, drop: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> str:
    """The running command as the user typed it (`sinkdlm train --out r ...`), for "resume with:" hints.

    `ctx` is the command's `typer.Context`. Rebuilt from the options given on the command line
    (not their defaults, so a `--config` file keeps its say), minus the parameters in `drop`,
    plus the words in `extra`.
    """
    import shlex

    words = ["sinkdlm", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if param.name in drop or getattr(source, "name", None) != "COMMANDLINE":
            continue
        value = ctx.params[param.name]
        if param.param_type_name != "option":
            words.append(str(value))
        elif getattr(param, "is_bool_flag", False):
            names = param.opts if value else param.secondary_opts
            words += names[:1]
        else:
            words += [param.opts[0], str(value)]
    return shlex.join([*words, *extra])
