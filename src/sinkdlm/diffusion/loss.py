"""The masked-diffusion training loss (docs/method.md §1, eq. 3-4) and its SFT variant.

    loss = mean_b [ (1/L) * sum_i 1[xt_i = MASK] * CE(logits_i, x0_i) / t_b ]

For SFT the prompt is never masked and LLaDA normalises by the response length instead of L.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from sinkdlm.diffusion.noise import MaskNoise, forward_mask


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable
    num_masked: torch.Tensor  # 0-dim int64 (on the model's device; planned on the host for a host batch)
    t: torch.Tensor  # [B]


def weighted_masked_ce(logits: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per-sequence `sum_i 1[masked_i] CE_i / t_b`, `[B]` (the numerator of eq. 4)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    ce = F.cross_entropy(logits.flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
    return (ce * masked).sum(-1) / t


def diffusion_loss(
    model,
    x0: torch.Tensor,
    noise: MaskNoise | None = None,
    *,
    mask_id: int | None = None,
    prompt_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    shift_logits: bool | None = None,
    **forward_kwargs,
) -> LossOutput:
    """eq. 3-4 on a batch `x0 [B, L]`.

    prompt_mask    `[B, L]` True on prompt positions: never masked, and the loss is normalised by
                   the response length (SFT, LLaDA); otherwise by L.
    attention_mask `[B, L]` True = real token; padding is never masked nor counted. Or a 4-D
                   `[B|1, 1, L, L]` content-to-content mask (attention annealing), handed to the model.
    noise          t and the masks' uniforms (`MaskNoise`: given, or drawn from its generator; default:
                   a fresh draw from torch's global generator).
    Host tensors (a data loader's batch) are planned on the host and moved to the model's device, so
    the device step has no host sync (`MaskPlan`); tensors already on the device are planned there.
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
    plan = plan_masks(x0, noise, mask_id=mask_id, prompt_mask=prompt_mask, attention_mask=attention_mask,
                      shift_logits=shift_logits)
    device = _device_of(model, x0.device)
    if device != x0.device:
        plan = plan.to(device)
    if attention_mask is not None:
        attention_mask = to_device(attention_mask, device)
    return masked_loss(model, plan, attention_mask=attention_mask, **forward_kwargs)


@dataclass
class MaskPlan:
    """One batch's noise and the positions the loss reads (eq. 3-4), with their shapes known.

    Everything whose size depends on the draw (N masked positions) is built here, where the noise is
    drawn: on the host when the batch comes from the host, as a data loader's does. The device step
    (`masked_loss`) then only gathers by these indices: no `nonzero`, no boolean indexing, no `.item()`,
    so a GPU step never waits for the host to learn N.
    """

    xt: torch.Tensor  # [B, L] the noised input
    t: torch.Tensor  # [B]
    rows: torch.Tensor  # [N] the batch row of each masked position (row-major order)
    cols: torch.Tensor  # [N] its column
    head_cols: torch.Tensor  # [N] the column whose logits score it (cols - 1 with shift_logits)
    target: torch.Tensor  # [N] x0 at the masked positions
    norm: torch.Tensor  # [B] eq. 4's normaliser: L, or the response length (SFT)
    num_masked: torch.Tensor  # 0-dim int64

    def to(self, device) -> "MaskPlan":
        return MaskPlan(**{f.name: to_device(getattr(self, f.name), device) for f in fields(self)})


def plan_masks(
    x0: torch.Tensor,
    noise: MaskNoise | None = None,
    *,
    mask_id: int,
    prompt_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    shift_logits: bool = False,
) -> MaskPlan:
    """q(xt | x0) for a batch and the masked positions as index tensors, on `x0`'s device (see `MaskPlan`)."""
    b, l = x0.shape
    noise = MaskNoise() if noise is None else noise
    if noise.complementary:  # never silently dropped: the whole-sequence loss has no complementary draw
        raise ValueError("complementary masks (Fast-dLLM v2's recipe) need a block model (ModelConfig.block_size)")
    t = noise.draw_t(b, device=x0.device)
    maskable = torch.ones_like(x0, dtype=torch.bool)
    if prompt_mask is not None:
        maskable &= ~prompt_mask.bool()
    if attention_mask is not None and attention_mask.dim() == 2:
        maskable &= attention_mask.bool()
    if shift_logits:  # logits[:, i-1] predicts x0[:, i]; position 0 is never masked
        maskable[:, 0] = False
    xt, masked = forward_mask(x0, t, mask_id, maskable, generator=noise.generator, u=noise.u)
    rows, cols = masked.nonzero(as_tuple=True)  # row-major, on the host for a host batch
    norm = maskable.sum(-1).clamp(min=1) if prompt_mask is not None else torch.full((b,), l, device=x0.device)
    return MaskPlan(xt=xt, t=t, rows=rows, cols=cols, head_cols=cols - 1 if shift_logits else cols,
                    target=x0[rows, cols], norm=norm, num_masked=masked.sum())


def masked_loss(model, plan: MaskPlan, **forward_kwargs) -> LossOutput:
    """eq. 4 from a `MaskPlan` on the model's device: the LM head runs only on the N positions the loss
    reads (on SmolLM2-135M the 49152 x 576 head is a fifth of the FLOPs; at mask rate t it costs t of
    that, benchmarks/bench_real_train.py), gathered by index, so the step has no host sync."""
    logits = model(plan.xt, logits_index=(plan.rows, plan.head_cols), **forward_kwargs).logits  # [N, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32; fp64 stays
    ce = F.cross_entropy(logits, plan.target, reduction="none")  # [N]
    b = plan.xt.shape[0]
    per_seq = torch.zeros(b, dtype=ce.dtype, device=ce.device).index_add_(0, plan.rows, ce) / plan.t
    return LossOutput(loss=(per_seq / plan.norm).mean(), num_masked=plan.num_masked, t=plan.t)


def to_device(x: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device`; to CUDA through pinned memory, asynchronously: a copy from pageable
    memory would make the host wait for the GPU at every step."""
    device = torch.device(device)
    if x.device == device:
        return x
    if device.type != "cuda" or x.device.type != "cpu":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def _device_of(model, default: torch.device) -> torch.device:
    """Where the model computes (DDP/FSDP wrappers included); `default` for a parameter-free stand-in."""
    for p in model.parameters():
        return p.device
    return default
