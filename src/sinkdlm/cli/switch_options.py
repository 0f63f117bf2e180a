"""Typer options for the model switches, generated from `sinkdlm.config.MODEL_SWITCHES`.

Typer builds a command's options from its Python signature, so `with_switch_options` appends one
keyword parameter per switch to the signature it reports (and to `__annotations__`, which typer
reads for the types); the command receives them in `**switches`. A switch added to the registry
thus appears in `sinkdlm train` and `sinkdlm convert` without touching either command.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import typer

from sinkdlm.config import MODEL_SWITCHES, ModelSwitch


def _option(switch: ModelSwitch, unset_default: bool) -> tuple[Any, Any]:
    """(annotation, typer.Option) for one switch; default None (`train`: keep the config file's
    or checkpoint's value) or the registry default (`convert`)."""
    default = None if unset_default else switch.default
    help_text = switch.help
    if switch.type is bool:
        decls = (f"{switch.flag}/--no-{switch.flag[2:]}",)
    else:
        decls = (switch.flag,)
    annotation = Optional[switch.type] if unset_default else switch.type
    return annotation, typer.Option(default, *decls, help=help_text, show_default=not unset_default)


def with_switch_options(*, unset_default: bool) -> Callable[[Callable], Callable]:
    """Decorator: add every model switch as a keyword option of a command taking `**switches`."""

    def decorate(func: Callable) -> Callable:
        sig = inspect.signature(func)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        assert len(params) < len(sig.parameters), f"{func.__name__} must accept **switches"
        annotations = dict(getattr(func, "__annotations__", {}))
        for switch in MODEL_SWITCHES:
            annotation, option = _option(switch, unset_default)
            params.append(inspect.Parameter(switch.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation))
            annotations[switch.name] = annotation
        func.__signature__ = sig.replace(parameters=params)
        func.__annotations__ = annotations
        return func

    return decorate
