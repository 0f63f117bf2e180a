"""The quantization endpoint's per-run measurement (docs/method.md §16): a run's final checkpoint scored quantized.

`check_torchao`: the plan-time refusal, in one line, where torchao cannot be imported (or a declared scheme cannot
run on the device). `measure_quant` scores the checkpoint on the study's fixed validation (`fixed_set`: the same
sequences, draws and noise seed as the run's val.json) unquantized and once per declared scheme with its block
linears quantized by `model.quantize.quantize_model`, in one process, so that Δ_quant = quantized − unquantized is
paired on the very same masked inputs and kernels; it measures the activation outliers (`analysis.outliers`: the
FFN ∞-norm per layer) of the unquantized model on the same validation sequences, unmasked; and keeps it all in
`runs/<run>/quant.json`. `quant_record` reads the run's record (results.json) back from it.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

from sinkdlm.io.atomic import atomic_write_json

QUANT = "quant.json"  # a run's quantized scorings and outliers


def check_torchao(schemes: tuple[str, ...], device: str | None) -> None:
    """Every declared scheme can run here: torchao importable (one line saying how to get it), and each scheme's
    own device checks (`model.quantize.check_quantize`: int4-weight needs CUDA and bfloat16)."""
    from sinkdlm.model.loader import resolve_device
    from sinkdlm.model.quantize import _quiet_import, check_quantize

    try:
        with _quiet_import():
            import torchao  # noqa: F401
    except ImportError as err:
        raise ValueError(f"the quantization endpoint needs torchao ({err}): pip install 'sinkdlm[quant]', or run in "
                         ".venv-quant (make test-quant builds it)") from None
    where = resolve_device(device)
    for scheme in schemes:
        check_quantize(scheme, where, torch.bfloat16 if scheme == "int4-weight" else torch.float32)


def _outlier_batches(x0: torch.Tensor, batch_size: int, device) -> list[tuple[torch.Tensor, None]]:
    """The validation sequences `[N, L]`, clean, in rows of `batch_size` (no padding: every row is whole)."""
    return [(x0[lo:lo + batch_size].to(device), None) for lo in range(0, len(x0), batch_size)]


def scheme_scores(model, x0: torch.Tensor, validation, scheme: str, reference: torch.Tensor | None) -> dict[str, Any]:
    """One scheme: a copy of the unquantized `model` quantized and scored on `x0`, against `reference` (the
    unquantized model's values `[N, D]`; None: int4-weight, whose reference is the model in bfloat16, scored here).
    `delta` = mean over (sequence, draw) of quantized − reference values; `delta_se` its Monte-Carlo standard
    error over the collapsed strata (`stratified_se`: the validation noise of Δ, the masks shared)."""
    from sinkdlm.diffusion.likelihood import stratified_se
    from sinkdlm.experiment.fixed_set import score_set
    from sinkdlm.model.quantize import quantize_model

    t0 = time.perf_counter()
    base = copy.deepcopy(model)
    if reference is None:  # int4-weight computes in bfloat16: its reference is the unquantized bf16 model
        base = base.to(torch.bfloat16)
        reference = score_set(base, x0, validation)
    values = score_set(quantize_model(base, scheme), x0, validation)  # [N, D]
    diff = values - reference
    return {"val_loss": float(values.mean()), "reference_val_loss": float(reference.mean()),
            "delta": float(diff.mean()), "delta_se": stratified_se(diff),
            "reference": "bfloat16" if scheme == "int4-weight" else "float32", "seconds": time.perf_counter() - t0}


def measure_quant(run: Path, ckpt: str, cfg_kwargs: dict[str, Any], preset, device: str | None) -> dict[str, Any]:
    """`run/quant.json` (see the module docstring), once: a second call reads it back."""
    path = run / QUANT
    if path.is_file():
        return json.loads(path.read_text())
    from sinkdlm.analysis.outliers import measure_outliers
    from sinkdlm.experiment.fixed_set import score_set, validation_inputs
    from sinkdlm.model.quantize import torchao_version

    validation, declared = preset.validation, preset.quantization
    model, x0 = validation_inputs(ckpt, cfg_kwargs, validation, device)
    model.eval()
    t0 = time.perf_counter()
    reference = score_set(model, x0, validation)  # [N, D], the unquantized model in this process: Δ is exactly paired
    seconds = time.perf_counter() - t0
    outliers = measure_outliers(model, _outlier_batches(x0, validation.batch_size, model.device))
    schemes = {s: scheme_scores(model, x0, validation, s, None if s == "int4-weight" else reference)
               for s in declared.schemes}
    record = {"schemes": schemes, "val_loss": float(reference.mean()), "reference_seconds": seconds,
              "tokens": int(x0.numel()), "draws": validation.draws, "noise_seed": validation.noise_seed,
              "bf16": validation.bf16, "torchao": torchao_version(), "outliers": outliers}
    atomic_write_json(path, record)
    return record


def quant_record(path: Path) -> dict[str, Any]:
    """A run's record of the endpoint (results.json): per scheme its val_loss, Δ_quant and the Δ's validation SE;
    the FFN ∞-norm per layer over every position (the sink and the content rows), its largest layer, and the
    number of FFN outlier channels (> 6 σ, `analysis.outliers`) summed over the layers."""
    q = json.loads(path.read_text())
    ffn = q["outliers"]["per_layer"]["ffn"]
    groups = [g for g in (ffn["content"], ffn.get("sink")) if g]
    per_layer = [max(g["inf_norm"][i] for g in groups) for i in range(len(ffn["content"]["inf_norm"]))]
    channels = [set().union(*(g["outlier_channels"][i] for g in groups)) for i in range(len(per_layer))]
    return {"schemes": {s: {k: v[k] for k in ("val_loss", "delta", "delta_se")} for s, v in q["schemes"].items()},
            "val_loss": q["val_loss"], "ffn_inf_norm": per_layer, "ffn_inf_norm_max": max(per_layer),
            "ffn_inf_norm_content": ffn["content"]["inf_norm"],
            "ffn_inf_norm_sink": ffn["sink"]["inf_norm"] if ffn.get("sink") else None,
            "ffn_outlier_channels": sum(len(c) for c in channels)}
