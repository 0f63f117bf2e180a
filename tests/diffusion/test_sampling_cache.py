"""Fast-dLLM KV caches (`generate(cache="prefix" | "dual")`) and the head on used positions only.

The reference below recomputes everything at every step, layer by layer, in plain eager code: the
keys/values of the columns outside the active window come from a full forward of the sequence as
it was at the start of the block (what Fast-dLLM caches), those inside it from the current
sequence. float64 models, so batched/padded and single-row runs agree to the last bit that matters.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_model
from sinkdlm import generate
from sinkdlm.diffusion.likelihood import loglikelihood
from sinkdlm.diffusion.remasking import steps_per_block, transfer_schedule
from sinkdlm.diffusion.sampling import StepProbe

VARIANTS = {
    "vanilla": dict(num_sink_tokens=0),
    "sink-front": dict(num_sink_tokens=1),
    "2sinks-end-gated": dict(num_sink_tokens=2, sink_position="end", gated_attention=True),
}


@pytest.fixture(params=list(VARIANTS))
def model(request):
    return tiny_model(**VARIANTS[request.param])


def prompts(b: int, p: int, model, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.mask_token_id, (b, p), generator=g)


# ----------------------------------------------------------------------------- the reference
def _rope(x, pos, head_dim, theta):  # x [B, H, L, hd], pos [B|1, L]; angles in fp32 as Hugging Face does
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    ang = pos.float()[..., None] * inv  # [B, L, hd/2]
    cos, sin = ang.cos()[:, None].to(x.dtype), ang.sin()[:, None].to(x.dtype)
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@torch.no_grad()
def reference_logits(model, x, frozen, fresh, attn=None):
    """Logits `[B, L, V]` of `x` when the keys/values of columns with `fresh[c] = False` are those of a
    full forward of `frozen` (the block-start sequence). Sinks: keys/values of the sink stream, each
    content query sees them (One-Token eq. 6), key order irrelevant to softmax."""
    cfg = model.config
    b, length = x.shape
    n, hd, theta = cfg.num_sink_tokens, cfg.head_dim, cfg.rope_theta
    am = torch.ones(b, length, dtype=torch.bool) if attn is None else attn
    pos = (n if cfg.sink_position == "front" else 0) + (am.long().cumsum(-1) - 1).clamp(min=0)
    spos = torch.arange(n)[None] if cfg.sink_position == "front" else am.sum(-1, keepdim=True) + torch.arange(n)
    sinks = model.sink_stream() if n else None
    key_ok = torch.cat([torch.ones(b, n, dtype=torch.bool), am], -1)[:, None, None, :]  # [B, 1, 1, n+L]
    hc, hf = model.embed_tokens(x), model.embed_tokens(frozen)
    for i, layer in enumerate(model.layers):
        a = layer.self_attn

        def qkv(h):
            xn = layer.input_layernorm(h)
            q = xn @ a.q_proj.weight.T + (a.q_proj.bias if a.q_proj.bias is not None else 0)
            k = xn @ a.k_proj.weight.T + (a.k_proj.bias if a.k_proj.bias is not None else 0)
            v = xn @ a.v_proj.weight.T + (a.v_proj.bias if a.v_proj.bias is not None else 0)
            heads = lambda t, m: t.view(b, length, m, hd).transpose(1, 2)  # noqa: E731
            q, k, v = heads(q, a.num_heads), heads(k, a.num_kv_heads), heads(v, a.num_kv_heads)
            return xn, _rope(q, pos, hd, theta), _rope(k, pos, hd, theta), v

        def attend(q, k, v):
            if n:
                k = torch.cat([_rope(sinks.k[i], spos, hd, theta).expand(b, -1, -1, -1), k], 2)
                v = torch.cat([sinks.v[i].expand(b, -1, -1, -1), v], 2)
            g = a.num_heads // a.num_kv_heads
            k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            s = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~key_ok, float("-inf"))
            return torch.softmax(s, -1) @ v

        xc, qc, kc, vc = qkv(hc)
        xf, qf, kf, vf = qkv(hf)
        sel = fresh[None, None, :, None]
        yc = attend(qc, torch.where(sel, kc, kf), torch.where(sel, vc, vf))
        yf = attend(qf, kf, vf)
        hc = hc + a.output(yc, xc)
        hf = hf + a.output(yf, xf)
        hc = hc + layer.mlp(layer.post_attention_layernorm(hc))
        hf = hf + layer.mlp(layer.post_attention_layernorm(hf))
    return model.lm_head(model.norm(hc))


@torch.no_grad()
def reference_generate(model, prompt, gen_length, steps, block_length, cache, threshold=None, shift=False, attn=None,
                       dream_entropy=False, eps=1e-3):
    """Fast-dLLM's cached loop at temperature 0, recomputing everything: per step, the fresh window is
    the whole sequence (no cache, or the block's first step), `[block start - shift, end)` ("prefix")
    or `[block start - shift, block end)` ("dual"); the rest comes from the block-start sequence.
    `dream_entropy`: Fast-dLLM's dream/ loop instead: per block, timesteps linspace(1, eps, steps + 1), the
    step t -> s commits int(n_masked (1 - s/t)) (all at the last step) of the highest negative entropies."""
    mask_id = model.config.mask_token_id
    b, p = prompt.shape
    length = p + gen_length
    x = torch.cat([prompt, torch.full((b, gen_length), mask_id)], 1)
    am = None if attn is None else torch.cat([attn, torch.ones(b, gen_length, dtype=torch.bool)], 1)
    num_blocks = gen_length // block_length
    for blk, bs in enumerate(steps_per_block(steps or num_blocks, num_blocks)):
        lo, hi = p + blk * block_length, p + (blk + 1) * block_length
        sched = transfer_schedule(block_length, bs) if threshold is None else None
        frozen, i = None, 0
        while (x[:, lo:hi] == mask_id).any():
            fresh = torch.ones(length, dtype=torch.bool)
            if cache is not None and frozen is not None:
                fresh[:] = False
                fresh[lo - shift:(length if cache == "prefix" else hi)] = True
            if frozen is None:
                frozen = x.clone()
            logits = reference_logits(model, x, frozen, fresh, am)
            if shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            logits = logits[:, lo:hi].clone()
            logits[..., mask_id] = float("-inf")
            x0 = logits.argmax(-1)
            conf = torch.softmax(logits, -1).gather(-1, x0[..., None]).squeeze(-1)
            is_m = x[:, lo:hi] == mask_id
            if dream_entropy:
                probs = torch.softmax(logits, -1)
                conf = (probs * torch.log(probs + 1e-10)).sum(-1)
                ts, n = torch.linspace(1, eps, bs + 1), is_m.sum() / b
                sched = [None] * i + [int(n * (1 - ts[i + 1] / ts[i])) if i < bs - 1 else int(n)]
            conf = conf.masked_fill(~is_m, float("-inf"))
            for r in range(b):
                if not is_m[r].any():
                    continue
                order = conf[r].argsort(descending=True)
                if threshold is None:
                    take = order[: sched[i]]
                else:
                    take = [order[0]] + [j for j in order[1:] if conf[r, j] > threshold]
                for j in take:
                    x[r, lo + j] = x0[r, j]
            i += 1
    return x


# ----------------------------------------------------------------------------- equality with the reference
@pytest.mark.parametrize("cache", ["prefix", "dual"])
# (16, None), one token a step, is (8, None)'s fixed-step schedule again: make test-slow
@pytest.mark.parametrize("steps,threshold", [(8, None), pytest.param(16, None, marks=pytest.mark.slow), (None, 0.3)])
def test_cache_matches_reference(model, cache, steps, threshold):
    prompt = prompts(2, 5, model)
    got = generate(model, prompt, gen_length=16, steps=steps, block_length=4, threshold=threshold, cache=cache)
    want = reference_generate(model, prompt, 16, steps, 4, cache, threshold=threshold)
    assert torch.equal(got, want)
    # the reference's uncached path is the plain sampler (checks the reference itself)
    plain = generate(model, prompt, gen_length=16, steps=steps, block_length=4, threshold=threshold)
    assert torch.equal(plain, reference_generate(model, prompt, 16, steps, 4, None, threshold=threshold))


@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
@pytest.mark.parametrize("steps", [8, 12])
def test_dream_schedule_with_a_cache_matches_fast_dllm_dream(cache, steps):
    """Dream's schedule per block under the caches (Fast-dLLM's dream/ block loop), shifted logits, padding."""
    model = tiny_model(num_sink_tokens=1, shift_logits=True, family="dream")
    prompt = prompts(2, 5, model)
    attn = torch.tensor([[False, True, True, True, True], [True] * 5])
    got = generate(model, prompt, gen_length=16, steps=steps, block_length=4, cache=cache, attention_mask=attn)
    want = reference_generate(model, prompt, 16, steps, 4, cache, shift=True, attn=attn, dream_entropy=True)
    assert torch.equal(got, want)


@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
def test_threshold_decoding_of_a_dream_model_uses_the_probability(cache):
    """With a threshold a Dream model's default rule is maskgit_plus (the chosen token's probability), as
    Fast-dLLM's dream/ threshold loop; at temperature 0 it commits what low_confidence commits."""
    model = tiny_model(num_sink_tokens=1, shift_logits=True, family="dream")
    prompt = prompts(2, 5, model)
    got = generate(model, prompt, gen_length=16, block_length=4, threshold=0.3, cache=cache)
    assert torch.equal(got, reference_generate(model, prompt, 16, None, 4, cache, threshold=0.3, shift=True))


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_shift_logits_and_padding_match_reference(cache):
    model = tiny_model(num_sink_tokens=1, sink_position="end")
    prompt = prompts(2, 5, model)
    attn = torch.tensor([[False, False, True, True, True], [True] * 5])
    got = generate(model, prompt, gen_length=12, steps=12, block_length=4, shift_logits=True, cache=cache, attention_mask=attn)
    want = reference_generate(model, prompt, 12, 12, 4, cache, shift=True, attn=attn)
    assert torch.equal(got, want)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_one_step_per_block_equals_uncached(model, cache):
    prompt = prompts(2, 5, model)
    for kw in (dict(temperature=0.0), dict(temperature=1.0, seed=3), dict(remasking="random", seed=4)):
        a = generate(model, prompt, gen_length=12, steps=3, block_length=4, cache=cache, **kw)
        b = generate(model, prompt, gen_length=12, steps=3, block_length=4, **kw)
        assert torch.equal(a, b), kw


@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_left_padded_batch_equals_rows_alone(model, cache, threshold):
    rows = [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13]]
    steps = None if threshold else 8
    out = generate(model, rows, gen_length=8, steps=steps, block_length=4, threshold=threshold, cache=cache, return_dict=True)
    width = out.prompt_length
    for r, row in enumerate(rows):
        alone = generate(model, [row], gen_length=8, steps=steps, block_length=4, threshold=threshold, cache=cache)
        assert torch.equal(out.sequences[r, width:], alone[0, len(row):]), (r, cache)


def test_cache_sampling_runs_and_repeats():
    model = tiny_model(num_sink_tokens=1)
    prompt = prompts(2, 5, model)
    mask_id = model.config.mask_token_id
    for cache in ("prefix", "dual"):
        for kw in (dict(temperature=0.8), dict(remasking="random")):
            a = generate(model, prompt, gen_length=12, steps=6, block_length=4, cache=cache, seed=5, **kw)
            assert torch.equal(a, generate(model, prompt, gen_length=12, steps=6, block_length=4, cache=cache, seed=5, **kw))
            assert torch.equal(a[:, :5], prompt) and not (a == mask_id).any()


def test_cache_step_callback_state():
    model = tiny_model(num_sink_tokens=1)
    prompt = prompts(2, 4, model)
    states = []
    out = generate(model, prompt, gen_length=8, steps=8, block_length=4, cache="dual", callback=states.append)
    assert len(states) == 8
    for s in states:
        assert s.attentions is None and s.logits.shape[:2] == (2, len(s.logit_columns))
        lo = 4 + 4 * s.block  # the block's columns, every step (no host sync to find the masked ones)
        assert torch.equal(s.logit_columns, torch.arange(lo, lo + 4))
    assert torch.equal(states[-1].x, out)


# ----------------------------------------------------------------------------- the head on used positions only
def test_forward_logits_index_and_cache_consistency(model):
    x = prompts(3, 10, model)
    attn = torch.ones(3, 10, dtype=torch.bool)
    attn[0, :3] = False
    full = model(x, attention_mask=attn)
    kv = model.allocate_cache(3, 10, attn)
    assert torch.equal(model(x, cache=kv).logits, full.logits)
    idx = torch.tensor([1, 4, 9])
    torch.testing.assert_close(model(x, attention_mask=attn, logits_index=idx).logits, full.logits[:, idx])
    torch.testing.assert_close(model(x, attention_mask=attn, logits_index=slice(2, 6)).logits, full.logits[:, 2:6])
    # Unchanged tokens: cached keys/values equal fresh ones, so a cached slice gives the full logits.
    kv.start = 4
    torch.testing.assert_close(model(x[:, 4:7], cache=kv).logits, full.logits[:, 4:7])
    torch.testing.assert_close(model(x[:, 4:], cache=kv, logits_index=[0, 5]).logits, full.logits[:, [4, 9]])


def test_narrow_head_gives_the_full_head_tokens(model):
    """With a callback (no cache) the head runs on every column; without, only on masked block columns."""
    prompt = prompts(2, 5, model)
    for kw in (dict(steps=8), dict(steps=None, threshold=0.3)):
        seen = []
        a = generate(model, prompt, gen_length=12, block_length=4, callback=lambda s: seen.append(s.logits.shape[1]), **kw)
        assert set(seen) == {17}
        assert torch.equal(a, generate(model, prompt, gen_length=12, block_length=4, **kw))


def test_likelihood_head_on_masked_continuation_equals_full_head():
    model = tiny_model(num_sink_tokens=1)
    pre, cont = [[1, 2, 3, 4], [5, 6]], [[7, 8, 9], [10, 11, 12, 13]]
    got = loglikelihood(model, pre, cont, mc_num=8, seed=0)
    # the same draw, scored with every column's logits: -sum_masked CE / t
    from sinkdlm.diffusion.likelihood import mc_draw

    g = torch.Generator().manual_seed(0)
    for r in range(2):
        seq = torch.tensor(pre[r] + cont[r])
        xt, x0, masked, t = mc_draw(seq, len(pre[r]), 8, 1e-3, model.config.mask_token_id, g)
        logp = F.log_softmax(model(xt).logits.double(), -1).gather(-1, x0[..., None]).squeeze(-1)
        want = ((logp * masked).sum(-1) / t.double()).mean()
        torch.testing.assert_close(got.logprob[r], want)


# ----------------------------------------------------------------------------- bad input
def test_cache_errors():
    model = tiny_model(num_sink_tokens=1)
    prompt = prompts(1, 4, model)
    with pytest.raises(ValueError, match="cache must be prefix or dual"):  # the one home: config/checks.py
        generate(model, prompt, gen_length=8, steps=8, block_length=4, cache="full")
    with pytest.raises(ValueError, match="single block.*block_length"):
        generate(model, prompt, gen_length=8, steps=8, cache="dual")
    with pytest.raises(ValueError, match="use cache=None"):
        generate(model, prompt, gen_length=8, steps=8, block_length=4, cache="prefix", probe=StepProbe(attentions=True))
    with pytest.raises(ValueError, match="use cache=None"):
        generate(model, prompt, gen_length=8, steps=8, block_length=4, cache="dual", probe=StepProbe(key_masks=lambda s, p: None))
    # prefix with a single block caches the prompt: allowed
    assert generate(model, prompt, gen_length=8, steps=8, cache="prefix").shape == (1, 12)


# ----------------------------------------------------------------------------- compiled cached steps
# all make test-slow: compiled cached steps giving the eager tokens stay in the default run in
# tests/diffusion/test_decoding_gpu_proxies.py (both caches, a threshold, shifted logits)
@pytest.mark.parametrize("cache,backend", [
    pytest.param("dual", "aot_eager", marks=pytest.mark.slow),
    pytest.param("prefix", "aot_eager", marks=pytest.mark.slow),
    pytest.param("dual", "inductor", marks=pytest.mark.slow),
])
def test_compiled_cached_steps_give_the_eager_tokens(cache, backend):
    # torch.compile traces the cached step (the whole block's columns, static shapes); aot_eager runs the
    # same ATen ops, so the tokens must be those of the eager cached loop, padded rows included.
    model = tiny_model(num_sink_tokens=1, initializer_range=0.5)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 11, 12, 13, 14]])
    am = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    kw = dict(gen_length=16, steps=16, block_length=8, cache=cache, attention_mask=am)
    eager = generate(model, ids, **kw)
    compiled = generate(model, ids, **kw, compile=True, compile_backend=backend)
    assert torch.equal(eager, compiled)


def test_compile_needs_a_cache_and_a_known_backend():
    model = tiny_model(num_sink_tokens=1)
    with pytest.raises(ValueError, match="compile=True compiles the cached decoding step"):
        generate(model, [5, 6], gen_length=8, steps=8, compile=True)
    with pytest.raises(ValueError, match="not a torch.compile backend"):
        generate(model, [5, 6], gen_length=8, steps=8, block_length=4, cache="dual", compile=True,
                 compile_backend="no-such-backend")
