"""Block-diffusion checkpoints opened directly as block models (`sinkdlm.model.formats`, docs/method.md §10, §13).

Tiny random checkpoints are written here in the layouts of the released models, with their config fields:
  * Fast-dLLM v2: a `Qwen2ForCausalLM` (Qwen2.5 names, QKV bias) saved with `model_type: "Fast_dLLM_Qwen"`,
    `architectures: ["Fast_dLLM_QwenForCausalLM"]` and its block size as `bd_size`; its logits are shifted;
  * SDAR: a `Qwen3ForCausalLM` (Qwen3 names, a per-head RMSNorm of q and k) saved with `model_type: "sdar"`,
    `architectures: ["SDARForCausalLM"]` and `block_size`; its logits are not shifted.
Both are checked against transformers' own Qwen2 / Qwen3 forward on the same weights under an explicit
block-causal mask built here (query i sees key j when j // b <= i // b, blocks counted from position 0, as
both models' inference masks are). Their reference decoders need their remote modeling code (extra forward
arguments of their own), which is never run, so neither is compared token for token with its own code: "mapped
only". SDAR's decoding rule (greedy `low_confidence_static`) is re-implemented here over transformers' Qwen3
without a cache and sinkdlm's block decoding gives its tokens, in float64.
Each checkpoint carries an `auto_map` to Python files that would leave a marker when imported.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from sinkdlm import DiffusionLM
from sinkdlm.checkpoint.manager import load_model_and_tokenizer
from sinkdlm.data.tokenizer import train_bpe_tokenizer
from sinkdlm.diffusion.block import block_diffusion_loss
from sinkdlm.diffusion.likelihood import loglikelihood
from sinkdlm.diffusion.sampling import generate
from sinkdlm.io.files import CheckpointError

from numerics import assert_model_close

V = 320
B = 4  # the block size written into the tiny checkpoints
TEXTS = ["the quick brown fox jumps over the lazy dog, and the cat sleeps. " * 30,
         "to be or not to be: that is the question; whether tis nobler. " * 30]
EVIL = "import pathlib\npathlib.Path(__file__).with_name('EXECUTED').write_text('x')\nraise SystemExit('ran')\n"
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rope_theta=5000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=False, attn_implementation="eager", bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, 300)  # <|endoftext|> 0, <|pad|> 1, [MASK] 2


def hf_model(layout: str):
    """A tiny transformers model of the layout's architecture, every weight random (norms near 1, QK norms too)."""
    if layout == "fast_dllm_v2":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON))
    else:  # Qwen3: head_dim given explicitly (its default is 128), the natural hidden / heads
        model = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=8, attention_bias=False))
    gen = torch.Generator().manual_seed(21 + (layout == "sdar"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.2 * torch.randn(*p.shape, generator=gen)
            p.copy_(1 + noise if "norm" in name else 1.5 * noise)
    return model.eval()


def save_layout(model, path, tok, layout: str, **changes):
    """Save `model` as the released checkpoints are laid out: their model_type, architectures, block-size key."""
    model.save_pretrained(str(path), max_shard_size="40KB")  # sharded, with an index
    cfg = json.loads((path / "config.json").read_text())
    if layout == "fast_dllm_v2":
        cfg.update(model_type="Fast_dLLM_Qwen", architectures=["Fast_dLLM_QwenForCausalLM"], bd_size=B)
    else:
        cfg.update(model_type="sdar", architectures=["SDARForCausalLM"], block_size=B)
    cfg.update(mask_token_id=tok.mask_token_id, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilModel"})
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    for name in ("modeling_evil.py", "configuration_evil.py"):
        (path / name).write_text(EVIL)
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module", params=["fast_dllm_v2", "sdar"])
def layout(request, tmp_path_factory, tok):
    hf = hf_model(request.param)
    return request.param, hf, save_layout(hf, tmp_path_factory.mktemp(request.param), tok, request.param)


def ids(b=2, n=11, seed=1):
    return torch.randint(3, 290, (b, n), generator=torch.Generator().manual_seed(seed))


def block_causal_additive(n: int, block: int) -> torch.Tensor:
    """`[1, 1, n, n]` float mask, 0 where query i may see key j (j's block not after i's), -inf elsewhere."""
    blocks = torch.arange(n) // block
    allowed = blocks[:, None] >= blocks[None, :]
    return torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]


def test_block_layouts_open_as_block_models_with_transformers_logits(layout, tok):
    name, hf, path = layout
    assert len(list(path.glob("model-*.safetensors"))) > 1
    model, tokenizer = load_model_and_tokenizer(path, device="cpu")
    cfg = model.config
    assert cfg.block_size == B and not cfg.causal and cfg.extra["source_format"] == name
    assert cfg.mask_token_id == tokenizer.mask_token_id == tok.mask_token_id
    assert (cfg.shift_logits, cfg.qkv_bias, cfg.qk_norm) == ((True, True, False) if name == "fast_dllm_v2"
                                                             else (False, False, True))
    x = ids()
    with torch.no_grad():  # transformers' forward under the block-causal mask (rows 2 and 3 of the 11 tokens: 3 blocks)
        ref = hf(input_ids=x, attention_mask=block_causal_additive(x.shape[1], B).expand(2, 1, -1, -1)).logits
        ours = model(x).logits
    assert_model_close(ours, ref, cfg)  # transformers' kernels: rule 2
    # the block structure is the model's: a token changed in the last block leaves the earlier blocks' logits alone
    y = x.clone()
    y[:, -1] = 7
    with torch.no_grad():
        changed = model(y).logits
    assert torch.equal(changed[:, :8], ours[:, :8])  # same kernels, same shapes, the first two blocks never see it
    assert not torch.equal(changed[:, 8:], ours[:, 8:])
    assert not (path / "EXECUTED").exists()


def test_sdar_decodes_and_scores_fast_dllm_v2_refuses_until_shifted_blocks(layout, tok):
    name, _, path = layout
    model = DiffusionLM.from_pretrained(path)
    if name == "fast_dllm_v2":  # shifted block decoding is not written yet: refused in one line, before any pass
        for call in (lambda: generate(model, [5, 6, 7], gen_length=8, steps=8),
                     lambda: loglikelihood(model, [5, 6], [7, 8], mc_num=2, seed=0),
                     lambda: block_diffusion_loss(model, ids(n=8), pad_id=0)):
            with pytest.raises(ValueError, match="shifted logits.*Fast-dLLM v2"):
                call()
        return
    out = generate(model, [5, 6, 7], gen_length=8, steps=8)  # the prompt ends inside the first block
    assert out.shape == (1, 11) and torch.equal(out[0, :3], torch.tensor([5, 6, 7]))
    assert not (out == model.config.mask_token_id).any()  # every generated column is filled
    ll = loglikelihood(model, [5, 6], [7, 8], mc_num=4, seed=0)
    assert torch.isfinite(torch.as_tensor(ll.logprob)).all() and float(ll.logprob) < 0
    loss = block_diffusion_loss(model, ids(n=8), pad_id=0)
    assert torch.isfinite(loss.loss)


def sdar_rule_reference(hf, prompt: list[int], gen: int, steps: int, mask_id: int) -> list[int]:
    """SDAR's decoding rule, written here from its description (`low_confidence_static`, greedy: each step reveals
    the block's masked position whose argmax token is most probable) over transformers' model, every pass over
    the whole sequence so far under the block-causal mask (what its cache of finished blocks computes): blocks
    counted from position 0, the prompt's last partial block completed first, `steps` steps a block."""
    total = -(-(len(prompt) + gen) // B) * B
    x = torch.tensor(prompt + [mask_id] * (total - len(prompt)))
    for lo in range(len(prompt) // B * B, total, B):
        hi = lo + B
        quota = [B // steps + (i < B % steps) for i in range(steps)]  # an even split, the remainder first
        for k in quota:
            masked = x[lo:hi] == mask_id
            if not masked.any():
                break
            with torch.no_grad():
                logits = hf(input_ids=x[None, :hi], attention_mask=block_causal_additive(hi, B).double()).logits[0, lo:hi]
            conf, tok = torch.softmax(logits, -1).max(-1)
            order = torch.where(masked, conf, -torch.inf).argsort(descending=True)[:min(k, int(masked.sum()))]
            x[lo + order] = tok[order]
    return x[: len(prompt) + gen].tolist()


def test_sdar_decoding_matches_its_rule_token_for_token(tmp_path, tok):
    """Float64 on both sides (no argmax near-tie can flip): sinkdlm's block decoding (static cache, one pass over
    the block a step) gives the tokens of SDAR's rule re-implemented over transformers' Qwen3 without a cache."""
    hf = hf_model("sdar").double()
    path = save_layout(hf, tmp_path, tok, "sdar")
    model = DiffusionLM.from_pretrained(path, dtype=torch.float64)
    for prompt, gen in (([5, 6, 7, 8, 9, 10], 10), ([11, 12, 13, 14], 8), ([3], 7)):
        blocks = -(-(len(prompt) % B + gen) // B)  # the blocks the answer spans (the prompt's last partial one too)
        ours = generate(model, prompt, gen_length=gen, steps=B * blocks)[0].tolist()
        assert ours == sdar_rule_reference(hf, prompt, gen, B, tok.mask_token_id), (prompt, gen)


@pytest.mark.parametrize("name,key,released", [("fast_dllm_v2", "bd_size", 32), ("sdar", "block_size", 4)])
@pytest.mark.parametrize("value", [None, 0, "32"])
def test_a_block_layout_without_its_block_size_is_refused_before_any_weight(tmp_path, tok, name, key, released, value):
    path = save_layout(hf_model(name), tmp_path, tok, name, **{key: value})
    for weights in path.glob("*.safetensors*"):
        weights.unlink()  # the refusal comes from config.json alone: no weight file is needed to get it
    with pytest.raises(CheckpointError, match=f"block size.*{key}.*{released}") as err:
        DiffusionLM.from_pretrained(path)
    assert "\n" not in str(err.value)


def test_block_layouts_refuse_what_they_cannot_compute(tmp_path, tok):
    # a decoupled head_dim (SDAR-4B's 128 over hidden 2560 / 32 heads) is not computed by the sinkdlm model
    path = save_layout(hf_model("sdar"), tmp_path / "hd", tok, "sdar", head_dim=16)
    with pytest.raises(CheckpointError, match="head_dim=16"):
        DiffusionLM.from_pretrained(path)
    # a mask id outside the vocabulary (the released one, 151669, in this 320-token model) is refused by name
    path = save_layout(hf_model("sdar"), tmp_path / "mask", tok, "sdar", mask_token_id=None)
    with pytest.raises(CheckpointError, match="mask_token_id.*151669"):
        DiffusionLM.from_pretrained(path)
    # SDAR's mixture-of-experts variant is another model type, not mapped
    path = save_layout(hf_model("sdar"), tmp_path / "moe", tok, "sdar", model_type="sdar_moe")
    with pytest.raises(CheckpointError, match="sdar_moe.*not supported"):
        DiffusionLM.from_pretrained(path)


def test_qk_norm_round_trips_through_a_sinkdlm_checkpoint(layout, tmp_path):
    name, _, path = layout
    model = DiffusionLM.from_pretrained(path)
    model.save_pretrained(tmp_path / "saved")
    again = DiffusionLM.from_pretrained(tmp_path / "saved")
    assert again.config.block_size == B and again.config.qk_norm == model.config.qk_norm
    x = ids()
    with torch.no_grad():
        assert torch.equal(again(x).logits, model(x).logits)  # a save/load round trip: the same weights and kernels
