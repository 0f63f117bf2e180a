"""Open any supported model file as a model: detect its format once, parse its config once, read and
map its weights (the body of `DiffusionLM.from_pretrained`).

The format is detected once (`open_source` parses `config.json` or the GGUF header a single time) and the
parsed `ModelSource` is handed down to the pure mappings in `sinkdlm.model.formats` and the byte readers
in `sinkdlm.io.files` / `sinkdlm.io.gguf_file`. Only JSON, safetensors and GGUF are read — never pickle, never
a checkpoint's own Python code (docs/method.md §10). The model class is an argument (`build_model`), so
this module imports no architecture and `DiffusionLM.from_pretrained` calls it without an import cycle;
the tokenizer side lives a layer up, in `sinkdlm.checkpoint.manager`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from sinkdlm.config import ModelConfig
from sinkdlm.config.fields import check_device
from sinkdlm.io.files import (
    CONFIG_NAME,
    SINK_BASE_NAME,
    SINKS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    CheckpointError,
    check_model_path,
    model_state_dict,
    read_json,
    read_weights,
    read_weights_file,
    resolve_dtype,
    weights_sha256,
)
from sinkdlm.model import formats


@dataclass
class ModelSource:
    """A model on disk, its format detected and its config parsed once."""

    path: Path
    fmt: str  # "sinkdlm", "llada", "dream", "qwen2", "llama", "fast_dllm_v2", "sdar" or "gguf" (`formats.FORMATS`)
    config: ModelConfig
    raw: dict = field(default_factory=dict)  # config.json as read (empty for GGUF)
    gguf: object | None = None  # the opened `GGUFFile` for a .gguf source
    base: "ModelSource | None" = None  # a --trainable sink checkpoint's frozen base (`open_sink_checkpoint`)

    @property
    def is_autoregressive(self) -> bool:
        return self.config.causal

    @property
    def weights_file(self) -> Path:
        if self.gguf is not None:
            return self.path
        if self.base is not None:
            return self.path / SINKS_NAME
        single = self.path / WEIGHTS_NAME
        return single if single.is_file() else self.path / WEIGHTS_INDEX_NAME

    @property
    def config_file(self) -> Path:
        return self.path if self.gguf is not None else self.path / CONFIG_NAME


def open_source(path: str | Path, flag: str = "model") -> ModelSource:
    """Detect what `path` holds and parse its config — no weight is read yet.

    Refused with one line naming the path: nothing there, a file that is neither a directory nor a
    `.gguf`, a missing or invalid config, an unsupported layout, architecture or tensor type.
    """
    if isinstance(path, ModelSource):
        return path
    path = check_model_path(path, flag)
    if path.is_file():  # a .gguf (check_model_path refused every other file)
        from sinkdlm.io.gguf_file import GGUFFile

        gguf = GGUFFile(path)
        config = formats.gguf_config(gguf.metadata, gguf.tensor_names, path)
        return ModelSource(path, "gguf", config, gguf=gguf)
    config_path = path / CONFIG_NAME
    if not config_path.is_file() and (path / "adapter_config.json").is_file():  # a `--trainable lora` checkpoint
        raise CheckpointError(f"{path} holds LoRA adapters, not a whole model; fold them into one with "
                              f"`sinkdlm merge --adapter {path} --out DIR`, then use DIR")
    if not config_path.is_file():
        raise CheckpointError(
            f"{config_path} is missing: a model directory needs {CONFIG_NAME} and {WEIGHTS_NAME} "
            f"(write one with DiffusionLM.save_pretrained, or `sinkdlm convert` an HF model)"
        )
    raw = read_json(config_path)
    config, fmt = formats.config_from_raw(raw, config_path)  # any layout (docs/method.md §10)
    base = open_sink_base(path, flag) if (path / SINK_BASE_NAME).is_file() else None
    return ModelSource(path, fmt, config, raw=raw, base=base)


def open_sink_base(path: Path, flag: str) -> ModelSource:
    """The frozen base of a `--trainable sink` checkpoint `path` (its `sink_base.json`: the base's path and the
    sha256 of its weights, checked when they are read); refused in one line when it is gone."""
    ref = read_json(path / SINK_BASE_NAME)
    base = ref.get("base")
    if not isinstance(base, str) or not isinstance(ref.get("sha256"), str):
        raise CheckpointError(f"{path / SINK_BASE_NAME} must name the base model and its sha256 ('base', 'sha256')")
    if not Path(base).exists():
        raise CheckpointError(f"{flag} {path} holds trained sink parameters over the base {base}, which is gone; put "
                              f"the base back there (sha256 {ref['sha256'][:12]}...), or use a checkpoint folded with "
                              f"`sinkdlm merge` while it was there")
    return open_source(base, flag=flag)


def _check_base(source: ModelSource) -> None:
    """The base's weights are the ones the sink parameters were trained over (their sha256, sink_base.json)."""
    want = read_json(source.path / SINK_BASE_NAME)["sha256"]
    got = weights_sha256(source.base.path)
    if got != want:
        raise CheckpointError(f"{source.path}: its base {source.base.path} now holds other weights (sha256 {got[:12]}..., "
                              f"trained over {want[:12]}...); put the original base back, or choose another checkpoint")


def read_tensors(source: ModelSource, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The source's weights in sinkdlm names, cast to `dtype` one tensor at a time.

    A GGUF is dequantised tensor by tensor, in blocks of rows, straight into `dtype` (float32 by
    default), so the peak stays near one float model plus one block."""
    if source.base is not None:  # the base's weights (its own format's names mapped), the trained sinks over them
        _check_base(source)
        tensors = read_tensors(source.base, dtype)
        for name, value in read_weights_file(source.path / SINKS_NAME).items():
            tensors[name] = value.to(dtype) if dtype is not None else value.to(tensors.get(name, value).dtype)
        return tensors
    adapter = formats.ADAPTERS[source.fmt](source.config, source.path)
    if source.gguf is not None:
        return adapter.convert(source.gguf.tensors(dtype or torch.float32))
    tensors = adapter.convert(read_weights(source.path))
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    return tensors


def build_model(model_class: type, path: str | Path | ModelSource, device=None, dtype=None):
    """A `model_class` (`DiffusionLM`) built from any supported model, checking config and weights agree:
    the body of `DiffusionLM.from_pretrained`, which passes its class (so this module imports no model).

    dtype: None or "auto" keeps the stored dtype (float32 for a quantised GGUF); a `torch.dtype`
    or its name casts floats.
    """
    from sinkdlm.config.checks import check_dtype

    dtype = resolve_dtype(check_dtype(dtype))  # a bad argument fails before any file is read
    source = open_source(path)
    config = source.config
    tensors = read_tensors(source, dtype)
    with torch.device("meta"):
        model = model_class(config)
    expected = {k: tuple(v.shape) for k, v in model_state_dict(model).items()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = sorted(k for k in set(expected) & set(tensors) if tuple(tensors[k].shape) != expected[k])
    if missing or unexpected or wrong:
        parts = [] if source.fmt == "sinkdlm" else [f"({source.fmt} layout, mapped to sinkdlm names)"]
        if missing:
            parts.append(f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if wrong:
            parts.append(
                "shape mismatch " + ", ".join(f"{k}: file {tuple(tensors[k].shape)} vs config {expected[k]}" for k in wrong[:5])
            )
        where = source.path if source.gguf is not None else f"{source.weights_file} does not match {source.config_file}"
        raise CheckpointError(f"{where}: " + "; ".join(parts))
    model.load_state_dict(tensors, strict=not config.tie_word_embeddings, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval()
    return model.to(device) if device is not None else model


def resolve_device(name=None):
    """`torch.device` for a `--device` value (`None`/`"auto"`: CUDA when available, else CPU)."""
    if isinstance(name, torch.device):
        name = str(name)
    text = check_device(name)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {text}: CUDA is not available on this machine; use --device cpu or auto")
        index = int(text.split(":")[1]) if ":" in text else 0
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return torch.device(text)
