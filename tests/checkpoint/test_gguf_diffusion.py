"""Dream and LLaDA GGUFs as llama.cpp stores them (llama-diffusion-cli's files) open like their checkpoint
directories: the same logits, the same sampler defaults, the shift and [MASK] id read from the metadata.

The files are written here with gguf-py's `GGUFWriter` from tiny Dream and LLaDA checkpoint directories, as
llama.cpp's convert_hf_to_gguf.py writes them: tensor names from gguf's own name map for the architecture,
`{arch}.attention.causal = false`, `tokenizer.ggml.mask_token_id`, LLaDA's `diffusion.shift_logits = false`
(Dream's converter writes none: absent means shifted), the vocabulary padded with `[PAD{i}]` to the model's
rows, and the Q/K rows (weights and biases) permuted for llama.cpp's interleaved rotary in LLaDA files only
(`LLaDAModel.permute`; Dream keeps Hugging Face's order, as Qwen2).
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

from sinkdlm import CheckpointError, DiffusionLM, generate
from sinkdlm.data.tokenizer import train_bpe_tokenizer

from numerics import assert_model_close

TEXTS = ["the quick brown fox jumps over the lazy dog, and the cat sleeps. " * 30,
         "to be or not to be: that is the question; whether tis nobler. " * 30]
V = 320  # model rows; the BPE has at most 300 tokens (padded rows, as in the released models)


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, 300)  # <|endoftext|> 0, <|pad|> 1, [MASK] 2


def dream_dir(path, tok):
    """A Dream checkpoint: Qwen2 weights and names, `model_type: "Dream"`, a mask_token_id."""
    torch.manual_seed(3)
    hf = Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=False))
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
    hf.save_pretrained(str(path))
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(model_type="Dream", architectures=["DreamModel"], mask_token_id=tok.mask_token_id)
    (path / "config.json").write_text(json.dumps(cfg))
    tok.save_pretrained(str(path))
    return path


def llada_dir(path, tok):
    """A LLaDA checkpoint: OLMo names (with q/k/v biases, to check their permutation too)."""
    d, heads, kv, mlp, layers = 32, 4, 2, 48, 2
    hd = d // heads
    g = torch.Generator().manual_seed(5)

    def r(*shape):
        return 0.3 * torch.randn(*shape, generator=g)

    t = {"model.transformer.wte.weight": r(V, d), "model.transformer.ln_f.weight": 1 + r(d),
         "model.transformer.ff_out.weight": r(V, d)}
    for i in range(layers):
        p = f"model.transformer.blocks.{i}."
        t.update({p + "attn_norm.weight": 1 + r(d), p + "ff_norm.weight": 1 + r(d), p + "q_proj.weight": r(d, d),
                  p + "k_proj.weight": r(kv * hd, d), p + "v_proj.weight": r(kv * hd, d), p + "attn_out.weight": r(d, d),
                  p + "ff_proj.weight": r(mlp, d), p + "up_proj.weight": r(mlp, d), p + "ff_out.weight": r(d, mlp),
                  p + "q_proj.bias": r(d), p + "k_proj.bias": r(kv * hd), p + "v_proj.bias": r(kv * hd)})
    path.mkdir(parents=True, exist_ok=True)
    save_file(t, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({
        "model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": d, "n_heads": heads, "n_kv_heads": kv,
        "n_layers": layers, "mlp_hidden_size": mlp, "rope_theta": 5000.0, "rms_norm_eps": 1e-5, "include_bias": False,
        "include_qkv_bias": True, "embedding_size": V, "vocab_size": V, "mask_token_id": tok.mask_token_id,
        "block_type": "llama", "weight_tying": False, "max_sequence_length": 128, "layer_norm_type": "rms",
        "activation_type": "silu", "rope": True, "alibi": False, "scale_logits": False,
    }))
    tok.save_pretrained(str(path))
    return path


def llada_permute(w: torch.Tensor, n_head: int, n_head_kv: int | None) -> torch.Tensor:
    """convert_hf_to_gguf.py's `LLaDAModel.permute`: each head's rows from (2, d/2) to (d/2, 2) order."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(src, out, arch: str, tok, *, mask=True, shift=None):
    """The checkpoint directory `src` as convert_hf_to_gguf.py writes it for `arch` ("dream" | "llada")."""
    if not hasattr(gguf.MODEL_ARCH, arch.upper()) or not hasattr(gguf.GGUFWriter, "add_diffusion_shift_logits"):
        # the writer below uses gguf's own dream/llada names; sinkdlm's reader does not need them (io/gguf_file.py)
        pytest.skip(f"writing a {arch} GGUF in this test needs a gguf package that knows the arch "
                    f"(installed: {getattr(gguf, '__version__', 'older')}); the reader is tested by test_gguf.py")
    cfg = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    if arch == "dream":
        hp = dict(ctx=cfg["max_position_embeddings"], d=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                  ff=cfg["intermediate_size"], heads=cfg["num_attention_heads"], kv=cfg["num_key_value_heads"],
                  theta=cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"], eps=cfg["rms_norm_eps"])
    else:
        hp = dict(ctx=cfg["max_sequence_length"], d=cfg["d_model"], layers=cfg["n_layers"], ff=cfg["mlp_hidden_size"],
                  heads=cfg["n_heads"], kv=cfg["n_kv_heads"], theta=cfg["rope_theta"], eps=cfg["rms_norm_eps"])
    w = gguf.GGUFWriter(str(out), arch)
    w.add_context_length(hp["ctx"])
    w.add_embedding_length(hp["d"])
    w.add_block_count(hp["layers"])
    w.add_feed_forward_length(hp["ff"])
    w.add_head_count(hp["heads"])
    w.add_head_count_kv(hp["kv"])
    w.add_rope_freq_base(hp["theta"])
    w.add_layer_norm_rms_eps(hp["eps"])
    w.add_causal_attention(False)
    if arch == "llada":
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(hp["d"] // hp["heads"])
        w.add_diffusion_shift_logits(False)
    if shift is not None:
        w.add_diffusion_shift_logits(shift)
    if mask:
        w.add_mask_token_id(cfg["mask_token_id"])
    vocab = {i: t for t, i in tok.get_vocab().items()}
    tokens = [vocab.get(i, f"[PAD{i}]") for i in range(V)]  # padded to the model's rows (Dream's get_vocab_base)
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in tok.all_special_tokens else (5 if t.startswith("[PAD") else 1) for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    w.add_eos_token_id(tok.eos_token_id)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DREAM if arch == "dream" else gguf.MODEL_ARCH.LLADA, hp["layers"])
    for name, x in tensors.items():
        if arch == "llada" and name.endswith(("q_proj.weight", "q_proj.bias")):
            x = llada_permute(x, hp["heads"], hp["heads"])
        if arch == "llada" and name.endswith(("k_proj.weight", "k_proj.bias")):
            x = llada_permute(x, hp["heads"], hp["kv"])
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), np.ascontiguousarray(x.float().numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


@pytest.fixture(scope="module", params=["dream", "llada"])
def pair(request, tok, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    src = (dream_dir if request.param == "dream" else llada_dir)(root / "dir", tok)
    return request.param, src, write_gguf(src, root / f"{request.param}.gguf", request.param, tok)


def ids(seed=1, b=2, n=11):
    return torch.randint(3, 300, (b, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_gguf_logits_equal_the_checkpoint_directory(pair):
    arch, src, path = pair
    ref, got = DiffusionLM.from_pretrained(src), DiffusionLM.from_pretrained(path)
    for field in ("mask_token_id", "shift_logits", "causal", "family", "qkv_bias", "tie_word_embeddings", "vocab_size"):
        assert getattr(got.config, field) == getattr(ref.config, field), field
    assert got.config.family == arch and got.config.shift_logits == (arch == "dream") and not got.config.causal
    x = ids()
    x[:, -4:] = ref.config.mask_token_id
    assert_model_close(got(x).logits, ref(x).logits, ref.config)
    # the sampler: Dream's defaults for Dream, LLaDA's for LLaDA, the same tokens either way (in float64: token
    # parity of two loads holds on every CPU only where no argmax gap is within rounding; tests/numerics.py)
    got, ref = got.double(), ref.double()
    assert torch.equal(generate(got, x[:, :6], gen_length=8, steps=4), generate(ref, x[:, :6], gen_length=8, steps=4))


def test_cli_generate_opens_the_gguf_like_the_directory(pair, capsys):
    from sinkdlm.cli import main

    arch, src, path = pair
    outs = []
    for model in (src, path):
        with pytest.raises(SystemExit) as e:
            main(["generate", "--model", str(model), "--prompt", "the quick brown fox", "--gen-length", "8",
                  "--steps", "4", "--json", "--device", "cpu"])
        assert e.value.code in (0, None)
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"])
    assert outs[0] == outs[1]


def test_a_diffusion_gguf_without_a_mask_id_is_refused(tok, tmp_path):
    src = llada_dir(tmp_path / "dir", tok)
    path = write_gguf(src, tmp_path / "nomask.gguf", "llada", tok, mask=False)
    with pytest.raises(CheckpointError, match="needs tokenizer.ggml.mask_token_id"):
        DiffusionLM.from_pretrained(path)


@torch.no_grad()
def test_shift_logits_is_read_from_the_metadata(tok, tmp_path):
    """A Dream file that says diffusion.shift_logits = false is not shifted (llama.cpp reads the key the same way)."""
    src = dream_dir(tmp_path / "dir", tok)
    model = DiffusionLM.from_pretrained(write_gguf(src, tmp_path / "noshift.gguf", "dream", tok, shift=False))
    assert not model.config.shift_logits and model.config.family == "dream"


def test_convert_adds_a_sink_to_a_diffusion_gguf(pair, tmp_path):
    """`sinkdlm convert` takes a dream/llada GGUF as a DLM: the same (dequantised) weights plus a sink;
    with no switch to add it refuses before reading any weight."""
    from sinkdlm.model.hf import convert_hf_checkpoint

    arch, _, path = pair
    with pytest.raises(ValueError, match="has these switches already"):
        convert_hf_checkpoint(path, tmp_path / "none")
    assert not (tmp_path / "none").exists()
    convert_hf_checkpoint(path, tmp_path / "out", num_sink_tokens=1)
    before, after = DiffusionLM.from_pretrained(path), DiffusionLM.from_pretrained(tmp_path / "out")
    old, new = before.state_dict(), after.state_dict()
    assert set(new) - set(old) == {"sink_embeddings"} and all(torch.equal(old[k], new[k]) for k in old)
    assert after.config.family == arch and after.config.shift_logits == before.config.shift_logits
