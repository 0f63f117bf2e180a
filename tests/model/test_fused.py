"""`DiffusionLM.fuse_projections`: one matmul for q/k/v and one for gate/up at inference, nothing else changed.

References: the same model's unpacked forward (separate `nn.Linear`s, the parameters untouched), its
state dict and its checkpoint files before packing.
"""

from __future__ import annotations

import pytest
import torch

from helpers import OpCounter
from sinkdlm import DiffusionLM, ModelConfig

from numerics import assert_model_close


def make(**kw) -> DiffusionLM:
    torch.manual_seed(0)
    base = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=48, max_position_embeddings=64, initializer_range=0.2, num_sink_tokens=1)
    return DiffusionLM(ModelConfig(**{**base, **kw})).double().eval()


@pytest.mark.parametrize("switches", [{}, {"qkv_bias": True}, {"gated_attention": True}], ids=str)
@torch.no_grad()
def test_packed_projections_give_the_same_logits_names_and_values(switches):
    model = make(**switches)
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(1))
    want = model(ids).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = dict(model.named_parameters())
    model.fuse_projections()
    assert_model_close(model(ids).logits, want, model.config)  # float64; one matmul for three: other shapes
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)  # HF names, values
    assert all(p is params[k] for k, p in model.named_parameters())  # the same Parameter objects
    a = model.layers[0].self_attn
    assert a.k_proj.weight.untyped_storage().data_ptr() == a.q_proj.weight.untyped_storage().data_ptr()
    with OpCounter() as packed:
        model(ids)
    model.layers[0].self_attn.qkv = model.layers[0].mlp.gate_up = None  # layer 0 unpacked: 3 more matmuls
    with OpCounter() as apart:
        model(ids)
    matmuls = lambda ops: ops.ops["mm"] + ops.ops["addmm"]  # noqa: E731 (addmm: with a bias)
    assert matmuls(apart) - matmuls(packed) == 3


def test_packed_parameters_train_and_save_as_before(tmp_path):
    model = make()
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(1))
    model.fuse_projections()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    model(ids).logits.sum().backward()  # under autograd the projections run apart: every weight gets a gradient
    assert all(p.grad is not None for p in model.parameters())
    opt.step()  # in place: the packed views see the update
    model.eval()
    with torch.no_grad():
        fused = model(ids).logits
        for layer in model.layers:
            layer.self_attn.qkv = layer.mlp.gate_up = None
        assert_model_close(fused, model(ids).logits, model.config)
    model.fuse_projections()
    model.save_pretrained(tmp_path / "ckpt")
    again = DiffusionLM.from_pretrained(tmp_path / "ckpt")
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())  # a round trip


@torch.no_grad()
def test_a_conversion_after_packing_runs_the_projections_apart_until_packed_again():
    model = make()
    ids = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(1))
    model.fuse_projections()
    model.float()  # new tensors for every parameter: the packed ones are stale
    a = model.layers[0].self_attn
    assert not a.qkv.holds((a.q_proj, a.k_proj, a.v_proj))
    want = model(ids).logits
    assert want.dtype == torch.float32
    model.fuse_projections()
    assert a.qkv.holds((a.q_proj, a.k_proj, a.v_proj)) and a.qkv.weight.dtype == torch.float32
    assert_model_close(model(ids).logits, want, model.config)  # float32 now
