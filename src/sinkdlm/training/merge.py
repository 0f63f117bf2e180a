"""`sinkdlm merge`: a `--trainable lora` checkpoint folded into a plain sinkdlm checkpoint (docs/method.md §12).

The base is the model the run trained on: rebuilt from the checkpoint's own training config, as the run
built it (`model_init.build_model`, the same seed drawing the same initialisation), or `--base`, any DLM
whose shapes fit the adapters (checked on the safetensors headers before a weight is read). peft loads
the adapters (`PeftModel.from_pretrained`), the trained sink parameters are copied in
(`training.trainable.load_adapter`), and `merge_and_unload` folds W + (alpha / r) B A into each projection.
A `--trainable sink` checkpoint (its sink parameters over a base on disk, `sink_base.json`) is opened by the
loader as a model (the base checked by its sha256) and written whole. The result opens in generate, analyze,
eval and the experiments like any checkpoint; `merged_from.json` beside it records what it was folded from:
the base and the adapter or sink checkpoint, each with the sha256 of its weights, and the sinkdlm version.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sinkdlm.checkpoint.manager import load_checkpoint, load_tokenizer_for, open_source
from sinkdlm.config.train import TrainConfig
from sinkdlm.data import load_tokenizer
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.files import SINK_BASE_NAME, SINKS_NAME, check_model_path, read_json, weights_sha256
from sinkdlm.model import DiffusionLM
from sinkdlm.training.checkpointing import STATE_NAME
from sinkdlm.training.model_init import build_model
from sinkdlm.training.rundir import MERGED_MARK
from sinkdlm.training.trainable import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, check_adapter_fits, is_adapter_checkpoint,
                                        load_adapter)


def merge_adapter(checkpoint: str | Path, out: str | Path, base: str | Path | None = None) -> DiffusionLM:
    """Write `checkpoint`'s base with its LoRA adapters and sink parameters merged (or a --trainable sink
    checkpoint's base with its sinks) to `out`, and `merged_from.json`; returns the model."""
    import importlib.util

    from sinkdlm.io.out_dir import check_out

    checkpoint = check_model_path(checkpoint, "--adapter")
    check_out(out, "merge")  # the one output rule (io/out_dir.py): a new or empty directory
    if (checkpoint / SINK_BASE_NAME).is_file():  # --trainable sink: the loader folds it
        if base is not None:
            raise ValueError(f"--adapter {checkpoint} names its own base in {SINK_BASE_NAME}; leave --base out")
        model = load_checkpoint(checkpoint)
        model.save_pretrained(Path(out), tokenizer=load_tokenizer_for(checkpoint))  # the base's, as the run's
        ref = read_json(checkpoint / SINK_BASE_NAME)
        _write_provenance(out, checkpoint, SINKS_NAME, ref["base"], ref["sha256"])
        return model
    if not is_adapter_checkpoint(checkpoint):
        raise ValueError(f"--adapter {checkpoint} holds no {ADAPTER_CONFIG} and no {SINK_BASE_NAME}: give a checkpoint "
                         "of a --trainable lora or sink run (OUT/checkpoints/step-N)")
    if importlib.util.find_spec("peft") is None:
        raise ValueError("merging LoRA adapters needs peft, which is not installed: pip install 'sinkdlm[lora]'")
    tokenizer = load_tokenizer(checkpoint)
    if base is None:
        state = json.loads((checkpoint / STATE_NAME).read_text())
        cfg = TrainConfig.resolve(**state["config"])
        model = build_model(cfg, tokenizer)
        # rebuilt as the run built it: from its --init-from (named by its sha256), else its preset and seed
        base_name = cfg.init_from or f"preset {cfg.preset}, seed {cfg.seed} (a new model, built again)"
    else:
        source = open_source(base, flag="--base")
        with torch.device("meta"):
            check_adapter_fits(DiffusionLM(source.config), checkpoint)  # before any weight of --base is read
        model = load_checkpoint(source)
        base_name = str(base)
    merged = load_adapter(model, checkpoint).merge_and_unload()
    merged.eval()
    merged.save_pretrained(Path(out), tokenizer=tokenizer)
    on_disk = Path(base_name).exists()
    _write_provenance(out, checkpoint, ADAPTER_WEIGHTS, str(Path(base_name).resolve()) if on_disk else base_name,
                      weights_sha256(base_name) if on_disk else None)
    return merged


def _write_provenance(out: str | Path, checkpoint: Path, weights: str, base: str, base_sha256: str | None) -> None:
    """`merged_from.json`: the base and the adapter or sink checkpoint merged, each with its weights' sha256, and
    the sinkdlm version that merged them."""
    from importlib.metadata import PackageNotFoundError, version

    from sinkdlm.io.files import sha256_of

    try:
        sinkdlm_version = version("sinkdlm")
    except PackageNotFoundError:  # run from a source tree
        sinkdlm_version = None
    sinks = checkpoint / SINKS_NAME
    atomic_write_json(Path(out) / MERGED_MARK.name, {  # written last: the merged directory is whole
        "checkpoint": checkpoint.name, "adapter": str(checkpoint.resolve()),
        "adapter_sha256": sha256_of(checkpoint / weights), "sinks_sha256": sha256_of(sinks) if sinks.is_file() else None,
        "base": base, "base_sha256": base_sha256, "sinkdlm": sinkdlm_version,
    })
