"""Checkpoint layouts as pure mappings: each format's config -> `ModelConfig`, and one state-dict
adapter per format (`from_hf`: the file's tensor names -> sinkdlm's).

Nothing here opens a file: `sinkdlm.io.files` and `sinkdlm.io.gguf_file` read bytes, `sinkdlm.checkpoint.manager`
detects the format once and calls these mappings with what it parsed. sinkdlm's parameter names
are Hugging Face Qwen2 names without the `model.` prefix, so `load_checkpoint` and everything
above it (`generate`, `loglikelihood`, `eval`, `analyze`, `train --init-from`) open every layout
as they open a sinkdlm checkpoint (docs/method.md §10):

| `model_type` | what it is                    | attention     | logits                        |
|--------------|-------------------------------|---------------|-------------------------------|
| `sinkdlm`    | this project's own checkpoint | bidirectional | `config.shift_logits`         |
| `llada`      | LLaDA / LLaDA-1.5 (OLMo names)| bidirectional | not shifted                   |
| `Dream`      | Dream-v0 (Qwen2 names)        | bidirectional | shifted (i predicts i+1)      |
| `qwen2`, `llama` | autoregressive causal LMs | causal        | shifted (next-token head)     |
| `Fast_dLLM_Qwen` | Fast-dLLM v2 (Qwen2.5 names) | block-causal, `bd_size` | shifted (i predicts i+1) |
| `sdar`       | SDAR (Qwen3 names, QK norm)   | block-causal, `block_size` | not shifted            |
| `gguf`       | a llama.cpp `.gguf` file of architecture llama or qwen2: causal, shifted, dequantised |
|              | or dream / llada (llama-diffusion-cli's): bidirectional, `diffusion.shift_logits`, the file's mask id |

Only `config.json`, `tokenizer*.json`, safetensors and GGUF are read. A checkpoint's `auto_map` (its
own Python modeling files) is never imported or run: the layouts are mapped here by name. Whatever a
layout can hold that the sinkdlm model cannot compute exactly (ALiBi, LLaDA's attention layer norm, biases in
the MLP, logit scaling, a non-llama LLaDA block, sliding windows, RoPE scaling, a head_dim other than
hidden_size / heads) is refused before any weight is read, instead of being silently turned into a different
function. The block layouts (Fast-dLLM v2, SDAR) open as block models (`ModelConfig.block_size`, §13): their
block-causal attention is the one sinkdlm computes; SDAR's QK norm is `ModelConfig.qk_norm`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from sinkdlm.config import MODEL_TYPE, ModelConfig
from sinkdlm.io.files import CONFIG_NAME, CheckpointError

# model_type as written in config.json, lower-cased -> our format name (Dream writes "Dream", Fast-dLLM v2
# "Fast_dLLM_Qwen").
FORMATS = {"sinkdlm": "sinkdlm", "llada": "llada", "dream": "dream", "qwen2": "qwen2", "llama": "llama",
           "fast_dllm_qwen": "fast_dllm_v2", "sdar": "sdar"}
# The [MASK] ids of the released models, quoted in the error for a config that lacks one.
RELEASED_MASK_IDS = {"llada": 126336, "dream": 151666, "fast_dllm_v2": 151665, "sdar": 151669}


def _error(message: str) -> CheckpointError:
    return CheckpointError(message)


def detect_format(raw: dict, path: Path | str = CONFIG_NAME) -> str:
    """The format name of a `config.json` dict (a missing model_type is a sinkdlm checkpoint)."""
    model_type = raw.get("model_type", MODEL_TYPE)
    fmt = FORMATS.get(str(model_type).lower()) if isinstance(model_type, str) else None
    if fmt is None:
        raise _error(
            f"{path}: model_type {model_type!r} is not supported; sinkdlm opens "
            f"{sorted(set(FORMATS) - {'dream', 'fast_dllm_qwen'}) + ['Dream', 'Fast_dLLM_Qwen']} checkpoints directly"
        )
    return fmt


# ----------------------------------------------------------------------------- Qwen2 / LLaMA / Dream
def check_qwen2_fields(cfg: dict, path: Path | str) -> None:
    """Refuse what a Qwen2/LLaMA/Dream config can hold but the sinkdlm model cannot compute exactly."""
    scaling = cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if rope_type not in ("default", None):
        raise _error(f"{path}: rope scaling {rope_type!r} is not supported (only plain RoPE)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise _error(f"{path}: hidden_act {act!r} is not supported (the MLP is SwiGLU with silu)")
    try:
        natural = cfg["hidden_size"] // cfg["num_attention_heads"]
    except (KeyError, TypeError, ZeroDivisionError) as e:
        raise _error(f"{path}: needs integer hidden_size and num_attention_heads ({e!r})") from e
    if cfg.get("head_dim") not in (None, natural):
        raise _error(
            f"{path}: head_dim={cfg['head_dim']} differs from hidden_size/num_attention_heads={natural}; "
            f"a decoupled head_dim is not supported"
        )
    if cfg.get("mlp_bias", False):
        raise _error(f"{path}: mlp_bias=true is not supported (the MLP has no biases)")
    layer_types = cfg.get("layer_types") or []
    if cfg.get("use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        raise _error(f"{path}: sliding-window attention layers are not supported (only full attention)")


def qwen2_config(cfg: dict, *, qkv_bias: bool, **fields: Any) -> ModelConfig:
    """Qwen2/LLaMA/Dream `config.json` -> ModelConfig; `fields` set the rest (mask id, causal, ...)."""
    rope = cfg.get("rope_parameters") or {}
    return ModelConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        intermediate_size=cfg["intermediate_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        **fields,
    )


def _mask_id(raw: dict, fmt: str, path) -> int:
    mask = raw.get("mask_token_id")
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise _error(
            f"{path}: a {fmt} diffusion model needs an integer mask_token_id (the released models use "
            f"{RELEASED_MASK_IDS[fmt]}); add it to {CONFIG_NAME}"
        )
    return mask


# ----------------------------------------------------------------------------- block diffusion (Fast-dLLM v2, SDAR)
# Each layout's config key for its block size (both attend block-causally from position 0 at inference) and the
# released models' value, quoted when a config lacks it.
BLOCK_KEYS = {"fast_dllm_v2": ("bd_size", 32), "sdar": ("block_size", 4)}
_BLOCK_NAMES = {"fast_dllm_v2": "Fast-dLLM v2", "sdar": "SDAR"}


def block_layout_config(raw: dict, fmt: str, path) -> ModelConfig:
    """A Fast-dLLM v2 (Qwen2.5 with QKV bias, shifted logits: a token's logits are read one position earlier)
    or SDAR (Qwen3: QK norm, no bias, not shifted) `config.json` -> a block model (`block_size`,
    docs/method.md §13). Refused, before any weight is read, without its block size."""
    key, released = BLOCK_KEYS[fmt]
    size = raw.get(key)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise _error(f"{path}: a {_BLOCK_NAMES[fmt]} config needs its block size, a positive integer {key} (the "
                     f"released models use {released}); got {size!r}: add it to {CONFIG_NAME}")
    mask = raw.get("mask_token_id", RELEASED_MASK_IDS[fmt])  # the modeling code's own id when the config has none
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < raw.get("vocab_size", 0):
        raise _error(f"{path}: a {_BLOCK_NAMES[fmt]} model needs an integer mask_token_id inside its vocabulary (the "
                     f"released models use {RELEASED_MASK_IDS[fmt]}); add it to {CONFIG_NAME}")
    if fmt == "fast_dllm_v2":  # Fast_dLLM_QwenAttention: q/k/v biases always on, as Qwen2
        return qwen2_config(raw, qkv_bias=True, mask_token_id=mask, shift_logits=True, block_size=size,
                            extra={"source_format": fmt})
    return qwen2_config(raw, qkv_bias=bool(raw.get("attention_bias", False)), qk_norm=True, mask_token_id=mask,
                        block_size=size, extra={"source_format": fmt})


# ----------------------------------------------------------------------------- LLaDA
# LLaDA's own config fields (OLMo's) that change the function; each must have its listed value.
_LLADA_REQUIRED = {
    "block_type": ("llama",), "alibi": (False, None), "rope": (True, None), "attention_layer_norm": (False, None),
    "include_bias": (False, None), "bias_for_layer_norm": (False, None), "layer_norm_type": ("rms", None),
    "activation_type": ("silu", None), "scale_logits": (False, None), "input_emb_norm": (False, None),
    "block_group_size": (1, None), "clip_qkv": (None,), "layer_norm_with_affine": (True, None),
}
_LLADA_WHY = {
    "block_type": "only the LLaMA-style block (separate q/k/v, SwiGLU with ff_proj/up_proj) is mapped",
    "block_group_size": "grouped blocks are stored under other names",
}


def llada_config(raw: dict, path) -> ModelConfig:
    for name, allowed in _LLADA_REQUIRED.items():
        if raw.get(name) not in allowed:
            why = _LLADA_WHY.get(name, "the sinkdlm model cannot compute it exactly")
            raise _error(f"{path}: LLaDA {name}={raw.get(name)!r} is not supported ({why}); "
                         f"supported: {[a for a in allowed if a is not None]}")
    try:
        d, heads = raw["d_model"], raw["n_heads"]
        kv = 1 if raw.get("multi_query_attention") else (raw.get("n_kv_heads") or heads)
        mlp = raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * d
        return ModelConfig(
            vocab_size=raw.get("embedding_size") or raw["vocab_size"],  # the padded embedding rows
            hidden_size=d, num_hidden_layers=raw["n_layers"], num_attention_heads=heads,
            num_key_value_heads=kv, intermediate_size=mlp,
            max_position_embeddings=raw.get("max_sequence_length", 4096),
            rope_theta=float(raw.get("rope_theta", 10000.0)), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(raw.get("weight_tying", False)), qkv_bias=bool(raw.get("include_qkv_bias", False)),
            mask_token_id=_mask_id(raw, "llada", path),
            extra={"source_format": "llada"},
        )
    except KeyError as e:
        raise _error(f"{path}: LLaDA config lacks the field {e.args[0]!r}") from e


# OLMo-style block names -> sinkdlm names (LLaDA's `ff_proj` is SwiGLU's gate: act(ff_proj x) * up_proj x).
_LLADA_BLOCK = {
    "attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj", "ff_norm": "post_attention_layernorm",
    "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj",
}
_LLADA_TOP = {"wte.weight": "embed_tokens.weight", "ln_f.weight": "norm.weight", "ff_out.weight": "lm_head.weight"}
_LLADA_KEY = re.compile(r"^(?:model\.)?transformer\.(?:blocks\.(\d+)\.(\w+)\.(weight|bias)|(.+))$")


# ----------------------------------------------------------------------------- GGUF (llama.cpp)
def _gguf_head(meta: dict, arch: str, path) -> dict[str, Any]:
    """The head fields of a GGUF: a causal LM (llama, qwen2), or a diffusion LM of llama.cpp's (dream, llada):
    bidirectional, its [MASK] id from `tokenizer.ggml.mask_token_id`, shifted as `diffusion.shift_logits` says
    (absent: Dream shifts, LLaDA does not, as llama.cpp's converter writes them), Dream's sampler for dream."""
    if arch not in ("dream", "llada"):
        return dict(mask_token_id=None, causal=True, shift_logits=True)
    mask = meta.get("tokenizer.ggml.mask_token_id")
    if not isinstance(mask, int) or isinstance(mask, bool):
        raise _error(f"{path}: a {arch} GGUF needs tokenizer.ggml.mask_token_id (the [MASK] id; the released model "
                     f"uses {RELEASED_MASK_IDS[arch]}); write it with GGUFWriter.add_mask_token_id")
    shift = meta.get("diffusion.shift_logits", arch == "dream")
    return dict(mask_token_id=mask, causal=False, shift_logits=bool(shift), family="dream" if arch == "dream" else "llada")


def gguf_config(meta: dict, tensor_names: list[str], path) -> ModelConfig:
    """A GGUF file's `{arch}.*` metadata -> ModelConfig of the model it holds (docs/method.md §10)."""
    arch = meta["general.architecture"]

    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    scaling = get("rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in tensor_names:
        raise _error(f"{path}: rope scaling {scaling or 'rope_freqs'!r} is not supported (only plain RoPE)")
    try:
        hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
        kv = int(get("attention.head_count_kv", heads))
        head_dim = hidden // heads
        if get("rope.dimension_count", head_dim) != head_dim or get("attention.key_length", head_dim) != head_dim:
            raise _error(f"{path}: a head_dim other than embedding_length/head_count ({head_dim}) is not supported")
        vocab = get("vocab_size") or meta.get("tokenizer.ggml.tokens")  # the token list's length
        return ModelConfig(
            vocab_size=int(vocab), hidden_size=hidden, num_hidden_layers=int(get("block_count")),
            num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=int(get("feed_forward_length")),
            max_position_embeddings=int(get("context_length", 4096)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            # llama.cpp stores no output.weight when the head is the embedding
            tie_word_embeddings="output.weight" not in tensor_names,
            qkv_bias="blk.0.attn_q.bias" in tensor_names,
            **_gguf_head(meta, arch, path),
            extra={"source_format": "gguf", "gguf_architecture": arch},
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise _error(f"{path}: GGUF metadata for {arch!r} lacks or mangles a shape field ({e})") from e


# llama.cpp tensor names (gguf-py's TENSOR_NAMES for LLaMA/Qwen2) -> sinkdlm names.
_GGUF_BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GGUF_TOP = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
             "output.weight": "lm_head.weight"}
_GGUF_KEY = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


# The architectures whose Q/K rows convert_hf_to_gguf.py permutes (LlamaModel.permute; LLaDAModel's own copy);
# qwen2 and dream keep Hugging Face's order (their rotary is NEOX-style in llama.cpp).
ROTARY_PERMUTED = ("llama", "llada")


def unpermute_rotary_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation for its interleaved rotary (LLaMA and LLaDA files).

    convert_hf_to_gguf.py stores each head's rows as (pairs, 2) interleaved, from HF's half-split
    order: `w.reshape(h, 2, d/2, ...).swapaxes(1, 2)`. The inverse reads (d/2, 2) and swaps back.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ----------------------------------------------------------------------------- state-dict adapters
class StateDictAdapter:
    """One checkpoint layout's tensor names <-> sinkdlm's (torchtitan's `StateDictAdapter`).

    `from_hf(name, tensor)` maps one tensor at a time (None drops it), so a loader can convert a
    file tensor by tensor."""

    def __init__(self, config: ModelConfig, path: Path | str = ""):
        self.config, self.path = config, path

    def from_hf(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        return name, tensor

    def convert(self, tensors) -> dict[str, torch.Tensor]:
        """All of `tensors` ((name, tensor) pairs or a dict, consumed one by one) in sinkdlm names."""
        items = tensors.items() if isinstance(tensors, dict) else tensors
        out = {}
        for name, value in items:
            mapped = self.from_hf(name, value)
            if mapped is not None:
                out[mapped[0]] = mapped[1]
        if self.config.tie_word_embeddings:  # a tied head is stored once, as the embedding
            out.pop("lm_head.weight", None)
        return out


class HFAdapter(StateDictAdapter):
    """Qwen2 / LLaMA / Dream: Hugging Face names with the `model.` prefix, the head as `lm_head.weight`."""

    def from_hf(self, name, tensor):
        if name.endswith("rotary_emb.inv_freq"):  # a buffer some exports store
            return None
        return name.removeprefix("model."), tensor


class LLaDAAdapter(StateDictAdapter):
    """LLaDA's OLMo-style names (`model.transformer.blocks.i.ff_proj`, ...)."""

    def from_hf(self, name, tensor):
        m = _LLADA_KEY.match(name)
        if m and m.group(1) is not None and m.group(2) in _LLADA_BLOCK:
            return f"layers.{m.group(1)}.{_LLADA_BLOCK[m.group(2)]}.{m.group(3)}", tensor
        if m and m.group(4) in _LLADA_TOP:
            return _LLADA_TOP[m.group(4)], tensor
        raise _error(f"{self.path}: unexpected LLaDA tensor {name!r} (not one of the mapped OLMo-style names)")


class GGUFAdapter(StateDictAdapter):
    """llama.cpp names (`blk.i.attn_q.weight`, ...); LLaMA and LLaDA files get their Q/K rows un-permuted."""

    def from_hf(self, name, tensor):
        m = _GGUF_KEY.match(name)
        if m and m.group(2) in _GGUF_BLOCK:
            stem = _GGUF_BLOCK[m.group(2)]
            if self.config.extra.get("gguf_architecture") in ROTARY_PERMUTED and stem in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = self.config.num_attention_heads if stem.endswith("q_proj") else self.config.num_key_value_heads
                tensor = unpermute_rotary_rows(tensor, heads)
            return f"layers.{m.group(1)}.{stem}.{m.group(3)}", tensor
        if name in _GGUF_TOP:
            return _GGUF_TOP[name], tensor
        raise _error(f"{self.path}: unexpected GGUF tensor {name!r} (not a LLaMA/Qwen2/Dream/LLaDA tensor sinkdlm maps)")


ADAPTERS: dict[str, type[StateDictAdapter]] = {
    "sinkdlm": StateDictAdapter, "llada": LLaDAAdapter, "dream": HFAdapter, "qwen2": HFAdapter,
    "llama": HFAdapter, "gguf": GGUFAdapter, "fast_dllm_v2": HFAdapter, "sdar": HFAdapter,  # Qwen2 / Qwen3 names
}


# ----------------------------------------------------------------------------- one entry point
def config_from_raw(raw: dict, path: Path | str = CONFIG_NAME) -> tuple[ModelConfig, str]:
    """(ModelConfig, format name) of a config.json dict of any supported layout."""
    fmt = detect_format(raw, path)
    try:
        if fmt == "sinkdlm":
            return ModelConfig.from_dict(raw), fmt
        if fmt == "llada":
            return llada_config(raw, path), fmt
        check_qwen2_fields(raw, path)
        if fmt in BLOCK_KEYS:
            return block_layout_config(raw, fmt, path), fmt
        if fmt == "dream":  # Qwen2 layout, QKV bias always on (DreamAttention), logits shifted
            return qwen2_config(raw, qkv_bias=True, mask_token_id=_mask_id(raw, "dream", path), shift_logits=True,
                                family="dream", extra={"source_format": "dream"}), fmt
        qkv_bias = fmt == "qwen2" or bool(raw.get("attention_bias", False))
        return qwen2_config(raw, qkv_bias=qkv_bias, mask_token_id=None, causal=True, shift_logits=True,
                            extra={"source_format": fmt}), fmt
    except KeyError as e:
        raise _error(f"{path}: missing field {e.args[0]!r}") from e
    except CheckpointError:
        raise
    except (TypeError, ValueError) as e:
        raise _error(f"{path}: invalid model config: {e}") from e
