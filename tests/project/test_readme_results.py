"""Every result table in the README (and in docs/results/README.md, docs/benchmarks.md, docs/guide.md) is generated from a committed
results file by the committed code (`tools/readme_results.py`, `make readme-results`)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_results", ROOT / "tools" / "readme_results.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)
PAGES = tool.PAGES
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


def test_the_quick_start_table_measures_the_quick_start_as_it_is_written():
    """The README's Quick-start table comes from benchmarks/bench_quickstart.py, which ran the block as written:
    every command line of the block, in order, and nothing else (a README edit without a new measurement fails)."""
    path = ROOT / "benchmarks" / "results" / "bench_quickstart.json"
    if not path.is_file():
        pytest.skip("benchmarks/bench_quickstart.py has not been run")
    import json

    from helpers import _load_tool

    bench = _load_tool("bench_quickstart", "benchmarks")
    commands = [ln for ln in bench.quick_start_block() if not bench.is_setup(ln)]
    measured = json.loads(path.read_text())
    assert [row["line"] for row in measured["lines"]] == commands
    assert measured["python"]["source"] == bench.quick_start_python()
    assert measured["all_ran"] and all(row["returncode"] == 0 for row in measured["lines"])
    rows = [ln for ln in tool.generated_block("bench/quickstart").splitlines() if ln.startswith("| `")]
    assert len(rows) == sum(ln.startswith("sinkdlm ") for ln in commands)  # one row per sinkdlm line


def test_quickstart_sink_sentence_is_computed_from_the_measured_layers(tmp_path, monkeypatch):
    """The bench keeps each `analyze` line's per-layer masses; the README sentence is their median and
    quartiles (statistics.quantiles, written out here), never a typed range."""
    import json

    from helpers import _load_tool

    bench = _load_tool("bench_quickstart", "benchmarks")
    analysis = {"model": {"label": "DLM + 1 sink"}, "sink_attention_mass": [0.9] * 4,
                "extra_sink": {"attention_mass": [0.10, 0.20, 0.30, 0.40, 0.50]}}
    (tmp_path / "dlm").mkdir()
    (tmp_path / "dlm" / "analysis.json").write_text(json.dumps(analysis))
    (tmp_path / "ar").mkdir()
    (tmp_path / "ar" / "analysis.json").write_text(json.dumps({"model": {"label": "AR"}, "sink_attention_mass": [0.2, 0.6, 0.7]}))
    dlm, ar = bench.attention_summary(tmp_path / "dlm"), bench.attention_summary(tmp_path / "ar")
    assert dlm["sink_token_mass"] == analysis["extra_sink"]["attention_mass"] and ar["sink_token_mass"] is None
    assert bench.attention_summary(tmp_path / "nothing") is None
    fake_root = tmp_path / "root"
    (fake_root / "benchmarks" / "results").mkdir(parents=True)
    rows = [{"line": "sinkdlm analyze --model $M", "attention": ar}, {"line": "sinkdlm convert", "attention": None},
            {"line": "sinkdlm analyze --model x", "attention": dlm}]
    (fake_root / "benchmarks" / "results" / "bench_quickstart.json").write_text(json.dumps({"lines": rows}))
    monkeypatch.setattr(tool, "ROOT", fake_root)
    text = tool.generated_block("bench/quickstart-sinks")
    # quartiles of 0.1..0.5 (exclusive method): 0.15, 0.30, 0.45; the AR median 0.6
    assert "median 30 % of a layer's attention (15 % to 45 % over the middle half of its 5 layers)" in text
    assert "detected sinks took a median 60 %" in text


def test_the_readme_is_a_front_page():
    """The README stays a front page (about 200 lines: at most 210), and no generated paragraph on it is longer than
    400 characters: the full verdicts are on docs/results/README.md, generated from the same files."""
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 210
    long = [(name, len(para)) for name in tool.block_names(readme)
            for para in tool.readme_block(readme, name).split("\n\n") if not para.lstrip().startswith("|")
            and len(para) > 400]
    assert not long, f"generated paragraphs on the README over 400 characters (put them on the results page): {long}"


def test_the_speed_lines_are_read_from_the_results_and_say_slower(tmp_path, monkeypatch):
    """The README's speed lines (`bench/speed`) take every figure from bench_block/bench_decoding/bench_quant.json, and a
    measured ratio below 1 reads "slower", never as a speed-up."""
    import json

    assert "bench/speed" in tool.block_names(ROOT / "README.md")
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    row = lambda s: {"forwards": 4, "seconds": 1.0, "tokens_per_s": 1.0, "block_speedup": s}
    (results / "bench_block.json").write_text(json.dumps({
        "preset": "tiny", "device": "CPU (Some CPU), 1 thread(s)", "threads": 1, "block_size": 8,
        "decoding": {"prompt_length": 32, "gen_length": 16, "rows": {"block model, its cache": row(1.0),
                     "whole sequence, no cache": row(3.456), "whole sequence, dual cache": row(0.5)}}}))
    mode = lambda s: {"speedup_vs_reference": s}
    (results / "bench_decoding.json").write_text(json.dumps({
        "machine": {"processor": "x86_64", "threads": 2}, "model": {"preset": "tiny", "num_sink_tokens": 1},
        "threshold": 0.9, "lengths": {"64": {"dual": mode(2.5), "dual + 0.9": mode(3.25)}, "_wall_s": 1.0}}))
    variant = lambda s, w, peak=None: {"speedup": s, "weight_bytes": w * 2**20, "peak_decode_mib": peak}
    (results / "bench_quant.json").write_text(json.dumps({"cpu": "Some CPU", "threads": 1, "decode": [
        {"model": "small", "parameters": 1, "variants": {"fp32": variant(1.0, 4), "int8-dynamic": variant(0.25, 1)}},
        {"model": "big", "parameters": 2, "kv_cache_bytes": {"fp32": 400, "int8": 100},
         "variants": {"fp32": variant(1.0, 500, 900), "int8-weight": variant(0.75, 200, 600),
                      "fp32, int8 KV cache": variant(1.25, 500)}}]}))
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    text = tool.generated_block("bench/speed")
    assert "3.46× the tokens/s of the whole-sequence model without a cache and 0.50× (slower) those of its dual cache" in text
    assert "16 new tokens after a 32-token prompt, blocks of 8" in text and "CPU (Some CPU), 1 thread;" in text
    assert "2.50× the tokens per CPU second at 64 new tokens; with threshold 0.9, 3.25×" in text and "2 threads" in text
    assert "big: `--quantize int8-weight` takes its weights 500 → 200 MiB (peak while decoding 900 → 600 MiB) at 0.75× (slower)" in text
    assert "its cache 4.0× smaller at 1.25×;" in text and "`int8-dynamic` decodes at 0.25× (slower) on small" in text
    assert len(text.split("\n\n")) == 3
