"""Every result table in the README (and in docs/results/README.md) is generated from a committed
results file by the committed code (`tools/readme_results.py`, `make readme-results`)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_results", ROOT / "tools" / "readme_results.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)
PAGES = [ROOT / "README.md", ROOT / "docs" / "results" / "README.md", ROOT / "docs" / "benchmarks.md"]
BLOCKS = [(page, name) for page in PAGES if page.is_file() for name in tool.block_names(page)]


def test_readme_has_generated_results_blocks():
    names = {name for _, name in BLOCKS}
    assert {"study", "smollm2/ar"} <= names
    # the speed tables of docs/benchmarks.md come from benchmarks/results/*.json
    assert {"bench/real-train", "bench/model", "bench/cache"} <= set(tool.block_names(ROOT / "docs" / "benchmarks.md"))


@pytest.mark.parametrize("page,name", BLOCKS, ids=[f"{p.name}:{n}" for p, n in BLOCKS])
def test_readme_tables_equal_the_committed_results(page, name):
    want = tool.generated_block(name)
    block = tool.readme_block(page, name)
    if want is None:  # not run yet: the page must not show numbers for it
        assert block.strip() == "", f"{page.name} shows results for {name!r} without docs/results/{name}/"
        return
    assert block == want, f"{page.name}'s {name!r} tables differ from docs/results/{name}/: run `make readme-results`"
