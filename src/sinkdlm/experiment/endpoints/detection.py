"""What a test that detects nothing may say (docs/method.md §7), one rule for every endpoint.

A test that rejects nothing has not shown that there is no difference; what it can say depends on what it could
have seen. `inconclusive` is the rule: such a test is *inconclusive* where its variance is zero (every seed's
difference alike: no variance estimate, no minimum detectable effect), where its MDE or the effect the study was
sized for (`sized_for`, declared with the study before its runs) is unknown, or where the MDE exceeds that effect;
otherwise it says *no difference detected*, with the MDE and the effect it was sized for beside it. The declared
primary (`endpoints.primary`), the escape tests (`endpoints.escape`) and the quantization endpoint
(`endpoints.quant`) all decide it here.

`differences_mde`: the MDE of the paired t test over seeds from the per-seed differences themselves (80 % power,
two-sided at `alpha`: `stats.minimum_detectable_effect` at se = sd / √n, n − 1 df); `null_words` the
quant endpoint's wording of a test that decided nothing.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from sinkdlm.stats import minimum_detectable_effect


def inconclusive(mde: float | None, sized_for: float | None, *, rejects: bool = False,
                 degenerate: bool = False) -> bool:
    """Whether a test is inconclusive by the rule above: never where it `rejects`; else where the variance is zero
    (`degenerate`), the MDE or `sized_for` is unknown (None or not finite), or the MDE exceeds `sized_for`."""
    if rejects:
        return False
    return bool(degenerate or sized_for is None or mde is None or not math.isfinite(mde) or mde > sized_for)


def differences_mde(d: Sequence[float], alpha: float = 0.05, degenerate: bool = False) -> float | None:
    """The paired t test's MDE over seeds from the per-seed differences `d` (80 % power, two-sided at `alpha`);
    None with fewer than two seeds or no spread (`degenerate`: the paired interval found every difference alike)."""
    if len(d) < 2 or degenerate:
        return None
    sd = statistics.stdev(d)
    mde = minimum_detectable_effect(sd / math.sqrt(len(d)), len(d) - 1, alpha=alpha)
    return mde if math.isfinite(mde) else None


def null_words(mde: float | None, sized_for: float | None, unit: str, *, degenerate: bool = False,
               seeds: int | None = None, level: str = "") -> str:
    """A test that decided nothing, in words, by `inconclusive`: "no difference detected (MDE 0.0123 nats, sized for
    0.02)" where the MDE is at or below the effect the study was sized for, else "inconclusive (...)" saying why.
    `level`: where the MDE is stated at an adjusted level, its words (e.g. "at the adjusted level 99 %")."""
    at = f" {level}" if level else ""
    if seeds is not None and seeds < 2:
        return f"inconclusive with {seeds} seed{'' if seeds == 1 else 's'} (no spread, no MDE)"
    if degenerate:
        return "inconclusive (no variance: every seed's difference alike, so no MDE)"
    if mde is None or not math.isfinite(mde):
        return "inconclusive (no MDE)"
    said = f"MDE {mde:.3g}{f' {unit}' if unit else ''}{at}"
    if not inconclusive(mde, sized_for):
        return f"no difference detected ({said}, sized for {sized_for:g})"
    if sized_for is None:
        return f"inconclusive ({said}; the study was not sized for an effect)"
    return f"inconclusive ({said}, above the {sized_for:g} the study was sized for)"
