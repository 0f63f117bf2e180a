"""Developer tooling: regenerate the README's result blocks from the committed results files.

Each block sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->` and is generated from
`docs/results/NAME/`: an experiment's `results.json` (`sinkdlm.experiment.report.markdown_summary`)
or an analysis over prompts' `intervals.json` (`sinkdlm.analysis.over_prompts_report.markdown_headline`).
`tests/test_readme_results.py` checks that every block equals what this file generates.

    .venv/bin/python tools/readme_results.py          # what `make readme-results` runs
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"<!-- results:([\w./-]+) -->")


def block_names(readme: Path = README) -> list[str]:
    return MARKER.findall(readme.read_text())


def _ar_vs_dlm(results_root: Path) -> str | None:
    ar, dlm = results_root / "smollm2" / "ar" / "intervals.json", results_root / "smollm2" / "dlm" / "results.json"
    if not (ar.is_file() and dlm.is_file()):
        return None
    from sinkdlm.experiment.report import ar_vs_dlm_markdown

    return ar_vs_dlm_markdown(json.loads(ar.read_text()), json.loads(dlm.read_text()))


def _bench_real_train(results_root: Path) -> str | None:
    path = ROOT / "benchmarks" / "results" / "bench_real_train.json"
    if not path.is_file():
        return None
    r = json.loads(path.read_text())
    b, l = r["batch"]
    lines = [f"{r['model']}, batch {b} × {l}, fp32, {r['threads']} threads, median of {r['repeats']} round-robin rounds "
             "(`benchmarks/bench_real_train.py`):", "", "| training step (forward + backward) | median s | speed-up vs transformers |",
             "|---|---:|---:|"]
    lines += [f"| {k} | {v:.3f} | {r['speedup_vs_transformers'][k]:.2f}× |" for k, v in r["median_s"].items()]
    lines += ["", f"The LM head on the masked positions only makes the step {r['masked_head_gain']:.2f}× faster than the head on "
              "every position."]
    return "\n".join(lines) + "\n"


# Blocks built from other files than one results folder.
COMBINED = {"smollm2/ar-vs-dlm": _ar_vs_dlm, "bench/real-train": _bench_real_train}


def generated_block(name: str, results_root: Path = ROOT / "docs" / "results") -> str | None:
    """The markdown for block `name`, or None when its results are not committed (yet)."""
    if name in COMBINED:
        return COMBINED[name](results_root)
    folder = results_root / name
    if (folder / "results.json").is_file():
        from sinkdlm.experiment.report import markdown_summary

        return markdown_summary(json.loads((folder / "results.json").read_text()))
    if (folder / "intervals.json").is_file():
        from sinkdlm.analysis.over_prompts_report import markdown_headline

        return markdown_headline(json.loads((folder / "intervals.json").read_text()))
    return None


def readme_block(readme: Path, name: str) -> str:
    text = readme.read_text()
    start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    return text.split(start, 1)[1].split(end, 1)[0].lstrip("\n")


def update(readme: Path = README) -> list[str]:
    """Rewrite every block whose results exist; the names that changed."""
    text = readme.read_text()
    changed = []
    for name in block_names(readme):
        block = generated_block(name)
        if block is None:
            continue
        start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
        if end not in text:
            raise ValueError(f"{readme} has {start} but no {end}")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        new = f"{head}{start}\n{block}{end}{tail}"
        if new != text:
            changed.append(name)
            text = new
    if changed:
        readme.write_text(text)
    return changed


if __name__ == "__main__":
    for page in (README, ROOT / "docs" / "results" / "README.md", ROOT / "docs" / "benchmarks.md"):
        if page.is_file():
            print(f"{page.relative_to(ROOT)}: updated", ", ".join(update(page)) or "nothing")
