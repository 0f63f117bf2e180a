"""Hugging Face conversion (`sinkdlm.model.hf`) checked against `transformers` itself (litgpt style).

A random tiny `Qwen2ForCausalLM` / `LlamaForCausalLM` is saved with `save_pretrained`, converted
with `convert_hf_checkpoint`, loaded with `DiffusionLM.from_pretrained`, and its logits are
compared with the original HF model run under the *same* attention pattern:
  * causal (HF default) vs `model(ids, causal=True)`;
  * bidirectional: HF with an explicit 4-D additive mask of zeros (a 4-D mask is used as-is by
    `transformers.masking_utils`, so nothing is causal any more);
  * sinks (docs/method.md §3, eq. 5-7): HF on `inputs_embeds = [sink; embed(ids)]` (or `[embed(ids); sink]`)
    with the eq. 6 bias (sink rows see only themselves), positions 0..L+n-1 in layout order,
    comparing content rows only.
The conversion adds a `[MASK]` row, so only the original vocabulary columns are compared.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import sinkdlm  # noqa: F401  (registers the checkpoint format)
from sinkdlm import CheckpointError, DiffusionLM
from sinkdlm.model.hf import convert_hf_checkpoint

from numerics import assert_fp_close, assert_model_close

VOCAB = 128


# ----------------------------------------------------------------------------- helpers
def hf_model(arch: str = "qwen2", tie: bool = False, attn: str = "eager", **kw):
    """A random tiny HF causal LM with weights far from their (near-zero) default init."""
    common = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=tie, rope_theta=5000.0, rms_norm_eps=1e-5, attn_implementation=attn,
    )
    common.update(kw)
    cfg = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    model = (Qwen2ForCausalLM if arch == "qwen2" else LlamaForCausalLM)(cfg)
    gen = torch.Generator().manual_seed(17 + 2 * (arch == "llama") + int(tie))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # RMSNorm gains around 1, not 0
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            else:  # includes the Qwen2 q/k/v biases (zero-initialised by HF)
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    return model.eval()


def save_hf(model, path, **kw):
    model.save_pretrained(str(path), **kw)
    return path


def ids_batch(b: int = 2, l: int = 11, seed: int = 1):
    return torch.randint(0, VOCAB, (b, l), generator=torch.Generator().manual_seed(seed))


def additive(allowed: torch.Tensor) -> torch.Tensor:
    """bool `[S, S]` (True = attend) -> additive float mask `[1, 1, S, S]` for HF."""
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]


def eq6_allowed(seq_len: int, n: int, position: str) -> torch.Tensor:
    """eq. 6 written out: a sink query sees only itself, every other query sees everything."""
    s = seq_len + n
    sinks = range(n) if position == "front" else range(seq_len, s)
    allowed = torch.ones(s, s, dtype=torch.bool)
    for i in sinks:
        allowed[i] = False
        allowed[i, i] = True
    return allowed


@torch.no_grad()
def hf_logits(model, ids=None, *, embeds=None, allowed=None, positions=None):
    kw = {}
    if allowed is not None:
        kw["attention_mask"] = additive(allowed).expand((ids if ids is not None else embeds).shape[0], -1, -1, -1)
    if positions is not None:
        kw["position_ids"] = positions
    if embeds is not None:
        return model(inputs_embeds=embeds, **kw).logits
    return model(input_ids=ids, **kw).logits


def convert(src, out, **kw) -> DiffusionLM:
    convert_hf_checkpoint(src, out, **kw)
    return DiffusionLM.from_pretrained(out)


# ----------------------------------------------------------------------------- parity
ARCHS = [("qwen2", False), ("qwen2", True), ("llama", False), ("llama", True)]


@pytest.mark.parametrize("arch,tie", ARCHS, ids=[f"{a}-{'tied' if t else 'untied'}" for a, t in ARCHS])
def test_causal_and_bidirectional_parity(tmp_path, arch, tie):
    hf = hf_model(arch, tie)
    ours = convert(save_hf(hf, tmp_path / "hf"), tmp_path / "dlm")
    assert ours.config.tie_word_embeddings == tie
    assert ours.config.qkv_bias == (arch == "qwen2")
    assert ours.config.rope_theta == 5000.0 and ours.config.rms_norm_eps == 1e-5
    ids = ids_batch()
    with torch.no_grad():
        ours_causal = ours(ids, causal=True).logits
        ours_bidir = ours(ids).logits
    assert ours_causal.shape == (2, 11, VOCAB + 1)  # + the [MASK] row
    assert_model_close(ours_causal[..., :VOCAB], hf_logits(hf, ids), ours.config)  # transformers' kernels
    full = torch.ones(11, 11, dtype=torch.bool)
    ref_bidir = hf_logits(hf, ids, allowed=full)
    assert_model_close(ours_bidir[..., :VOCAB], ref_bidir, ours.config)
    # The two patterns really differ (otherwise the test would prove nothing).
    assert not torch.allclose(ref_bidir, hf_logits(hf, ids), atol=1e-3)


def test_bidirectional_parity_with_sdpa_and_left_padding(tmp_path):
    """HF sdpa backend; a left-padded row: our 2-D padding mask vs an HF 4-D mask + positions."""
    hf = hf_model("qwen2", attn="sdpa")
    ours = convert(save_hf(hf, tmp_path / "hf"), tmp_path / "dlm")
    ids = ids_batch(2, 9)
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, :3] = False  # row 1: 3 pad tokens on the left
    allowed = pad[:, None, None, :].expand(2, 1, 9, 9)  # nobody attends to padding
    bias = torch.zeros(2, 1, 9, 9).masked_fill(~allowed, float("-inf"))
    positions = (pad.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=bias, position_ids=positions).logits
        got = ours(ids, attention_mask=pad).logits[..., :VOCAB]
    assert_model_close(got[pad], ref[pad], ours.config)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("position,n", [("front", 1), ("end", 1), ("front", 2), ("end", 4)])
def test_sink_parity_with_hf_on_joined_sequence(tmp_path, arch, position, n):
    """eq. 5-7: HF on [s; X] / [X; s] with the eq. 6 bias == our sink fast path, content rows."""
    hf = hf_model(arch)
    ours = convert(save_hf(hf, tmp_path / "hf"), tmp_path / "dlm", num_sink_tokens=n, sink_position=position)
    assert ours.config.num_sink_tokens == n and ours.config.sink_position == position
    b, l = 2, 10
    ids = ids_batch(b, l)
    with torch.no_grad():
        content = hf.get_input_embeddings()(ids)  # [B, L, d]
        sink = ours.sink_embeddings[None].expand(b, -1, -1)  # [B, n, d]
        joined = torch.cat([sink, content] if position == "front" else [content, sink], dim=1)
        positions = torch.arange(l + n)[None].expand(b, -1)  # layout order, as the reference code
        ref = hf_logits(hf, embeds=joined, allowed=eq6_allowed(l, n, position), positions=positions)
        ref = ref[:, n:] if position == "front" else ref[:, :l]
        got = ours(ids).logits[..., :VOCAB]
        with ours.sink_cache_mode(False):
            got_nocache = ours(ids).logits[..., :VOCAB]
    assert_model_close(got, ref, ours.config)
    assert_model_close(got_nocache, ref, ours.config)
    # And the sink changes the output: it is not the vanilla bidirectional model.
    vanilla = hf_logits(hf, ids, allowed=torch.ones(l, l, dtype=torch.bool))
    assert not torch.allclose(got, vanilla, atol=1e-3)


@pytest.mark.parametrize("block_size", [1, 4])
def test_block_model_converted_from_ar_is_hf_under_a_block_causal_mask(tmp_path, block_size):
    """`convert --block-size` (docs/method.md §13): the block model's logits are transformers' under a
    block-causal mask written here; block size 1 is the causal LM itself."""
    hf = hf_model("qwen2")
    ours = convert(save_hf(hf, tmp_path / "hf"), tmp_path / "dlm", block_size=block_size)
    assert ours.config.block_size == block_size and not ours.config.causal
    ids = ids_batch()
    blocks = torch.arange(ids.shape[1]) // block_size
    with torch.no_grad():
        got = ours(ids).logits[..., :VOCAB]
    assert_model_close(got, hf_logits(hf, ids, allowed=blocks[:, None] >= blocks[None, :]), ours.config)
    if block_size == 1:
        assert_model_close(got, hf_logits(hf, ids), ours.config)  # transformers' own causal mask


def test_sharded_safetensors_source(tmp_path):
    hf = hf_model("qwen2", tie=False)
    src = save_hf(hf, tmp_path / "hf", max_shard_size="40KB")
    files = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(files) > 1 and (src / "model.safetensors.index.json").is_file()
    ours = convert(src, tmp_path / "dlm")
    ids = ids_batch()
    with torch.no_grad():
        got = ours(ids, causal=True).logits[..., :VOCAB]
    assert_model_close(got, hf_logits(hf, ids), ours.config)


# ----------------------------------------------------------------------------- converter details
def word_level_tokenizer(n_tokens: int, with_mask: bool = False) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(n_tokens)}
    vocab["[UNK]"] = n_tokens - 1  # reuse the last id: exactly n_tokens entries
    vocab.pop(f"w{n_tokens - 1}")
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    if with_mask:
        fast.add_special_tokens({"mask_token": "[MASK]"})
    return fast


@pytest.mark.parametrize(
    "n_tok,with_mask,grows",
    [
        (100, False, False),  # spare rows past the tokenizer: [MASK] fits, no growth
        (VOCAB, False, True),  # the tokenizer fills the matrix: new rows
        (90, True, False),  # the tokenizer already has a mask token: used as is
    ],
)
def test_mask_token_added_to_tokenizer(tmp_path, n_tok, with_mask, grows):
    from transformers import AutoTokenizer

    hf = hf_model("qwen2", tie=False)
    src = save_hf(hf, tmp_path / "hf")
    word_level_tokenizer(n_tok, with_mask).save_pretrained(str(src))
    # The tokenizer as the converter sees it (AutoTokenizer may add its model type's specials).
    base = AutoTokenizer.from_pretrained(str(src))
    expect_mask = base.mask_token_id if with_mask else len(base)
    ours = convert(src, tmp_path / "dlm")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "dlm"))
    assert tok.mask_token == "[MASK]" and len(tok) == len(base) + (not with_mask)
    assert ours.config.mask_token_id == tok.mask_token_id == expect_mask
    assert tok.convert_tokens_to_ids("[MASK]") == expect_mask
    assert ours.config.vocab_size == max(VOCAB, expect_mask + 1)
    assert (ours.config.vocab_size > VOCAB) == grows
    emb, head = ours.embed_tokens.weight, ours.lm_head.weight
    old_emb = hf.get_input_embeddings().weight
    old_head = hf.get_output_embeddings().weight
    # Every trained row is kept; a newly added [MASK] row — a spare padded row too (Qwen2.5's case)
    # — and every grown row start at the mean of the trained rows (those below the mask id).
    keep = [i for i in range(VOCAB) if with_mask or i != expect_mask]
    torch.testing.assert_close(emb[keep], old_emb[keep], atol=0, rtol=0)  # copied rows: bit for bit
    torch.testing.assert_close(head[keep], old_head[keep], atol=0, rtol=0)
    if not with_mask:
        trained = min(VOCAB, expect_mask)
        assert_fp_close(emb[expect_mask], old_emb[:trained].mean(0), n=trained)  # a mean: one sum of `trained` rows
        assert_fp_close(head[expect_mask], old_head[:trained].mean(0), n=trained)
    if grows:
        new = ours.config.vocab_size - VOCAB
        assert_fp_close(emb[VOCAB:], old_emb.mean(0, keepdim=True).expand(new, -1), n=VOCAB)
        assert_fp_close(head[VOCAB:], old_head.mean(0, keepdim=True).expand(new, -1), n=VOCAB)


def test_no_tokenizer_mask_is_a_new_mean_row(tmp_path):
    hf = hf_model("llama", tie=True)
    ours = convert(save_hf(hf, tmp_path / "hf"), tmp_path / "dlm")
    assert ours.config.vocab_size == VOCAB + 1 and ours.config.mask_token_id == VOCAB
    old = hf.get_input_embeddings().weight
    assert_fp_close(ours.embed_tokens.weight[VOCAB], old.mean(0), n=VOCAB)
    assert ours.lm_head.weight is ours.embed_tokens.weight  # still tied
    assert ours.config.extra["source_model_type"] == "llama"


@pytest.mark.parametrize("n", [0, 1])
def test_gated_conversion_is_the_same_function_at_step_0(tmp_path, n):
    """W_g = 0 -> σ = 1/2 everywhere; o_proj doubled -> exactly the ungated model (eq. 8-10)."""
    src = save_hf(hf_model("qwen2"), tmp_path / "hf")
    plain = convert(src, tmp_path / "plain", num_sink_tokens=n)
    gated = convert(src, tmp_path / "gated", num_sink_tokens=n, gated_attention=True)
    assert gated.config.gated_attention and gated.layers[0].self_attn.g_proj is not None
    assert torch.count_nonzero(gated.layers[0].self_attn.g_proj.weight) == 0
    ids = ids_batch()
    with torch.no_grad():
        assert_model_close(gated(ids).logits, plain(ids).logits, plain.config)  # (0.5 x) and (2 x) add a product
        assert_model_close(gated(ids, causal=True).logits, plain(ids, causal=True).logits, plain.config)


@pytest.mark.parametrize("n", [2, 4])
def test_multiple_sinks_have_distinct_embeddings(tmp_path, n):
    hf = hf_model("qwen2")
    ours = convert(save_hf(hf, tmp_path / "hf"), tmp_path / "dlm", num_sink_tokens=n, seed=3)
    s = ours.sink_embeddings.detach()
    assert s.shape == (n, 64)
    assert torch.cdist(s, s)[~torch.eye(n, dtype=torch.bool)].min() > 1e-2
    # Drawn at the scale of real token embeddings (per-dimension mean/std of the trained rows).
    e = hf.get_input_embeddings().weight.detach()
    assert 0.3 < s.norm(dim=-1).mean() / e.norm(dim=-1).mean() < 3
    # Same seed -> same sinks; the seed is what makes them reproducible.
    again = convert(tmp_path / "hf", tmp_path / "again", num_sink_tokens=n, seed=3)
    torch.testing.assert_close(again.sink_embeddings, ours.sink_embeddings, atol=0, rtol=0)  # the same draw


# ----------------------------------------------------------------------------- converter errors
def test_error_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        convert_hf_checkpoint(tmp_path / "nope", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_error_directory_without_config(tmp_path):
    (tmp_path / "hf").mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        convert_hf_checkpoint(tmp_path / "hf", tmp_path / "out")


def test_error_invalid_config_json(tmp_path):
    src = save_hf(hf_model("qwen2"), tmp_path / "hf")
    (src / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json.*not valid JSON"):
        convert_hf_checkpoint(src, tmp_path / "out")


def test_error_unsupported_model_type(tmp_path):
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32))
    src = save_hf(gpt2, tmp_path / "hf")
    with pytest.raises(CheckpointError, match="'gpt2' is not supported"):
        convert_hf_checkpoint(src, tmp_path / "out")


def test_error_pickle_only_is_never_read(tmp_path):
    hf = hf_model("qwen2")
    src = tmp_path / "hf"
    src.mkdir()
    hf.config.save_pretrained(str(src))
    torch.save(hf.state_dict(), src / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*pickle files are never read"):
        convert_hf_checkpoint(src, tmp_path / "out")


@pytest.mark.parametrize(
    "edit,match",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"head_dim": 8}, "head_dim=8"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "rope scaling 'llama3'"),
        ({"mlp_bias": True}, "mlp_bias"),
    ],
)
def test_error_unsupported_llama_variants(tmp_path, edit, match):
    """Layouts we cannot represent are refused up front, not silently converted to another function."""
    src = save_hf(hf_model("llama"), tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(edit)
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        convert_hf_checkpoint(src, tmp_path / "out")


def test_error_sliding_window_qwen2(tmp_path):
    src = save_hf(hf_model("qwen2"), tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=4, max_window_layers=0,
               layer_types=["sliding_attention", "sliding_attention"])
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="sliding"):
        convert_hf_checkpoint(src, tmp_path / "out")


def test_bad_switch_fails_before_reading_weights(tmp_path, monkeypatch):
    import sinkdlm.model.hf as hfmod

    src = save_hf(hf_model("qwen2"), tmp_path / "hf")

    def boom(*a, **k):
        raise AssertionError("weights were read before the switches were validated")

    monkeypatch.setattr(hfmod, "read_tensors", boom)
    with pytest.raises(ValueError, match="sink_position"):
        convert_hf_checkpoint(src, tmp_path / "out", num_sink_tokens=1, sink_position="middle")
    with pytest.raises(ValueError, match="num_sink_tokens"):
        convert_hf_checkpoint(src, tmp_path / "out", num_sink_tokens=-1)


def test_error_weights_do_not_fit_config(tmp_path):
    """A weight file whose shapes disagree with config.json is a CheckpointError, not a RuntimeError."""
    src = save_hf(hf_model("qwen2"), tmp_path / "hf")
    cfg = json.loads((src / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="mlp"):
        convert_hf_checkpoint(src, tmp_path / "out")

