"""The typer application every command module registers on, and the entry point.

Commands only parse arguments and call library functions. A `ValueError` raised by the library
(the user's error) is printed as one line `error: ...` with exit code 2, not as a traceback, with
the library's parameter names re-spelled as the command's flags (`seq_len` -> `--seq-len`); click's
usage errors (unknown option, not an integer, ...) get the same one line.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time

import typer
import typer.core
import typer.main



class HelpGroup(typer.core.TyperGroup):
    """A command group whose `--help` lists each command's whole first paragraph (click cuts it at the first
    period or the terminal's width, with "...")."""

    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                first = (cmd.short_help or cmd.help or "").strip().split("\n\n")[0]
                rows.append((name, " ".join(first.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    name="sinkdlm",
    cls=HelpGroup,
    help="Masked diffusion language models with a stable attention sink: "
    "train, sample, evaluate, analyse.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Plain click help: rich's table truncates long option names (`--attention-anneal-s…`)
    # on an 80-column terminal and hides the default column; plain help wraps instead.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from sinkdlm import __version__

        typer.echo(f"sinkdlm {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print sinkdlm's version and exit.")) -> None:
    """Masked diffusion language models with a stable attention sink."""


def _click_exceptions():
    """The exceptions module of the click that typer runs on (typer >= 0.2x ships its own copy, older
    typer uses click), found from the public `typer.BadParameter`, a `UsageError` of that click."""
    usage = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    return sys.modules[usage.__module__]


def main(argv: list[str] | None = None) -> None:
    import sinkdlm.cli  # noqa: F401  (registers every command)

    click_errors = _click_exceptions()

    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" not in args:  # --help runs nothing (and must stay fast: ~40 ms of metadata look-ups)
        from sinkdlm.versions import check_versions

        try:  # an installed dependency older than its floor: one line, before anything runs
            check_versions()
        except ImportError as e:
            typer.secho(f"error: {e}", err=True, fg=typer.colors.RED)
            sys.exit(2)
    if args and args[-1] == "--help":
        _print_help_and_exit(args[:-1])
    try:
        group = typer.main.get_command(app)
        _check_empty_values(args)
        args = _spread_values(args)
        _check_value_counts(args)
        # Not standalone: click's usage errors come here, to be printed as one line like ours.
        code = group.main(args=args, prog_name="sinkdlm", standalone_mode=False)
    except ValueError as e:
        from sinkdlm.config.checks import cli_message

        message = cli_message(str(e), _command_flags(args))
        typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
        sys.exit(2)
    except getattr(click_errors, "NoArgsIsHelpError", ()) as e:  # `sinkdlm tokenizer`: the help is the answer
        e.show()
        sys.exit(e.exit_code)
    except click_errors.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        typer.secho(f"error: {e.format_message()}{hint}", err=True, fg=typer.colors.RED)
        sys.exit(e.exit_code)
    except click_errors.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(n) comes back as n


def _print_help_and_exit(words: list[str]) -> None:
    """`sinkdlm [COMMAND ...] --help`, printed from the command's own help without parsing anything.

    Parsing would coerce the help flag's value, and typer imports pydantic to do that: about 0.1 s of
    a 0.4 s `--help` (tests/config/test_config.py holds `--help` under 0.5 s). Anything but command
    words before `--help` (an option, a value) goes the ordinary way; so does an unknown command, for
    click's own error.
    """
    cmd = typer.main.get_command(app)
    ctx = typer.Context(cmd, info_name="sinkdlm")
    for word in words:
        sub = getattr(cmd, "commands", {}).get(word)
        if sub is None:  # an option, a value or an unknown name: let click parse it
            return
        cmd, ctx = sub, typer.Context(sub, info_name=word, parent=ctx)
    if not getattr(cmd, "add_help_option", True):  # a command with its own --help (lm-eval's): it answers
        return
    typer.echo(cmd.get_help(ctx), color=ctx.color)
    sys.exit(0)


def _command(argv: list[str]):
    """The click command named in `argv` (the group itself when none is)."""
    cmd = typer.main.get_command(app)
    for word in argv:
        sub = getattr(cmd, "commands", {}).get(word) if not word.startswith("-") else None
        if sub is not None:
            cmd = sub
    return cmd


def _command_flags(argv: list[str]) -> list[str]:
    """Long option names of the command named in `argv` (to re-spell library names in errors)."""
    flags = []
    for param in getattr(_command(argv), "params", []):
        flags += [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
    return flags


def _is_path_option(param) -> bool:
    """A `Path`-typed option (click's type; typer >= 0.2x keeps the annotation instead)."""
    if getattr(getattr(param, "type", None), "name", None) == "path":
        return True
    from pathlib import Path

    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return annotation is Path or Path in getattr(annotation, "__args__", ())


def _check_empty_values(argv: list[str]) -> None:
    """Refuse `--model ""` by its flag: read as `Path("")` (the working directory) it would fail, or
    write, there with a message about some file in it; an empty value is a slip for every option."""
    params = [p for p in getattr(_command(argv), "params", []) if not getattr(p, "is_flag", False)]
    paths = {o for p in params if _is_path_option(p) for o in p.opts}
    flags = {o for p in params for o in p.opts if o.startswith("--")}
    for i, word in enumerate(argv):
        name, eq, value = word.partition("=")
        if name not in flags or (not eq and i + 1 >= len(argv)):
            continue
        value = value if eq else argv[i + 1]
        if not (value.strip() if name in paths else value):
            raise ValueError(f"{name} is empty; give a {'path' if name in paths else 'value'}")


def _spread_values(argv: list[str]) -> list[str]:
    """An option of any number of values (a list field, click's `multiple`) typed once with them all,
    `--compare A B C`, as click reads it: `--compare A --compare B --compare C`. Only on a command without
    positional arguments, where a word after the values can be nothing else."""
    cmd = _command(argv)
    params = getattr(cmd, "params", [])
    if any(getattr(p, "param_type_name", "") == "argument" for p in params):
        return argv
    spread = {o for p in params if getattr(p, "multiple", False) for o in p.opts}
    out, current = [], None
    for word in argv:
        if word.startswith("-"):
            current = word if word in spread else None
        elif current is not None and out[-1] != current:  # a second, third, ... value of the same option
            out.append(current)
        out.append(word)
    return out


def _check_value_counts(argv: list[str]) -> None:
    """An option of several values given fewer (`analyze --compare A --out B`): said in its own words, not as
    the next option swallowed as a value (click then reports "Missing option '--out'")."""
    params = [p for p in getattr(_command(argv), "params", []) if getattr(p, "nargs", 1) > 1]
    for param in params:
        for i, word in enumerate(argv):
            if word not in param.opts:
                continue
            values = list(itertools.takewhile(lambda w: not w.startswith("--"), argv[i + 1:i + 1 + param.nargs]))
            if len(values) < param.nargs:
                noun = "directories" if "director" in (param.help or "") else "values"
                words = {0: "none", 1: "one", 2: "two", 3: "three"}
                got = words.get(len(values), str(len(values))) + (f" ({' '.join(values)})" if values else "")
                what = (param.help or "").rstrip(".")
                raise ValueError(f"{word} needs {words.get(param.nargs, param.nargs)} {noun}, got {got}"
                                 + (f": {what[:1].lower()}{what[1:]}" if what else ""))


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


@contextlib.contextmanager
def progress_when_slow(describe, after_s: float = 3.0, every_s: float = 5.0):
    """Print `describe(elapsed_s)` to stderr every `every_s` seconds once the block has run `after_s`
    seconds (a long `generate`): a quick block prints nothing, and the block's own output is untouched."""
    done = threading.Event()
    start = time.perf_counter()

    def tick() -> None:
        wait = after_s
        while not done.wait(wait):
            typer.echo(describe(time.perf_counter() - start), err=True)
            wait = every_s

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def said_when_slow(message: str, after_s: float = 3.0):
    """Print `message` to stderr if the block is still running after `after_s` seconds (loading a GGUF,
    converting, preparing a run): a slow step says what it does, a quick one (or a refusal) prints nothing."""
    timer = threading.Timer(after_s, lambda: typer.echo(message, err=True))
    timer.daemon = True
    timer.start()
    try:
        yield timer
    finally:
        timer.cancel()
