"""The length of an experiment, said on its console: the plan at the start (runs x steps, the estimated
time), after each run, "run k of N" with the time left and the expected end, and, while a stage with no log
line of its own runs (the fixed validation, evaluation, analysis: their progress bars show on a terminal only),
"still running" every `HEARTBEAT_S` seconds (`heartbeat`), so the console is never silent for a minute.

Every estimate comes from measured seconds: the runs' own `timing.json` (this directory's, kept across
resumed invocations), else the preset's committed reference run (`docs/results/<preset>/results.json`,
scaled by runs and steps), else none yet ("after the first run"). Nothing here trains or writes.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HEARTBEAT_S = 30.0  # seconds between "still running" lines: well inside the minute a console may stay silent
REFERENCE_RESULTS = Path(__file__).resolve().parents[3] / "docs" / "results"  # a source checkout's measured runs


def run_seconds(timing: dict) -> float | None:
    """A run's seconds (training, validation, evaluation, analysis) from its timing.json record; None
    before its training was timed."""
    return sum(float(v) for v in timing.values()) if "train" in timing else None


def reference_seconds_per_step(preset: str, results_dir: Path = REFERENCE_RESULTS) -> float | None:
    """Seconds per training step of one run of `preset`'s committed reference (its elapsed time over its
    runs and steps, evaluation and analysis included); None without one."""
    try:
        results = json.loads((results_dir / preset / "results.json").read_text())
        runs = len(results["seeds"]) * len(results["variants"])
        return float(results["elapsed_s"]) / (runs * int(results["train"]["max_steps"]))
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{round(seconds / 60)} min"


def plan_line(*, variants: int, seeds: int, steps: int, controls: int, measured: list[float],
              per_step: float | None, progress: Path) -> str:
    """The plan: runs x steps, the estimated time and where progress is written."""
    runs = variants * seeds
    what = f"{runs} run{'s' if runs != 1 else ''} ({variants} variant{'s' if variants != 1 else ''} x {seeds} " \
           f"seed{'s' if seeds != 1 else ''}) x {steps:,} training steps"
    if controls:
        what += f", then {controls} step-0 control{'s' if controls != 1 else ''} (validated, no training)"
    if measured:
        estimate = f"about {_duration(statistics.median(measured) * runs)} in all (measured: {len(measured)} " \
                   f"run{'s' if len(measured) != 1 else ''} here)"
    elif per_step is not None:
        estimate = f"about {_duration(per_step * steps * runs)} on a 2-core CPU (the preset's reference run; " \
                   "a faster machine takes less)"
    else:
        estimate = "the time is estimated after the first run"
    return f"plan: {what}; {estimate}; progress: {progress} (rewritten after every stage)"


def pace_line(done: int, total: int, measured: list[float], progress: Path, now: float | None = None) -> str:
    """After run `done` of `total`: the time left at the median measured run and the expected end."""
    line = f"run {done} of {total} done"
    if done < total and measured:
        left = statistics.median(measured) * (total - done)
        end = time.strftime("%H:%M", time.localtime((time.time() if now is None else now) + left))
        line += f"; about {_duration(left)} left (ends about {end})"
    return f"{line}; progress: {progress}"


@contextmanager
def heartbeat(what: str, log: Callable[[str], None], every: float | None = None) -> Iterator[None]:
    """While the body runs, `log("WHAT: still running (N s so far)")` every `every` seconds (default `HEARTBEAT_S`,
    read at the call) from a daemon thread; the thread stops, and says nothing more, when the body ends."""
    every = HEARTBEAT_S if every is None else every
    stop, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            log(f"{what}: still running ({_duration(time.monotonic() - start)} so far)")

    thread = threading.Thread(target=beat, name="sinkdlm-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
