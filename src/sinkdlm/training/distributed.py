"""Parallel plumbing: torchrun environment, DDP or FSDP2 wrapping, per-block options, collectives.

`torchrun --nproc_per_node=N -m sinkdlm train ...` sets RANK/WORLD_SIZE/LOCAL_RANK; without them
everything here is a no-op and training runs in one process. CPU uses the gloo backend, CUDA nccl.
With `--fsdp` a process group is created even for one process (`torchrun --nproc_per_node=1`), so
one sharded code path serves every world size and a run can resume with another one.

Per-block options (`prepare_blocks`), applied before any wrapping so that parameter names never
change (checkpoints stay in the usual layout): activation checkpointing by running each block's
forward through the public `torch.utils.checkpoint.checkpoint` (non-reentrant; the instance's
`forward` is replaced, no wrapper module) and `torch.compile` of each block's forward
(`nn.Module.compile`, in place).
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sinkdlm.model.compile import check_compile  # noqa: F401  (re-exported: `--compile`'s check)

LAUNCH_HINT = "torchrun --nproc_per_node=N -m sinkdlm train --fsdp ... (N = 1 is fine)"


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    fsdp: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """A process group exists (several processes, or `--fsdp` under torchrun at any size)."""
        return self.world_size > 1 or self.fsdp


def check_launch(fsdp: bool) -> None:
    """`--fsdp` needs torchrun's environment (a process group) and a torch that writes its sharded
    checkpoints; say how to get them."""
    if fsdp:
        import torch.distributed.checkpoint as dcp

        if not hasattr(dcp, "HuggingFaceStorageWriter"):  # added in torch 2.8
            raise ValueError(
                f"--fsdp needs torch>=2.8 (its sharded checkpoints are written with torch.distributed.checkpoint's "
                f"HuggingFaceStorageWriter); this is torch {torch.__version__}: pip install -U 'torch>=2.8', or drop --fsdp"
            )
    if fsdp and not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} <= set(os.environ):
        raise ValueError(
            "--fsdp shards the model over a process group, which only torchrun provides: launch with "
            f"`{LAUNCH_HINT}`, or drop --fsdp to train in this one process"
        )


def init(fsdp: bool = False) -> DistEnv:
    check_launch(fsdp)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and not fsdp:
        return DistEnv()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistEnv(rank, world, local, device, fsdp)


def _checkpoint_forward(layer: torch.nn.Module) -> None:
    """Recompute `layer.forward` in backward (public `torch.utils.checkpoint`, non-reentrant): the
    instance attribute shadows the class method, so hooks, FSDP and `compile` still see the module."""
    import functools

    from torch.utils.checkpoint import checkpoint

    inner = layer.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    layer.forward = forward


def prepare_blocks(model: torch.nn.Module, activation_checkpointing: bool = False, compile_backend: str | None = None) -> None:
    """Activation checkpointing and/or `torch.compile` of every block, in place (names unchanged)."""
    for layer in model.layers:
        if activation_checkpointing:
            # Non-reentrant recomputation of the block in backward: only the block inputs are kept.
            _checkpoint_forward(layer)
        if compile_backend is not None:
            layer.compile(backend=compile_backend)


def wrap(model: torch.nn.Module, env: DistEnv, fsdp: bool = False, bf16: bool = False) -> torch.nn.Module:
    """DDP by default; FSDP2 (`fully_shard` per block, then the root) for models that do not fit.

    Under FSDP each block is all-gathered once per step: the sinks ride in the sequence (transformer.py),
    so there is no second stream to gather for. With `bf16`, FSDP computes in bf16 and
    reduces gradients in fp32 (`MixedPrecisionPolicy`); the sharded master weights stay fp32.
    """
    if fsdp:
        assert env.fsdp and dist.is_initialized(), "FSDP needs the process group of dist_utils.init(fsdp=True)"
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # Blocks return views (keys/values after a transpose); nothing modifies them in place, which
        # is the case this FSDP warning is about, so it is silenced instead of printed per rank.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        for layer in model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    if env.world_size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)


def no_sync(model: torch.nn.Module):
    """Skip the gradient reduction on non-final micro-batches (DDP's no_sync, FSDP2's sync switch)."""
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        return _fsdp_no_sync(model)
    return nullcontext()


@contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor (e.g. FSDP's gradient norm) as the plain tensor it stands for; others unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def mean_across_ranks(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The mean over ranks, as a tensor on the same device (no host sync)."""
    if env.world_size == 1:
        return value.detach()
    t = value.detach().float().clone().reshape(())
    dist.all_reduce(t)
    return t / env.world_size


def sum_across_ranks(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.world_size == 1:
        return value
    t = value.detach().clone()
    dist.all_reduce(t)
    return t


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def shutdown(env: DistEnv) -> None:
    """Destroy the process group; the caller has dropped its DDP wrapper first.

    Why the order matters: DDP's C++ Reducer holds the gloo process group, and pybind frees the Reducer
    with the GIL held. Were the Reducer the group's last holder (the wrapper freed after
    `destroy_process_group`, when `train()`'s frame goes), ~ProcessGroupGloo would join its worker
    thread with the GIL held, while that thread needs the GIL to free the tensors of the last
    collective: a hang at the very end of a finished run (one in ten two-process CPU runs here).
    Collected first, the Reducer only lets go of its reference; the last one is the Python-side group's,
    whose destructor releases the GIL.
    """
    if env.distributed and dist.is_initialized():
        import gc

        gc.collect()  # a wrapper caught in a reference cycle is freed here, not after the group
        dist.destroy_process_group()
