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


def _pilot_as_study(root: Path, pilot: str, name: str, figure: str) -> dict:
    """A final study under docs/results-like `root`/NAME: the pilot's committed results.json (the same structure
    as the study's) and its figure."""
    import json
    import shutil

    src = ROOT / "docs" / "results" / pilot
    (root / name / "figures").mkdir(parents=True)
    shutil.copy(src / "results.json", root / name / "results.json")
    shutil.copy(src / "figures" / figure, root / name / "figures" / figure)
    return json.loads((src / "results.json").read_text())


def _write(root: Path, name: str, results: dict) -> None:
    import json

    (root / name / "results.json").write_text(json.dumps(results))


def test_block_sinks_and_quant_findings_are_read_from_their_final_results(tmp_path):
    """Once block-sinks and quant (issues 65, 66) are final, the findings table has their declared primaries and
    secondaries and the answers block one sentence per study beside its figure, every number from results.json
    and every verdict by the rules (a direction only where the declared test decided; else the null words)."""
    b = _pilot_as_study(tmp_path, "block-sinks-pilot", "block-sinks", "block_sizes.png")
    q = _pilot_as_study(tmp_path, "quant-pilot", "quant", "quant.png")
    table = tool.generated_block("findings", tmp_path)
    rows = [ln for ln in table.splitlines() if ln.startswith("| [")]
    assert len(rows) == 3  # the other studies are not under tmp_path
    p, t = b["primary"], b["primary"]["t"]
    assert p["test"] == "t" and not p["rejects"] and p["inconclusive"]
    assert rows[0] == ("| [sinks under block-causal attention](docs/results/block-sinks/report.md) | tiny DLMs, 2 arms × "
                       f"3 seeds × 3,000 steps | block 4 − DLM: no difference detected: inconclusive (MDE {t['mde']:.2g}) "
                       f"| {t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}] |")
    qp, rank = q["quant"]["primary"], q["quant"]["primary"]["rank"]
    assert not qp["decided"] and qp["sized_for"] is None and rank["low"] is None  # 3 seeds: no exact interval
    assert rows[1] == ("| [does a sink make a DLM quantizable?](docs/results/quant/report.md) | tiny DLMs, 3 arms × 3 seeds "
                       "× 6,000 steps, int8-dynamic | DLM + 1 sink (front)'s Δ_quant − DLM's: inconclusive (MDE "
                       f"{qp['mde']:.3g} nats; the study was not sized for an effect) | {rank['estimate']:+.4f} nats, "
                       "Hodges-Lehmann |")
    sec = {e["metric"]: e for e in q["quant"]["secondary"] if e["pair"] == ["gated", "vanilla"]}
    d, n = sec["delta:int8-dynamic"], sec["ffn_inf_norm_max"]
    assert f"DLM + GA − DLM: Δ_quant: {d['verdict']}; largest FFN ∞-norm: {n['verdict']} |" in rows[2]
    assert rows[2].endswith(f"| {d['adjusted']['mean']:+.4f} [{d['adjusted']['low']:+.4f}, {d['adjusted']['high']:+.4f}] "
                            f"nats; ∞-norm {n['adjusted']['mean']:+.1f} [{n['adjusted']['low']:+.1f}, "
                            f"{n['adjusted']['high']:+.1f}] (at the adjusted level 99 %) |")
    assert "inconclusive" in d["verdict"] and "higher" not in rows[2] and "lower" not in rows[2]
    answers = tool.generated_block("findings/answers", tmp_path).split("\n\n")
    assert len(answers) == 2 and all(len(a) <= 400 for a in answers)  # the front page's paragraph limit
    assert answers[0] == ("**Do sinks move differently as the block shrinks?** The moving-sink rate, block 4 − DLM: no "
                          f"difference detected: inconclusive (MDE {t['mde']:.2g}), {t['mean']:+.3f} [{t['low']:+.3f}, "
                          f"{t['high']:+.3f}] ([report](docs/results/block-sinks/report.md)). ![Moving-sink rate "
                          "against block size, per arm, 95 % CI]"
                          "(docs/results/block-sinks/figures/block_sizes.png)")
    assert answers[1].startswith("**Does a sink make a DLM quantizable (int8-dynamic, W8A8)?** DLM + 1 sink (front)'s "
                                 f"Δ_quant − DLM's: inconclusive (MDE {qp['mde']:.3g} nats;")
    assert answers[1].endswith("(docs/results/quant/figures/quant.png)\n")


def test_block_sinks_findings_say_a_direction_only_by_the_rules(tmp_path):
    """The block-sinks rows on changed numbers: a primary whose test rejects says the direction; one that rejects
    with a zero variance is inconclusive; a secondary (+ 1 sink − vanilla at a block size) says a direction only
    where it survives the BH family, else "no difference detected"."""
    import copy

    b = _pilot_as_study(tmp_path, "block-sinks-pilot", "block-sinks", "block_sizes.png")
    b["variants"]["block4-sink1"] = {**copy.deepcopy(b["variants"]["block4"]), "label": "block 4 + 1 sink",
                                     "switches": {**b["variants"]["block4"]["switches"], "num_sink_tokens": 1}}
    entry = lambda metric, mean, survives: {"pair": ["block4-sink1", "block4"], "metric": metric, "mean": mean,  # noqa: E731
                                            "low": mean - 0.01, "high": mean + 0.01, "n": 3, "p_adjusted": 0.012,
                                            "survives": survives, "degenerate": False}
    b["comparisons"] += [entry("content_sink_set_change_rate", -0.05, True), entry("val_loss", 0.02, False)]
    b["primary"].update(rejects=True, inconclusive=False, t={**b["primary"]["t"], "mean": -0.2, "low": -0.3,
                                                             "high": -0.1, "p": 0.004})
    _write(tmp_path, "block-sinks", b)
    rows = [ln for ln in tool.generated_block("findings", tmp_path).splitlines() if ln.startswith("| [")]
    assert "| block 4 − DLM: lower with block 4 in the moving-sink rate (p = 0.004) | -0.200 [-0.300, -0.100] |" in rows[0]
    assert ("+ 1 sink − vanilla, moving-sink rate: blocks of 4: lower (BH-adjusted p = 0.012) | blocks of 4: "
            "-0.050 [-0.060, -0.040] |") in rows[1]
    assert "+ 1 sink − vanilla, val_loss: blocks of 4: no difference detected | blocks of 4: +0.020 [+0.010, +0.030] nats |" in rows[2]
    answer = tool.generated_block("findings/answers", tmp_path)  # names the rate once, then the direction
    assert answer.startswith("**Do sinks move differently as the block shrinks?** The moving-sink rate, block 4 − DLM: "
                             "lower with block 4 (p = 0.004), -0.200 [-0.300, -0.100] (")
    b["primary"]["t"]["degenerate"] = True
    _write(tmp_path, "block-sinks", b)
    row = tool.generated_block("findings", tmp_path).splitlines()[2]
    assert "inconclusive (no variance" in row and "lower with" not in row


def test_a_study_with_runs_missing_shows_nothing(tmp_path):
    """A results.json written while runs are missing (one shard's merge, an interim report) is no finding: no row
    and no answer, for block-sinks (a declared run absent) and quant (its endpoint not complete)."""
    b = _pilot_as_study(tmp_path, "block-sinks-pilot", "block-sinks", "block_sizes.png")
    q = _pilot_as_study(tmp_path, "quant-pilot", "quant", "quant.png")
    del b["variants"]["block4"]["seeds"]["402"]
    q["quant"]["complete"] = False
    _write(tmp_path, "block-sinks", b)
    _write(tmp_path, "quant", q)
    assert tool.generated_block("findings", tmp_path) is None
    assert tool.generated_block("findings/answers", tmp_path) is None
    b["preset"] = "no-such-preset"  # nothing to check it against: not final either
    _write(tmp_path, "block-sinks", b)
    assert tool.generated_block("findings", tmp_path) is None
