"""Forward process of masked diffusion (docs/method.md §1): time sampling and independent masking.

`t` is the masking probability of a sequence; `xt` is `x0` with each (maskable) position replaced
by `mask_id` independently with probability `t`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sinkdlm.config.train import TrainConfig  # the one home of eps


def sample_t(
    batch: int,
    eps: float = TrainConfig.eps,
    low_discrepancy: bool = False,
    generator: torch.Generator | None = None,
    device=None,
) -> torch.Tensor:
    """`t [B]` in (eps, 1]: uniform, or low-discrepancy `t_b = (u0 + b/B) mod 1` (SMDM/LLaDA eval).

    Both are mapped affinely from u in [0, 1) to t = eps + (1 - eps) * (1 - u) in (eps, 1], so
    no sequence is ever left unmasked by a t of 0.
    """
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps must lie in [0, 1), got {eps}")
    if low_discrepancy:
        u0 = torch.rand((), generator=generator, device=device)
        u = (u0 + torch.arange(batch, device=device) / batch) % 1.0
    else:
        u = torch.rand(batch, generator=generator, device=device)
    return eps + (1.0 - eps) * (1.0 - u)


def forward_mask(
    x0: torch.Tensor,
    t: torch.Tensor,
    mask_id: int,
    maskable: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q(xt | x0): mask each position of `x0 [B, L]` with probability `t [B]` (eq. 1-2).

    `maskable [B, L]` (True = may be masked) keeps e.g. SFT prompts clean. `u [B, L]` are the
    uniforms to threshold (drawn from `generator` when not given: a data-parallel trainer draws
    them for the global batch so every sequence gets the same noise however it is sharded).
    Returns (xt, masked).
    """
    if u is None:
        u = torch.rand(x0.shape, generator=generator, device=x0.device)
    masked = u < t[:, None]
    if maskable is not None:
        masked &= maskable.bool()
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    return xt, masked


@dataclass
class MaskNoise:
    """One batch's noise (eq. 1-3): `t [B]`, each sequence's masking probability, and `u [B, L]`, the
    uniforms a position is masked by (`u < t`). Give `t` and/or `u` to fix them (a data-parallel trainer
    draws them for the global batch); what is not given is drawn from `generator`: t ~ U(eps, 1], or
    low-discrepancy (`sample_t`), and u ~ U[0, 1)."""

    t: torch.Tensor | None = None
    u: torch.Tensor | None = None
    generator: torch.Generator | None = None
    eps: float = TrainConfig.eps
    low_discrepancy: bool = False
    complementary: bool = False
    """`TrainConfig.complementary_masks` (Fast-dLLM v2's recipe, block models only): each sequence is drawn twice,
    the second copy masked where the first is not (`diffusion.block.plan_block_masks`)."""

    def draw_t(self, batch: int, device=None) -> torch.Tensor:
        """`t [B]`: the given one, or a fresh draw."""
        if self.t is not None:
            return self.t
        return sample_t(batch, self.eps, self.low_discrepancy, generator=self.generator, device=device)
