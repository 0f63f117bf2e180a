"""Training (its config is `sinkdlm.config.TrainConfig`): the loop with exact resume (`trainer`), atomic training
checkpoints (`checkpointing`), the run directory's lifecycle — lock, no silent overwrite,
explained resume, clean Ctrl-C (`rundir`) — and data-parallel plumbing (`distributed`).

`TrainConfig` and `train` are imported on first use (PEP 562), so reading the config (as
`sinkdlm train --help` does for its defaults) does not import torch.
"""

from __future__ import annotations

import importlib

_LAZY = {"TrainConfig": "sinkdlm.config.train", "train": "sinkdlm.training.trainer"}
__all__ = ["TrainConfig", "train"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'sinkdlm.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
