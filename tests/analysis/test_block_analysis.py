"""`analyze` on a block model (docs/method.md §15): one block over the whole canvas is the whole-sequence model's
analysis, number for number; in smaller blocks it decodes the tokens `generate` decodes and says what it is."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from helpers import tiny_model, word_tokenizer
from sinkdlm import DiffusionLM, generate
import sinkdlm.analysis.figures as figures
from sinkdlm.analysis import analyze
from sinkdlm.config import AnalyzeConfig, SampleConfig

KEYS = ("non_sink_fraction", "non_sink_fraction_per_layer", "sinks_per_head", "sink_attention_mass", "moving")


def _leaves(d, prefix=""):
    """(path, value) of every leaf of nested dicts/lists."""
    if isinstance(d, dict):
        return [x for k, v in d.items() for x in _leaves(v, f"{prefix}/{k}")]
    if isinstance(d, list):
        return [x for i, v in enumerate(d) for x in _leaves(v, f"{prefix}/{i}")]
    return [(prefix, d)]


def _twin(model: DiffusionLM, **kw) -> DiffusionLM:
    other = DiffusionLM(model.config.replace(**kw)).double().eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("n", [pytest.param(0, marks=pytest.mark.slow), 1])  # no sink (0): make test-slow
def test_one_block_over_the_canvas_is_the_whole_sequence_analysis(tmp_path, n, monkeypatch):
    # the figures are built but not rendered to PNG (most of the time here; rendering: test_analysis_figures.py)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: Path(path).write_bytes(b"") or Path(path))
    model = tiny_model(vocab_size=47, mask_token_id=46, num_sink_tokens=n, block_size=8)
    whole = _twin(model, block_size=None)
    config = AnalyzeConfig(sample=SampleConfig(gen_length=5, steps=5), epsilon=0.5, quiet=True)
    prompt = ["w1 w2 w3"]  # 3 tokens + 5 generated: one block of 8
    got = analyze(model, word_tokenizer(), prompt, dataclasses.replace(config, out=tmp_path / "block"))
    ref = analyze(whole, word_tokenizer(), prompt, dataclasses.replace(config, out=tmp_path / "whole"))
    assert got["samples"] == ref["samples"]
    for key in KEYS:
        g, r = dict(_leaves(got[key])), dict(_leaves(ref[key]))
        assert set(r) <= set(g), key  # the block model's has its within/across split besides
        for path, b in r.items():
            assert g[path] == (pytest.approx(b, rel=1e-9, abs=1e-12) if isinstance(b, float) else b), path
    moving = got["moving"]  # one block: every pair of steps is within it
    assert moving["content_sink_set_change_rate_within_block"] == moving["content_sink_set_change_rate"]
    assert moving["mean"]["content_sink_set_change_rate_across_blocks"] is None
    assert got["model"]["block_size"] == 8 and got["model"]["kind"].startswith("block diffusion")
    assert ref["model"]["block_size"] is None


def test_a_block_model_is_analysed_on_the_tokens_it_decodes(tmp_path, monkeypatch):
    # the figures are built but not rendered to PNG (most of the time here; rendering: test_analysis_figures.py)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: Path(path).write_bytes(b"") or Path(path))
    model = tiny_model(vocab_size=47, mask_token_id=46, num_sink_tokens=1, block_size=2)
    tok = word_tokenizer()
    got = analyze(model, tok, ["w1 w2 w3", "w4 w5"], AnalyzeConfig(sample=SampleConfig(gen_length=6, steps=6),
                                                                    out=tmp_path, quiet=True))
    ids = [tok.encode("w1 w2 w3"), tok.encode("w4 w5")]
    out = generate(model, ids, max_new_tokens=6, steps=6, return_dict=True)
    assert got["samples"] == [tok.decode(r, skip_special_tokens=True) for r in out.sequences[:, out.prompt_length:].tolist()]
    assert got["setup"]["block_length"] == 2 and got["setup"]["steps_taken"] >= 6
    assert got["ablation"] is None  # its sink-masking ablation: test_block_ablation.py


def test_the_recorder_splits_a_block_models_moving_sinks_within_and_across_blocks():
    """Maps written here: in every head one content key takes all the attention, the key of the block being
    denoised (the first still-masked column's block). Its sink set then changes at each block boundary and never
    within a block: across-block rate 1, within-block rate 0, and the pairs add up to the whole-decoding rate."""
    import torch

    from sinkdlm import ModelConfig
    from sinkdlm.analysis.recorder import SinkRecorder

    cfg = ModelConfig(vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      intermediate_size=16, max_position_embeddings=32, block_size=2, mask_token_id=15)
    rec = SinkRecorder(cfg, AnalyzeConfig(epsilon=0.5), decode=str)
    width, mask = 6, cfg.mask_token_id
    x = torch.tensor([[1, 2, mask, mask, mask, mask]])  # the prompt's block, then two blocks of two steps each
    for step in range(4):
        block = 1 + step // 2
        attn = torch.zeros(1, 2, width, width)
        attn[..., 2 * block] = 1.0  # every query on the block's first column
        hook = rec.step_hook(step, x.clone(), torch.ones(1, width, dtype=torch.bool))
        for layer in range(2):
            hook(layer, attn, torch.randn(1, 1, width, 4))
        x[0, 2 * block + step % 2] = 3  # this step commits one token
    moving = rec.summary()["moving"]
    assert moving["content_sink_set_change_rate_across_blocks"] == [1.0, 1.0]
    assert moving["content_sink_set_change_rate_within_block"] == [0.0, 0.0]
    assert moving["content_sink_set_change_rate"] == [pytest.approx(1 / 3)] * 2  # 3 pairs of steps, 1 across


@pytest.mark.slow  # ~14 s: three analyses; make test-slow
def test_compare_puts_an_ar_a_block_and_a_whole_sequence_model_side_by_side(tmp_path):
    """The three kinds of one set of weights, analysed on one prompt, in one comparison: each named by its kind."""
    from sinkdlm.analysis.comparison import compare

    block = tiny_model(vocab_size=47, mask_token_id=46, block_size=2)
    kinds = {"block": block, "whole": _twin(block, block_size=None),
             "ar": _twin(block, block_size=None, causal=True, shift_logits=True, mask_token_id=None)}
    config = AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), quiet=True)
    dirs = {}
    for name, model in kinds.items():
        dirs[name] = tmp_path / name
        analyze(model, word_tokenizer(), ["w1 w2 w3"], dataclasses.replace(config, out=dirs[name], label=name))
    result = compare(dirs, tmp_path / "compare")
    assert result["models"] == ["block", "whole", "ar"] and (tmp_path / "compare" / "report.md").is_file()
    report = (tmp_path / "compare" / "report.md").read_text()
    for kind in ("block diffusion (block-causal, blocks of 2)", "diffusion (bidirectional)", "autoregressive (causal)"):
        assert kind in report, kind


def test_sinkdlm_analyze_runs_end_to_end_on_a_shifted_block_model(tmp_path, monkeypatch):
    """The command line on a tiny Fast-dLLM-v2-like checkpoint (a block model with shifted logits, an extra sink):
    analysis.json has its per-layer sinks from the recorded decoding, the sink-masking ablation's block NELBO at
    K = 0, 1, and the samples the decoding gives without a probe."""
    # the figures are built but not rendered to PNG (most of the time here; rendering: test_analysis_figures.py)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: Path(path).write_bytes(b"") or Path(path))
    import json

    from typer.testing import CliRunner

    import sinkdlm.cli  # noqa: F401  (registers the commands on the app)
    from sinkdlm.cli import app

    model = tiny_model(vocab_size=47, mask_token_id=46, num_sink_tokens=1, block_size=4, shift_logits=True)
    tok = word_tokenizer()
    model.save_pretrained(tmp_path / "m", tokenizer=tok)
    prompts = ["w1 w2 w3 w4 w5", "w6 w7 w8 w9"]  # inside a block, and on a block boundary
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    args = ["--model", tmp_path / "m", "--prompts", tmp_path / "prompts.txt", "--gen-length", 8, "--steps", 8,
            "--ablation-k", 1, "--mc-num", 2, "--batch-size", 2, "--out", tmp_path / "out", "--quiet"]
    result = CliRunner().invoke(app, ["analyze", *map(str, args)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    a = json.loads((tmp_path / "out" / "analysis.json").read_text())
    assert a["model"]["shift_logits"] is True and a["model"]["block_size"] == 4
    layers = model.config.num_hidden_layers
    assert len(a["non_sink_fraction_per_layer"]) == len(a["sinks_per_head"]) == layers
    assert all(0 <= f <= 1 for f in a["non_sink_fraction_per_layer"]) and sum(a["sinks_per_head"]) > 0
    assert len(a["moving"]["content_sink_set_change_rate_within_block"]) == layers
    assert a["moving"]["mean"]["content_sink_set_change_rate_across_blocks"] is not None
    assert a["ablation"]["metric"] == "continuation_block_elbo_per_token" and a["ablation"]["k"] == [0, 1]
    out = generate(model, [tok.encode(p) for p in prompts], max_new_tokens=8, steps=8, return_dict=True)
    rows = out.sequences[:, out.prompt_length:].tolist()
    assert a["samples"] == [tok.decode(r, skip_special_tokens=True) for r in rows]
