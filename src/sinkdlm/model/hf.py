"""Hugging Face integration: `AutoModelForMaskedLM` registration and Qwen2/LLaMA conversion.

* `register()` (run by `import sinkdlm`) lets `transformers.AutoConfig` / `AutoModelForMaskedLM`
  open a sinkdlm checkpoint directory; loading goes through `DiffusionLM.from_pretrained`, so it
  keeps our checks and never reads pickle.
* `convert_hf_checkpoint()` turns a local Qwen2 or LLaMA causal-LM directory (safetensors, sharded
  too) into a sinkdlm checkpoint: same weights, bidirectional attention, a `[MASK]` token and the
  sink embeddings (docs/method.md §5).
"""

from __future__ import annotations

import json
from typing import Any
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForMaskedLM, PretrainedConfig

from sinkdlm.config import MODEL_SWITCH_DEFAULTS, MODEL_TYPE, ModelConfig, check_model_switches
from sinkdlm.model.checkpoint import CONFIG_NAME, CheckpointError, read_weights
from sinkdlm.model.transformer import DiffusionLM

SUPPORTED_ARCHITECTURES = ("qwen2", "llama")
MASK_TOKEN = "[MASK]"


class SinkDLMConfig(PretrainedConfig):
    """The `transformers` face of `ModelConfig` (only used to route AutoModel loading)."""

    model_type = MODEL_TYPE

    def to_model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.to_dict())


def register() -> None:
    AutoConfig.register(MODEL_TYPE, SinkDLMConfig, exist_ok=True)
    DiffusionLM.config_class = SinkDLMConfig
    AutoModelForMaskedLM.register(SinkDLMConfig, DiffusionLM, exist_ok=True)


# ----------------------------------------------------------------------------- conversion
def _read_hf_config(src: Path) -> dict:
    """Read and check a Qwen2/LLaMA `config.json`: anything we cannot represent exactly is refused
    here, before any weight is read, instead of being converted into a different function."""
    path = src / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: --from-hf needs a local Hugging Face model directory")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(cfg).__name__}")
    if cfg.get("model_type") not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: model_type {cfg.get('model_type')!r} is not supported; "
            f"convert one of {SUPPORTED_ARCHITECTURES}"
        )
    scaling = cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else "default"
    if rope_type not in ("default", None):
        raise CheckpointError(f"{path}: rope scaling {rope_type!r} is not supported (only plain RoPE)")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{path}: hidden_act {act!r} is not supported (the MLP is SwiGLU with silu)")
    try:
        natural = cfg["hidden_size"] // cfg["num_attention_heads"]
    except (KeyError, TypeError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path}: needs integer hidden_size and num_attention_heads ({e!r})") from e
    if cfg.get("head_dim") not in (None, natural):
        raise CheckpointError(
            f"{path}: head_dim={cfg['head_dim']} differs from hidden_size/num_attention_heads={natural}; "
            f"a decoupled head_dim is not supported"
        )
    if cfg.get("mlp_bias", False):
        raise CheckpointError(f"{path}: mlp_bias=true is not supported (the MLP has no biases)")
    layer_types = cfg.get("layer_types") or []
    if cfg.get("use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        raise CheckpointError(
            f"{path}: sliding-window attention layers are not supported (only full attention)"
        )
    return cfg


def hf_to_model_config(cfg: dict, **switches) -> ModelConfig:
    """Map a Qwen2/LLaMA `config.json` onto ModelConfig (mask id/vocab are set by the caller)."""
    rope = cfg.get("rope_parameters") or {}
    qkv_bias = cfg["model_type"] == "qwen2" or bool(cfg.get("attention_bias", False))
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
        mask_token_id=cfg["vocab_size"] - 1,
        **switches,
    )


def _init_new_rows(w: torch.Tensor, new_vocab: int, mask_id: int | None) -> torch.Tensor:
    """Grow `w [V, d]` to `new_vocab` rows and set the new [MASK] row, all to the mean trained row.

    The mask row is set even when it lies inside the matrix: Qwen2.5 pads its embedding past the
    tokenizer, and those spare rows were never trained.
    """
    trained = w.shape[0] if mask_id is None else min(w.shape[0], mask_id)
    mean = w[:trained].float().mean(0).to(w.dtype)
    if new_vocab > w.shape[0]:
        w = torch.cat([w, mean.expand(new_vocab - w.shape[0], -1)])
    elif mask_id is not None:
        w = w.clone()
    if mask_id is not None:
        w[mask_id] = mean
    return w


def _load_tokenizer(src: Path):
    if not any((src / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(src), local_files_only=True)


def convert_hf_checkpoint(
    src: str | Path,
    out: str | Path,
    *,
    seed: int = 0,
    **switches: Any,
) -> DiffusionLM:
    """Convert a local HF Qwen2/LLaMA causal LM into a sinkdlm checkpoint at `out`.

    `switches` are model switches by name (`sinkdlm.config.MODEL_SWITCHES`: num_sink_tokens,
    sink_position, sink_zero_value, gated_attention, sink_logit, softmax_one); unset ones take
    their registry default.

    New parameters and how they start:
      * `[MASK]` gets the id `len(tokenizer)` (after adding it), or `vocab_size` without a
        tokenizer; when that id lies past the embedding matrix, the embedding and head grow by
        the missing rows. New rows — and the [MASK] row even when it is a spare padded row, as in
        Qwen2.5 — are the mean of the trained rows (the new token starts
        "average" instead of random, so its logit neither dominates nor vanishes — Hewitt 2021).
      * sink embeddings are drawn per dimension from N(mean, std) of the trained embedding rows,
        so they sit at the scale of real tokens; distinct draws keep 2 or 4 sinks distinguishable.
      * gated attention: W_g = 0 gives σ(0) = 1/2 everywhere; o_proj is doubled so the layer
        computes exactly the original function at step 0 (eq. 8-10 then learns the gate).
      * sink logits (`sink_logit`): N(0, initializer_range) per head, as gpt-oss initialises its
        `sinks` (transformers `GptOssPreTrainedModel._init_weights`); softmax_one has no parameter.
    """
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise CheckpointError(f"--from-hf directory {str(src)!r} does not exist")
    hf_cfg = _read_hf_config(src)
    check_model_switches(switches)  # unknown names and bad values, before any weight is read
    switches = {**MODEL_SWITCH_DEFAULTS, **switches}
    num_sink_tokens, gated_attention = switches["num_sink_tokens"], switches["gated_attention"]
    try:  # validates the shape fields and the switches before any weight is read
        hf_to_model_config(hf_cfg, **switches)
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{src / CONFIG_NAME}: missing or invalid field {e}") from e
    tensors = read_weights(src)
    tensors = {k.removeprefix("model."): v for k, v in tensors.items()}
    if "embed_tokens.weight" not in tensors:
        raise CheckpointError(f"{src}: no model.embed_tokens.weight in its safetensors files")
    if hf_cfg.get("tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    elif "lm_head.weight" not in tensors:
        raise CheckpointError(f"{src}: untied model without lm_head.weight in its safetensors files")

    tokenizer = _load_tokenizer(src)
    vocab = hf_cfg["vocab_size"]
    mask_is_new = tokenizer is None or tokenizer.mask_token is None
    if tokenizer is not None:
        if mask_is_new:
            tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
        mask_id = tokenizer.mask_token_id
    else:
        mask_id = vocab
    new_vocab = max(vocab, mask_id + 1)

    config = hf_to_model_config(hf_cfg, **switches).replace(vocab_size=new_vocab, mask_token_id=mask_id)
    config.extra = {"converted_from": str(src), "source_model_type": hf_cfg["model_type"]}
    config.validate()

    gen = torch.Generator().manual_seed(seed)
    emb = tensors["embed_tokens.weight"]
    for name in ("embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            tensors[name] = _init_new_rows(tensors[name], new_vocab, mask_id if mask_is_new else None)
    if num_sink_tokens > 0:
        e = emb.float()
        sinks = e.mean(0) + e.std(0) * torch.randn(num_sink_tokens, e.shape[1], generator=gen)
        tensors["sink_embeddings"] = sinks.to(emb.dtype)
    model_dtype = emb.dtype
    with torch.device("meta"):
        model = DiffusionLM(config)
    if gated_attention:
        for i in range(config.num_hidden_layers):
            o = tensors.get(f"layers.{i}.self_attn.o_proj.weight")
            if o is None:  # reported with the other missing tensors below
                continue
            tensors[f"layers.{i}.self_attn.o_proj.weight"] = o * 2
            tensors[f"layers.{i}.self_attn.g_proj.weight"] = torch.zeros(
                config.num_attention_heads * config.head_dim, config.hidden_size, dtype=model_dtype
            )
    if config.sink_logit:
        for i in range(config.num_hidden_layers):
            tensors[f"layers.{i}.self_attn.sink_logit"] = (
                config.initializer_range * torch.randn(config.num_attention_heads, generator=gen)
            ).to(model_dtype)
    # Drop buffers HF sometimes stores (rotary inv_freq); everything else must match.
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(k for k in set(expected) & set(tensors) if tuple(tensors[k].shape) != expected[k])
    if missing or unexpected or wrong:
        shapes = [f"{k}: file {tuple(tensors[k].shape)} vs config {expected[k]}" for k in wrong[:5]]
        raise CheckpointError(
            f"{src}: weights do not fit its {CONFIG_NAME} ({hf_cfg['model_type']} layout): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatch {shapes}"
        )
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval()
    model.save_pretrained(out, tokenizer=tokenizer)
    return model
