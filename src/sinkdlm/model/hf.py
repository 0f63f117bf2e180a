"""Hugging Face integration: `AutoModelForMaskedLM` registration, Qwen2/LLaMA conversion, sinks for a DLM.

* `register()` (run by `import sinkdlm`) lets `transformers.AutoConfig` / `AutoModelForMaskedLM`
  open a sinkdlm checkpoint directory; loading goes through `DiffusionLM.from_pretrained`, so it
  keeps our checks and never reads pickle.
* `convert_hf_checkpoint()` turns a local Qwen2 or LLaMA causal LM (a safetensors directory, sharded
  too, or a llama/qwen2 `.gguf` file) into a sinkdlm checkpoint: same weights, bidirectional
  attention, a `[MASK]` token and the sink embeddings (docs/method.md §5). The weights are read by
  the loader (`sinkdlm.checkpoint.manager`) with the format's state-dict adapter, as `load_checkpoint` reads them.
* A diffusion LM (a sinkdlm, LLaDA or Dream directory, a dream/llada `.gguf`) goes through the same
  `convert_hf_checkpoint`: `convert_dlm_model` adds the switches asked for (sink tokens, a sink logit, ...)
  with their new parameters drawn as the AR conversion draws them; every other tensor is the input's.
"""

from __future__ import annotations

import json

from typing import Any
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForMaskedLM, PretrainedConfig

from sinkdlm.config import MODEL_SWITCH_DEFAULTS, MODEL_TYPE, ModelConfig, check_model_switches
from sinkdlm.config.model import switch_values
from sinkdlm.io.files import CheckpointError, without_loader_args
from sinkdlm.checkpoint.manager import ModelSource, load_tokenizer_for, open_source, read_tensors
from sinkdlm.model.transformer import DiffusionLM

SUPPORTED_ARCHITECTURES = ("qwen2", "llama")
MASK_TOKEN = "[MASK]"


class SinkDLMConfig(PretrainedConfig):
    """The `transformers` face of `ModelConfig` (only used to route AutoModel loading)."""

    model_type = MODEL_TYPE

    def to_model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.to_dict())


class AutoDiffusionLM(DiffusionLM):
    """`DiffusionLM` as `transformers`' Auto classes open it: the same model, declaring the `config_class`
    they read (`AutoModelForMaskedLM.register` checks it), so `DiffusionLM` itself stays free of transformers
    and no attribute is set on it at import."""

    config_class = SinkDLMConfig


def register() -> None:
    """Route `AutoConfig` / `AutoModelForMaskedLM` to sinkdlm checkpoints, through their public `register`."""
    AutoConfig.register(MODEL_TYPE, SinkDLMConfig, exist_ok=True)
    AutoModelForMaskedLM.register(SinkDLMConfig, AutoDiffusionLM, exist_ok=True)


# ----------------------------------------------------------------------------- conversion
def _open_causal_source(src: str | Path) -> ModelSource:
    """Open and check a Qwen2/LLaMA causal LM (directory or .gguf): anything we cannot represent
    exactly was refused by the format mapping, before any weight is read."""
    source = open_source(src, flag="src")
    if source.fmt not in ("qwen2", "llama", "gguf"):
        raise CheckpointError(
            f"{source.config_file}: model_type {source.raw.get('model_type', source.fmt)!r} is not supported; "
            f"convert one of {SUPPORTED_ARCHITECTURES} (a directory or a .gguf file)"
        )
    if not source.config.causal:  # a dream/llada GGUF is already a diffusion LM
        raise CheckpointError(f"{source.path}: a {source.gguf.architecture} GGUF is already a diffusion LM; open it "
                              f"directly (--model), no conversion is needed")
    return source


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


def _load_tokenizer(source: ModelSource):
    if source.gguf is not None:  # a .gguf always carries its tokenizer
        return load_tokenizer_for(source)
    if not any((source.path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    import transformers

    try:
        return without_loader_args(transformers.AutoTokenizer.from_pretrained(str(source.path), local_files_only=True))
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
    # transformers 4.46 reads config.json, where a DLM directory (Dream, LLaDA) names its custom code (auto_map),
    # and refuses without trust_remote_code; sinkdlm never runs a checkpoint's code: the tokenizer class the
    # directory names, looked up in transformers itself (its fast variant first, as AutoTokenizer does)
    config = source.path / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    names = (name if name.endswith("Fast") else f"{name}Fast", name) if isinstance(name, str) else ()
    cls = next((getattr(transformers, n) for n in names if hasattr(transformers, n)), transformers.PreTrainedTokenizerFast)
    return without_loader_args(cls.from_pretrained(str(source.path), local_files_only=True))


def tokenizer_with_mask(src: str | Path | ModelSource):
    """(the HF model's tokenizer with a `[MASK]` token added when it has none, whether it was added);
    (None, True) for a directory without tokenizer files. Deterministic: the converter and
    `train --init-from` get the same ids."""
    tokenizer = _load_tokenizer(open_source(src, flag="src"))
    mask_is_new = tokenizer is None or tokenizer.mask_token is None
    if tokenizer is not None and mask_is_new:
        tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})
    return tokenizer, mask_is_new


def convert_hf_checkpoint(
    src: str | Path | ModelSource,
    out: str | Path,
    *,
    seed: int = 0,
    shift_logits: bool = False,
    **switches: Any,
) -> DiffusionLM:
    """Convert a local model into a sinkdlm checkpoint at `out`, then `save_pretrained`: a HF Qwen2/LLaMA
    causal LM becomes a bidirectional DLM (`convert_hf_model`; `shift_logits`: keep the AR head's shift,
    Dream's recipe, docs/method.md §5); a diffusion LM gains the switches asked for (`convert_dlm_model`)."""
    source = open_source(src, flag="--from-hf")
    if source.config.causal:
        model, tokenizer = convert_hf_model(source, seed=seed, **switches)
        model.config.shift_logits = bool(shift_logits)  # stored in config.json; train/generate read it there
    else:
        model, tokenizer = convert_dlm_model(source, seed=seed, shift_logits=shift_logits, **switches)
    model.save_pretrained(Path(out), tokenizer=tokenizer)
    return model


def convert_hf_model(src: str | Path | ModelSource, *, seed: int = 0, **switches: Any):
    """A local HF Qwen2/LLaMA causal LM as a bidirectional sinkdlm DLM in memory: (model, tokenizer
    with `[MASK]`, or None when the directory has no tokenizer). `train --init-from` uses it.

    `switches` are model switches by name (`sinkdlm.config.MODEL_SWITCHES`: num_sink_tokens,
    sink_position, sink_zero_value, gated_attention, sink_logit, softmax_one); unset ones take
    their registry default.

    New parameters and how they start:
      * `[MASK]` gets the id `len(tokenizer)` (after adding it), or `vocab_size` without a
        tokenizer; when that id lies past the embedding matrix, the embedding and head grow by
        the missing rows. New rows — and the [MASK] row even when it is a spare padded row, as in
        Qwen2.5 — are the mean of the trained rows (the new token starts
        "average" instead of random, so its logit neither dominates nor vanishes — Hewitt 2021).
      * the switches' parameters as `_draw_switch_parameters` draws them.
    """
    source = _open_causal_source(src)
    check_model_switches(switches)  # unknown names and bad values, before any weight is read
    switches = {**MODEL_SWITCH_DEFAULTS, **switches}
    causal = source.config
    # The causal LM's shapes as a bidirectional DLM with the run's switches: validated (bad switch
    # values included) before any weight is read.
    dlm = causal.replace(causal=False, shift_logits=False, mask_token_id=causal.vocab_size - 1, **switches)
    dlm.validate()
    tokenizer, mask_is_new = tokenizer_with_mask(source)
    tensors = read_tensors(source)  # the format's adapter: sinkdlm names, a tied head dropped
    if "embed_tokens.weight" not in tensors:
        raise CheckpointError(f"{source.path}: no embedding (model.embed_tokens.weight / token_embd.weight) in its weights")
    if not causal.tie_word_embeddings and "lm_head.weight" not in tensors:
        raise CheckpointError(f"{source.path}: untied model without lm_head.weight in its weights")

    vocab = causal.vocab_size
    mask_id = tokenizer.mask_token_id if tokenizer is not None else vocab
    new_vocab = max(vocab, mask_id + 1)

    config = dlm.replace(vocab_size=new_vocab, mask_token_id=mask_id)
    source_type = _source_type(source)
    # the rows this conversion sets (the [MASK] row and any row past the input's) are mean rows, no trained ones:
    # recorded, so that a later conversion adding sinks leaves them out of their statistics as this one does (one
    # conversion or two draw the same sinks)
    config.extra = {"converted_from": str(source.path), "source_model_type": source_type,
                    "trained_rows": vocab, "mask_row_added": mask_is_new}
    config.validate()

    emb = _trained_rows(tensors["embed_tokens.weight"], vocab, mask_id if mask_is_new else None)
    for name in ("embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            tensors[name] = _init_new_rows(tensors[name], new_vocab, mask_id if mask_is_new else None)
    _draw_switch_parameters(tensors, config, emb, seed, switches)
    return _assemble(config, tensors, source), tokenizer


# Switches that shape the sinks a model already has: fixed once it has one.
_SINK_SHAPE = ("sink_position", "sink_zero_value")


def convert_dlm_model(src: str | Path | ModelSource, *, seed: int = 0, shift_logits: bool = False, **switches: Any):
    """A diffusion LM (sinkdlm, LLaDA or Dream directory, dream/llada .gguf) with model switches added:
    (model, its tokenizer). The switches a model has are kept; a switch at its default keeps the model's
    value, any other value adds it (`--num-sink-tokens 1` adds a sink). The new parameters start as in
    `convert_hf_model` (`_draw_switch_parameters`, by `seed`); every other tensor is the input's, bit for
    bit. Refused before any weight is read: a switch the model has set to another value, sink settings of
    sinks it has, nothing to add, `shift_logits` on a model without it (a DLM keeps its own head)."""
    from sinkdlm.checkpoint.manager import load_tokenizer_for

    source = open_source(src, flag="--from-hf")
    assert not source.config.causal, "causal LMs go through convert_hf_model"
    added = switches_to_add(source, switches)
    wanted = {**switch_values(source.config), **added}
    if not added:
        raise ValueError(f"--from-hf {source.path} is a diffusion LM that has these switches already; give the "
                         f"ones to add, e.g. --num-sink-tokens 1")
    if shift_logits and not source.config.shift_logits:
        raise ValueError(f"--shift-logits: {source.path} is a diffusion LM trained without the shift; it keeps its "
                         "own head (leave --shift-logits off)")
    config = source.config.replace(**wanted)
    config.extra = {**config.extra, "switches_added_from": str(source.path), "source_model_type": _source_type(source)}
    config.validate()  # before any weight is read
    tokenizer = load_tokenizer_for(source)
    tensors = read_tensors(source)
    emb = tensors["embed_tokens.weight"]  # the rows a conversion set left out, as convert_hf_model does
    emb = _trained_rows(emb, config.extra.get("trained_rows", emb.shape[0]),
                        config.mask_token_id if config.extra.get("mask_row_added") else None)
    _draw_switch_parameters(tensors, config, emb, seed, added)
    return _assemble(config, tensors, source), tokenizer


def switches_to_add(source: ModelSource, switches: dict[str, Any]) -> dict[str, Any]:
    """What converting the diffusion LM `source` with `switches` adds: {name: value} (empty: it has them all). A
    switch at its default keeps the model's value; one the model has set to another value is refused."""
    check_model_switches(switches)
    have = switch_values(source.config)
    added = {}
    for name, value in {**MODEL_SWITCH_DEFAULTS, **switches}.items():
        if value == MODEL_SWITCH_DEFAULTS[name] or value == have[name]:
            continue  # at its default: the model's own value stands
        fixed = have[name] != MODEL_SWITCH_DEFAULTS[name] or (name in _SINK_SHAPE and have["num_sink_tokens"] > 0)
        if fixed:
            raise ValueError(f"--from-hf {source.path} already has {name}={have[name]!r}; conversion adds "
                             f"switches to a diffusion LM and changes none it has (asked for {value!r})")
        added[name] = value
    return added


def _source_type(source: ModelSource) -> str:
    return source.raw.get("model_type", source.fmt) if source.gguf is None else f"gguf:{source.gguf.architecture}"


def _trained_rows(emb: torch.Tensor, rows: int, mask_row: int | None) -> torch.Tensor:
    """The first `rows` embedding rows of `emb [V, d]` without the [MASK] row a conversion set (`mask_row`; None
    or past them: none left out): the trained rows, which the sinks' statistics are drawn from."""
    emb = emb[:rows]
    if mask_row is None or mask_row >= rows:
        return emb
    return torch.cat([emb[:mask_row], emb[mask_row + 1:]])


def _draw_switch_parameters(tensors: dict, config: ModelConfig, emb: torch.Tensor, seed: int, new: dict) -> None:
    """Add to `tensors` the parameters that the switches in `new` bring to `config` (in place):
      * sink embeddings are drawn per dimension from N(mean, std) of the trained embedding rows `emb`,
        so they sit at the scale of real tokens; distinct draws keep 2 or 4 sinks distinguishable.
      * gated attention: W_g = 0 gives σ(0) = 1/2 everywhere; o_proj is doubled so the layer
        computes exactly the original function at step 0 (eq. 8-10 then learns the gate).
      * sink logits (`sink_logit`): N(0, initializer_range) per head, as gpt-oss initialises its
        `sinks` (transformers `GptOssPreTrainedModel._init_weights`); softmax_one has no parameter.
    One generator seeded by `seed` draws the sinks, then the sink logits."""
    gen = torch.Generator().manual_seed(seed)
    dtype = emb.dtype
    if new.get("num_sink_tokens", 0) > 0:
        e = emb.float()
        sinks = e.mean(0) + e.std(0) * torch.randn(config.num_sink_tokens, e.shape[1], generator=gen)
        tensors["sink_embeddings"] = sinks.to(dtype)
    if new.get("gated_attention"):
        for i in range(config.num_hidden_layers):
            o = tensors.get(f"layers.{i}.self_attn.o_proj.weight")
            if o is None:  # reported with the other missing tensors by `_assemble`
                continue
            tensors[f"layers.{i}.self_attn.o_proj.weight"] = o * 2
            tensors[f"layers.{i}.self_attn.g_proj.weight"] = torch.zeros(
                config.num_attention_heads * config.head_dim, config.hidden_size, dtype=dtype
            )
    if new.get("sink_logit"):
        for i in range(config.num_hidden_layers):
            tensors[f"layers.{i}.self_attn.sink_logit"] = (
                config.initializer_range * torch.randn(config.num_attention_heads, generator=gen)
            ).to(dtype)


def _assemble(config: ModelConfig, tensors: dict, source: ModelSource) -> DiffusionLM:
    """A `DiffusionLM(config)` holding `tensors` (assigned, not copied), checked name by name and shape by shape."""
    with torch.device("meta"):
        model = DiffusionLM(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(k for k in set(expected) & set(tensors) if tuple(tensors[k].shape) != expected[k])
    if missing or unexpected or wrong:
        shapes = [f"{k}: file {tuple(tensors[k].shape)} vs config {expected[k]}" for k in wrong[:5]]
        raise CheckpointError(
            f"{source.path}: weights do not fit its config ({_source_type(source)} layout): "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}, shape mismatch {shapes}"
        )
    model.load_state_dict(tensors, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval()
    return model
