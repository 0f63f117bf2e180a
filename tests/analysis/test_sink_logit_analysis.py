"""The analysis of a model with a virtual sink column (sink_logit / softmax_one).

The recorder's per-layer attention mass on the column and its non-sink fraction "with the column
as one more key" are checked against the full maps and columns of every step, stored by a plain
callback and reduced here with the eq. 3 rule written out (Rulli et al. eq. 3, sum scale).
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import tiny_model

from sinkdlm import generate
from sinkdlm.diffusion.sampling import StepProbe
from sinkdlm.analysis import SinkRecorder
from sinkdlm.model.sink import sink_indices
from sinkdlm.config import AnalyzeConfig, SampleConfig

EPS = 1.0


def real_positions(mask_row, cfg):
    n = cfg.num_sink_tokens
    offset = n if cfg.sink_position == "front" else 0
    return sorted((mask_row.nonzero().squeeze(-1) + offset).tolist() + sink_indices(len(mask_row), n, cfg.sink_position))


def with_logits(model, std=2.0):
    with torch.no_grad():
        for layer in model.layers:
            if layer.self_attn.sink_logit is not None:
                layer.self_attn.sink_logit.normal_(0.0, std)
    return model


@pytest.mark.parametrize("variant", [dict(sink_logit=True), dict(softmax_one=True, num_sink_tokens=1)],
                         ids=["sink_logit", "softmax_one+sink"])
def test_recorder_reports_the_virtual_sink_per_layer(variant):
    torch.manual_seed(0)
    model = with_logits(tiny_model(**variant))
    cfg = model.config
    rec = SinkRecorder(cfg, AnalyzeConfig(epsilon=EPS))
    stored = []

    def callback(state):
        rec(state)
        stored.append(([a.clone() for a in state.attentions], [c.clone() for c in state.virtual_sink_attentions],
                       state.attention_mask))

    generate(model, [[3, 4, 5, 6, 7, 8], [9, 10]], gen_length=6, steps=4, callback=callback, probe=StepProbe(attentions=True, values=True))
    s = rec.summary()["virtual_sink"]
    assert s["kind"] == ("sink_logit" if cfg.sink_logit else "softmax_one")
    assert s["label"] == ("virtual sink (logit)" if cfg.sink_logit else "softmax₁")

    am = stored[0][2]
    sinks = set(sink_indices(am.shape[1], cfg.num_sink_tokens, cfg.sink_position))
    layers = cfg.num_hidden_layers
    mass, rows = torch.zeros(layers, dtype=torch.float64), torch.zeros(layers, dtype=torch.float64)
    keys, non, is_sink, heads = (torch.zeros(layers, dtype=torch.float64) for _ in range(4))
    for attentions, columns, _ in stored:
        for layer in range(layers):
            for r in range(am.shape[0]):
                pos = real_positions(am[r], cfg)
                a = attentions[layer][r][:, pos][:, :, pos]  # [H, S', S']
                col = columns[layer][r][:, pos]  # [H, S']
                torch.testing.assert_close(a.sum(-1) + col, torch.ones_like(col))  # rows sum to 1 with the column
                content = torch.tensor([p not in sinks for p in pos])
                mass[layer] += col[:, content].sum()
                rows[layer] += a.shape[0] * int(content.sum())
                # eq. 3 over the content queries (the sinks' own rows never count), the column one more key
                c = torch.cat([a[:, content].sum(-2), col[:, content].sum(-1, keepdim=True)], dim=-1)  # [H, S'+1]
                others = (c.sum(-1, keepdim=True) - c) / (c.shape[-1] - 1)
                sink = c > others + EPS
                keys[layer] += a.shape[0] * a.shape[-1]
                non[layer] += float((~sink[:, :-1]).sum())
                is_sink[layer] += float(sink[:, -1].sum())
                heads[layer] += a.shape[0]
    assert s["attention_mass"] == pytest.approx((mass / rows).tolist())
    assert s["non_sink_fraction_with_virtual"] == pytest.approx((non / keys).tolist())
    assert s["is_sink_share"] == pytest.approx((is_sink / heads).tolist())
    assert s["mean_attention_mass"] == pytest.approx(float(mass.sum() / rows.sum()))
    assert 0 < s["mean_attention_mass"] < 1


def test_recorder_refuses_states_without_the_column():
    model = tiny_model(sink_logit=True)
    rec = SinkRecorder(model.config)

    def callback(state):
        state.virtual_sink_attentions = None
        rec(state)

    with pytest.raises(ValueError, match="sink_logit=True.*virtual"):
        generate(model, [1, 2], gen_length=4, steps=2, callback=callback, probe=StepProbe(attentions=True, values=True))


def test_vanilla_model_has_no_virtual_sink_entry():
    model = tiny_model()
    rec = SinkRecorder(model.config, AnalyzeConfig(epsilon=EPS))
    generate(model, [1, 2, 3], gen_length=4, steps=2, callback=rec, probe=StepProbe(attentions=True, values=True))
    assert rec.summary()["virtual_sink"] is None


def test_analyze_writes_the_virtual_sink_and_labels_the_figure(tmp_path):
    """End to end: analysis.json carries `virtual_sink`, the report names it, the figure is drawn."""
    from sinkdlm.analysis import analyze

    class Tok:  # the analysis only encodes prompts and decodes tokens
        mask_token_id = 47

        def __call__(self, text, add_special_tokens=False, **kw):  # one text or a batch, as HF does
            ids = lambda t: [3 + (ord(ch) % 40) for ch in t]  # noqa: E731
            return {"input_ids": ids(text) if isinstance(text, str) else [ids(t) for t in text]}

        def decode(self, ids, **kw):
            return "".join(chr(97 + (i % 26)) for i in ids)

    model = with_logits(tiny_model(sink_logit=True, mask_token_id=47))
    out = tmp_path / "analysis"
    analyze(model, Tok(), ["abcde", "fgh"], AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=2), epsilon=EPS, out=out,
                                                          label="sink logit"))
    data = json.loads((out / "analysis.json").read_text())
    assert data["model"]["sink_logit"] is True and data["model"]["softmax_one"] is False
    assert data["virtual_sink"]["label"] == "virtual sink (logit)"
    assert len(data["virtual_sink"]["attention_mass"]) == model.config.num_hidden_layers
    assert (out / data["figures"]["layer_bars"]).is_file()
    report = "".join(p.read_text() for p in out.glob("*.md"))
    assert "virtual sink (logit)" in report
