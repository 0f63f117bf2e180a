"""Checkpoint directories: `config.json` + `model.safetensors` (+ tokenizer files).

The single exchange format between training, sampling, evaluation and analysis. Writes are atomic
(temp file + `os.replace`), so a crash leaves either the old file or the new one. Only JSON and
safetensors are ever read — never pickle. Every failure names the file and what to do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


import safetensors.torch
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from sinkdlm.atomic import atomic_write, atomic_write_json
from sinkdlm.config import ModelConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read; the message names the file."""


def save_state_dict(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict | None = None) -> None:
    """safetensors `save_file`, atomically."""
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    # save_file is looked up on the module at call time (not imported by name) so tests can
    # simulate a crash in the middle of the write.
    atomic_write(path, lambda tmp: safetensors.torch.save_file(tensors, tmp, metadata=metadata))


def model_state_dict(model, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The state dict to store: a tied head is stored once (as `embed_tokens.weight`).

    `state_dict`: the model's full state dict when it was gathered elsewhere (FSDP).
    """
    sd = dict(model.state_dict() if state_dict is None else state_dict)
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def save_checkpoint(model, directory: str | Path, tokenizer=None, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """config.json + model.safetensors (+ tokenizer). `state_dict`: as for `model_state_dict`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_state_dict(model_state_dict(model, state_dict), directory / WEIGHTS_NAME, metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    # config.json last: a directory with a config has complete weights beside it.
    atomic_write_json(directory / CONFIG_NAME, model.config.to_dict())
    return directory


def read_config(directory: str | Path) -> ModelConfig:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} does not exist (or is not a directory)")
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(
            f"{path} is missing: a sinkdlm checkpoint needs {CONFIG_NAME} and {WEIGHTS_NAME} "
            f"(write one with DiffusionLM.save_pretrained, or `sinkdlm convert` an HF model)"
        )
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object (the model config), got {type(raw).__name__}")
    from sinkdlm.model.formats import config_from_raw

    # A LLaDA, Dream or Qwen2/LLaMA config maps onto ModelConfig too (docs/method.md §10).
    return config_from_raw(raw, path)[0]


def read_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """Read `model.safetensors`, or the shards listed in `model.safetensors.index.json`."""
    directory = Path(directory)
    single, index = directory / WEIGHTS_NAME, directory / WEIGHTS_INDEX_NAME
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index (needs a 'weight_map'): {e}") from e
        files = [directory / name for name in sorted(set(weight_map.values()))]
    else:
        pickled = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt")]
        hint = (
            f" (found {pickled}: pickle files are never read; re-save them as safetensors)" if pickled else ""
        )
        raise CheckpointError(f"{single} is missing{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f} is missing (listed in {index.name})")
        try:
            loaded = load_file(str(f))
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{f} is corrupt or truncated ({e}); re-save or re-download it") from e
        for name in list(loaded):  # one at a time: peak memory grows by one tensor, not the model
            tensors[name] = _aligned(loaded.pop(name))
    return tensors


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """A copy in torch's own (64-byte aligned) memory when safetensors' buffer is not aligned.

    safetensors allocates tensors at 8-byte alignment; CPU kernels then take other SIMD paths,
    and a reloaded model's logits differ from the saved model's in the last bits (seen on the
    batch-1 sink stream). Aligned copies make save -> load bit-exact.
    """
    return t.clone() if t.data_ptr() % 64 else t


def resolve_dtype(dtype) -> torch.dtype | None:
    """None / "auto" (the `transformers` idiom) = as stored; a `torch.dtype` or its name otherwise."""
    if dtype is None or dtype == "auto":
        return None
    resolved = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(
            f"dtype {dtype!r} is not a floating-point torch dtype; use e.g. torch.bfloat16, 'float32' or 'auto'"
        )
    return resolved


def load_checkpoint(directory: str | Path, device=None, dtype=None):
    """Build a `DiffusionLM` from a checkpoint directory, checking config and weights agree.

    dtype: None or "auto" keeps the stored dtype; a `torch.dtype` or its name casts floats.
    """
    from sinkdlm.model.transformer import DiffusionLM

    from sinkdlm.model.formats import checkpoint_format, to_sinkdlm_names

    dtype = resolve_dtype(dtype)  # a bad argument fails before any file is read
    config = read_config(directory)  # any supported layout (sinkdlm, LLaDA, Dream, Qwen2, LLaMA)
    fmt = checkpoint_format(directory)
    tensors = to_sinkdlm_names(fmt, read_weights(directory), config, directory)
    weights_file = Path(directory) / (WEIGHTS_NAME if (Path(directory) / WEIGHTS_NAME).is_file() else WEIGHTS_INDEX_NAME)
    with torch.device("meta"):
        model = DiffusionLM(config)
    expected = {k: tuple(v.shape) for k, v in model_state_dict(model).items()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(k for k in set(expected) & set(tensors) if tuple(tensors[k].shape) != expected[k])
    if missing or unexpected or wrong:
        parts = [] if fmt == "sinkdlm" else [f"({fmt} layout, mapped to sinkdlm names)"]
        if missing:
            parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if wrong:
            parts.append(
                "shape mismatch " + ", ".join(f"{k}: file {tuple(tensors[k].shape)} vs config {expected[k]}" for k in wrong[:5])
            )
        raise CheckpointError(
            f"{weights_file} does not match {Path(directory) / CONFIG_NAME}: " + "; ".join(parts)
        )
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    model.load_state_dict(tensors, strict=not config.tie_word_embeddings, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval()
    return model.to(device) if device is not None else model


def load_model_and_tokenizer(directory: str | Path, device=None, dtype: str | torch.dtype | None = None):
    """(DiffusionLM in eval mode, its tokenizer) from one checkpoint directory, checked to agree.

    The directory may also be a LLaDA, Dream or Qwen2/LLaMA checkpoint (`sinkdlm.model.formats`).

    `device`: a `--device` value (None or "auto": CUDA when available, `sinkdlm.device`);
    `dtype` as for `load_checkpoint`.
    """
    from sinkdlm.data.tokenizer import check_tokenizer_matches, load_tokenizer
    from sinkdlm.device import resolve_device

    device = resolve_device(device)
    model = load_checkpoint(directory, device=device, dtype=dtype)
    tokenizer = load_tokenizer(directory)
    check_tokenizer_matches(tokenizer, model.config.vocab_size, model.config.mask_token_id)
    return model, tokenizer


def ensure_writable_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create `path` if needed and prove we can write into it — before any work starts."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{flag} {path} is not writable ({e.strerror}); choose another directory") from e
    return path
