"""The GPU-scale presets' cost (experiment/gpu_cost.py): FLOPs per token, GPU-hours, the dry run's line."""

from __future__ import annotations

import json

import pytest

from sinkdlm.config import ExperimentConfig, ModelConfig, TrainConfig
from sinkdlm.experiment.gpu_cost import H100_BF16_PEAK, flops_per_token, measured_mfu, run_gpu_hours
from sinkdlm.experiment.presets import get_preset
from sinkdlm.experiment.runner import describe_experiment


@pytest.mark.parametrize("tied, sinks", [(True, 0), (False, 1)])
def test_flops_per_token_is_6n_plus_attention(tied, sinks):
    """6 N (N: every weight but the input embedding, the tied head counted once more) + 12 L d S, with N counted
    on a real (not meta) model built here."""
    from sinkdlm.model.transformer import DiffusionLM

    cfg = ModelConfig.from_preset("tiny", tie_word_embeddings=tied, num_sink_tokens=sinks)
    model = DiffusionLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    embed = model.embed_tokens.weight.numel()
    n = total - embed + (embed if tied else 0)  # tied: the head's matmul uses the embedding's weights
    seq_len = 128
    assert flops_per_token(cfg, seq_len) == 6 * n + 12 * cfg.num_hidden_layers * cfg.hidden_size * (seq_len + sinks)


def test_gpu_hours_are_tokens_times_flops_over_the_achieved_rate():
    cfg = ModelConfig.from_preset("tiny")
    train = TrainConfig(max_steps=1000, batch_size=8, seq_len=128)
    sft = TrainConfig(max_steps=10, batch_size=4, seq_len=64)
    want = (1000 * 8 * 128 * flops_per_token(cfg, 128) + 10 * 4 * 64 * flops_per_token(cfg, 64)) / (H100_BF16_PEAK * 0.3) / 3600
    assert run_gpu_hours(cfg, train, sft, 0.3) == pytest.approx(want, rel=1e-12)


def test_mfu_comes_from_the_committed_gpu_results_when_there(tmp_path):
    path = tmp_path / "bench_gpu_train.json"
    path.write_text(json.dumps({"train": [{"variant": "vanilla", "mfu": 0.31}, {"variant": "vanilla --compile", "mfu": 0.44}]}))
    mfu, source = measured_mfu(path)
    assert mfu == {"eager": 0.31, "compiled": 0.44} and "measured" in source
    mfu, source = measured_mfu(tmp_path / "absent.json")
    assert mfu == {"eager": 0.27, "compiled": 0.37} and "not reproduced" in source


@pytest.mark.parametrize("preset, tokens", [("paper-0.5b", 60_000 * 512 * 1024),
                                            pytest.param("paper-1.5b", 23_842 * 4096 * 1024, marks=pytest.mark.slow)])
def test_paper_presets_state_their_gpu_hours_and_mde(tmp_path, preset, tokens):
    """The dry run prices each run and the study (3 arms) in GPU-hours and says the paper gives no spread."""
    p = get_preset(preset)
    assert p.train.max_steps * p.train.batch_size * p.train.seq_len == tokens  # 30 B and 100 B (the paper's Table 1)
    text = describe_experiment(ExperimentConfig(preset=preset, out=str(tmp_path / "x"), dry_run=True))
    line = next(x for x in text.splitlines() if x.startswith("GPU cost"))
    model = ModelConfig.from_preset(p.gpu_model)
    mfu, _ = measured_mfu()
    per_run = run_gpu_hours(model, p.train, p.sft, mfu["eager"])
    assert f"{per_run:,.0f} GPU-h per run eager" in line and f"study's 3 runs {3 * per_run:,.0f}" in line
    assert "minimum detectable effect: unknown" in line
    assert not (tmp_path / "x").exists()
