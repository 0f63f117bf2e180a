"""Open pretrained checkpoints of other layouts directly: LLaDA, Dream, and Qwen2/LLaMA causal LMs.

One loader maps any supported directory onto sinkdlm's `ModelConfig` plus a state dict in sinkdlm's
parameter names (Hugging Face Qwen2 names without the `model.` prefix), so `load_checkpoint` and
everything above it (`generate`, `loglikelihood`, `eval`, `analyze`, `train --init-from`) open them
as they open a sinkdlm checkpoint (docs/method.md §10):

| `model_type` | what it is                    | attention     | logits                        |
|--------------|-------------------------------|---------------|-------------------------------|
| `sinkdlm`    | this project's own checkpoint | bidirectional | `config.shift_logits`         |
| `llada`      | LLaDA / LLaDA-1.5 (OLMo names)| bidirectional | not shifted                   |
| `Dream`      | Dream-v0 (Qwen2 names)        | bidirectional | shifted (i predicts i+1)      |
| `qwen2`, `llama` | autoregressive causal LMs | causal        | shifted (next-token head)     |

Only `config.json`, `tokenizer*.json` and safetensors are read. A checkpoint's `auto_map` (its own
Python modeling files) is never imported or run: the layouts are mapped here by name. Whatever a
layout can hold that the sinkdlm model cannot compute exactly (ALiBi, QK norm, biases in the MLP,
logit scaling, a non-llama LLaDA block, sliding windows, RoPE scaling) is refused before any weight
is read, instead of being silently turned into a different function.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sinkdlm.config import MODEL_TYPE, ModelConfig
from sinkdlm.model.checkpoint import CONFIG_NAME, CheckpointError, read_weights

# model_type as written in config.json -> our format name (Dream writes "Dream").
FORMATS = {"sinkdlm": "sinkdlm", "llada": "llada", "dream": "dream", "qwen2": "qwen2", "llama": "llama"}
AUTOREGRESSIVE = ("qwen2", "llama")
# The [MASK] ids of the released models, quoted in the error for a config that lacks one.
RELEASED_MASK_IDS = {"llada": 126336, "dream": 151666}


def _error(message: str) -> CheckpointError:
    return CheckpointError(message)


def read_json(path: Path, what: str = "config") -> dict:
    """A JSON object from `path`, or a CheckpointError naming the file."""
    if not path.is_file():
        raise _error(f"{path} is missing: a model directory needs its {CONFIG_NAME}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _error(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise _error(f"{path} must hold a JSON object (the model {what}), got {type(raw).__name__}")
    return raw


def detect_format(raw: dict, path: Path | str = CONFIG_NAME) -> str:
    """The format name of a `config.json` dict (a missing model_type is a sinkdlm checkpoint)."""
    model_type = raw.get("model_type", MODEL_TYPE)
    fmt = FORMATS.get(str(model_type).lower()) if isinstance(model_type, str) else None
    if fmt is None:
        raise _error(
            f"{path}: model_type {model_type!r} is not supported; sinkdlm opens "
            f"{sorted(set(FORMATS) - {'dream'}) + ['Dream']} checkpoints directly"
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


def llada_names(tensors: dict, path) -> dict:
    out = {}
    for key, value in tensors.items():
        m = _LLADA_KEY.match(key)
        name = None
        if m and m.group(1) is not None and m.group(2) in _LLADA_BLOCK:
            name = f"layers.{m.group(1)}.{_LLADA_BLOCK[m.group(2)]}.{m.group(3)}"
        elif m and m.group(4) in _LLADA_TOP:
            name = _LLADA_TOP[m.group(4)]
        if name is None:
            raise _error(f"{path}: unexpected LLaDA tensor {key!r} (not one of the mapped OLMo-style names)")
        out[name] = value
    return out


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
        if fmt == "dream":  # Qwen2 layout, QKV bias always on (DreamAttention), logits shifted
            return qwen2_config(raw, qkv_bias=True, mask_token_id=_mask_id(raw, "dream", path), shift_logits=True,
                                extra={"source_format": "dream"}), fmt
        qkv_bias = fmt == "qwen2" or bool(raw.get("attention_bias", False))
        return qwen2_config(raw, qkv_bias=qkv_bias, mask_token_id=None, causal=True, shift_logits=True,
                            extra={"source_format": fmt}), fmt
    except KeyError as e:
        raise _error(f"{path}: missing field {e.args[0]!r}") from e
    except CheckpointError:
        raise
    except (TypeError, ValueError) as e:
        raise _error(f"{path}: invalid model config: {e}") from e


def to_sinkdlm_names(fmt: str, tensors: dict, config: ModelConfig, path) -> dict:
    """A checkpoint's tensors in sinkdlm's parameter names (a tied head is not stored)."""
    if fmt == "sinkdlm":
        return tensors
    if fmt == "llada":
        tensors = llada_names(tensors, path)
    else:  # Qwen2 names with the `model.` prefix, the head as `lm_head.weight`
        tensors = {k.removeprefix("model."): v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    return tensors


def read_pretrained(directory: str | Path) -> tuple[ModelConfig, dict, str]:
    """(ModelConfig, tensors in sinkdlm names, format) of a checkpoint directory of any supported layout."""
    directory = Path(directory)
    path = directory / CONFIG_NAME
    config, fmt = config_from_raw(read_json(path), path)
    return config, to_sinkdlm_names(fmt, read_weights(directory), config, directory), fmt


def checkpoint_format(directory: str | Path) -> str:
    """The format of a model directory ("sinkdlm", "llada", "dream", "qwen2", "llama")."""
    path = Path(directory) / CONFIG_NAME
    return detect_format(read_json(path), path)


# ----------------------------------------------------------------------------- tokenizers
_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")


def _token_text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def load_pretrained_tokenizer(directory: str | Path, config: ModelConfig | None = None):
    """The fast tokenizer of a foreign-format directory from `tokenizer.json` and the special-token
    roles in `tokenizer_config.json` / `special_tokens_map.json` — read as JSON, so a
    `tokenizer_config.json` that names its own tokenizer class (`auto_map`) runs nothing.
    A diffusion model's `[MASK]` (config.mask_token_id) becomes the tokenizer's mask token."""
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    if config is None:
        config, _ = config_from_raw(read_json(directory / CONFIG_NAME), directory / CONFIG_NAME)
    file = directory / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{file} is missing: sinkdlm reads a pretrained model's fast tokenizer (tokenizer.json) only")
    roles: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
        if (directory / name).is_file():
            meta = read_json(directory / name, "tokenizer settings")
            roles.update({r: t for r in _ROLES if (t := _token_text(meta.get(r))) is not None})
    tok = PreTrainedTokenizerFast(tokenizer_file=str(file), clean_up_tokenization_spaces=False, **roles)
    if not config.causal and tok.mask_token is None:
        mask = tok.convert_ids_to_tokens(config.mask_token_id)
        if mask is None:
            raise ValueError(f"{file} has no token with the model's mask_token_id {config.mask_token_id}")
        tok.mask_token = mask
    return tok
