"""CPU proxies of the sink's GPU properties: op counts, one dtype into SDPA, the fused kernel, no host sync.

Each test pins a property whose failure made a GPU step slow (launch-bound sink stream, autocast
copies of q and k, the unfused math kernel for the virtual column, host syncs in the loss), measured
here without a GPU: a `TorchDispatchMode` sees every ATen op (each non-view op a kernel launch on a
GPU) and a spy sees what reaches `F.scaled_dot_product_attention`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sinkdlm import DiffusionLM, ModelConfig, generate
from sinkdlm.diffusion.loss import diffusion_loss, masked_loss, plan_masks
from sinkdlm.diffusion.noise import MaskNoise
from helpers import OpCounter

VARIANTS = {
    "1 sink": dict(num_sink_tokens=1),
    "1 sink, end": dict(num_sink_tokens=1, sink_position="end"),
    "2 sinks": dict(num_sink_tokens=2),
    "4 sinks, end": dict(num_sink_tokens=4, sink_position="end"),
    "zero-value sink": dict(num_sink_tokens=1, sink_zero_value=True),
    "sink_logit": dict(sink_logit=True),
    "softmax_one": dict(softmax_one=True),
    "gated": dict(gated_attention=True),
    "1 sink + sink_logit": dict(num_sink_tokens=1, sink_logit=True),
}


def tiny(**switches) -> ModelConfig:
    return ModelConfig.from_preset("tiny", **switches)


def step_ops(switches: dict) -> OpCounter:
    torch.manual_seed(0)
    model = DiffusionLM(tiny(**switches)).train()
    ids = torch.randint(0, 100, (2, 64), generator=torch.Generator().manual_seed(0))
    with OpCounter() as ops:
        logits = model(ids).logits
        F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    return ops


@pytest.mark.parametrize("name", [k for k in VARIANTS if k != "1 sink + sink_logit"])  # the paper's variants
def test_a_training_step_of_every_sink_variant_dispatches_at_most_115_percent_of_vanilla(name):
    # The sink used to run as a second, batch-1 stream in every layer: 1.77x vanilla's ops.
    vanilla, variant = step_ops({}), step_ops(VARIANTS[name])
    assert variant.total <= 1.15 * vanilla.total, (variant.total, vanilla.total)
    assert variant.kernels <= 1.16 * vanilla.kernels, (variant.kernels, vanilla.kernels)  # views launch nothing


class SdpaSpy:
    def __init__(self, monkeypatch):
        self.calls = []
        real = F.scaled_dot_product_attention

        def spy(q, k, v, attn_mask=None, **kw):
            self.calls.append((q.dtype, k.dtype, v.dtype, attn_mask, q.shape[-1], k.shape[-1], v.shape[-1]))
            return real(q, k, v, attn_mask=attn_mask, **kw)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)


@pytest.mark.parametrize("name", ["vanilla", "1 sink", "zero-value sink", "sink_logit", "softmax_one", "gated",
                                  "1 sink + sink_logit"])
@pytest.mark.parametrize("mode", ["train", "eval", "decode"])
def test_under_bf16_autocast_q_k_and_v_reach_sdpa_in_bf16_with_no_float_mask(name, mode, monkeypatch):
    # train: the sinks ride in the batch; eval: their cached keys/values are joined; decode: `generate`'s
    # static KV cache, allocated under the autocast (issue 44: the zero-value sink's v was float32)
    spy = SdpaSpy(monkeypatch)
    torch.manual_seed(0)
    model = DiffusionLM(tiny(**VARIANTS.get(name, {}))).train(mode == "train")
    ids = torch.randint(0, 100, (2, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if mode == "decode":
            generate(model, ids[:, :8], gen_length=8, steps=2, block_length=4, cache="dual")
        else:
            logits = model(ids).logits
    if mode == "train":
        logits.float().sum().backward()
    assert len(spy.calls) == model.config.num_hidden_layers * (2 if mode == "decode" else 1)
    for qd, kd, vd, mask, hq, hk, hv in spy.calls:
        assert (qd, kd, vd) == (torch.bfloat16,) * 3  # RoPE's result in the activation dtype: no autocast copy
        assert mask is None or mask.dtype == torch.bool
        assert hq == hk == hv and hq % 8 == 0  # equal head dims, a multiple of 8: what fused kernels take


@pytest.mark.parametrize("name", ["vanilla", "1 sink", "sink_logit", "softmax_one"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_attention_runs_the_fused_kernel_not_the_math_path(name, padded):
    # SDPA's math path dispatches an explicit softmax; the fused CPU kernel is one op.
    torch.manual_seed(0)
    model = DiffusionLM(tiny(**VARIANTS.get(name, {}))).train()
    ids = torch.randint(0, 100, (2, 32))
    mask = torch.ones(2, 32, dtype=torch.bool)
    if padded:
        mask[1, :5] = False
    with OpCounter() as ops:
        model(ids, attention_mask=mask if padded else None).logits.sum().backward()
    layers = model.config.num_hidden_layers
    assert ops.ops["_scaled_dot_product_flash_attention_for_cpu"] == layers
    assert ops.ops["_softmax"] == 0 and ops.ops["_safe_softmax"] == 0


@pytest.mark.parametrize("switches", [dict(), dict(num_sink_tokens=1), dict(sink_logit=True)], ids=str)
@pytest.mark.parametrize("shift", [False, True], ids=["plain", "shift"])
def test_a_loss_step_planned_on_the_host_has_no_host_syncing_op(switches, shift):
    torch.manual_seed(0)
    model = DiffusionLM(tiny(**switches)).train()
    x0 = torch.randint(0, 100, (4, 48))
    gen = torch.Generator().manual_seed(0)
    plan = plan_masks(x0, MaskNoise(generator=gen), mask_id=model.config.mask_token_id, shift_logits=shift)
    with OpCounter() as ops:
        out = masked_loss(model, plan)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert not ops.syncs, dict(ops.syncs)
    # the same loss, to the bit, as diffusion_loss drawing the same noise itself (eq. 3-4 unchanged)
    again = diffusion_loss(model, x0, MaskNoise(generator=torch.Generator().manual_seed(0)), shift_logits=shift)
    assert torch.equal(out.loss, again.loss)


def test_the_counter_sees_what_syncs():
    x = torch.arange(6.0)
    with OpCounter() as ops:
        x[x > 2]  # boolean indexing: the size depends on the data
        x.nonzero()
        x.sum().item()
        x[torch.tensor([0, 2])]  # integer indexing: no sync
    assert ops.syncs["index[bool]"] == 1 and ops.syncs["nonzero"] == 1 and ops.syncs["_local_scalar_dense"] == 1
    assert sum(ops.syncs.values()) == 3


@pytest.mark.parametrize("name", [k for k in VARIANTS if "sink" in k] + ["vanilla"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_sinks_riding_in_the_sequence_equal_the_constant_sink_path_in_fp64(name, padded):
    # Training runs the sinks as rows of the batch; inference joins their cached keys/values. Same model.
    torch.manual_seed(0)
    model = DiffusionLM(tiny(**VARIANTS.get(name, {}))).double()
    with torch.no_grad():
        for layer in model.layers:
            if layer.self_attn.sink_logit is not None:
                layer.self_attn.sink_logit.normal_(0.0, 1.0)
    ids = torch.randint(0, 100, (3, 12))
    mask = None
    if padded:
        mask = torch.ones(3, 12, dtype=torch.bool)
        mask[0, :4] = False
        mask[2, 9:] = False
    rows = model.train()(ids, attention_mask=mask).logits
    with torch.no_grad():
        constant = model.eval()(ids, attention_mask=mask).logits
    real = mask if mask is not None else torch.ones(3, 12, dtype=torch.bool)
    torch.testing.assert_close(rows.detach()[real], constant[real], rtol=1e-10, atol=1e-10)
