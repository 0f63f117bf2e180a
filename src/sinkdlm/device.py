"""One device resolver for every entry point (train, experiment, generate, eval, analyze, lm-eval).

`--device` accepts `auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`, and
`None` means `auto`. Everything that places a model calls `resolve_device`, so the spelling
`auto` can never reach `model.to(...)`, and a CUDA request on a machine without one fails with
a message saying what to use instead, before any work starts.
"""

from __future__ import annotations

import re

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


def resolve_device(name=None):
    """`torch.device` for a `--device` value (`None`/`"auto"`: CUDA when available, else CPU)."""
    import torch

    if isinstance(name, torch.device):
        name = str(name)
    text = check_device(name)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {text}: CUDA is not available on this machine; use --device cpu or auto")
        index = int(text.split(":")[1]) if ":" in text else 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return torch.device(text)
