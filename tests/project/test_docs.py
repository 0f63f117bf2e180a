"""What a user reads points only at the project's own files: no team-internal references."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_FACING = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py")]


@pytest.mark.parametrize("needle", ["../shared", "SPEC.md", "SPEC" + " §"])  # split: this file must not match itself
def test_no_reference_outside_the_project(needle):
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in USER_FACING for i, line in enumerate(p.read_text().splitlines(), 1)
            if needle in line]
    assert not hits, f"{needle!r} is not shipped with the project; cite docs/method.md instead: {hits}"


def test_method_notes_have_every_cited_section():
    import re

    notes = (ROOT / "docs" / "method.md").read_text()
    sections = {int(m) for m in re.findall(r"^## §(\d+)\.", notes, flags=re.M)}
    cited = {int(n) for p in USER_FACING for n in re.findall(r"docs/method\.md §(\d+)", p.read_text())}
    assert cited, "no code cites the method notes"
    assert cited <= sections, f"cited sections missing from docs/method.md: {sorted(cited - sections)}"


def test_every_relative_link_in_the_docs_resolves():
    """Images and links of the README and the committed reports point at files that are committed."""
    import re

    broken = []
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to files that are not in the repository: {broken}"


def test_every_project_file_the_docs_name_exists():
    """A path in backticks (`tests/...py`, `tools/...py`, `docs/...md`) names a file of this checkout; the only
    exceptions are the results files a GPU run writes, which the pages say are not measured yet."""
    import re

    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md"), ROOT / "docs" / "results" / "README.md"]
    pattern = re.compile(r"`((?:src|tests|tools|benchmarks|docs)/[\w./-]+\.(?:py|md|json|sh|png))")
    gpu_results = re.compile(r"benchmarks/results/bench_(?:gpu_\w+|cache_gpu|block_gpu)\.json")
    missing = [f"{page.relative_to(ROOT)}: {path}" for page in pages for path in pattern.findall(page.read_text())
               if not (ROOT / path).exists() and not (page.parent / path).exists() and not gpu_results.fullmatch(path)]
    assert not missing, f"the docs name files that are not in the checkout: {missing}"
