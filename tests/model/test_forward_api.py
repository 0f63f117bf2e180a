"""`DiffusionLM.forward`'s two objects: the Fast-dLLM `KVCache` and the analysis' `Probe`.

References: the model's own full, uncached forward (a cached pass over unchanged tokens must give its
numbers exactly) and its `Probe(attentions=True)` maps, which tests/model/test_model.py and
tests/model/test_sink_logit.py check against eager joined-sequence implementations.
"""

from __future__ import annotations

import pytest
import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.model import KVCache, Probe

from numerics import assert_fp_close, assert_model_close


def make(**kw) -> DiffusionLM:
    torch.manual_seed(0)
    base = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=48, max_position_embeddings=64, initializer_range=0.2, num_sink_tokens=1)
    return DiffusionLM(ModelConfig(**{**base, **kw})).eval()


def batch():
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(1))
    attn = torch.ones(2, 10, dtype=torch.bool)
    attn[0, :3] = False  # a left-padded row
    return ids, attn


@pytest.mark.parametrize("switch", [{}, {"sink_position": "end", "num_sink_tokens": 2}, {"sink_logit": True}])
@torch.no_grad()
def test_a_static_cache_gives_the_plain_forward_and_keeps_its_shapes(switch):
    model = make(**switch)
    ids, attn = batch()
    full = model(ids, attention_mask=attn)
    cfg = model.config
    kv = model.allocate_cache(2, 10, attn)
    shape = (2, cfg.num_key_value_heads, 10 + cfg.num_sink_tokens, cfg.head_dim)
    assert len(kv.keys) == cfg.num_hidden_layers and kv.keys[0].shape == shape
    assert torch.equal(model(ids, cache=kv).logits, full.logits)  # from column 0 over all: the plain pass
    # A dual pass over columns 4..7 (unchanged tokens: the cached keys are the fresh ones) and a prefix
    # pass from column 4; the start as an int (eager) or a tensor (what a compiled step takes).
    for start in (4, torch.tensor(4)):
        kv.start = start
        # other matmul shapes than the full pass (3 or 6 query columns, not 10): its rounding, not its numbers
        assert_model_close(model(ids[:, 4:7], cache=kv).logits, full.logits[:, 4:7], cfg)
        assert_model_close(model(ids[:, 4:], cache=kv).logits, full.logits[:, 4:], cfg)
    assert all(k.shape == shape for k in kv.keys + kv.values)  # written in place: the shapes never change
    # A pass over changed tokens writes its columns and no other: layer 0's keys are a token's own.
    before = [k.clone() for k in kv.keys]
    changed = ids.clone()
    changed[:, 5] = 7
    kv.start = 4
    model(changed[:, 4:7], cache=kv)
    model(changed, cache=(fresh := model.allocate_cache(2, 10, attn)))
    col = kv.offset + torch.arange(10)
    inside, outside = col[4:7], torch.cat([torch.arange(kv.offset + 4), col[7:]])
    # layer 0's keys: RMSNorm and k_proj of the same rows, in a 3-row and a 10-row matmul (other shapes)
    assert_fp_close(kv.keys[0][:, :, inside], fresh.keys[0][:, :, inside], n=cfg.hidden_size, depth=2)
    for k, k0 in zip(kv.keys, before):
        assert torch.equal(k[:, :, outside], k0[:, :, outside])  # untouched memory


@pytest.mark.parametrize("switch", [{}, {"sink_logit": True}])
@torch.no_grad()
def test_probe_hook_sees_what_attentions_return(switch):
    model = make(**switch)
    ids, attn = batch()
    kept = model(ids, attention_mask=attn, probe=Probe(attentions=True, values=True))
    seen = []
    hooked = model(ids, attention_mask=attn, probe=Probe(hook=lambda i, a, v, c: seen.append((i, a, v, c))))
    assert hooked.attentions is None and hooked.values is None  # the hook's maps are not kept
    assert [s[0] for s in seen] == [0, 1]
    for i, a, v, c in seen:
        assert torch.equal(a, kept.attentions[i]) and torch.equal(v, kept.values[i])  # the same pass's tensors
        if switch:
            assert torch.equal(c, kept.virtual_sink_attentions[i])
        else:
            assert c is None and kept.virtual_sink_attentions is None
    assert torch.equal(hooked.logits, kept.logits)  # same eager kernels and shapes; the hook only reads
    # values alone need no maps: the fast backend runs, the logits are the plain pass's
    plain = model(ids, attention_mask=attn)
    assert torch.equal(model(ids, attention_mask=attn, probe=Probe(values=True)).logits, plain.logits)  # same backend


@torch.no_grad()
def test_probe_backend_is_the_backend_of_a_pass_without_maps():
    model = make()
    ids, attn = batch()
    via_probe = model(ids, attention_mask=attn, probe=Probe(backend="eager")).logits
    model.attn_implementation = "eager"
    assert torch.equal(via_probe, model(ids, attention_mask=attn).logits)  # the same eager backend, same shapes


@torch.no_grad()
def test_sink_cache_mode_is_scoped():
    model = make()
    ids, _ = batch()
    assert model.use_sink_cache is None
    with model.sink_cache_mode(False):
        fresh = model(ids).logits
        assert model.use_sink_cache is False
    assert model.use_sink_cache is None
    with pytest.raises(RuntimeError), model.sink_cache_mode(True):
        raise RuntimeError("inside")
    assert model.use_sink_cache is None  # restored after an error too
    assert torch.equal(model(ids).logits, fresh)  # both modes compute the sinks by sink_stream(): same kernels


@torch.no_grad()
def test_bad_cache_and_probe_use_is_refused_before_any_work():
    model = make()
    ids, attn = batch()
    kv = model.allocate_cache(2, 10, attn)
    kv.start = 9
    with pytest.raises(ValueError, match="from KVCache.start=9 does not fit"):
        model(ids[:, :2], cache=kv)
    kv.start = 0
    with pytest.raises(ValueError, match="holds 2 rows, the input 1"):
        model(ids[:1], cache=kv)
    with pytest.raises(ValueError, match="attention_mask must be"):
        model.allocate_cache(2, 11, attn)
    for probe in (Probe(attentions=True), Probe(key_masks=[None, None])):
        with pytest.raises(ValueError, match="KV cache cannot be combined"):
            model(ids[:, :2], cache=kv, probe=probe)
    for kw in (dict(causal=True), dict(attention_mask=attn)):
        with pytest.raises(ValueError, match="KV cache cannot be combined"):
            model(ids, cache=kv, **kw)
    with pytest.raises(ValueError, match=r"\[B, L\] or \[B, 1, L, L\]"):
        model(ids, attention_mask=attn[:, None])
    with pytest.raises(TypeError):  # the old keywords are gone: a probe / a cache replaces them
        model(ids, output_attentions=True)
