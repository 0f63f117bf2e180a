"""The masked-diffusion training loss (docs/method.md §1, eq. 3-4) and its SFT variant.

    loss = mean_b [ (1/L) * sum_i 1[xt_i = MASK] * CE(logits_i, x0_i) / t_b ]

For SFT the prompt is never masked and LLaDA normalises by the response length instead of L.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sinkdlm.diffusion.noise import forward_mask, sample_t


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    num_masked: torch.Tensor  # 0-dim int64 on the batch's device: reading it is the caller's host sync
    t: torch.Tensor  # [B]


def weighted_masked_ce(logits: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per-sequence `sum_i 1[masked_i] CE_i / t_b`, `[B]` (the numerator of eq. 4)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    ce = F.cross_entropy(logits.flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
    return (ce * masked).sum(-1) / t


def diffusion_loss(
    model,
    x0: torch.Tensor,
    *,
    mask_id: int | None = None,
    eps: float = 1e-3,
    t: torch.Tensor | None = None,
    low_discrepancy: bool = False,
    prompt_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    shift_logits: bool | None = None,
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,
    **forward_kwargs,
) -> LossOutput:
    """eq. 3-4 on a batch `x0 [B, L]`.

    prompt_mask    `[B, L]` True on prompt positions: never masked, and the loss is normalised by
                   the response length (SFT, LLaDA); otherwise by L.
    attention_mask `[B, L]` True = real token; padding is never masked nor counted. Or a 4-D
                   `[B|1, 1, L, L]` content-to-content mask (attention annealing), handed to the model.
    t, u           the noise, when the caller draws it (else from `generator`).
    shift_logits   position i predicts token i+1 (an AR-initialised head, docs/method.md §5): the logits
                   of position i-1 score the token at i; position 0 is then never masked. None
                   (default): the model's `config.shift_logits`.
    """
    config = getattr(model, "config", None) or model.module.config  # DDP wraps the model
    mask_id = config.mask_token_id if mask_id is None else mask_id
    shift_logits = getattr(config, "shift_logits", False) if shift_logits is None else bool(shift_logits)
    if mask_id is None:
        raise ValueError("this is an autoregressive model (no [MASK] token): the diffusion loss needs a DLM; "
                         "train from it with `--init-from DIR`, which converts it")
    b, l = x0.shape
    if t is None:
        t = sample_t(b, eps, low_discrepancy, generator=generator, device=x0.device)
    maskable = torch.ones_like(x0, dtype=torch.bool)
    if prompt_mask is not None:
        maskable &= ~prompt_mask.bool()
    if attention_mask is not None and attention_mask.dim() == 2:
        maskable &= attention_mask.bool()
    if shift_logits:
        maskable[:, 0] = False
    xt, masked = forward_mask(x0, t, mask_id, maskable, generator=generator, u=u)
    # The LM head runs only where the loss reads it: the masked positions (or, shifted, the positions
    # just before them). On SmolLM2-135M the 49152 x 576 head is a fifth of the FLOPs; at mask rate t
    # it now costs t of that (benchmarks/bench_real_train.py).
    need = torch.zeros_like(masked)
    if shift_logits:  # logits[:, i-1] predicts x0[:, i]; position 0 is never masked
        need[:, :-1] = masked[:, 1:]
    else:
        need = masked
    logits = model(xt, attention_mask=attention_mask, logits_index=need, **forward_kwargs).logits  # [N, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    ce = F.cross_entropy(logits, x0[masked], reduction="none")  # row-major, as `need` is
    rows = masked.nonzero()[:, 0]
    per_seq = torch.zeros(b, dtype=ce.dtype, device=ce.device).index_add_(0, rows, ce) / t
    norm = maskable.sum(-1).clamp(min=1) if prompt_mask is not None else torch.full_like(per_seq, l)
    return LossOutput(loss=(per_seq / norm).mean(), num_masked=masked.sum(), t=t)
