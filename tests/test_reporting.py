"""reporting.Document: both renderings link each figure by its path relative to the page, none inlines it."""

import re
from html.parser import HTMLParser
from pathlib import Path

from sinkdlm.reporting import Document

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64  # a PNG signature: the Document reads no pixels


class _Images(HTMLParser):
    """Every <img src> of a page (the standard library's HTML parser: an independent reading)."""

    def __init__(self):
        super().__init__()
        self.src: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.src.append(dict(attrs)["src"])


def test_a_written_report_links_its_figures_and_embeds_none(tmp_path):
    out = tmp_path / "study"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "forest.png").write_bytes(PNG)
    (tmp_path / "shared.png").write_bytes(PNG)  # a figure outside the page's directory
    doc = Document("t")
    doc.table(["a", "b"], [[1, "`x`"]])
    doc.image(out / "figures" / "forest.png", "the forest")
    doc.image(tmp_path / "shared.png", "shared")
    doc.image(out / "figures" / "never_drawn.png", "no data")
    md, page = doc.write(out)
    html = page.read_text()
    assert "data:image" not in html and "base64" not in html
    parser = _Images()
    parser.feed(html)
    assert parser.src == ["figures/forest.png", "../shared.png"]  # a figure not drawn is left out
    assert all((page.parent / src).read_bytes() == PNG for src in parser.src)
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md.read_text())
    assert linked[:2] == parser.src  # the Markdown links the same files


def test_write_markdown_writes_no_html(tmp_path):
    path = Document("progress").write_markdown(tmp_path, "progress")
    assert path == tmp_path / "progress.md" and path.read_text().startswith("# progress")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.md"]
