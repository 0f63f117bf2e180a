"""GGUF files as checkpoints (`sinkdlm.io.gguf_file`, `GGUFAdapter`, `sinkdlm.checkpoint.manager`; docs/method.md §10).

Tiny random `LlamaForCausalLM` / `Qwen2ForCausalLM` models are written here as llama.cpp writes
them (its tensor names, the Q/K row permutation of LLaMA files, `tokenizer.ggml.*` metadata from a
small BPE) with gguf-py's `GGUFWriter`. References:
  * F32 files: the HF model itself (the same weights), logits in fp32;
  * quantised files (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and hand-built Q4_K/Q5_K/Q6_K blocks):
    transformers' own GGUF loader (`from_pretrained(gguf_file=...)`), which dequantises with its
    own code, so both the name mapping and the dequantisation are checked against it;
  * the tokenizer: `AutoTokenizer.from_pretrained(gguf_file=...)`.
Bad files are refused with one line before any weight is read.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import quantize
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from helpers import assert_logits_and_greedy_equal_hf
from numerics import assert_model_close
from sinkdlm.data.tokenizer import train_bpe_tokenizer
from sinkdlm.io.files import CheckpointError
from sinkdlm.checkpoint.manager import load_checkpoint, load_model_and_tokenizer, open_source


TEXTS = ["the quick brown fox jumps over the lazy dog, and the cat sleeps. " * 30,
         "to be or not to be: that is the question; whether tis nobler. " * 30]
V = 320


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, 300)


def hf_model(arch: str, d: int = 64, mlp: int = 96, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=V, hidden_size=d, intermediate_size=mlp, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LLaMA Q/K permutation (HF half-split -> interleaved rotary)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def kquant_block(qtype, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random k-quant bytes with sane fp16 scales (random bytes there could be inf/NaN)."""
    from gguf.constants import GGML_QUANT_SIZES

    block, nbytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin first
        data[..., 0:2] = scale
        data[..., 2:4] = scale
    elif qtype == Q.Q6_K:  # d last
        data[..., -2:] = scale
    return data.reshape(rows, -1)


def write_gguf(path, hf, tok, arch: str, qtype=Q.F32, *, tokenizer=True, arch_name=None, pre="default"):
    """The HF model as llama.cpp would store it, linear weights in `qtype` (1-D tensors stay F32)."""
    cfg = hf.config
    w = GGUFWriter(str(path), arch_name or arch)
    w.add_name("tiny")  # llama.cpp always writes it; transformers 4.46's GGUF loader (the reference) requires it
    a = arch_name or arch
    w.add_uint32(f"{a}.vocab_size", cfg.vocab_size)
    w.add_uint32(f"{a}.context_length", cfg.max_position_embeddings)
    w.add_uint32(f"{a}.embedding_length", cfg.hidden_size)
    w.add_uint32(f"{a}.block_count", cfg.num_hidden_layers)
    w.add_uint32(f"{a}.feed_forward_length", cfg.intermediate_size)
    w.add_uint32(f"{a}.attention.head_count", cfg.num_attention_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", cfg.num_key_value_heads)
    w.add_float32(f"{a}.rope.freq_base", cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") and cfg.rope_parameters else cfg.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    w.add_uint32(f"{a}.rope.dimension_count", cfg.hidden_size // cfg.num_attention_heads)
    if tokenizer:
        vocab = tok.get_vocab()
        tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        import json

        merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
        merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([3 if t in tok.all_special_tokens else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_eos_token_id(tok.eos_token_id)
        w.add_pad_token_id(tok.pad_token_id)
    for name, p in hf.state_dict().items():
        x = p.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, i, rest = name.split(".", 3)
            stem, kind = rest.rsplit(".", 1)
            gname = f"blk.{i}.{_NAMES[stem]}.{kind}"
            if arch == "llama" and stem == "self_attn.q_proj":
                x = permute(x, cfg.num_attention_heads)
            elif arch == "llama" and stem == "self_attn.k_proj":
                x = permute(x, cfg.num_key_value_heads)
        if x.ndim == 1 or qtype == Q.F32:
            w.add_tensor(gname, np.ascontiguousarray(x))
        elif qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            w.add_tensor(gname, kquant_block(qtype, *x.shape, seed=len(gname)), raw_dtype=qtype)
        else:
            w.add_tensor(gname, quantize(x, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f32_gguf_logits_and_greedy_equal_the_hf_model(tmp_path, tok, arch):
    hf = hf_model(arch)
    path = write_gguf(tmp_path / "m.gguf", hf, tok, arch)
    model, tokenizer = load_model_and_tokenizer(path, device="cpu")
    assert model.config.causal and model.config.shift_logits and model.config.qkv_bias == (arch == "qwen2")
    assert_logits_and_greedy_equal_hf(model, hf)
    text = "the lazy fox, to be or not"
    assert tokenizer(text, add_special_tokens=False).input_ids == tok(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_quantised_gguf_equals_transformers_gguf_loader(tmp_path, tok, qtype):
    """Dequantised weights, the un-permuted Q/K rows and the logits agree with transformers' GGUF load."""
    d = 256 if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 64  # k-quant blocks span 256 columns
    hf = hf_model("llama", d=d, mlp=256 if d == 256 else 96)
    path = write_gguf(tmp_path / "m.gguf", hf, tok, "llama", qtype)
    ours = load_checkpoint(path)
    pytest.importorskip("accelerate", reason="transformers' GGUF model loader (the reference) needs accelerate")
    ref = LlamaForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf").eval()
    x = torch.randint(3, 290, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        # the same dequantised weights; transformers' kernels (the quantisation is on both sides alike)
        assert_model_close(ours(x).logits, ref(input_ids=x).logits, ours.config)
    q_ref = ref.model.layers[1].self_attn.q_proj.weight
    torch.testing.assert_close(ours.layers[1].self_attn.q_proj.weight, q_ref, atol=0, rtol=0)


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2"])
def test_tokenizer_matches_transformers_gguf_tokenizer(tmp_path, tok, pre):
    """sinkdlm builds the byte-level BPE from the metadata itself (no private transformers code);
    transformers' public GGUF tokenizer is the reference, for GPT-2's split and Llama 3's / Qwen2's."""
    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), tok, "llama", pre=pre)
    _, ours = load_model_and_tokenizer(path, device="cpu")
    ref = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="m.gguf")
    lines = [line for t in TEXTS for line in t.split(", ")] + ["Ünïcödé ✓ 12345\n\tx", "<|endoftext|> mid",
                                                               "it's  2024\r\n\n  end"]
    for line in lines:
        assert ours(line).input_ids == ref(line).input_ids, line
        assert ours.decode(ours(line).input_ids) == ref.decode(ref(line).input_ids), line
    assert ours.eos_token == ref.eos_token == "<|endoftext|>"


def test_gguf_converts_to_a_dlm_with_sinks(tmp_path, tok):
    """`convert` / `train --init-from` take a .gguf: the causal LM's weights, bidirectional, + [MASK] + sink."""
    from sinkdlm.model.hf import convert_hf_checkpoint

    hf = hf_model("llama")
    path = write_gguf(tmp_path / "m.gguf", hf, tok, "llama")
    dlm = convert_hf_checkpoint(path, tmp_path / "dlm", num_sink_tokens=1)
    assert not dlm.config.causal and dlm.config.num_sink_tokens == 1
    torch.testing.assert_close(dlm.layers[0].self_attn.q_proj.weight, hf.model.layers[0].self_attn.q_proj.weight,
                               atol=0, rtol=0)  # F32 weights copied, not computed
    model, tokenizer = load_model_and_tokenizer(tmp_path / "dlm", device="cpu")
    assert tokenizer.mask_token_id == model.config.mask_token_id == tok.convert_tokens_to_ids("[MASK]")


# ----------------------------------------------------------------------------- refusals
def test_unsupported_architecture_is_refused(tmp_path, tok):
    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), tok, "llama", arch_name="falcon")
    with pytest.raises(CheckpointError, match="architecture 'falcon' is not supported") as e:
        open_source(path)
    assert "\n" not in str(e.value)


def test_unknown_quantisation_type_is_refused_before_reading(tmp_path, tok, monkeypatch):
    import gguf.quants

    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), tok, "llama", Q.Q8_0)
    data = bytearray(path.read_bytes())
    # Rewrite the first Q8_0 tensor's type id in the header to IQ2_XXS (same file, unknown to us).
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.tensor_type == Q.Q8_0)
    type_offset = int(t.field.offset) + int(sum(p.nbytes for p in t.field.parts[:-2]))
    assert int.from_bytes(data[type_offset:type_offset + 4], "little") == Q.Q8_0
    data[type_offset:type_offset + 4] = int(Q.IQ2_XXS).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    monkeypatch.setattr(gguf.quants, "dequantize", lambda *a: pytest.fail("a weight was read"))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(bad)
    msg = str(e.value)
    assert ("IQ2_XXS" in msg or "not a readable GGUF" in msg) and "\n" not in msg


@pytest.mark.parametrize("keep", [10, 0.5, 0.999])
def test_truncated_file_is_refused(tmp_path, tok, keep):
    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), tok, "llama", Q.Q4_1)
    data = path.read_bytes()
    n = keep if isinstance(keep, int) else int(len(data) * keep)
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:n])
    with pytest.raises(CheckpointError, match="short.gguf.*(truncated|not a readable GGUF)") as e:
        load_checkpoint(short)
    assert "\n" not in str(e.value)


def test_a_file_that_is_not_a_model_says_what_is_accepted(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("")
    with pytest.raises(CheckpointError, match=r"is a file, not a model.*model directory.*\.gguf"):
        load_checkpoint(f)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.gguf")


def test_convert_of_a_truncated_gguf_writes_nothing(tmp_path, tok, capsys):
    from sinkdlm.cli.app import main

    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), tok, "llama", Q.Q4_1)
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[:-500])
    with pytest.raises(SystemExit) as e:
        main(["convert", "--from-hf", str(short), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "short.gguf" in err
    assert not (tmp_path / "out").exists()


def test_train_init_from_a_gguf_opens_it_once(tmp_path, tok, monkeypatch):
    """`train --init-from x.gguf` converts it on load (+ [MASK], bidirectional) and parses the file's
    header once: the tokenizer and the model get the same opened source."""
    import sinkdlm.io.gguf_file as gf
    from sinkdlm.training import TrainConfig, train

    path = write_gguf(tmp_path / "m.gguf", hf_model("llama"), tok, "llama", Q.Q8_0)
    opened = []
    real_init = gf.GGUFFile.__init__
    monkeypatch.setattr(gf.GGUFFile, "__init__", lambda self, p: (opened.append(p), real_init(self, p))[1])
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(TEXTS))
    run = train(TrainConfig.resolve(out=str(tmp_path / "run"), data=str(corpus), init_from=str(path), max_steps=1,
                                    batch_size=2, seq_len=16, save_every=1, eval_every=1, eval_batches=1,
                                    tensorboard=False, cache_dir=str(tmp_path / "cache")))
    model = load_checkpoint(run["checkpoint"])
    assert not model.config.causal and model.config.mask_token_id is not None
    assert len(opened) == 1, opened  # the run's one open (the reload above is of a directory)
