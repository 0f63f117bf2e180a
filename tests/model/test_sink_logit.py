"""The per-head sink logit (gpt-oss) and softmax-off-by-one against a direct implementation.

The reference here runs the joined layout sequence ([s; X] or [X; s]) through every layer in
fp64, builds the full score matrix with the eq. 6 rule and the padding as -inf, appends the
virtual column (score b_h for every row), takes the softmax and drops the column before
multiplying by the values. The model's fast path (SDPA with a detached float mask and a hand-made
gradient for b) and its eager path must agree with it, forward and gradients.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.model import Probe
from sinkdlm.model import attention as attnlib
from sinkdlm.model import sink as sinklib

from numerics import assert_fp_close, assert_model_close

V = 61


def tiny(**kw) -> ModelConfig:
    base = dict(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=128, qkv_bias=True, initializer_range=0.2,
    )
    return ModelConfig(**{**base, **kw})


def make(seed=0, logit_std=1.0, **kw) -> DiffusionLM:
    torch.manual_seed(seed)
    model = DiffusionLM(tiny(**kw)).double()
    with torch.no_grad():  # logits of order 1, so the column takes a visible share of each row
        for layer in model.layers:
            if layer.self_attn.sink_logit is not None:
                layer.self_attn.sink_logit.normal_(0.0, logit_std)
    return model


def rms(x, w, eps):
    # normalised in fp32, as Qwen2/LLaMA (and the model) do; everything else stays fp64
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, pos, theta):  # x [B, H, S, hd]; pos [B|1, S]
    hd = x.shape[-1]
    # angles in fp32, as Hugging Face Qwen2/LLaMA compute them (the model follows that)
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = pos.float()[..., None] * inv  # [B, S, hd/2]
    cos, sin = torch.cos(ang).double()[:, None], torch.sin(ang).double()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def reference(model: DiffusionLM, ids, attention_mask=None, column=None):
    """Content logits `[B, L, V]` and per layer the probabilities `[B, H, S, S + 1]` (column last).

    column: per layer the virtual logit `[H]` (default: the model's parameter / 0 for softmax_one).
    """
    cfg = model.config
    b, l = ids.shape
    n, hd, h = cfg.num_sink_tokens, cfg.head_dim, cfg.num_attention_heads
    x = model.embed_tokens.weight[ids]
    if n:
        s = model.sink_embeddings[None].expand(b, -1, -1)
        x = sinklib.join(s, x, cfg.sink_position, dim=1)  # eq. 5 / 7
    pos_c, pos_s = sinklib.positions(b, l, n, cfg.sink_position, attention_mask, ids.device)
    pos = sinklib.join(pos_s.expand(b, -1), pos_c.expand(b, -1), cfg.sink_position, dim=1)  # [B, S]
    sinks = sinklib.sink_indices(l, n, cfg.sink_position)
    bias = torch.zeros(b, 1, l + n, l + n, dtype=torch.float64)
    if attention_mask is not None:  # nobody attends to padding
        keys = sinklib.join(torch.ones(b, n, dtype=torch.bool), attention_mask.bool(), cfg.sink_position, dim=1)
        bias = bias.masked_fill(~keys[:, None, None, :], float("-inf"))
    for i in sinks:  # eq. 6: a sink sees only itself
        bias[:, :, i] = float("-inf")
        bias[:, :, i, i] = 0.0
    probs_all = []
    for li, layer in enumerate(model.layers):
        a = layer.self_attn
        hin = rms(x, layer.input_layernorm.weight, cfg.rms_norm_eps)
        q = a.q_proj(hin).view(b, -1, h, hd).transpose(1, 2)
        k = a.k_proj(hin).view(b, -1, cfg.num_key_value_heads, hd).transpose(1, 2)
        v = a.v_proj(hin).view(b, -1, cfg.num_key_value_heads, hd).transpose(1, 2)
        if cfg.sink_zero_value and n:
            v = v.clone()
            v[:, :, sinks] = 0.0
        q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        rep = h // cfg.num_key_value_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + bias  # [B, H, S, S]
        col = column[li] if column is not None else (a.sink_logit if a.sink_logit is not None else torch.zeros(h, dtype=torch.float64))
        scores = torch.cat([scores, col.view(1, h, 1, 1).expand(b, h, l + n, 1)], dim=-1)  # the virtual column
        p = torch.softmax(scores, dim=-1)
        probs_all.append(p)
        y = (p[..., :-1] @ v).transpose(1, 2).reshape(b, l + n, -1)  # column dropped: zero value
        if cfg.gated_attention:
            y = y * torch.sigmoid(hin @ a.g_proj.weight.T)
        x = x + y @ a.o_proj.weight.T
        m = layer.mlp
        h2 = rms(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
        x = x + m.down_proj(F.silu(m.gate_proj(h2)) * m.up_proj(h2))
    content = sinklib.split(x, n, cfg.sink_position, dim=1)[1]
    logits = rms(content, model.norm.weight, cfg.rms_norm_eps) @ model.lm_head.weight.T
    return logits, probs_all


CASES = [
    dict(sink_logit=True),
    dict(softmax_one=True),
    dict(sink_logit=True, num_key_value_heads=4),  # MHA
    dict(sink_logit=True, num_sink_tokens=1),
    dict(sink_logit=True, num_sink_tokens=2, sink_position="end"),
    dict(softmax_one=True, num_sink_tokens=1, sink_zero_value=True),
    dict(sink_logit=True, gated_attention=True),
    dict(sink_logit=True, num_sink_tokens=1, gated_attention=True, num_key_value_heads=1),
]
case_id = lambda c: ",".join(f"{k}={v}" for k, v in c.items())  # noqa: E731


def inputs(padded: bool):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (3, 10), generator=gen)
    if not padded:
        return ids, None
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[0, :3] = False  # left padding
    mask[2, 7:] = False  # right padding
    return ids, mask


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_and_gradients_match_reference(case, padded, backend):
    model = make(**case).train()  # train(): the sink stream runs with autograd, no cache
    ids, mask = inputs(padded)
    model.attn_implementation = backend
    out = model(ids, attention_mask=mask).logits
    ref, _ = reference(model, ids, mask)
    rows = mask if mask is not None else torch.ones(ids.shape, dtype=torch.bool)
    # fp64 up to the fp32 rotary angles (as HF computes them): the reference rotates a sink's q and
    # k at position p, the model uses that RoPE at one position leaves q.k unchanged (~1e-7 apart).
    assert_model_close(out[rows], ref[rows], model.config, dtype=torch.float32)

    w = torch.randn_like(out) * rows[..., None]  # padded query rows carry no loss
    params = [p for p in model.parameters()]
    g_model = torch.autograd.grad((out * w).sum(), params, allow_unused=True)
    g_ref = torch.autograd.grad((ref * w).sum(), params, allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), g_model, g_ref):
        assert (a is None) == (b is None), name
        if a is not None:
            # the fp32 rotary angles, through forward and backward (2x the depth; a wrong formula is off by O(1))
            assert_fp_close(a, b, n=48, depth=2 * (model.config.num_hidden_layers + 1), dtype=torch.float32,
                            msg=f"gradient of {name}")
    if case.get("sink_logit"):  # the learned logits do get a gradient
        assert model.layers[0].self_attn.sink_logit.grad is None  # autograd.grad, not .backward
        i = [n for n, _ in model.named_parameters()].index("layers.0.self_attn.sink_logit")
        assert g_model[i].abs().max() > 1e-6


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[4], CASES[5]], ids=case_id)
def test_eager_exposes_the_virtual_sink_probability(case):
    model = make(**case).eval()
    ids, mask = inputs(padded=True)
    out = model(ids, attention_mask=mask, probe=Probe(attentions=True))
    _, ref = reference(model, ids, mask)
    assert out.virtual_sink_attentions is not None and len(out.virtual_sink_attentions) == 2
    for got, column, want in zip(out.attentions, out.virtual_sink_attentions, ref):
        assert_model_close(got, want[..., :-1], model.config, dtype=torch.float32)  # fp32 rotary angles, as above
        assert_model_close(column, want[..., -1], model.config, dtype=torch.float32)
        assert_fp_close(got.sum(-1) + column, torch.ones_like(column), n=got.shape[-1] + 1)  # one fp64 sum
        assert column.min() > 0  # every row, sink rows included, gives the column some mass


def test_no_virtual_column_means_no_virtual_output():
    out = make(num_sink_tokens=1).eval()(torch.randint(0, V, (1, 5)), probe=Probe(attentions=True))
    assert out.virtual_sink_attentions is None


def copy_weights(src: DiffusionLM, **switches) -> DiffusionLM:
    dst = DiffusionLM(src.config.replace(**switches)).double()
    state = {k: v for k, v in src.state_dict().items() if not k.endswith("sink_logit")}
    missing, _ = dst.load_state_dict(state, strict=False)
    assert all(k.endswith("sink_logit") for k in missing), missing
    return dst


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("n", [0, 1])
def test_limits_minus_inf_zero_and_plus_large(backend, n):
    model = make(sink_logit=True, num_sink_tokens=n).eval()
    ids, mask = inputs(padded=True)

    def run(m):
        m.attn_implementation = backend
        return m(ids, attention_mask=mask).logits

    rows = mask
    with torch.no_grad():
        # -inf: the column takes nothing -> the vanilla model (same weights)
        for layer in model.layers:
            layer.self_attn.sink_logit.fill_(float("-inf"))
        vanilla = copy_weights(model, sink_logit=False).eval()
        assert_model_close(run(model)[rows], run(vanilla)[rows], model.config)  # fp64, both sides
        # 0: Miller's softmax_1
        for layer in model.layers:
            layer.self_attn.sink_logit.zero_()
        one = copy_weights(model, sink_logit=False, softmax_one=True).eval()
        assert_model_close(run(model)[rows], run(one)[rows], model.config)
        assert not torch.allclose(run(one)[rows], run(vanilla)[rows], atol=1e-4)
        # very large: the column takes everything, attention outputs 0 -> the model without attention
        for layer in model.layers:
            layer.self_attn.sink_logit.fill_(1e4)
        no_attn = copy_weights(model, sink_logit=False).eval()
        for layer in no_attn.layers:
            layer.self_attn.o_proj.weight.zero_()
        assert_model_close(run(model)[rows], run(no_attn)[rows], model.config)


def test_sink_cache_carries_the_sinks_own_column_share():
    model = make(sink_logit=True, num_sink_tokens=2).eval()
    ids = torch.randint(0, V, (2, 7))
    cached = model(ids).logits  # eval(): the sink cache
    with model.sink_cache_mode(False):
        fresh = model(ids).logits
    torch.testing.assert_close(cached, fresh, rtol=0, atol=0)  # both modes compute the sinks by sink_stream()
    with torch.no_grad():
        model.layers[1].self_attn.sink_logit.add_(3.0)  # a parameter change invalidates the cache
    with model.sink_cache_mode(False):
        fresh = model(ids).logits
    torch.testing.assert_close(model(ids).logits, fresh, rtol=0, atol=0)


def test_parameters_initialisation_and_checkpoint_roundtrip(tmp_path):
    model = DiffusionLM(tiny(sink_logit=True, initializer_range=0.02))
    names = [n for n, _ in model.named_parameters() if "sink_logit" in n]
    assert names == [f"layers.{i}.self_attn.sink_logit" for i in range(2)]
    logits = torch.cat([model.layers[i].self_attn.sink_logit for i in range(2)])
    assert logits.shape == (8,) and 0 < logits.std() < 0.1  # N(0, initializer_range), as gpt-oss
    assert not any("sink_logit" in n for n, _ in DiffusionLM(tiny(softmax_one=True)).named_parameters())
    model.save_pretrained(tmp_path / "ckpt")
    loaded = DiffusionLM.from_pretrained(tmp_path / "ckpt")
    assert loaded.config.sink_logit and not loaded.config.softmax_one
    ids = torch.randint(0, V, (1, 6))
    torch.testing.assert_close(loaded.eval()(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)  # a round trip


def test_bad_input_is_refused_with_an_explanation(monkeypatch):
    with pytest.raises(ValueError, match="choose one"):
        tiny(sink_logit=True, softmax_one=True)
    with pytest.raises(ValueError, match="softmax_one must be true or false"):
        tiny(softmax_one=1)
    # a backend without the virtual column (e.g. a plain kernel) is refused before any work
    monkeypatch.setitem(attnlib.BACKENDS, "plain", lambda q, k, v, mask=None, need_probs=False: (None, None))
    model = make(sink_logit=True)
    with pytest.raises(ValueError, match="sink_logit.*plain"):
        model.attn_implementation = "plain"
        model(torch.randint(0, V, (1, 4)))
    vanilla = make()
    vanilla.attn_implementation = "sdpa"
    vanilla(torch.randint(0, V, (1, 4)))  # vanilla: any backend is fine
