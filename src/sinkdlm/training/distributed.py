"""Data-parallel plumbing: torchrun environment, DDP (or FSDP2) wrapping, small collectives.

`torchrun --nproc_per_node=N -m sinkdlm train ...` sets RANK/WORLD_SIZE/LOCAL_RANK; without them
everything here is a no-op and training runs in one process. CPU uses the gloo backend, CUDA nccl.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init() -> DistEnv:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return DistEnv()
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistEnv(rank, world, local, device)


def wrap(model: torch.nn.Module, env: DistEnv, fsdp: bool = False) -> torch.nn.Module:
    """DDP by default; FSDP2 (`fully_shard` per block, then the root) for models that do not fit."""
    if env.world_size == 1:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)


def no_sync(model: torch.nn.Module):
    """Skip the gradient all-reduce on non-final micro-batches (DDP only)."""
    return model.no_sync() if hasattr(model, "no_sync") else nullcontext()


def mean_across_ranks(value: torch.Tensor, env: DistEnv) -> float:
    if env.world_size == 1:
        return float(value)
    t = value.detach().float().clone().reshape(1)
    dist.all_reduce(t)
    return float(t) / env.world_size


def barrier(env: DistEnv) -> None:
    if env.world_size > 1:
        dist.barrier()


def shutdown(env: DistEnv) -> None:
    if env.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
