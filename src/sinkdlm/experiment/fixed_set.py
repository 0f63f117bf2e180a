"""The study's fixed validation set (docs/method.md §1): its sequences and its scoring, in one place.

`validation_inputs` loads a checkpoint and the set it is scored on: the first `Validation.tokens` tokens (whole rows)
of the packed validation split of the run's corpus; `score_set` scores rows of it with `validation_elbo`, the
draws and noise seed of the study (every sequence's noise depends on its index only, so a slice scored on its own
sees the same masks). The run's own validation (`units.fixed_validation`) and every endpoint that scores a run on the
same set again (the quantized scorings of `endpoints/quant`) go through these two.
"""

from __future__ import annotations

from typing import Any

import torch

from sinkdlm.experiment.presets import Validation


def validation_inputs(ckpt: str, cfg_kwargs: dict[str, Any], validation: Validation,
                      device: str | None = None) -> tuple[Any, torch.Tensor]:
    """(model, x0 `[N, L]`): the checkpoint loaded (as training ran it: a step-0 control's `shift_logits` from the
    run's settings) and the study's fixed validation sequences of the run's corpus and length (`cfg_kwargs`: the
    run's TrainConfig fields)."""
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.config import TrainConfig
    from sinkdlm.training.trainer import load_batches

    cfg = TrainConfig(**{k: v for k, v in cfg_kwargs.items() if k != "init_from"})
    model, tok = load_model_and_tokenizer(ckpt, device=device)
    if cfg.shift_logits is not None:  # the step-0 control: the converted model as training will run it
        model.config.shift_logits = bool(cfg.shift_logits)
    val = load_batches(cfg, tok, model.config.max_content_length, "validation")
    rows = min(len(val), -(-validation.tokens // cfg.seq_len))
    x0, _ = val.get(list(range(rows)))  # [N, L]
    return model, x0


def score_set(model, x0: torch.Tensor, validation: Validation, first_sequence: int = 0) -> torch.Tensor:
    """The per-(sequence, draw) values `[N, D]` (float64) of `x0`'s rows under the study's fixed noise
    (`first_sequence`: the index of x0's first row in the whole set), in the study's precision (bf16 autocast
    where `validation.bf16`)."""
    from sinkdlm.diffusion.likelihood import validation_elbo
    from sinkdlm.training.trainer import bf16_autocast

    with torch.inference_mode(), bf16_autocast(validation.bf16, model.device):
        return validation_elbo(model, x0, validation.draws, validation.noise_seed, batch_size=validation.batch_size,
                               first_sequence=first_sequence).values
