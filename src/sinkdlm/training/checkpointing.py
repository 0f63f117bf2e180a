"""Training checkpoints: `OUT/checkpoints/step-N/`, each a complete model directory plus state.

    step-N/config.json, model.safetensors, tokenizer files   <- opens with DiffusionLM.from_pretrained
    step-N/optimizer.safetensors                              <- AdamW moments (tensors)
    step-N/trainer_state.json                                 <- step, param groups, run config

A `--trainable lora` run writes its adapters in place of the model (`write_model`, see `training.trainable`).

The directory is written as `.tmp-step-N` and renamed into place (`os.replace` of a directory is
atomic on POSIX), so a process killed at any moment leaves either no `step-N` or a complete one:
the previous checkpoint is always loadable. Only the last `keep_last` are kept. No pickle.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file

from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.files import CheckpointError, save_checkpoint, save_state_dict

STEP_DIR = re.compile(r"^step-(\d+)$")
OPTIMIZER_NAME = "optimizer.safetensors"
STATE_NAME = "trainer_state.json"


def optimizer_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Flatten `optimizer.state_dict()` into safetensors-ready tensors + JSON param groups."""
    sd = optimizer.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"{idx}.{key}"] = t.detach().cpu().contiguous()
    return tensors, sd["param_groups"]


def optimizer_from_tensors(tensors: dict[str, torch.Tensor], param_groups: list[dict]) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = t
    return {"state": state, "param_groups": param_groups}


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under `out_dir/checkpoints`, oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / STATE_NAME).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(out_dir)
    return ckpts[-1][1] if ckpts else None


def run_label(checkpoint_dir) -> str:
    """A readable model label for a checkpoint directory: the run's name, not `step-30`.

    `runs/base/checkpoints/step-30` -> `base (step 30)`; an experiment's
    `runs/vanilla-s0/train/checkpoints/step-3` -> `vanilla-s0/train (step 3)`; any other
    directory -> its own name.
    """
    path = Path(checkpoint_dir).resolve()
    m = STEP_DIR.match(path.name)
    if m is None or path.parent.name != "checkpoints":
        return path.name
    run = path.parent.parent
    name = f"{run.parent.name}/{run.name}" if run.name in ("train", "sft") else run.name
    return f"{name} (step {int(m.group(1))})"


def save_training_checkpoint(
    out_dir: str | Path,
    step: int,
    model,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    tokenizer=None,
    keep_last: int = 3,
    write_model: Callable[[Path], None] | None = None,
) -> Path:
    """`write_model(directory)`: writes what stands for the model (LoRA adapters); default the whole model."""
    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    if write_model is None:
        save_checkpoint(model, tmp, tokenizer=tokenizer)
    else:
        tmp.mkdir()
        write_model(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    tensors, groups = optimizer_to_tensors(optimizer)
    save_state_dict(tensors, tmp / OPTIMIZER_NAME)
    atomic_write_json(tmp / STATE_NAME, {**state, "step": step, "param_groups": groups})
    _fsync_dir(tmp)
    return publish_checkpoint(tmp, final, out_dir, keep_last)


def publish_checkpoint(tmp: Path, final: Path, out_dir: str | Path, keep_last: int) -> Path:
    """Rename a complete `.tmp-step-N` to `step-N` (atomic), then drop all but the last `keep_last`."""
    if final.exists():  # re-saving the same step (e.g. after a resume): replace it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    for _, old in list_checkpoints(out_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_training_state(ckpt: str | Path) -> tuple[dict[str, Any], dict]:
    """(trainer_state.json contents, optimizer state_dict) of a checkpoint directory."""
    ckpt = Path(ckpt)
    state_path, opt_path = ckpt / STATE_NAME, ckpt / OPTIMIZER_NAME
    try:
        state = json.loads(state_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{state_path} cannot be read ({e}); resume from an earlier checkpoint") from e
    try:
        tensors = load_file(str(opt_path))
    except Exception as e:  # safetensors raises several types for truncated/corrupt files
        raise CheckpointError(f"{opt_path} is missing or corrupt ({e})") from e
    return state, optimizer_from_tensors(tensors, state["param_groups"])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
