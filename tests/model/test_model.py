"""DiffusionLM against a direct implementation of eq. 5-10 written here.

The reference runs the *joined* sequence ([s; X] or [X; s]) through every layer with the eq. 6
mask as an explicit -inf bias, rotary positions 0..S-1 in layout order, and plain softmax
attention — the way the paper's reference code does it. The model's fast path instead runs a
separate sink stream and unmasked content attention; the two must agree (forward and gradients).
"""

from __future__ import annotations

import math

import pytest
import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.model import Probe
from sinkdlm.model.attention import annealed_mask, causal_mask

from numerics import assert_fp_close, assert_model_close

torch.manual_seed(0)


def tiny(**kw) -> ModelConfig:
    base = dict(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=128, qkv_bias=True,
        initializer_range=0.2,  # large weights: attention far from uniform, so errors would show
    )
    return ModelConfig(**{**base, **kw})


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):  # x [B, H, S, hd]; pos [S]
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos.double()[:, None] * inv[None]  # [S, hd/2]
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def eq6_bias(seq_len, n, position):
    """M[i, j] = -inf if i is a sink and j != i, else 0 (eq. 6), layout order."""
    s = seq_len + n
    sinks = list(range(n)) if position == "front" else list(range(seq_len, s))
    bias = torch.zeros(s, s)
    for i in sinks:
        bias[i] = float("-inf")
        bias[i, i] = 0.0
    return bias, sinks


def reference_forward(model: DiffusionLM, ids, causal=False, return_all=False, content_mask=None):
    """Straightforward joined-sequence forward (eq. 5-10). Returns content logits [B, L, V].

    content_mask: `[L, L]` bool, True = content query i may attend to content key j (the sinks stay
    visible to every content query)."""
    cfg = model.config
    b, l = ids.shape
    n, hd = cfg.num_sink_tokens, cfg.head_dim
    x = model.embed_tokens.weight[ids]  # [B, L, d]
    if n:
        s = model.sink_embeddings[None].expand(b, -1, -1)
        x = torch.cat([s, x], 1) if cfg.sink_position == "front" else torch.cat([x, s], 1)  # eq. 5 / 7
    bias, sinks = eq6_bias(l, n, cfg.sink_position)
    if causal:
        bias = bias + torch.full((l + n, l + n), float("-inf")).triu(1)
    if content_mask is not None:
        content = torch.tensor([i for i in range(l + n) if i not in sinks])
        blocked = torch.zeros(l + n, l + n, dtype=torch.bool)
        blocked[content[:, None], content[None, :]] = ~content_mask
        bias = bias.masked_fill(blocked, float("-inf"))
    pos = torch.arange(l + n)
    probs_all = []
    for layer in model.layers:
        a = layer.self_attn
        hin = rms(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
        q = a.q_proj(hin).view(b, -1, cfg.num_attention_heads, hd).transpose(1, 2)
        k = a.k_proj(hin).view(b, -1, cfg.num_key_value_heads, hd).transpose(1, 2)
        v = a.v_proj(hin).view(b, -1, cfg.num_key_value_heads, hd).transpose(1, 2)
        if cfg.sink_zero_value and n:
            v = v.clone()
            v[:, :, sinks] = 0.0  # Table 5
        q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)
        probs_all.append(p)
        y = (p @ v).transpose(1, 2).reshape(b, l + n, -1)
        if cfg.gated_attention:  # eq. 9
            y = y * torch.sigmoid(hin @ a.g_proj.weight.T)
        x = x + y @ a.o_proj.weight.T  # eq. 10
        m = layer.mlp
        h2 = rms(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
        x = x + m.down_proj(torch.nn.functional.silu(m.gate_proj(h2)) * m.up_proj(h2))
    content = x[:, n:] if cfg.sink_position == "front" else x[:, :l]
    logits = rms(content, model.norm.weight, cfg.rms_norm_eps) @ model.lm_head.weight.T
    return (logits, x, probs_all) if return_all else logits


VARIANTS = [
    dict(),
    dict(num_sink_tokens=1),
    dict(num_sink_tokens=1, sink_position="end"),
    dict(num_sink_tokens=2),
    dict(num_sink_tokens=4, sink_position="end"),
    dict(num_sink_tokens=1, sink_zero_value=True),
    dict(num_sink_tokens=2, sink_position="end", sink_zero_value=True),
    dict(gated_attention=True),
    dict(num_sink_tokens=1, gated_attention=True),
    dict(num_sink_tokens=1, tie_word_embeddings=False, qkv_bias=False, num_key_value_heads=4),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "vanilla")
def test_fast_path_matches_reference_forward_and_grad(variant):
    model = DiffusionLM(tiny(**variant)).train()  # train(): no sink cache, full autograd path
    ids = torch.randint(0, 97, (3, 11))
    out = model(ids).logits
    ref = reference_forward(model, ids)
    assert_model_close(out, ref, model.config)

    w = torch.randn_like(out)
    g_fast = torch.autograd.grad((out * w).sum(), list(model.parameters()), allow_unused=True)
    g_ref = torch.autograd.grad((ref * w).sum(), list(model.parameters()), allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), g_fast, g_ref):
        assert (a is None) == (b is None), name
        if a is not None:
            # forward and backward chained (2x the depth); a weight's gradient sums over the 3 x 11 tokens too
            assert_fp_close(a, b, n=max(48, 3 * 11), depth=2 * (model.config.num_hidden_layers + 1),
                            msg=f"gradient of {name}")


@pytest.mark.parametrize("variant", VARIANTS[:5] + VARIANTS[7:9])
def test_eager_probabilities_match_reference(variant):
    model = DiffusionLM(tiny(**variant)).eval()
    ids = torch.randint(0, 97, (2, 9))
    out = model(ids, probe=Probe(attentions=True, values=True))
    ref_logits, _, ref_probs = reference_forward(model, ids, return_all=True)
    assert_model_close(out.logits, ref_logits, model.config)
    assert len(out.attentions) == model.config.num_hidden_layers
    for got, want in zip(out.attentions, ref_probs):
        assert_model_close(got, want, model.config)
    s = 9 + model.config.num_sink_tokens
    assert out.values[0].shape == (2, model.config.num_key_value_heads, s, model.config.head_dim)


def test_no_sinks_is_plain_bidirectional_model():
    """num_sink_tokens=0: every query attends to every key, positions 0..L-1."""
    model = DiffusionLM(tiny()).eval()
    ids = torch.randint(0, 97, (2, 10))
    probs = model(ids, probe=Probe(attentions=True)).attentions[0]
    assert probs.shape == (2, 4, 10, 10)
    assert (probs > 0).all()  # nothing masked
    assert_model_close(model(ids).logits, reference_forward(model, ids), model.config)


def test_causal_mode_matches_reference():
    model = DiffusionLM(tiny(num_sink_tokens=1)).eval()
    ids = torch.randint(0, 97, (2, 8))
    assert_model_close(model(ids, causal=True).logits, reference_forward(model, ids, causal=True), model.config)


@pytest.mark.parametrize("position", ["front", "end"])
def test_4d_attention_mask_is_a_content_mask(position):
    """Attention annealing passes `[1, 1, L, L]` as attention_mask: a content-to-content mask, sinks visible."""
    model = DiffusionLM(tiny(num_sink_tokens=2, sink_position=position)).eval()
    ids = torch.randint(0, 97, (2, 8))
    mask = annealed_mask(8, 0.4)
    ref = reference_forward(model, ids, content_mask=mask[0, 0])
    assert_model_close(model(ids, attention_mask=mask).logits, ref, model.config)
    # causal=True builds this very causal_mask: the same kernels on the same shapes
    assert torch.equal(model(ids, attention_mask=causal_mask(8)).logits, model(ids, causal=True).logits)


@pytest.mark.parametrize("position", ["front", "end"])
def test_sink_hidden_states_do_not_depend_on_content(position):
    model = DiffusionLM(tiny(num_sink_tokens=2, sink_position=position)).eval()
    a = torch.randint(0, 97, (1, 7))
    b = torch.randint(0, 97, (1, 7))
    _, xa, _ = reference_forward(model, a, return_all=True)
    _, xb, _ = reference_forward(model, b, return_all=True)
    sinks = [0, 1] if position == "front" else [7, 8]
    assert_model_close(xa[:, sinks], xb[:, sinks], model.config)  # rows of 7-token batches: same shapes, yet ≠ rows
    assert not torch.allclose(xa, xb)
    # and the model's own values at the sink positions agree too
    va = model(a, probe=Probe(values=True)).values
    vb = model(b, probe=Probe(values=True)).values
    for la, lb in zip(va, vb):
        assert_model_close(la[:, :, sinks], lb[:, :, sinks], model.config)


def test_zero_value_sink_values_are_zero():
    model = DiffusionLM(tiny(num_sink_tokens=1, sink_zero_value=True)).eval()
    values = model(torch.randint(0, 97, (1, 5)), probe=Probe(values=True)).values
    for v in values:
        assert torch.count_nonzero(v[:, :, 0]) == 0
        assert torch.count_nonzero(v[:, :, 1:]) > 0


def test_sink_cache_equals_recomputing_and_invalidates():
    model = DiffusionLM(tiny(num_sink_tokens=2)).eval()
    ids = torch.randint(0, 97, (2, 6))
    with torch.no_grad():
        cached = model(ids).logits  # eval(): the sink cache
        with model.sink_cache_mode(False):
            fresh = model(ids).logits
    assert torch.equal(cached, fresh)  # both modes compute the sinks by sink_stream(): the same kernels
    first = model.sink_cache()
    assert model.sink_cache() is first  # reused
    with torch.no_grad():
        model.sink_embeddings.add_(0.5)  # an optimiser step would do the same
    assert model.sink_cache() is not first
    with torch.no_grad():
        with model.sink_cache_mode(False):
            fresh = model(ids).logits
        assert torch.equal(model(ids).logits, fresh)  # as above: sink_stream() either way


@pytest.mark.parametrize("variant", [dict(), dict(num_sink_tokens=1), dict(num_sink_tokens=2, sink_position="end")])
def test_left_padded_rows_equal_single_rows(variant):
    model = DiffusionLM(tiny(**variant)).eval()
    long = torch.randint(0, 97, (1, 9))
    short = torch.randint(0, 97, (1, 5))
    pad = 0
    batch = torch.cat([long, torch.cat([torch.full((1, 4), pad), short], 1)])
    mask = torch.ones_like(batch, dtype=torch.bool)
    mask[1, :4] = False
    with torch.no_grad():
        out = model(batch, attention_mask=mask).logits
        assert_model_close(out[0], model(long).logits[0], model.config)  # batch of 2 vs 1: other shapes
        assert_model_close(out[1, 4:], model(short).logits[0], model.config)


def test_key_masks_send_attention_to_zero():
    model = DiffusionLM(tiny(num_sink_tokens=1)).eval()
    ids = torch.randint(0, 97, (1, 6))
    km = torch.ones(1, 4, 7, dtype=torch.bool)
    km[:, 1, 3] = False  # block key 3 for head 1
    out = model(ids, probe=Probe(attentions=True, key_masks=[km, None]))
    assert (out.attentions[0][:, 1, 1:, 3] == 0).all()
    assert (out.attentions[0][:, 0, 1:, 3] > 0).all()
    assert (out.attentions[1][:, 1, 1:, 3] > 0).all()


def test_num_sink_tokens_changes_only_the_sink_parameter():
    plain = DiffusionLM(tiny())
    sink = DiffusionLM(tiny(num_sink_tokens=1))
    extra = set(sink.state_dict()) - set(plain.state_dict())
    assert extra == {"sink_embeddings"}
    assert sink.state_dict()["sink_embeddings"].shape == (1, 32)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("num_attention_heads", 5, "num_attention_heads"),
        ("num_key_value_heads", 3, "num_key_value_heads"),
        ("num_sink_tokens", -1, "num_sink_tokens"),
        ("sink_position", "middle", "sink_position"),
        ("hidden_size", 0, "hidden_size"),
        ("mask_token_id", 97, "mask_token_id"),
    ],
)
def test_config_validation_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        tiny(**{field: value})


def test_presets_and_roundtrip():
    for name in ["tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "smdm-85m"]:
        cfg = ModelConfig.from_preset(name)
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelConfig.from_preset("nope")
    qwen = ModelConfig.from_preset("qwen2.5-0.5b")
    assert (qwen.hidden_size, qwen.num_hidden_layers, qwen.num_key_value_heads) == (896, 24, 2)


def test_too_long_input_is_rejected():
    model = DiffusionLM(tiny(max_position_embeddings=8, num_sink_tokens=1))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, 8, dtype=torch.long))
