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


@torch.no_grad()
def test_cache_records_the_full_key_sequence_and_replaces_the_run_columns():
    model = make()
    ids, attn = batch()
    full = model(ids, attention_mask=attn, cache=(rec := KVCache(record=True)))
    cfg = model.config
    assert len(rec.layers) == cfg.num_hidden_layers and rec.length == 10
    assert rec.layers[0][0].shape == (2, cfg.num_key_value_heads, 10, cfg.head_dim)
    # A dual pass over columns 4..7 that also records: the keys it stores are the full pass's.
    dual = KVCache(rec.layers, start=4, record=True)
    out = model(ids[:, 4:7], attention_mask=attn, cache=dual)
    torch.testing.assert_close(out.logits, full.logits[:, 4:7])
    for (k, v), (k0, v0) in zip(dual.layers, rec.layers):
        torch.testing.assert_close(k, k0)
        torch.testing.assert_close(v, v0)
    # A prefix cache: crop keeps the first columns; the pass runs everything from `start`.
    rec.crop(4)
    assert rec.length == 4
    rec.start = 4
    torch.testing.assert_close(model(ids[:, 4:], attention_mask=attn, cache=rec).logits, full.logits[:, 4:])
    # A cache that neither holds nor records anything is the plain pass.
    assert torch.equal(model(ids, attention_mask=attn, cache=KVCache()).logits, full.logits)


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
        assert torch.equal(a, kept.attentions[i]) and torch.equal(v, kept.values[i])
        if switch:
            assert torch.equal(c, kept.virtual_sink_attentions[i])
        else:
            assert c is None and kept.virtual_sink_attentions is None
    assert torch.equal(hooked.logits, kept.logits)
    # values alone need no maps: the fast backend runs, the logits are the plain pass's
    plain = model(ids, attention_mask=attn)
    assert torch.equal(model(ids, attention_mask=attn, probe=Probe(values=True)).logits, plain.logits)


@torch.no_grad()
def test_probe_backend_is_the_backend_of_a_pass_without_maps():
    model = make()
    ids, attn = batch()
    via_probe = model(ids, attention_mask=attn, probe=Probe(backend="eager")).logits
    model.attn_implementation = "eager"
    assert torch.equal(via_probe, model(ids, attention_mask=attn).logits)


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
    assert torch.equal(model(ids).logits, fresh)


@torch.no_grad()
def test_bad_cache_and_probe_use_is_refused_before_any_work():
    model = make()
    ids, attn = batch()
    rec = KVCache(record=True)
    model(ids, cache=rec)
    with pytest.raises(ValueError, match="start=11 must lie in"):
        model(ids[:, :2], cache=KVCache(rec.layers, start=11))
    with pytest.raises(ValueError, match="1 layers, the model 2"):
        model(ids[:, :2], cache=KVCache(rec.layers[:1]))
    with pytest.raises(ValueError, match="needs cached keys"):
        model(ids, cache=KVCache(start=3))
    for probe in (Probe(attentions=True), Probe(hook=lambda *a: None), Probe(key_masks=[None, None])):
        with pytest.raises(ValueError, match="KV cache cannot be combined"):
            model(ids[:, :2], cache=KVCache(rec.layers), probe=probe)
    with pytest.raises(ValueError, match="KV cache cannot be combined"):
        model(ids[:, :2], cache=KVCache(rec.layers), causal=True)
    with pytest.raises(ValueError, match=r"\[B, L\] or \[B, 1, L, L\]"):
        model(ids, attention_mask=attn[:, None])
    with pytest.raises(TypeError):  # the old keywords are gone: a probe / a cache replaces them
        model(ids, output_attentions=True)
