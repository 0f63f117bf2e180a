"""Block diffusion training (BD3-LM, docs/method.md §13): the mask, the x_t ⊕ x_0 pass and the loss (also with
shifted logits, a Fast-dLLM v2 model's), each against an independent computation written here (float64 models:
exactness of the construction is the claim)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from sinkdlm import DiffusionLM
from sinkdlm.diffusion.block import block_diffusion_loss, block_diffusion_mask, xt_forward
from sinkdlm.diffusion.likelihood import loglikelihood
from sinkdlm.diffusion.noise import MaskNoise

from helpers import tiny_model
from numerics import assert_fp_close, assert_model_close


def twin(model: DiffusionLM, **changes) -> DiffusionLM:
    """The same weights under another config (a whole-sequence model: block_size=None)."""
    other = DiffusionLM(model.config.replace(**changes)).double().eval()
    other.load_state_dict(model.state_dict())
    return other


@settings(max_examples=60, deadline=None)
@given(seq_len=st.integers(1, 12), block_size=st.integers(1, 13), n=st.integers(0, 3),
       where=st.sampled_from(["front", "end"]))
def test_mask_is_the_three_part_definition_with_sink_rows(seq_len, block_size, n, where):
    mask = block_diffusion_mask(seq_len, block_size, n, where)
    t = 2 * seq_len + n
    assert mask.shape == (t, t) and mask.dtype == torch.bool
    sinks = list(range(n)) if where == "front" else list(range(2 * seq_len, t))
    content = [i for i in range(t) if i not in sinks]  # x_t then x_0, in order
    for qi, q in enumerate(content):
        for ki, k in enumerate(content):
            q_clean, k_clean = qi >= seq_len, ki >= seq_len
            bq, bk = (qi % seq_len) // block_size, (ki % seq_len) // block_size
            if not q_clean and not k_clean:
                want = bq == bk  # x_t: its own block only
            elif not q_clean:
                want = bk < bq  # x_t's block sees the clean blocks before it
            elif k_clean:
                want = bk <= bq  # x_0 is block-causal
            else:
                want = False  # x_0 never sees x_t
            assert bool(mask[q, k]) == want, (q, k)
        for s in sinks:
            assert mask[q, s]  # every query sees the sinks (eq. 6)
    for s in sinks:
        assert mask[s].nonzero().flatten().tolist() == [s]  # a sink attends only to itself


@pytest.mark.parametrize("bad", [dict(block_size=0), dict(seq_len=0), dict(num_sink_tokens=-1),
                                 dict(sink_position="middle")])
def test_mask_refuses_bad_input(bad):
    args = {**dict(seq_len=4, block_size=2, num_sink_tokens=0, sink_position="front"), **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        block_diffusion_mask(**args)


SINKS = [(0, "front"), (1, "front"), (2, "end")]


def noisy(x0, mask_id, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(x0.shape, generator=g) < 0.5, torch.full_like(x0, mask_id), x0)


@pytest.mark.parametrize("n,where", SINKS)
def test_whole_sequence_block_gives_the_masked_dlm(n, where):
    """block_size = L: the x_t half's logits are the whole-sequence model's forward on x_t."""
    l = 12
    model = tiny_model(block_size=l, num_sink_tokens=n, sink_position=where)
    x0 = torch.randint(0, 40, (2, l), generator=torch.Generator().manual_seed(1))
    xt = noisy(x0, model.config.mask_token_id)
    got = xt_forward(model, xt, x0).logits[:, :l]
    want = twin(model, block_size=None)(xt).logits
    assert_model_close(got, want, model.config, keys=2 * l + n)


@pytest.mark.parametrize("n,where", SINKS)
@pytest.mark.parametrize("block_size", [1, 3, 5])
def test_xt_half_is_block_by_block(block_size, n, where):
    """For each block k: a pass over the clean blocks before k and the noisy block k (attention block-causal,
    written here on a whole-sequence twin) gives the x_t half's logits of block k. End sinks sit after the
    whole sequence in both, so there the later clean blocks ride along, invisible to block k."""
    l = 10  # 3 does not divide it: a shorter last block
    model = tiny_model(block_size=block_size, num_sink_tokens=n, sink_position=where)
    plain = twin(model, block_size=None)
    x0 = torch.randint(0, 40, (2, l), generator=torch.Generator().manual_seed(2))
    xt = noisy(x0, model.config.mask_token_id, seed=3)
    got = xt_forward(model, xt, x0).logits[:, :l]
    for k in range(-(-l // block_size)):
        lo, hi = k * block_size, min((k + 1) * block_size, l)
        ids = torch.cat([x0[:, :lo], xt[:, lo:hi]] + ([x0[:, hi:]] if where == "end" and n else []), dim=1)
        blocks = torch.arange(ids.shape[1]) // block_size
        causal = (blocks[:, None] >= blocks[None, :])[None, None]  # [1, 1, L, L]
        want = plain(ids, attention_mask=causal).logits[:, lo:hi]
        assert_model_close(got[:, lo:hi], want, model.config, keys=2 * l + n)


@pytest.mark.parametrize("per_block", [True, False])
def test_loss_is_eq_3_4_per_block_with_eos_padding(per_block):
    """L = 10, block 4: padded to 12 with EOS; each masked x_t token's CE / t of its block, summed over the
    sequence, / 12, averaged over the batch; the logits from block-by-block passes (mask written here)."""
    bs, l, eos = 4, 10, 7
    model = tiny_model(block_size=bs, num_sink_tokens=1)
    plain = twin(model, block_size=None)
    x0 = torch.randint(0, 40, (3, l), generator=torch.Generator().manual_seed(4))
    t = torch.tensor([[0.2, 0.6, 1.0], [0.5, 0.5, 0.5], [0.9, 0.3, 0.7]], dtype=torch.float64)
    t = t if per_block else t[:, 0]
    u = torch.rand(3, 12, generator=torch.Generator().manual_seed(5))
    out = block_diffusion_loss(model, x0, MaskNoise(t=t, u=u), pad_id=eos)
    padded = torch.cat([x0, torch.full((3, 2), eos)], dim=1)
    t_pos = (t if per_block else t[:, None].expand(3, 3)).repeat_interleave(bs, dim=1)  # [3, 12]
    masked = u < t_pos
    xt = torch.where(masked, model.config.mask_token_id, padded)
    want = 0.0
    for b in range(3):
        for k in range(3):
            ids = torch.cat([padded[b:b + 1, :k * bs], xt[b:b + 1, k * bs:(k + 1) * bs]], dim=1)
            blocks = torch.arange(ids.shape[1]) // bs
            logits = plain(ids, attention_mask=(blocks[:, None] >= blocks[None, :])[None, None]).logits[0, k * bs:]
            ce = F.cross_entropy(logits, padded[b, k * bs:(k + 1) * bs], reduction="none")
            want = want + (ce * masked[b, k * bs:(k + 1) * bs]).sum() / t_pos[b, k * bs]
    want = want / (12 * 3)
    assert out.num_masked == int(masked.sum())
    assert_fp_close(out.loss, want, n=12 * model.config.vocab_size, depth=model.config.num_hidden_layers + 2)
    out.loss.backward()  # differentiable through the 2L pass
    assert model.embed_tokens.weight.grad is not None


def test_loss_refuses_bad_input():
    model = tiny_model(block_size=4)
    x0 = torch.randint(0, 40, (2, 10))
    with pytest.raises(ValueError, match="pad_id"):
        block_diffusion_loss(model, x0)  # 10 is not a multiple of 4: EOS padding needs the id
    with pytest.raises(ValueError, match="larger than the training sequence"):
        block_diffusion_loss(tiny_model(block_size=16), x0, pad_id=1)
    with pytest.raises(ValueError, match="block model"):
        block_diffusion_loss(tiny_model(), x0)


# ----------------------------------------------------------------------------- the block NELBO
def block_logits(plain: DiffusionLM, ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """The whole-sequence twin's logits `[L, V]` of one sequence under a block-causal mask written here."""
    blocks = torch.arange(len(ids)) // block_size
    with torch.no_grad():
        return plain(ids[None], attention_mask=(blocks[:, None] >= blocks[None, :])[None, None]).logits[0]


def test_block_nelbo_of_one_token_blocks_is_the_exact_autoregressive_likelihood():
    """block_size 1: each block is one [MASK] given the clean tokens before it, so the bound is the chain rule's
    exact sum of log p(x_i | x_<i), with no Monte-Carlo error."""
    model = tiny_model(block_size=1, num_sink_tokens=1)
    plain = twin(model, block_size=None)
    pre, cont = torch.tensor([3, 9, 4]), torch.tensor([7, 1, 30, 12])
    out = loglikelihood(model, pre, cont, mc_num=4, seed=0)
    seq, mask_id, want = torch.cat([pre, cont]), model.config.mask_token_id, 0.0
    for i in range(len(pre), len(seq)):
        ids = torch.cat([seq[:i], torch.tensor([mask_id])])
        want += torch.log_softmax(block_logits(plain, ids, 1)[i], -1)[seq[i]]
    assert out.method == "block_nelbo" and float(out.stderr) == 0.0  # every draw is the same computation
    assert_fp_close(out.logprob, want, n=model.config.vocab_size * len(cont), depth=model.config.num_hidden_layers + 2)


def test_block_nelbo_is_unbiased_for_the_enumerated_bound():
    """Blocks of 3 over a 2-token prefix and a 5-token continuation: the exact bound, every masked subset of every
    block enumerated (block k's term: mean over l of M/l times the mean over l-subsets of their summed CE, given
    the clean blocks before k), lies within 4 standard errors of the Monte-Carlo estimate, which shrinks as
    1/sqrt(samples)."""
    from itertools import combinations

    bs = 3
    model = tiny_model(block_size=bs)
    plain = twin(model, block_size=None)
    pre, cont = torch.tensor([5, 11]), torch.tensor([2, 8, 19, 33, 6])
    seq, mask_id, lp = torch.cat([pre, cont]), model.config.mask_token_id, len(pre)
    exact = 0.0
    for lo in range(0, len(seq), bs):
        scored = [i for i in range(lo, min(lo + bs, len(seq))) if i >= lp]
        m = len(scored)
        for l in range(1, m + 1):
            subsets = list(combinations(scored, l))
            for subset in subsets:
                ids = seq[:lo + bs].clone()
                ids[list(subset)] = mask_id
                logp = torch.log_softmax(block_logits(plain, ids, bs), -1)
                term = -sum(float(logp[i, seq[i]]) for i in subset)
                exact += (1 / m) * (m / l) * term / len(subsets)
    few = loglikelihood(model, pre, cont, mc_num=32, seed=1)
    many = loglikelihood(model, pre, cont, mc_num=512, seed=2)
    assert abs(float(many.logprob) + exact) < 4 * float(many.stderr)
    assert 0.5 < float(few.stderr) / float(many.stderr) / 4 < 2  # sqrt(512 / 32) = 4


# ----------------------------------------------------------------------------- shifted logits (Fast-dLLM v2)
@pytest.mark.parametrize("per_block", [True, False])
@pytest.mark.parametrize("bs,l", [(2, 9), (3, 10)])
def test_shifted_loss_is_the_eager_block_loop_read_one_column_back(bs, l, per_block):
    """A shifted block model (Fast-dLLM v2): padded to whole blocks with EOS; row 0 pretraining, rows 1-2 SFT with a
    prompt ending on a block boundary (column 6) and inside a block (column 5). For each block k a pass over the
    clean blocks before k and the noisy block k (block-causal mask written here on a whole-sequence twin): the block's
    first token is never masked and is scored exactly at the last clean position before it (column 0 never); every
    other masked token, / t of its block, at the column before it in the noisy block. Summed, / the padded length
    or the response length, averaged over the batch."""
    eos = 7
    model = tiny_model(block_size=bs, shift_logits=True, num_sink_tokens=1)
    plain = twin(model, block_size=None)
    length = -(-l // bs) * bs
    k_blocks = length // bs
    x0 = torch.randint(0, 40, (3, l), generator=torch.Generator().manual_seed(6))
    prompt = torch.zeros(3, l, dtype=torch.bool)
    prompt[1, :6], prompt[2, :5] = True, True
    t = 0.25 + 0.7 * torch.rand(3, k_blocks, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    t = t if per_block else t[:, 0]
    u = torch.rand(3, length, generator=torch.Generator().manual_seed(8))
    pm = prompt.clone()
    pm[0] = False
    out = block_diffusion_loss(model, x0, MaskNoise(t=t, u=u), pad_id=eos, prompt_mask=pm)
    padded = torch.cat([x0, torch.full((3, length - l), eos)], dim=1)
    pm = torch.cat([pm, torch.zeros(3, length - l, dtype=torch.bool)], dim=1)
    t_pos = (t if per_block else t[:, None].expand(3, k_blocks)).repeat_interleave(bs, dim=1)  # [3, L']
    starts = torch.arange(length) % bs == 0
    masked = (u < t_pos) & ~pm & ~starts
    xt = torch.where(masked, model.config.mask_token_id, padded)
    want, exact_terms = 0.0, 0
    for r in range(3):
        total = 0.0
        for k in range(k_blocks):
            lo, hi = k * bs, (k + 1) * bs
            ids = torch.cat([padded[r, :lo], xt[r, lo:hi]])
            logp = torch.log_softmax(block_logits(plain, ids, bs), -1)  # [hi, V]
            for c in range(max(lo, 1), hi):
                if pm[r, c]:
                    continue
                if c == lo:  # the block's first token: from the last clean position before it, exactly
                    total = total - logp[c - 1, padded[r, c]]
                    exact_terms += 1
                elif masked[r, c]:  # from the column before it in its own noisy block
                    total = total - logp[c - 1, padded[r, c]] / t_pos[r, c]
        want = want + total / (length if r == 0 else int((~pm[r]).sum()))
    want = want / 3
    assert exact_terms > 0 and masked.any() and out.num_masked == int(masked.sum())
    assert_fp_close(out.loss, want, n=length * model.config.vocab_size, depth=model.config.num_hidden_layers + 2)


def test_shifted_loss_is_the_block_nelbo_terms_with_the_same_masks():
    """One sequence: the loss times L is `block_nelbo_terms` (the block NELBO's, loglikelihood's) for the same
    masks, weights 1/t and the block-start columns: one reading of each target for training and scoring."""
    from sinkdlm.diffusion.block import block_nelbo_terms, first_columns, plan_block_masks

    bs, l = 3, 12
    model = tiny_model(block_size=bs, shift_logits=True)
    x0 = torch.randint(0, 40, (1, l), generator=torch.Generator().manual_seed(9))
    noise = MaskNoise(t=torch.tensor([[0.9, 0.5, 0.7, 0.8]], dtype=torch.float64),
                      u=torch.rand(1, l, generator=torch.Generator().manual_seed(10)))
    out = block_diffusion_loss(model, x0, noise)
    plan = plan_block_masks(x0, noise, block_size=bs, mask_id=model.config.mask_token_id, pad_id=None, shift=True)
    masked = plan.xt == model.config.mask_token_id
    weight = torch.zeros(1, l, dtype=torch.float64)
    weight[masked] = 1 / plan.t.repeat_interleave(bs, dim=1)[masked]
    with torch.no_grad():
        terms = block_nelbo_terms(model, plan.xt, x0, masked, weight, first=first_columns(0, l, bs))
    assert masked.any() and not masked[:, ::bs].any()  # block starts are never masked
    assert_fp_close(out.loss * l, terms[0], n=l * model.config.vocab_size, depth=model.config.num_hidden_layers + 2)


def test_shifted_loss_of_one_token_blocks_is_the_causal_cross_entropy():
    """block_size 1: every column starts a block, so nothing is masked and each token is scored exactly from the
    clean column before it under causal attention: the autoregressive loss, sum over columns 1.. / L."""
    model = tiny_model(block_size=1, shift_logits=True, num_sink_tokens=1)
    plain = twin(model, block_size=None)
    x0 = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(13))
    out = block_diffusion_loss(model, x0, MaskNoise(t=torch.full((2,), 0.999, dtype=torch.float64)))
    causal = torch.ones(7, 7, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        logits = plain(x0, attention_mask=causal).logits  # [2, 7, V]
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x0[:, 1:].reshape(-1), reduction="sum")
    assert out.num_masked == 0
    assert_fp_close(out.loss, ce / (7 * 2), n=7 * model.config.vocab_size, depth=model.config.num_hidden_layers + 2)


def test_shifted_loss_trains():
    """Gradients reach every weight; one Adam step on a fixed batch and noise lowers the loss."""
    model = tiny_model(block_size=2, shift_logits=True, num_sink_tokens=1).train()
    x0 = torch.randint(0, 40, (4, 10), generator=torch.Generator().manual_seed(11))
    noise = MaskNoise(t=torch.full((4, 5), 0.6, dtype=torch.float64),
                      u=torch.rand(4, 10, generator=torch.Generator().manual_seed(12)))
    before = block_diffusion_loss(model, x0, noise, shift_logits=True)
    before.loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.step()
    with torch.no_grad():
        after = block_diffusion_loss(model, x0, noise)
    assert float(after.loss) < float(before.loss.detach())
    with pytest.raises(ValueError, match=r"reads its own shift_logits \(True\)"):
        block_diffusion_loss(model, x0, noise, shift_logits=False)


# ----------------------------------------------------------------------------- complementary masks (Fast-dLLM v2)
def eager_row(plain: DiffusionLM, x: torch.Tensor, masked: torch.Tensor, weight: torch.Tensor, prompt: torch.Tensor,
              bs: int, shift: bool) -> torch.Tensor:
    """One row's summed loss terms, float64, block by block on the whole-sequence twin (a pass over the clean blocks
    before block k and the noisy block k): a masked token's CE times `weight [L']` (1 / its row's rate), read
    at its own column, or the column before it when shifted, where each block's first token (not column 0, not a
    prompt's) is also scored exactly, weight 1, from the clean previous block's last column."""
    xt = torch.where(masked, plain.config.mask_token_id, x)
    total = torch.zeros((), dtype=torch.float64)
    for k in range(len(x) // bs):
        lo, hi = k * bs, (k + 1) * bs
        with torch.no_grad():
            logp = torch.log_softmax(block_logits(plain, torch.cat([x[:lo], xt[lo:hi]]), bs).double(), -1)
        for c in range(lo, hi):
            if shift and (c == 0 or prompt[c]):
                continue
            if shift and c == lo:
                total = total - logp[c - 1, x[c]]
            elif masked[c]:
                total = total - logp[c - int(shift), x[c]] * weight[c]
    return total


@pytest.mark.parametrize("shift,bs,l", [(False, 4, 10), (False, 3, 9), (True, 2, 9), (True, 3, 10)])
def test_complementary_loss_is_both_copies_written_out(shift, bs, l):
    """--complementary-masks: t and u drawn from the same generator as the library draws them (t per block, then
    u over the padded length); row b masked where u < t, row B + b where u >= t (the maskable positions: not a
    prompt's, not a block start when shifted), each masked token's CE / t or / max(1 - t, eps); each row / its
    normaliser (L', or the response length), averaged over the 2B rows. Against the library loss, 1e-10 relative
    (the weights are float32 reciprocals of the float32 draw, as the trainer's; the CE and the sums float64)."""
    eos, eps = 7, MaskNoise.eps
    model = tiny_model(block_size=bs, shift_logits=shift, num_sink_tokens=1)
    plain = twin(model, block_size=None)
    length, b = -(-l // bs) * bs, 3
    k_blocks = length // bs
    x0 = torch.randint(0, 40, (b, l), generator=torch.Generator().manual_seed(20))
    pm = torch.zeros(b, l, dtype=torch.bool)
    pm[1, :bs], pm[2, :bs + 1] = True, True  # SFT prompts ending on a block boundary and inside a block
    out = block_diffusion_loss(model, x0, MaskNoise(generator=torch.Generator().manual_seed(21), complementary=True),
                               pad_id=eos, prompt_mask=pm)
    gen = torch.Generator().manual_seed(21)  # the same draws, in the library's order
    from sinkdlm.diffusion.noise import sample_t
    t = sample_t(b * k_blocks, eps, generator=gen).view(b, k_blocks)  # float32, as drawn
    u = torch.rand(b, length, generator=gen)
    x = torch.cat([x0, torch.full((b, length - l), eos)], dim=1)
    prompt = torch.cat([pm, torch.zeros(b, length - l, dtype=torch.bool)], dim=1)
    t_pos = t.repeat_interleave(bs, dim=1)
    maskable = ~prompt & ~((torch.arange(length) % bs == 0) & shift)
    want = torch.zeros((), dtype=torch.float64)
    for r in range(b):
        norm = int((~prompt[r]).sum()) if r else length  # row 0 has no prompt: normalised by L' either way
        first = eager_row(plain, x[r], (u[r] < t_pos[r]) & maskable[r], 1.0 / t_pos[r], prompt[r], bs, shift)
        second = eager_row(plain, x[r], (u[r] >= t_pos[r]) & maskable[r], 1.0 / (1 - t_pos[r]).clamp(min=eps),
                           prompt[r], bs, shift)
        want = want + (first + second) / norm
    want = want / (2 * b)
    assert out.t.shape == (2 * b, k_blocks) and torch.equal(out.t[b:], 1 - out.t[:b])
    assert int(out.num_masked) == int(maskable.sum())  # every maskable token once, over the two copies
    assert abs(out.loss.item() - float(want)) <= 1e-10 * abs(float(want)), (float(out.loss), float(want))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), l=st.integers(1, 14), bs=st.integers(1, 6), shift=st.booleans(),
       prompt=st.integers(0, 5), per_block=st.booleans())
def test_complementary_rows_mask_every_maskable_token_exactly_once(seed, l, bs, shift, prompt, per_block):
    """Each pair of rows (b, B + b) masks every maskable token (padding included; not a prompt's, not a block start
    when shifted) in exactly one of the two, and nothing else; the complement's rate is 1 - t and its weight
    1 / max(1 - t, eps); the first B rows are the plain plan's, tensor for tensor."""
    from sinkdlm.diffusion.block import plan_block_masks

    bs = min(bs, l)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randint(0, 40, (2, l), generator=gen)
    pm = torch.zeros(2, l, dtype=torch.bool)
    pm[1, :min(prompt, l)] = True
    noise = MaskNoise(generator=gen, eps=0.05)
    kw = dict(block_size=bs, mask_id=47, pad_id=7, prompt_mask=pm, shift=shift)
    state = gen.get_state()
    plain = plan_block_masks(x0, noise, **kw)
    gen.set_state(state)
    plan = plan_block_masks(x0, dataclasses.replace(noise, complementary=True), **kw)
    length = plain.x0.shape[1]
    maskable = ~torch.cat([pm, torch.zeros(2, length - l, dtype=torch.bool)], dim=1)
    if shift:
        maskable[:, torch.arange(length) % bs == 0] = False
    masked = plan.xt == 47
    assert torch.equal(masked[:2] ^ masked[2:], maskable) and not (masked[:2] & masked[2:]).any()
    assert torch.equal(plan.xt[:2], plain.xt) and torch.equal(plan.x0, torch.cat([plain.x0, plain.x0]))
    assert torch.equal(plan.t[2:], 1 - plan.t[:2]) and torch.equal(plan.norm, torch.cat([plain.norm, plain.norm]))
    rate = torch.cat([plan.t[:2], (1 - plan.t[:2]).clamp(min=0.05)]).repeat_interleave(bs, dim=1)
    n = int(masked.sum())
    assert int(plan.num_masked) == n == int(maskable.sum())
    assert torch.equal(plan.weight[:n], 1.0 / rate[plan.rows[:n], plan.cols[:n]])
    assert bool((plan.weight[n:] == 1).all())  # the exact first tokens (shifted), in both rows


def test_default_loss_is_unchanged_by_the_option():
    """complementary=False is the default draw, bit for bit (the plain loss itself is checked against the eager
    references above; a stored value would hold only for one machine's kernels)."""
    model = tiny_model(block_size=3, shift_logits=False, num_sink_tokens=1)
    x0 = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(6))
    pm = torch.zeros(3, 10, dtype=torch.bool)
    pm[1, :5] = True
    a, b = (block_diffusion_loss(model, x0, MaskNoise(generator=torch.Generator().manual_seed(1), **kw), pad_id=7,
                                 prompt_mask=pm) for kw in ({}, {"complementary": False}))
    assert torch.equal(a.loss, b.loss) and a.t.shape == (3, 4)


def test_the_whole_sequence_loss_refuses_complementary_noise_rather_than_dropping_it():
    from sinkdlm.diffusion.loss import diffusion_loss

    model = tiny_model(num_sink_tokens=1)
    with pytest.raises(ValueError, match="need a block model"):
        diffusion_loss(model, torch.randint(0, 40, (2, 8)), MaskNoise(complementary=True))
