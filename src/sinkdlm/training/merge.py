"""`sinkdlm merge`: a `--trainable lora` checkpoint folded into a plain sinkdlm checkpoint (docs/method.md §12).

The base is the model the run trained on: rebuilt from the checkpoint's own training config, as the run
built it (`model_init.build_model`, the same seed drawing the same initialisation), or `--base`, any DLM
whose shapes fit the adapters (checked on the safetensors headers before a weight is read). peft loads
the adapters (`PeftModel.from_pretrained`), the trained sink parameters are copied in
(`training.trainable.load_adapter`), and `merge_and_unload` folds W + (alpha / r) B A into each projection.
The result opens in generate, analyze, eval and the experiments like any checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sinkdlm.checkpoint.manager import load_checkpoint, open_source
from sinkdlm.config.train import TrainConfig
from sinkdlm.data import load_tokenizer
from sinkdlm.io.files import check_model_path
from sinkdlm.model import DiffusionLM
from sinkdlm.training.checkpointing import STATE_NAME
from sinkdlm.training.model_init import build_model
from sinkdlm.training.trainable import ADAPTER_CONFIG, check_adapter_fits, is_adapter_checkpoint, load_adapter


def merge_adapter(checkpoint: str | Path, out: str | Path, base: str | Path | None = None) -> DiffusionLM:
    """Write `checkpoint`'s base with its LoRA adapters and sink parameters merged to `out`; returns the model."""
    import importlib.util

    from sinkdlm.io.out_dir import check_out

    checkpoint = check_model_path(checkpoint, "--adapter")
    check_out(out, "merge")  # the one output rule (io/out_dir.py): a new or empty directory
    if not is_adapter_checkpoint(checkpoint):
        raise ValueError(f"--adapter {checkpoint} holds no {ADAPTER_CONFIG}: give a checkpoint of a --trainable lora "
                         "run (OUT/checkpoints/step-N)")
    if importlib.util.find_spec("peft") is None:
        raise ValueError("merging LoRA adapters needs peft, which is not installed: pip install 'sinkdlm[lora]'")
    tokenizer = load_tokenizer(checkpoint)
    if base is None:
        state = json.loads((checkpoint / STATE_NAME).read_text())
        model = build_model(TrainConfig.resolve(**state["config"]), tokenizer)
    else:
        source = open_source(base, flag="--base")
        with torch.device("meta"):
            check_adapter_fits(DiffusionLM(source.config), checkpoint)  # before any weight of --base is read
        model = load_checkpoint(source)
    merged = load_adapter(model, checkpoint).merge_and_unload()
    merged.eval()
    merged.save_pretrained(Path(out), tokenizer=tokenizer)
    return merged
