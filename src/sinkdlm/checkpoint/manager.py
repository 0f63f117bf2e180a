"""The checkpoint manager: open any supported model (a directory or a `.gguf` file) as model + tokenizer.

It sits above both `sinkdlm.model` and `sinkdlm.data` (nanochat's checkpoint_manager): the format
is detected once (`open_source`, in `sinkdlm.model.loader`, parses `config.json` or the GGUF header a
single time) and the parsed `ModelSource` is handed to both the model (`DiffusionLM.from_pretrained`,
defined on the class, its body `sinkdlm.model.loader.build_model`) and the tokenizer builders in
`sinkdlm.data.tokenizer`. Only JSON, safetensors and GGUF are read — never pickle, never a
checkpoint's own Python code (docs/method.md §10).
"""

from __future__ import annotations

from pathlib import Path

import torch

from sinkdlm.model.loader import ModelSource, open_source, read_tensors
from sinkdlm.model.transformer import DiffusionLM

__all__ = ["ModelSource", "load_checkpoint", "load_model_and_tokenizer", "load_tokenizer_for", "open_source",
           "read_tensors"]


def load_checkpoint(path: str | Path | ModelSource, device=None, dtype=None) -> DiffusionLM:
    """`DiffusionLM.from_pretrained(path, device=, dtype=)`: a model from any supported directory or .gguf."""
    return DiffusionLM.from_pretrained(path, device=device, dtype=dtype)


def load_tokenizer_for(path: str | Path | ModelSource):
    """The tokenizer that belongs to a model: its directory's files, or a .gguf file's metadata."""
    from sinkdlm.data.tokenizer import gguf_tokenizer, load_pretrained_tokenizer, load_tokenizer

    source = open_source(path)
    if source.base is not None and not (source.path / "tokenizer.json").is_file():  # a sink checkpoint: the base's
        return load_tokenizer_for(source.base)
    if source.gguf is not None:
        return gguf_tokenizer(source.path, source.config.mask_token_id)
    if source.fmt != "sinkdlm":
        return load_pretrained_tokenizer(source.path, source.config.mask_token_id)
    return load_tokenizer(source.path, sinkdlm_checkpoint=True)  # config.json parsed once, by open_source


def load_model_and_tokenizer(path: str | Path | ModelSource, device=None, dtype: str | torch.dtype | None = None,
                             quantize: str | None = None):
    """(DiffusionLM in eval mode, its tokenizer) from one model, checked to agree.

    `path`: a sinkdlm, LLaDA, Dream or Qwen2/LLaMA directory, or a `.gguf` file (llama, qwen2, or llama.cpp's diffusion architectures dream and llada).
    `device`: a `--device` value (None or "auto": CUDA when available, `sinkdlm.model.loader.resolve_device`);
    `dtype` as for `load_checkpoint`; `quantize`: a `--quantize` scheme applied after loading
    (`sinkdlm.model.quantize`, checked before any weight is read), None: as loaded.
    """
    from sinkdlm.data.tokenizer import check_tokenizer_matches
    from sinkdlm.model.loader import resolve_device
    from sinkdlm.model.quantize import check_quantize, quantize_model

    device = resolve_device(device)
    check_quantize(quantize, device, dtype)
    source = open_source(path)  # detected and parsed once, for both model and tokenizer
    model = quantize_model(load_checkpoint(source, device=device, dtype=dtype), quantize)
    tokenizer = load_tokenizer_for(source)
    check_tokenizer_matches(tokenizer, model.config.vocab_size, model.config.mask_token_id)
    return model, tokenizer
