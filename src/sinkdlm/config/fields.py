"""Field helpers shared by every config class: attribute docstrings as help text, field metadata.

A config field is declared once, with its default and, on the next line, a docstring:

    epsilon: float = 3.0
    '''Sink threshold ϵ (Rulli et al. eq. 3).'''

Python drops such attribute docstrings at run time, so `field_docs` reads them back from the
class's source with `ast` (as jsonargparse and tyro do); the command line (`sinkdlm.cli.options`)
turns them into `--help` text. Nothing here imports torch: `sinkdlm <cmd> --help` stays fast.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import sys
import typing
from dataclasses import field
from pathlib import Path
from typing import Any


@functools.cache
def _class_docs(module_name: str) -> dict[str, dict[str, str]]:
    """{class name: {field: docstring}} for every class of a module, from one parse of its file
    (`inspect.getsource` would parse the file again for every class: 0.1 s of `--help`)."""
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if not path or not path.endswith(".py"):
        return {}
    out: dict[str, dict[str, str]] = {}
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    # Our configs are module-level classes: walking the whole tree (for classes inside functions,
    # as in tests) is kept for other modules.
    for node in tree.body if module_name.startswith("sinkdlm.config.") else ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        docs = out.setdefault(node.name, {})
        for stmt, after in zip(node.body, node.body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return out


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: the docstring under its declaration}, over the class and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_class_docs(klass.__module__).get(klass.__name__, {}))
    for f in dataclasses.fields(cls):  # generated fields (make_dataclass) carry their help in metadata
        if f.name not in docs and f.metadata.get("help"):
            docs[f.name] = f.metadata["help"]
    return docs


def nested_config(cls: type, name: str) -> type:
    """The config class that field `name` of `cls` holds (`SampleConfig | None` -> `SampleConfig`)."""
    args = [a for a in typing.get_args(field_types(cls)[name]) if a is not type(None)] or [field_types(cls)[name]]
    return args[0]


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """{field name: resolved type} (the modules use `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


def option(default: Any = dataclasses.MISSING, *, flag: str | None = None, cli: bool = True,
           required: bool = False, default_factory: Any = dataclasses.MISSING,
           flatten: dict[str, str | None] | None = None) -> Any:
    """A field with command-line metadata: `flag` spells its option differently from its name
    (`as_json` -> `--json`); `cli=False` keeps it out of the command line (config files only);
    `required=True` makes the option required although the field has a default (e.g. an output path
    that a library caller, such as the experiment runner, sets itself). `flatten` (a field holding
    another config, e.g. `AnalyzeConfig.sample: SampleConfig | None`): {its field: help text, None =
    its own docstring} become flat options of this command (`--gen-length`, not `--sample.gen-length`),
    each optional; the held config is built when its required fields are given, else it stays None."""
    metadata = {"flag": flag, "cli": cli, "required": required, "flatten": flatten}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def switch(default: Any, *, choices: tuple[Any, ...] | None = None, minimum: int | None = None) -> Any:
    """A model switch of `ModelConfig` (an architecture choice the experiments compare)."""
    return field(default=default, metadata={"switch": True, "choices": choices, "minimum": minimum})


def field_default(f: dataclasses.Field) -> Any:
    """The default of a field (its factory called), or `dataclasses.MISSING` for a required one."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def non_default_fields(config: Any) -> dict[str, Any]:
    """{name: value} of the fields of a config instance that differ from their defaults (what a recipe sets)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if getattr(config, f.name) != field_default(f)}


def with_overrides(cls: type, config: Any, overrides: dict[str, Any], where: str) -> Any:
    """`config` (an instance of `cls`, or None for the defaults) with `overrides` of its fields
    replaced: the settings of a library call such as `generate(model, ids, config, steps=8)`."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise TypeError(f"{where}() got unknown setting(s) {', '.join(unknown)}; the {cls.__name__} fields are "
                        f"{', '.join(names)}")
    if config is None:
        missing = [f.name for f in dataclasses.fields(cls)
                   if field_default(f) is dataclasses.MISSING and f.name not in overrides]
        if missing:
            raise TypeError(f"{where}() needs {', '.join(missing)} (a keyword, or a {cls.__name__})")
        return cls(**overrides)
    if not isinstance(config, cls):
        raise TypeError(f"{where}() takes a {cls.__name__} as config, got {type(config).__name__}")
    return dataclasses.replace(config, **overrides) if overrides else config


def flag_of(f: dataclasses.Field) -> str:
    """The long option of a field: its metadata's `flag`, else `--field-name`."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


# `--device`: `auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`; placed by
# `sinkdlm.model.loader.resolve_device`, checked here without touching CUDA.
DEVICE_CHOICES = "auto | cpu | cuda | cuda:N"
_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(name) -> str:
    """The device spelling, checked without touching CUDA; `None` becomes `"auto"`."""
    if name is None:
        return "auto"
    text = str(name)
    if not _PATTERN.match(text):
        raise ValueError(f"--device must be one of {DEVICE_CHOICES}, got {text!r}")
    return text


@dataclasses.dataclass(kw_only=True)
class DeviceOption:
    """The one declaration of `--device`, inherited by every config that places a model."""

    device: str = "auto"
    """auto (CUDA when available, else CPU) | cpu | cuda | cuda:N."""
