"""The committed results stay light (CONTRIBUTING.md, "What a study commits"): docs/results/ fits a declared
budget, no page embeds its figures, every committed figure is one a committed page shows, and no sentinel or
temp file is tracked. Read from `git ls-files`, so only what a clone gets is counted."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = "docs/results"
# The whole tracked docs/results/ tree. It was 88 MB when pages inlined their figures, then 45 MB, then 55 MB
# with the late-sink study; 36 MB since per-run figures (each run's analysis figures, each escape run's figure)
# are drawn on demand by `make reports` and the per-run arrays are packed into one file per study
# (CONTRIBUTING.md, "What a study commits"); then 41.5 MB, and 30.1 MB once the three older studies kept
# the analysis arrays of their first seed only, leaving room for the block-sinks and quant studies.
BUDGET_BYTES = 45_000_000
# What one study (a folder of docs/results/) may add: its results, report, the figures the report shows and the
# per-run data they are drawn from. The three studies over it when it was set keep their tracked size as their cap
# (rounded up to 0.1 MB); they may shrink, never grow. They were 8.2, 9.3 and 9.5 MB; 4.0, 4.5 and 7.0 MB since
# they commit the per-run arrays (`analysis_arrays.npz`) of their first seed only, as a new study does
# (.gitignore; CONTRIBUTING.md, "What a study commits").
STUDY_BUDGET_BYTES = 5_000_000
STUDY_CAPS = {"late-sink": 4_000_000, "smollm2": 4_500_000, "study": 7_000_000}
KINDS = (".json", ".jsonl", ".md", ".png", ".npz", ".html")  # the results files a study writes and commits


@pytest.fixture(scope="module")
def tracked() -> list[str]:
    """The paths under docs/results/ that git tracks (present in this checkout)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: what is committed cannot be read")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", RESULTS], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def _links(page: Path) -> list[str]:
    """The relative targets a Markdown or HTML page links: `](target)` and `<img src="target">`."""
    text = page.read_text()
    found = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'<img src="([^"]+)"', text)
    return [t.split("#")[0] for t in found if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_the_committed_results_fit_their_budget(tracked):
    sizes = {p: (ROOT / p).stat().st_size for p in tracked}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= BUDGET_BYTES, (f"the tracked {RESULTS}/ is {total / 1e6:.1f} MB, over its {BUDGET_BYTES / 1e6:.0f} MB "
                                   f"budget; largest: {[(p, sizes[p]) for p in largest]}")


def test_each_study_fits_its_budget(tracked):
    sizes: dict[str, int] = {}
    for p in tracked:
        parts = Path(p).relative_to(RESULTS).parts
        if len(parts) > 1:  # the results page itself is no study
            sizes[parts[0]] = sizes.get(parts[0], 0) + (ROOT / p).stat().st_size
    over = {s: n for s, n in sizes.items() if n > STUDY_CAPS.get(s, STUDY_BUDGET_BYTES)}
    assert not over, (f"studies over their budget ({STUDY_BUDGET_BYTES / 1e6:.0f} MB for a new one, CONTRIBUTING.md "
                      f"\"What a study commits\"): { {s: f'{n / 1e6:.1f} MB' for s, n in over.items()} }")


def test_no_committed_page_embeds_a_figure(tracked):
    embedded = [p for p in tracked if p.endswith((".md", ".html")) and "data:image" in (ROOT / p).read_text()]
    assert not embedded, f"pages that inline an image instead of linking its PNG: {embedded}"


def test_every_committed_figure_is_shown_by_a_committed_page_and_every_link_resolves(tracked):
    files = set(tracked)
    shown, broken = set(), []
    for page in (p for p in tracked if p.endswith((".md", ".html"))):
        for target in _links(ROOT / page):
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            shown.add(path)
            committed = path in files if path.startswith(RESULTS + "/") else (ROOT / path).exists()
            if not committed:  # a figure drawn here but not committed is missing from a clone
                broken.append(f"{page} -> {target}")
    unshown = sorted(p for p in files if p.endswith(".png") and p not in shown)
    assert not broken, f"committed pages link files that are not committed: {broken}"
    assert not unshown, f"committed figures that no committed page shows (draw them on demand instead): {unshown}"


def test_no_sentinel_or_temp_file_is_committed(tracked):
    odd = [p for p in tracked if p != f"{RESULTS}/README.md" and (not p.endswith(KINDS) or any(
        part.startswith(".") for part in Path(p).parts))]
    assert not odd, f"not results files (sentinels such as ALL_DONE, or the temp file of an atomic write): {odd}"
