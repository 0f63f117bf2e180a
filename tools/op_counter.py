"""Count what a pass asks of the device: ATen ops, kernel-launching ops, and host-syncing ops.

On a GPU every non-view ATen op is a kernel launch, and a small model's step is bound by launches,
not FLOPs; an op whose output size depends on the data (`nonzero`, boolean indexing,
`masked_select`) or that reads a value back (`item`) makes the host wait for the device. Both show
on a CPU too, through a `TorchDispatchMode` that sees every op below autograd (backward included):

    with OpCounter() as ops:
        loss = model(ids).logits.sum(); loss.backward()
    ops.total, ops.kernels, ops.syncs

This is the CPU proxy of the GPU properties `benchmarks/bench_ops.py` tabulates and
`tests/model/test_gpu_proxies.py` pins. A developer's instrument, kept out of the package: PyTorch offers
`TorchDispatchMode` only from a private module.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that make the host wait for the device: data-dependent output sizes, or a value read back.
SYNC_OPS = frozenset({"nonzero", "masked_select", "_local_scalar_dense", "item", "masked_scatter", "unique",
                      "_unique2", "repeat_interleave"})


class OpCounter(TorchDispatchMode):
    """Counts dispatched ATen ops by name; `kernels` leaves out views (no launch), `syncs` lists the
    host-syncing ones (see `SYNC_OPS`; boolean-mask indexing counts as one)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.kernels = 0
        self.syncs: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if not func.is_view and name not in ("detach", "lift_fresh", "_unsafe_view", "as_strided"):
            self.kernels += 1
        if name in SYNC_OPS and not (name == "repeat_interleave" and "output_size" in kwargs):
            self.syncs[name] += 1
        elif name in ("index", "index_put", "index_put_") and _has_bool_index(args):
            self.syncs[f"{name}[bool]"] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def _has_bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
