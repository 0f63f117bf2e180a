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
