"""`sinkdlm convert` on a diffusion LM: the same model plus sinks (issue 52).

A tiny sinkdlm DLM and a tiny LLaDA directory are converted with `--num-sink-tokens`: every tensor of the
input is in the output bit for bit, the new sink rows are drawn by `--seed`, and with the sink's key
masked out of every layer (`Probe.key_masks`) the logits are the input model's. Refusals come before any
weight is read.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.data import train_bpe_tokenizer
from sinkdlm.model.hf import convert_hf_checkpoint
from sinkdlm.model.probe import Probe

CFG = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           intermediate_size=48, max_position_embeddings=64, initializer_range=0.2)
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "we sing and we dance"] * 20


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, 300)


def write_dlm(path, tok, **kw):
    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig(**{**CFG, "mask_token_id": tok.mask_token_id, **kw}))
    model.save_pretrained(path, tokenizer=tok)
    return path


def write_llada(path, tok):
    """A LLaDA directory (OLMo names, its config.json): what `sinkdlm convert` reads as a LLaDA model."""
    gen = torch.Generator().manual_seed(5)
    d, kv, mlp, v = 32, 16, 48, 300
    r = lambda *s: 0.2 * torch.randn(*s, generator=gen)  # noqa: E731
    t = {"model.transformer.wte.weight": r(v, d), "model.transformer.ln_f.weight": 1 + r(d),
         "model.transformer.ff_out.weight": r(v, d)}
    for i in range(2):
        p = f"model.transformer.blocks.{i}."
        t.update({p + "attn_norm.weight": 1 + r(d), p + "ff_norm.weight": 1 + r(d), p + "q_proj.weight": r(d, d),
                  p + "k_proj.weight": r(kv, d), p + "v_proj.weight": r(kv, d), p + "attn_out.weight": r(d, d),
                  p + "ff_proj.weight": r(mlp, d), p + "up_proj.weight": r(mlp, d), p + "ff_out.weight": r(d, mlp)})
    path.mkdir(parents=True)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({
        "model_type": "llada", "d_model": d, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "mlp_hidden_size": mlp,
        "mlp_ratio": 4, "rope_theta": 5000.0, "rms_norm_eps": 1e-5, "include_bias": False, "include_qkv_bias": False,
        "embedding_size": v, "vocab_size": len(tok), "mask_token_id": tok.mask_token_id, "block_type": "llama",
        "weight_tying": False, "max_sequence_length": 64, "layer_norm_type": "rms", "activation_type": "silu",
        "rope": True, "alibi": False, "scale_logits": False, "attention_layer_norm": False, "block_group_size": 1,
        "input_emb_norm": False, "multi_query_attention": None, "rope_full_precision": True, "pad_token_id": 1,
        "eos_token_id": 0, "torch_dtype": "float32"}))
    tok.save_pretrained(str(path))
    return path


def logits_without_sink(model, ids):
    """Logits with every layer's sink keys masked out (`Probe.key_masks`, True = may be attended to)."""
    n, l = model.config.num_sink_tokens, ids.shape[1]
    keep = torch.ones(ids.shape[0], model.config.num_attention_heads, n + l, dtype=torch.bool)
    keep[..., model.config.sink_position == "front" and slice(0, n) or slice(l, l + n)] = False
    return model(ids, probe=Probe(key_masks=[keep] * model.config.num_hidden_layers)).logits


@pytest.mark.parametrize("source", ["sinkdlm", "llada"])
@pytest.mark.parametrize("n,position,zero_value", [(1, "front", False), (2, "end", True)])
def test_sinks_added_to_a_dlm_keep_every_weight_and_the_function(tmp_path, tok, source, n, position, zero_value):
    src = write_dlm(tmp_path / "in", tok) if source == "sinkdlm" else write_llada(tmp_path / "in", tok)
    before = DiffusionLM.from_pretrained(src)
    convert_hf_checkpoint(src, tmp_path / "out", seed=4, num_sink_tokens=n, sink_position=position,
                          sink_zero_value=zero_value)
    after = DiffusionLM.from_pretrained(tmp_path / "out")
    c = after.config
    assert (c.num_sink_tokens, c.sink_position, c.sink_zero_value) == (n, position, zero_value)
    assert c.mask_token_id == before.config.mask_token_id and c.shift_logits == before.config.shift_logits
    old, new = before.state_dict(), after.state_dict()
    assert set(new) - set(old) == {"sink_embeddings"}
    assert all(torch.equal(old[k], new[k]) for k in old), "a weight of the input changed"
    # the sinks as conversion draws them: N(mean, std) per dimension of the embedding rows, by --seed
    e = old["embed_tokens.weight"].float()
    want = e.mean(0) + e.std(0) * torch.randn(n, e.shape[1], generator=torch.Generator().manual_seed(4))
    assert torch.equal(new["sink_embeddings"], want)
    ids = torch.randint(3, 290, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(logits_without_sink(after, ids), before(ids).logits, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(after(ids).logits, before(ids).logits, atol=1e-4)  # the sink is attended to
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_a_sink_logit_added_to_a_dlm_is_drawn_by_the_seed(tmp_path, tok):
    src = write_dlm(tmp_path / "in", tok, num_sink_tokens=1)
    convert_hf_checkpoint(src, tmp_path / "out", seed=2, num_sink_tokens=1, sink_logit=True)
    old, new = DiffusionLM.from_pretrained(src).state_dict(), DiffusionLM.from_pretrained(tmp_path / "out").state_dict()
    assert all(torch.equal(old[k], new[k]) for k in old)
    gen = torch.Generator().manual_seed(2)
    for i in range(2):
        assert torch.equal(new[f"layers.{i}.self_attn.sink_logit"], 0.2 * torch.randn(4, generator=gen))


@pytest.mark.parametrize("have,ask,match", [
    ({}, {}, "has these switches already"),
    ({"num_sink_tokens": 1}, {"num_sink_tokens": 2}, "already has num_sink_tokens=1"),
    ({"num_sink_tokens": 1}, {"sink_position": "end"}, "already has sink_position='front'"),
    ({}, {"num_sink_tokens": 1, "shift_logits": True}, "keeps its own head"),
])
def test_refusals_before_any_weight_is_read(tmp_path, tok, have, ask, match):
    src = write_dlm(tmp_path / "in", tok, **have)
    (src / "model.safetensors").write_bytes(b"not read")  # any read would fail otherwise
    with pytest.raises(ValueError, match=match):
        convert_hf_checkpoint(src, tmp_path / "out", **ask)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mask_in_vocab", [False, True])
def test_sinks_added_in_one_conversion_or_two_are_bitwise_the_same(tmp_path, tok, mask_in_vocab):
    """AR -> DLM + sink in one `convert`, or AR -> DLM, then DLM -> DLM + sink, with the same seed: the same sink
    rows bit for bit (both draw from the trained rows, never the [MASK] row the conversion set: appended after the
    vocabulary, or a spare row inside it); and no loader argument saved as tokenizer configuration."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sinkdlm.io.files import LOADER_ARGS

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if mask_in_vocab:  # the [MASK] string is in the vocabulary, but no mask token is declared: a spare row
        plain = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, eos_token=tok.eos_token)
    else:  # no [MASK] at all: the conversion appends its row after the vocabulary
        words = sorted({w for t in TEXTS for w in t.split()} | {"<eos>"})
        backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        plain = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    ar = tmp_path / "ar"
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(plain), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=64)).save_pretrained(str(ar))
    plain.save_pretrained(str(ar))
    one = convert_hf_checkpoint(ar, tmp_path / "one", seed=7, num_sink_tokens=2)
    convert_hf_checkpoint(ar, tmp_path / "dlm", seed=7)
    two = convert_hf_checkpoint(tmp_path / "dlm", tmp_path / "two", seed=7, num_sink_tokens=2)
    assert torch.equal(one.sink_embeddings, two.sink_embeddings)  # same rows, same kernels: the same draw
    mask_id = one.config.mask_token_id
    assert mask_id == two.config.mask_token_id and (mask_id == tok.mask_token_id if mask_in_vocab else mask_id >= len(plain))
    for out in ("one", "dlm", "two"):
        saved = tmp_path / out / "tokenizer_config.json"
        if saved.is_file():
            assert not set(LOADER_ARGS) & set(json.loads(saved.read_text())), out
