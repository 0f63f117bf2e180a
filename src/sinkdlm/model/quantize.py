"""`--quantize`: a loaded model's linear layers quantized by torchao's `quantize_` (inference only).

Schemes (`QUANTIZE_SCHEMES`, torchao's public configs):
  int8-weight   `Int8WeightOnlyConfig`: int8 weights, one symmetric scale per output row; activations stay
                float. Saves memory (the block linears take a quarter of float32's bytes), not time.
  int8-dynamic  `Int8DynamicActivationInt8WeightConfig` (W8A8): the weights as above, and every activation row
                quantized to int8 on the fly (a scale per token), an int8 x int8 matmul; on this project's CPU
                (torch 2.13, torchao 0.18) slower than float32, eager and compiled (benchmarks/bench_quant.py).
  int4-weight   `Int4WeightOnlyConfig` in the tile-packed layout of torch's tinygemm kernel: CUDA with compute
                capability >= 8.0 and bfloat16 weights only (torchao 0.18 has no int4 kernel for a CPU outside
                its prototypes); groups of 128 (or the largest of 64, 32 dividing the input width).
Only the linear layers inside the transformer blocks are quantized (q/k/v/o, the gate of gated attention,
the SwiGLU's gate/up/down). Kept in their own dtype, bit for bit: the sink tokens' embedding rows
(`sink_embeddings`), the token embeddings, the RMSNorm weights, the per-head sink logits and the LM head (the
head is tied to the embeddings in many models, and the sink's row of the logits is no quantizer's business).

`check_quantize` says in one line what cannot run, before any weight is read; `quantize_model` applies the
scheme to a loaded model, which then refuses training (`DiffusionLM.train`) and skips the packed q/k/v
projections (`DiffusionLM.fuse_projections`: torchao's tensors are not concatenated).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from torch import nn

from sinkdlm.config.checks import QUANTIZE_SCHEMES

INT4_GROUPS = (128, 64, 32)  # the group sizes tinygemm takes, the coarsest that divides the input width first
# torchao computes in these dtypes (its Int8Tensor refuses float64)
QUANTIZABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@contextmanager
def _quiet_import():
    """torchao's import logs a warning per C++ extension built for other Pythons or GPUs (none is used
    here) and torch one about torchao's enum: not the user's concern, so silenced while it imports."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def torchao_version() -> str | None:
    """The installed torchao's version, or None (read from metadata: nothing is imported)."""
    from importlib import metadata

    try:
        return metadata.version("torchao")
    except metadata.PackageNotFoundError:
        return None


def check_quantize(scheme: str | None, device, dtype=None) -> None:
    """`--quantize` can run here, said in one line before any weight is read: a known scheme, torchao
    installed, and for int4-weight a CUDA device of compute capability >= 8.0 and `--dtype bfloat16`.
    `device` a `torch.device`; `dtype` the `--dtype` asked for (None: as stored)."""
    if scheme is None:
        return
    if scheme not in QUANTIZE_SCHEMES:
        raise ValueError(f"--quantize must be one of {' | '.join(QUANTIZE_SCHEMES)}, got {scheme!r}")
    if torchao_version() is None:
        raise ValueError(f"--quantize {scheme} needs torchao: pip install 'sinkdlm[quant]'")
    if scheme != "int4-weight":
        if dtype is not None and str(dtype).removeprefix("torch.") == "float64":
            raise ValueError(f"--quantize {scheme} quantizes float32, bfloat16 or float16 weights (torchao's int8 "
                             "tensors refuse float64): drop --dtype float64")
        return
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"--quantize int4-weight has no torchao kernel on {device.type} (torchao "
                         f"{torchao_version()}: tinygemm, CUDA only); on a CPU use int8-weight (a quarter of the "
                         "block weights' memory)")
    if torch.cuda.get_device_capability(device)[0] < 8:
        raise ValueError(f"--quantize int4-weight needs a GPU of compute capability >= 8.0 (torchao's tinygemm "
                         f"kernel); {device} has {torch.cuda.get_device_capability(device)}: use int8-weight")
    if dtype is None or str(dtype).removeprefix("torch.") != "bfloat16":
        raise ValueError("--quantize int4-weight computes in bfloat16 (torchao's tinygemm kernel): add --dtype bfloat16")


def quantized_linears(model: nn.Module) -> list[str]:
    """The names of the linear layers `quantize_model` quantizes: those inside the transformer blocks."""
    return [name for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name.startswith("layers.")]


def torchao_config(scheme: str, in_features: int):
    """torchao's public config of `scheme` for linears of `in_features` inputs (int4: the group that divides it)."""
    with _quiet_import():
        from torchao.quantization import (
            Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,
        )
    if scheme == "int8-weight":
        return Int8WeightOnlyConfig()
    if scheme == "int8-dynamic":
        return Int8DynamicActivationInt8WeightConfig()
    group = next((g for g in INT4_GROUPS if in_features % g == 0), None)
    if group is None:
        raise ValueError(f"--quantize int4-weight needs linear input widths divisible by 32; this model has one of "
                         f"{in_features}: use int8-weight")
    return Int4WeightOnlyConfig(group_size=group, int4_packing_format="tile_packed_to_4d")


@torch.no_grad()
def quantize_model(model: nn.Module, scheme: str | None) -> nn.Module:
    """Quantize `model`'s block linears in place with torchao (`scheme` one of `QUANTIZE_SCHEMES`; None: as
    it is) and return it, in eval mode; from then on it refuses `train()`. Check with `check_quantize` first."""
    if scheme is None:
        return model
    if model.dtype not in QUANTIZABLE_DTYPES:
        raise ValueError(f"--quantize {scheme} quantizes float32, bfloat16 or float16 weights, and this model is "
                         f"{str(model.dtype).removeprefix('torch.')}: load it with --dtype float32 or bfloat16")
    check_quantize(scheme, model.device, model.dtype)
    if getattr(model, "quantization", None) is not None:
        raise ValueError(f"the model is quantized already ({model.quantization}); load it again to quantize it "
                         "another way")
    with _quiet_import():
        from torchao.quantization import quantize_
    model.eval()
    names = set(quantized_linears(model))
    widths = sorted({model.get_submodule(n).in_features for n in names})
    for width in widths:  # one config per input width (int4's group divides it)
        quantize_(model, torchao_config(scheme, width),
                  filter_fn=lambda m, fqn, w=width: fqn in names and m.in_features == w)
    model.quantization = scheme
    return model
