"""Argument checks shared by every module: one home for "must be an integer >= 1" and friends.

Each check raises `ValueError` with a message that names the argument, says what it must be and
what it got, before any work starts. Library functions pass their own parameter names; the
command line re-spells them as its flags (`seq_len` -> `--seq-len`) with `cli_message`, so an
error printed by `sinkdlm ...` speaks the names the user typed.

No torch import here: the CLI imports this module on its fast `--help` path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

SCALES = ("sum", "mean")  # received-attention scale, Rulli et al. eq. 3 (column sum or mean)


def check_int(name: str, value, minimum: int = 1) -> int:
    """`value` is an int (not a bool) >= minimum."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_optional_int(name: str, value, minimum: int = 1, *, none_means: str) -> int | None:
    """`value` is None (which means `none_means`) or an int >= minimum."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (or left unset: {none_means}), got {value!r}")
    return value


def check_seed(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"seed must be an integer, got {value!r}")
    return value


def check_choice(name: str, value, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}")
    return value


def check_scale(scale) -> str:
    """Scale of received attention (Rulli et al. eq. 3): column 'sum' (default) or 'mean'."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use 'sum' (column sum, default) or 'mean' (column mean)")
    return scale


def check_epsilon(epsilon) -> float:
    """Sink threshold ϵ (Rulli et al. eq. 3): a finite number >= 0."""
    try:
        eps = float(epsilon)
    except (TypeError, ValueError) as err:
        raise ValueError(f"epsilon must be a number, got {epsilon!r}") from err
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return eps


def check_epsilons(epsilons) -> list[float]:
    """One threshold or a non-empty collection of thresholds, each as in `check_epsilon`."""
    if isinstance(epsilons, (int, float)):
        epsilons = (epsilons,)
    eps = [check_epsilon(e) for e in epsilons]
    if not eps:
        raise ValueError("epsilons is empty; pass at least one threshold, e.g. (3.0,)")
    return eps


# ----------------------------------------------------------------------------- CLI spelling
def cli_message(message: str, flags: Iterable[str]) -> str:
    """Rewrite library parameter names in an error message as the running command's flags.

    `flags` are the command's long options (e.g. `--seq-len`). A name with an underscore
    (`seq_len`, `text_field`) becomes its flag wherever it stands as a word; a one-word name
    (`steps`, `limit`) only where it is clearly the argument (`steps=64`, `steps must ...`), so
    prose such as "denoising steps" is left alone. `got None` becomes `got nothing` (an unset
    option): the user never reads the Python spelling.
    """
    known = {f[2:].replace("-", "_"): f for f in flags if f.startswith("--")}
    out = message
    for name, flag in sorted(known.items(), key=lambda kv: -len(kv[0])):
        # not part of a longer name (`max_seq_len` vs `seq_len`), of a flag or of an attribute
        lead = r"(?<![\w.\-])"
        out = re.sub(lead + re.escape(name) + "=", flag + "=", out)
        if "_" in name:
            out = re.sub(lead + re.escape(name) + r"(?![\w(])", flag, out)
        else:
            out = re.sub(lead + re.escape(name) + r"(?= must\b| is required\b)", flag, out)
    return out.replace("got None", "got nothing")
