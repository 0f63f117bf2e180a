"""A tiny report document: headings, paragraphs, tables and images -> Markdown and HTML.

Both renderings link each figure by its path relative to the page (`figures/forest.png`), so a page
is as small as its text and a figure is stored once, as its PNG: a committed report adds no copy of
its figures to the repository's history (the HTML opens beside its PNGs, as the Markdown does).
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass, field

from sinkdlm.io.atomic import atomic_write_bytes
from pathlib import Path


@dataclass
class Document:
    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def paragraph(self, text: str) -> None:
        self.blocks.append(("paragraph", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(("bullets", list(items)))

    def table(self, header: list[str], rows: list[list[object]]) -> None:
        self.blocks.append(("table", (header, [[str(c) for c in r] for r in rows])))

    def image(self, path: str | Path, caption: str = "") -> None:
        self.blocks.append(("image", (Path(path), caption)))

    # ------------------------------------------------------------------ rendering
    def to_markdown(self, base: Path) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                out += ["#" * level + " " + text, ""]
            elif kind == "paragraph":
                out += [value, ""]
            elif kind == "bullets":
                out += [f"- {item}" for item in value] + [""]
            elif kind == "table":
                header, rows = value
                out.append("| " + " | ".join(header) + " |")
                out.append("|" + "|".join("---" for _ in header) + "|")
                out += ["| " + " | ".join(r) + " |" for r in rows]
                out.append("")
            elif kind == "image":
                path, caption = value
                rel = os.path.relpath(path, base)
                out += [f"![{caption}]({rel})", f"*{caption}*" if caption else "", ""]
        return "\n".join(out).rstrip() + "\n"

    def to_html(self, base: Path) -> str:
        esc = html.escape
        body = [f"<h1>{esc(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                body.append(f"<h{level}>{esc(text)}</h{level}>")
            elif kind == "paragraph":
                body.append(f"<p>{_inline(value)}</p>")
            elif kind == "bullets":
                body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in value) + "</ul>")
            elif kind == "table":
                header, rows = value
                head = "".join(f"<th>{_inline(h)}</th>" for h in header)
                rows_html = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows_html}</tbody></table>")
            elif kind == "image":
                path, caption = value
                if Path(path).is_file():  # a figure not drawn (no data for it) is left out, not linked broken
                    rel = Path(os.path.relpath(path, base)).as_posix()
                    body.append(f'<figure><img src="{esc(rel)}" alt="{esc(caption)}">'
                                f"<figcaption>{esc(caption)}</figcaption></figure>")
        style = (
            "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
            "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
            "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
            "figcaption{color:#555;font-size:90%}code{background:#f3f3f3;padding:0 3px}"
        )
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(self.title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
        )

    def write(self, out_dir: str | Path, stem: str = "report") -> tuple[Path, Path]:
        """`out_dir/<stem>.md` and `out_dir/<stem>.html`, both linking the figures by relative path."""
        out_dir = Path(out_dir)
        md, page = self.write_markdown(out_dir, stem), out_dir / f"{stem}.html"
        atomic_write_bytes(page, self.to_html(out_dir).encode())
        return md, page

    def write_markdown(self, out_dir: str | Path, stem: str) -> Path:
        """Only `out_dir/<stem>.md` (a progress page, rewritten often and committed: no HTML copy)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        return atomic_write_bytes(out_dir / f"{stem}.md", self.to_markdown(out_dir).encode())


def _inline(text: str) -> str:
    """Escape, then render `code` spans and **bold** (the only inline markup reports use)."""
    s = html.escape(str(text))
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", s)
