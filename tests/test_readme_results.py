"""Every result table in the README is generated from a committed results file by the committed code."""

import json
import re
from pathlib import Path

import pytest

from sinkdlm.experiment.report import markdown_summary, readme_block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = re.findall(r"<!-- results:([\w.-]+) -->", README.read_text())


def test_readme_has_a_generated_results_block():
    assert "study" in BLOCKS


@pytest.mark.parametrize("name", BLOCKS)
def test_readme_tables_equal_the_committed_results(name):
    results = ROOT / "docs" / "results" / name / "results.json"
    block = readme_block(README, name)
    if not results.is_file():  # not run yet: the README must not show numbers for it
        assert block.strip() == "", f"README shows results for {name!r} without docs/results/{name}/results.json"
        return
    assert block == markdown_summary(json.loads(results.read_text())), (
        f"README's {name!r} tables differ from docs/results/{name}/results.json: run `make readme-results`")
