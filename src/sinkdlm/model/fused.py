"""Fused projections for inference: one matmul for q/k/v and one for SwiGLU's gate/up, parameters unchanged.

`pack(linears)` moves the weights (and biases) of `nn.Linear`s that read the same input into one
contiguous tensor `[sum of their outputs, d]`, each parameter becoming a view of its rows, so that a
single `F.linear` computes them all: two fewer kernel launches per layer for q/k/v, one fewer for
gate/up (a batch-1 decoding step is bound by launches). The parameters keep their objects, names and
values: state dicts, optimizers and checkpoints (Hugging Face names, GGUF, ours) see no change, and
no memory is added (the separate storages are freed). A `.to()` or an assignment replaces a
parameter's tensor; `Packed.holds` then says no and the projections run apart, as they always do
under autograd (training), until the next `pack`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Packed:
    """The joint weight `[rows, d]` (and bias `[rows]`) of some linears, their row counts, and the
    addresses of their weights when packed (what `holds` compares)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    rows: list[int]
    addresses: tuple[int, ...]

    def holds(self, linears: Sequence[nn.Linear]) -> bool:
        """The linears' weights are still the views `pack` made (by address; not checkable, and so
        trusted, inside `torch.compile`, whose caller packs right before: `generate`)."""
        if torch.compiler.is_compiling():
            return True
        return tuple(lin.weight.data_ptr() for lin in linears) == self.addresses

    def joint(self, x: torch.Tensor) -> torch.Tensor:
        """The linears' outputs side by side `[..., sum of rows]`: one matmul."""
        return F.linear(x, self.weight, self.bias)


@torch.no_grad()
def pack(linears: Sequence[nn.Linear]) -> Packed:
    """Make the linears' weights (and biases) consecutive rows of one tensor each; their `Packed`."""
    joint = []
    for name in ("weight", "bias"):
        params = [getattr(lin, name) for lin in linears]
        if params[0] is None:
            joint.append(None)
            continue
        base = torch.cat([p.detach() for p in params])  # [sum of rows, ...]
        row = 0
        for p in params:
            p.data = base[row:row + p.shape[0]]  # the same Parameter object, now a view of `base`
            row += p.shape[0]
        joint.append(base)
    return Packed(joint[0], joint[1], [lin.weight.shape[0] for lin in linears],
                  tuple(lin.weight.data_ptr() for lin in linears))
