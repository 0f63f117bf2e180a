"""Command-line options generated from the typed configs (`sinkdlm.config`): one option per field.

Typer builds a command's options from a Python signature; `config_options(Config)` gives the command
one keyword parameter per field of `Config` — its type, its default (shown in `--help`) and the
docstring under its declaration as the help text — and calls the command with the built config.
A field added to a config therefore appears on the command line, in `--help` and in the fuzz
test (`tests/test_cli_fuzz.py` reads the options back) without another edit. Why typer and not
jsonargparse/tyro: every command, the one-line error handling (`cli/app.py`), the resume hint
(`typed_command`) and the fuzz test are click-based, and typer keeps flat flag names
(`--num-sink-tokens`, not `--model.num-sink-tokens`), which scripts and results already use.

`layered=True` (train, sft): every option defaults to None, so a `--config FILE` is overridden
only by the flags the user typed (`TrainConfig.resolve`); `--help` still shows the default each
option resolves to.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import PurePath
from typing import Any, Callable, Optional

import typer

from sinkdlm.config.fields import field_default, field_docs, field_types, flag_of, nested_config

_CLI_TYPES = (bool, int, float, str, PurePath)


def _cli_type(annotation: Any) -> bool:
    """True for the types an option can hold: scalars, paths, their Optional, tuples and lists of them (a list
    is an option given once with several values, `--compare A B C`: `cli/app.py` spreads them)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return all(typing.get_origin(a) in (tuple, list) or (isinstance(a, type) and issubclass(a, _CLI_TYPES))
               for a in args)


def _shown(value: Any, decls: tuple[str, ...]) -> str:
    if isinstance(value, bool):  # name the switch, not "True"
        on, _, off = decls[0].partition("/")
        return on if value else off
    return str(value)


def config_parameters(cls: type, *, layered: bool = False, exclude: tuple[str, ...] = (),
                      flags: dict[str, str] | None = None, defaults: dict[str, Any] | None = None,
                      required: tuple[str, ...] = (), first: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """The keyword parameters (each a `typer.Option`) for the command-line fields of `cls`, in `--help`'s order:
    those named in `first`, then the required ones, then the rest in declaration order."""
    flags, defaults = flags or {}, defaults or {}
    docs, types = field_docs(cls), field_types(cls)
    params = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("flatten") and f.name not in exclude:  # a held config: its chosen fields, flat
            params += _flattened_parameters(cls, f)
            continue
        if f.name in exclude or not f.metadata.get("cli", True) or not _cli_type(types[f.name]):
            continue
        flag = flags.get(f.name) or flag_of(f)
        annotation = types[f.name]
        decls = (f"{flag}/--no-{flag[2:]}",) if annotation is bool or annotation == Optional[bool] else (flag,)
        default = defaults[f.name] if f.name in defaults else field_default(f)
        if default is dataclasses.MISSING or f.name in required or f.metadata.get("required"):
            default = ...
        help_text = docs.get(f.name, "")
        if layered and default is not ...:
            if default is not None:
                help_text = f"{help_text}  [default: {_shown(default, decls)}]"
            default, annotation = None, Optional[annotation]
        option = typer.Option(default, *decls, help=help_text, show_default=not layered)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    rank = {name: i for i, name in enumerate(first)}
    return sorted(params, key=lambda p: (rank.get(p.name, len(rank)), p.default.default is not ...))


def _flattened_parameters(cls: type, holder: dataclasses.Field) -> list[inspect.Parameter]:
    """One optional flat option per chosen field of the config that `holder` holds (`option(flatten=)`)."""
    nested = nested_config(cls, holder.name)
    params = []
    for name, help_text in holder.metadata["flatten"].items():
        f = next(x for x in dataclasses.fields(nested) if x.name == name)
        annotation = Optional[field_types(nested)[name]]
        option = typer.Option(None, flag_of(f), help=help_text or field_docs(nested)[name], show_default=False)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
    return params


def build_config(cls: type, values: dict[str, Any]) -> Any:
    """`cls(**values)`, the flat options of a held config (`option(flatten=)`) gathered into it: built
    when its required fields are given (their defaults filling the rest), else None."""
    values = dict(values)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("flatten"):
            continue
        nested = nested_config(cls, f.name)
        given = {k: values.pop(k) for k in f.metadata["flatten"] if k in values}
        given = {k: v for k, v in given.items() if v is not None}
        required = [x.name for x in dataclasses.fields(nested) if field_default(x) is dataclasses.MISSING]
        values[f.name] = nested(**given) if all(k in given for k in required) else None
    return cls(**values)


def config_options(cls: type, *, layered: bool = False, **kwargs: Any) -> Callable[[Callable], Callable]:
    """Decorator: add every command-line field of `cls` as an option of the command.

    The command declares its own parameters (e.g. `ctx: typer.Context`, `config: Path`) and one
    named `cfg` (receives `cls(**values)`) or, with `layered=True`, `options` (the dict of values,
    None where not typed). `kwargs` go to `config_parameters` (exclude, flags, defaults, required).
    """

    def decorate(func: Callable) -> Callable:
        hints = typing.get_type_hints(func)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(func).parameters.values() if p.name not in ("cfg", "options")]
        generated = config_parameters(cls, layered=layered, **kwargs)

        @functools.wraps(func)
        def command(**values: Any) -> Any:
            passed = {p.name: values.pop(p.name) for p in own}
            if layered:
                return func(**passed, options=values)
            return func(**passed, cfg=build_config(cls, values))

        params = own + generated
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer must read the generated signature, not the function's
        return command

    return decorate
