"""Outliers per layer (analysis/outliers.py) on a model built here with one planted outlier channel.

Channel 5 of every token embedding and of the sink's is set to 40 (the others ~0.02): the residual stream
carries it through every layer, on the sink and on the content positions, and the measurement must name
channel 5 there (and nowhere in the FFN and attention outputs, which the norm in front of them flattens) and
give the residual ∞-norm exactly (the maximum of the block's own output over the real positions, read here by a
hook of the test's). The FFN's tensor must be its output (recomputed here as down(silu(gate x) ⊙ up x) from its
input), and the kurtosis scipy's Pearson kurtosis averaged over positions.
"""

from __future__ import annotations

import pytest
import scipy.stats
import torch
import torch.nn.functional as F

from helpers import tiny_model
from numerics import assert_fp_close
from sinkdlm.analysis.outliers import measure_outliers, prompt_batches

CHANNEL, LAYER, PLANTED = 5, 1, 40.0


def _planted():
    model = tiny_model(num_sink_tokens=1, initializer_range=0.02, hidden_size=64, intermediate_size=128,
                       tie_word_embeddings=False)
    with torch.no_grad():
        model.embed_tokens.weight[:, CHANNEL] = PLANTED
        model.sink_embeddings[:, CHANNEL] = PLANTED
    return model


def _prompts():
    return [[3, 4, 5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17]]  # lengths differ: left padding


def _captured(model, module, run):
    """(input, output) of every call of `module` during `run()` (a block's output: its hidden states)."""
    seen = []
    handle = module.register_forward_hook(
        lambda m, args, out: seen.append((args[0].detach(), (out[0] if isinstance(out, tuple) else out).detach())))
    try:
        run()
    finally:
        handle.remove()
    return seen


def _real(x, mask):
    """`x [B, L, d]` at the real positions `[N, d]` (mask None: every position)."""
    return x.flatten(0, 1) if mask is None else x[mask]


def test_the_planted_channel_and_its_inf_norm():
    model = _planted()
    batches = prompt_batches(_prompts(), 2, model.config.mask_token_id, "cpu")
    result = measure_outliers(model, batches)
    residual, per_layer = result["per_layer"]["residual"], result["per_layer"]
    for group in ("sink", "content"):
        assert residual[group]["outlier_channels"] == [[CHANNEL], [CHANNEL]]
        for kind in ("attention", "ffn"):
            assert per_layer[kind][group]["outlier_channels"] == [[], []]
    assert result["positions"] == {"sink": 1, "content": sum(map(len, _prompts()))}

    block, mlp = model.layers[LAYER], model.layers[LAYER].mlp
    with torch.no_grad(), model.sink_cache_mode(True):
        model.sink_cache()
        outputs = [(_real(_captured(model, block, lambda i=ids, m=m: model(i, attention_mask=m))[0][1], m),
                    [(_real(x, m), _real(y, m)) for x, y in _captured(model, mlp, lambda i=ids, m=m: model(i, attention_mask=m))])
                   for ids, m in batches]
        sink = _captured(model, block, model.sink_stream)[0][1]  # [1, n, d]
    # the same tensors, reduced here: exactly
    assert residual["content"]["inf_norm"][LAYER] == max(float(h.abs().max()) for h, _ in outputs)
    assert residual["sink"]["inf_norm"][LAYER] == float(sink.abs().max())
    assert residual["sink"]["inf_norm"][LAYER] > PLANTED / 2  # the planted channel, carried by the residual
    content = [xy for _, pairs in outputs for xy in pairs]
    # the tensor is the FFN's output: SwiGLU recomputed from its input
    x, y = content[0]
    eager = F.linear(F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight), mlp.down_proj.weight)
    assert_fp_close(y, eager, n=model.config.intermediate_size, depth=2)
    # the kurtosis: scipy's Pearson kurtosis of each position over its channels, averaged
    rows = torch.cat([y for _, y in content]).numpy()
    assert per_layer["ffn"]["content"]["kurtosis"][LAYER] == pytest.approx(
        float(scipy.stats.kurtosis(rows, axis=-1, fisher=False).mean()), rel=1e-12)


def test_no_sink_group_without_sink_tokens_and_no_outlier_unplanted():
    model = tiny_model(num_sink_tokens=0, initializer_range=0.02, hidden_size=64, intermediate_size=128)
    result = measure_outliers(model, prompt_batches(_prompts(), 3, model.config.mask_token_id, "cpu"))
    for kind in ("residual", "attention", "ffn"):
        assert result["per_layer"][kind]["sink"] is None
    assert result["per_layer"]["ffn"]["content"]["outlier_channels"] == [[], []]
    assert result["positions"]["sink"] == 0


def test_analyze_writes_them_and_compare_sets_them_side_by_side(tmp_path, monkeypatch):
    import json
    import shutil
    from pathlib import Path

    import sinkdlm.analysis.figures as figures

    from helpers import word_tokenizer
    from sinkdlm.analysis import analyze, compare
    from sinkdlm.analysis.outliers_report import plot_outliers
    from sinkdlm.config import AnalyzeConfig, SampleConfig

    model = tiny_model(vocab_size=47, mask_token_id=46, num_sink_tokens=1, initializer_range=0.02, hidden_size=64,
                       intermediate_size=128, tie_word_embeddings=False).float()
    with torch.no_grad():
        model.embed_tokens.weight[:, CHANNEL] = PLANTED
    real_save = figures.save_figure  # every figure is built, none rasterised (seconds each); the last one is
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: Path(path).write_bytes(b"") or Path(path))
    analyze(model, word_tokenizer(), ["w1 w2 w3 w4", "w5 w6 w7"],
            AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), out=tmp_path / "a", label="sink", quiet=True))
    written = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert written["outliers"]["per_layer"]["residual"]["content"]["outlier_channels"] == [[CHANNEL], [CHANNEL]]
    assert written["figures"]["outliers"] == "outliers.png" and (tmp_path / "a" / "outliers.png").is_file()
    assert "Activation outliers" in (tmp_path / "a" / "report.md").read_text()
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # a second run to set beside it (labels: the folder names)
    result = compare([tmp_path / "a", tmp_path / "b"], tmp_path / "c")
    assert result["figures"]["outliers"] == "outliers.png" and (tmp_path / "c" / "outliers.png").is_file()
    report = (tmp_path / "c" / "report.md").read_text()
    assert "max ‖FFN output‖∞ over layers, content" in report and "**b**" in report
    from sinkdlm.model.quantize import quantize_model, torchao_version

    if torchao_version() is not None:  # a quantized model's analysis says so (and still measures its outliers)
        quantized = tiny_model(vocab_size=47, mask_token_id=46, num_sink_tokens=1, hidden_size=64,
                               intermediate_size=128).float()
        analyze(quantize_model(quantized, "int8-weight"), word_tokenizer(), ["w1 w2 w3"],
                AnalyzeConfig(sample=SampleConfig(gen_length=2, steps=2), out=tmp_path / "q", quiet=True))
        assert json.loads((tmp_path / "q" / "analysis.json").read_text())["model"]["quantization"] == "int8-weight"
        assert "`--quantize int8-weight`" in (tmp_path / "q" / "report.md").read_text()
    # a model without sink tokens draws its content lines only
    monkeypatch.setattr(figures, "save_figure", real_save)
    vanilla = measure_outliers(tiny_model(), prompt_batches(_prompts(), 3, 0, "cpu"))
    assert plot_outliers({"vanilla": vanilla, "sink": written["outliers"]}, tmp_path / "o.png").is_file()
