"""Developer tooling: draw the reports a study does not commit, from the results files it does.

A study commits each run's `analysis/analysis.json` and `analysis_arrays.npz`, and only the figures its
report shows (CONTRIBUTING.md, "What a study commits"); this draws every stored analysis under the given
directories whose report.md is missing again: its figures and report.md / report.html
(`sinkdlm.analysis.comparison.redraw`; nothing is run), and each escape study's per-run figures
(`figures/escape_runs/`, `sinkdlm.experiment.endpoints.escape.report.draw_escape_runs`). The files it writes are ignored
by git.

    .venv/bin/python tools/reports.py [DIR ...]      # what `make reports` runs (default: docs/results)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def missing_reports(roots: list[Path]) -> list[Path]:
    """The analysis directories under `roots` that hold analysis.json but no report.md."""
    return sorted(p.parent for root in roots for p in root.rglob("analysis.json") if not (p.parent / "report.md").is_file())


def main(argv: list[str]) -> int:
    from sinkdlm.analysis.comparison import redraw

    roots = [Path(a) for a in argv] or [ROOT / "docs" / "results"]
    todo, drawn = missing_reports(roots), 0
    for i, path in enumerate(todo, 1):
        try:
            print(f"[{i}/{len(todo)}] {redraw(path)}", flush=True)
            drawn += 1
        except ValueError as e:  # an analysis committed without its arrays (an older study's extra seeds)
            print(f"[{i}/{len(todo)}] skipped: {e}", flush=True)
    print(f"drew {drawn} of {len(todo)} missing report(s)")
    from sinkdlm.experiment.endpoints.escape.report import draw_escape_runs

    for results in sorted(p for root in roots for p in root.rglob("results.json")):
        if (json.loads(results.read_text()).get("declared") or {}).get("escape"):
            paths, missing = draw_escape_runs(results.parent)
            print(f"{results.parent}: drew {len(paths)} escape run figure(s); {missing} run(s) without probes.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
