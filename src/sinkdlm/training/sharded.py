"""Sharded training checkpoints (FSDP): every rank writes its own shards, in safetensors.

    step-N/config.json, model.safetensors, tokenizer files  <- consolidated model, as every checkpoint
    step-N/sharded/shard-0000R-model-00001-of-00001.safetensors   <- rank R's shards: parameters
                                                               (`model.*`) and AdamW state (`optim.*`)
    step-N/trainer_state.json                               <- step, world size, optimizer hyper-parameters

The training state goes through `torch.distributed.checkpoint` (DCP) with its safetensors storage
(`HuggingFaceStorageWriter(save_distributed=True)` / `HuggingFaceStorageReader`): each file holds
one rank's local chunks, and where each chunk sits in the full tensor is JSON in the safetensors
header. DCP's default `FileSystemWriter` would add a pickled `.metadata` file; this path writes
none, so the project's rule — only safetensors and JSON are ever read — holds here too. Because the
reader rebuilds the layout from the chunk offsets, a checkpoint written by N processes loads into
M (resharding): resume with another world size, or into a plain single-process model.

Atomicity as in `checkpointing.py`: all ranks write under `.tmp-step-N`; after a barrier rank 0
renames it to `step-N`, so a rank killed mid-save leaves the previous checkpoint untouched. The
consolidated `model.safetensors` is gathered with the distributed state-dict API
(`get_model_state_dict(..., full_state_dict=True, cpu_offload=True)`, only rank 0 holds it), so
`sinkdlm generate/eval/analyze` open an FSDP checkpoint like any other. The directory must be on a
file system every rank sees (one machine, or a shared one across nodes).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.files import CheckpointError, save_checkpoint
from sinkdlm.training.checkpointing import STATE_NAME, _fsync_dir, publish_checkpoint

SHARDED_DIR = "sharded"
FORMAT = "sharded-safetensors"
TIED_HEAD = "lm_head.weight"


def is_sharded(ckpt: str | Path) -> bool:
    return (Path(ckpt) / SHARDED_DIR).is_dir()


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # Optimizer state keyed by parameter name ("state.layers.0.mlp.up_proj.weight.exp_avg"), not by
    # position: the same keys for any wrapping and world size.
    return StateDictOptions(flatten_optimizer_state_dict=True, **kw)


def _split(model, optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors for DCP: `model.*` and `optim.*`, the optimizer's non-tensor entries for JSON)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    tensors = {f"model.{k}": v for k, v in model_sd.items()}
    if model.config.tie_word_embeddings:  # one tensor under two names: stored once, as the embedding
        del tensors[f"model.{TIED_HEAD}"]
    extras = {}
    for k, v in optim_sd.items():
        if torch.is_tensor(v):
            tensors[f"optim.{k}"] = v
        else:  # param_groups.<name>.lr, betas, ... (floats, bools, tuples)
            extras[k] = v
    return tensors, extras


def save_sharded_checkpoint(
    out_dir: str | Path, step: int, model, optimizer, state: dict[str, Any], env, tokenizer=None, keep_last: int = 3,
) -> Path:
    """Collective: every rank calls it. Returns `OUT/checkpoints/step-N`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from sinkdlm.training import distributed as dist_utils

    root = Path(out_dir) / "checkpoints"
    final, tmp = root / f"step-{step}", root / f".tmp-step-{step}"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / SHARDED_DIR).mkdir(parents=True)
    dist_utils.barrier(env)
    tensors, extras = _split(model, optimizer)
    dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDED_DIR), save_distributed=True))
    full = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        save_checkpoint(model, tmp, tokenizer=tokenizer, state_dict=full)
        atomic_write_json(tmp / STATE_NAME, {
            **state, "step": step, "format": FORMAT, "world_size": env.world_size, "optimizer_extras": extras,
        })
    _fsync_dir(tmp / SHARDED_DIR)
    dist_utils.barrier(env)  # every rank's shards are on disk before the directory is published
    if env.is_main:
        publish_checkpoint(tmp, final, out_dir, keep_last)
    dist_utils.barrier(env)
    return final


def load_sharded_checkpoint(ckpt: str | Path, model, optimizer) -> dict[str, Any]:
    """Load a sharded checkpoint's parameters and AdamW state into `model`/`optimizer`, in place.

    Collective when a process group exists; works with any world size (and none) and any
    wrapping (FSDP, DDP's inner module, a plain model). Returns the trainer_state.json contents.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import set_state_dict

    ckpt = Path(ckpt)
    state_path = ckpt / STATE_NAME
    try:
        state = json.loads(state_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{state_path} cannot be read ({e}); resume from an earlier checkpoint") from e
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt} is not a sharded checkpoint ({state_path} has no format {FORMAT!r})")
    tensors, extras = _split(model, optimizer)
    try:
        dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(ckpt / SHARDED_DIR)))
    except Exception as e:  # DCP wraps per-rank failures (missing key, truncated file) in its own types
        raise CheckpointError(f"the sharded training state in {ckpt / SHARDED_DIR} cannot be read ({e}); "
                              "resume from an earlier checkpoint") from e
    saved = state["optimizer_extras"]
    for k, fresh in extras.items():  # JSON turned tuples (betas) into lists
        if k in saved:
            extras[k] = tuple(saved[k]) if isinstance(fresh, tuple) else saved[k]
    model_sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    if model.config.tie_word_embeddings:
        model_sd[TIED_HEAD] = model_sd["embed_tokens.weight"]
    optim_sd = {k[len("optim."):]: v for k, v in tensors.items() if k.startswith("optim.")}
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict={**optim_sd, **extras}, options=_options())
    return state
