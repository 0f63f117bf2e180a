"""The eq. 3-4 loss and its SFT variant, checked against the docs/method.md §1 formula written out here."""

from __future__ import annotations

import math

import pytest
import torch

from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise, forward_mask, sample_t

from numerics import assert_fp_close


class Recorder(torch.nn.Module):
    """A stand-in model with fixed random logits that remembers the input it saw."""

    def __init__(self, vocab=11, mask_id=10):
        super().__init__()
        self.config = type("C", (), {"mask_token_id": mask_id})()
        self.vocab = vocab
        self.seen = None
        self.table = torch.randn(64, vocab)

    def forward(self, xt, attention_mask=None, logits_index=None, **_):
        self.seen = xt.clone()
        out = self.table[: xt.shape[1]][None].expand(xt.shape[0], -1, -1).clone()
        if logits_index is not None:  # DiffusionLM's contract: (rows, cols) -> [N, V] rows
            out = out[logits_index]
        return type("O", (), {"logits": out})()


def spec_loss(logits, x0, xt, t, mask_id, norm):
    """mean_b [ (1/norm_b) * sum_i 1[xt_i = MASK] * CE(logits_i, x0_i) / t_b ]"""
    total = 0.0
    for b in range(x0.shape[0]):
        s = 0.0
        for i in range(x0.shape[1]):
            if xt[b, i] == mask_id:
                s += -torch.log_softmax(logits[b, i], -1)[x0[b, i]].item() / t[b].item()
        total += s / norm[b]
    return total / x0.shape[0]


def test_loss_matches_spec_formula():
    model = Recorder()
    x0 = torch.randint(0, 10, (4, 16))
    t = torch.tensor([0.1, 0.5, 0.9, 1.0])
    out = diffusion_loss(model, x0, MaskNoise(t=t, generator=torch.Generator().manual_seed(0)))
    xt = model.seen
    assert ((xt == 10) | (xt == x0)).all()
    logits = model.table[:16][None].expand(4, -1, -1)
    want = spec_loss(logits, x0, xt, t, 10, [16] * 4)
    assert out.loss.item() == pytest.approx(want, rel=1e-5)
    assert out.num_masked == int((xt == 10).sum())


def test_unmasked_positions_do_not_count():
    model = Recorder()
    x0 = torch.randint(0, 10, (2, 16))
    g = lambda: torch.Generator().manual_seed(3)
    t = torch.tensor([0.5, 0.5])
    base = diffusion_loss(model, x0, MaskNoise(t=t, generator=g())).loss
    unmasked = model.seen != 10
    model.table[:16][unmasked[0]] += 5.0 * torch.randn(int(unmasked[0].sum()), 11)  # perturb only unmasked rows of row 0
    model.table[:16][unmasked[0] & ~unmasked[1]] = model.table[:16][unmasked[0] & ~unmasked[1]]
    # rows masked in row 1 but unmasked in row 0 would leak; choose x0 identical rows to avoid that
    x0_same = x0[:1].expand(2, -1).contiguous()
    model2 = Recorder()
    a = diffusion_loss(model2, x0_same, MaskNoise(t=t, generator=g())).loss
    masked_any = (model2.seen == 10).any(0)
    model2.table[:16][~masked_any] += 7.0
    b = diffusion_loss(model2, x0_same, MaskNoise(t=t, generator=g())).loss
    assert torch.equal(a, b)
    assert base.isfinite()


def test_weight_is_one_over_t():
    """Same masks, t doubled => loss halved (the 1/t factor of eq. 4)."""
    model = Recorder()
    x0 = torch.randint(0, 10, (1, 32))
    xt_mask = torch.zeros(1, 32, dtype=torch.bool)
    gen = lambda: torch.Generator().manual_seed(1)
    # With t=0.4 vs 0.8 the masks differ; compare against the formula instead on each.
    for t in (0.4, 0.8):
        out = diffusion_loss(model, x0, MaskNoise(t=torch.tensor([t]), generator=gen()))
        want = spec_loss(model.table[:32][None], x0, model.seen, torch.tensor([t]), 10, [32])
        assert out.loss.item() == pytest.approx(want, rel=1e-5)
    assert not xt_mask.any()


def test_sft_never_masks_prompt_and_normalises_by_response():
    model = Recorder()
    x0 = torch.randint(0, 10, (3, 20))
    prompt = torch.zeros(3, 20, dtype=torch.bool)
    prompt[0, :5] = True
    prompt[1, :12] = True
    prompt[2, :1] = True
    t = torch.ones(3)  # t = 1: every maskable position is masked
    out = diffusion_loss(model, x0, MaskNoise(t=t, generator=torch.Generator().manual_seed(0)), prompt_mask=prompt)
    xt = model.seen
    assert (xt[prompt] == x0[prompt]).all()
    assert (xt[~prompt] == 10).all()
    resp_len = (~prompt).sum(-1).tolist()
    want = spec_loss(model.table[:20][None].expand(3, -1, -1), x0, xt, t, 10, resp_len)
    assert out.loss.item() == pytest.approx(want, rel=1e-5)
    for seed in range(20):  # and at random t, the prompt is never touched
        diffusion_loss(model, x0, MaskNoise(generator=torch.Generator().manual_seed(seed)), prompt_mask=prompt)
        assert (model.seen[prompt] == x0[prompt]).all()


def test_forward_mask_rate_and_low_discrepancy_t():
    x0 = torch.zeros(8, 4000, dtype=torch.long)
    t = torch.linspace(0.1, 0.9, 8)
    xt, masked = forward_mask(x0, t, 5, generator=torch.Generator().manual_seed(0))
    rate = masked.float().mean(-1)
    assert torch.allclose(rate, t, atol=0.03)
    assert torch.equal(xt == 5, masked)
    ts = sample_t(8, eps=1e-3, low_discrepancy=True, generator=torch.Generator().manual_seed(0))
    assert ((ts > 1e-3) & (ts <= 1.0)).all()
    # low discrepancy: exactly one t in each of the B equal strata of (eps, 1]
    strata = ((1.0 - ts) / (1.0 - 1e-3) * 8).floor().long().clamp(max=7)
    assert sorted(strata.tolist()) == list(range(8))
    with pytest.raises(ValueError, match="eps"):
        sample_t(2, eps=1.5)


def test_loss_on_real_model_is_near_log_vocab_at_init():
    from sinkdlm import DiffusionLM, ModelConfig

    cfg = ModelConfig.from_preset("tiny", vocab_size=256, num_sink_tokens=1)
    model = DiffusionLM(cfg)
    x0 = torch.randint(0, 255, (4, 64))
    out = diffusion_loss(model, x0, MaskNoise(t=torch.ones(4)))  # all masked, weight 1: plain mean CE
    assert out.loss.item() == pytest.approx(math.log(256), rel=0.05)
    out.loss.backward()
    assert model.sink_embeddings.grad is not None and model.sink_embeddings.grad.abs().sum() > 0


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("sinks", [0, 1])
def test_head_on_masked_positions_only_equals_the_full_head(shift, sinks):
    """The loss runs the LM head only on the positions it reads; value and gradient equal eq. 3-4
    computed from the full `[B, L, V]` logits (written out here)."""
    from sinkdlm import DiffusionLM, ModelConfig

    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                    mask_token_id=49, num_sink_tokens=sinks, shift_logits=shift))
    x0 = torch.randint(0, 49, (3, 12))
    t = torch.tensor([0.3, 0.6, 0.9])
    out = diffusion_loss(model, x0, MaskNoise(t=t, generator=torch.Generator().manual_seed(1)))
    grads = torch.autograd.grad(out.loss, model.lm_head.weight)[0]
    xt, masked = forward_mask(x0, t, 49, torch.ones_like(x0, dtype=torch.bool) if not shift else
                              torch.ones_like(x0, dtype=torch.bool).index_fill_(1, torch.tensor([0]), False),
                              generator=torch.Generator().manual_seed(1))
    logits = model(xt).logits
    if shift:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
    want = ((ce * masked).sum(-1) / t / 12).mean()
    # the same forward; the cross-entropy over 49 classes and the mean over 36 tokens summed in another order
    assert_fp_close(out.loss, want, n=x0.numel() * 49, depth=2)
    assert_fp_close(grads, torch.autograd.grad(want, model.lm_head.weight)[0], n=x0.numel() * 49, depth=2)
