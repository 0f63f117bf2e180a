"""The model a run trains: a preset's new model, or an `--init-from` checkpoint (any DLM, or an AR LM converted
on load), with the run's settings. Below the trainer and `merge`, which both rebuild a run's model this way."""

from __future__ import annotations

import torch

from sinkdlm.checkpoint.manager import ModelSource, load_checkpoint, open_source
from sinkdlm.config import ModelConfig
from sinkdlm.config.train import TrainConfig
from sinkdlm.data import check_tokenizer_matches
from sinkdlm.model import DiffusionLM


def open_init_source(cfg: TrainConfig, init: ModelSource | None) -> ModelSource:
    """The `--init-from` model, opened here unless the caller already did (a GGUF header takes seconds)."""
    return init if init is not None else open_source(cfg.init_from, flag="init_from")


def build_model(cfg: TrainConfig, tokenizer, init: ModelSource | None = None) -> DiffusionLM:
    """The model to train. `--init-from` opens any supported checkpoint (sinkdlm, LLaDA, Dream); a
    Qwen2/LLaMA causal LM is converted to a bidirectional DLM on load with the run's switches, as
    `sinkdlm convert` would. `--shift-logits/--no-shift-logits` set the model's `shift_logits`
    (stored in its config.json); unset, the checkpoint's own value stands. `init`: as for
    `prepare_tokenizer`."""
    switches = cfg.model_switches()
    init = open_init_source(cfg, init) if cfg.init_from is not None else None
    if init is not None and init.is_autoregressive:
        from sinkdlm.model.hf import convert_hf_model

        model, _ = convert_hf_model(init, seed=cfg.seed, **switches)
    elif init is not None:
        model = load_checkpoint(init)
        differ = {k: v for k, v in switches.items() if getattr(model.config, k) != v}
        if differ:
            raise ValueError(
                f"--init-from {cfg.init_from} has {({k: getattr(model.config, k) for k in differ})}, but the run asks "
                f"for {differ}; add them with `sinkdlm convert --from-hf {cfg.init_from} --out DIR` and those switches "
                "first, then --init-from DIR"
            )
    else:
        base = ModelConfig.from_preset(cfg.preset)
        vocab = switches.pop("vocab_size", base.vocab_size if cfg.tokenizer is None else len(tokenizer))
        config = base.replace(**switches, vocab_size=vocab, mask_token_id=tokenizer.mask_token_id)
        config.validate()
        torch.manual_seed(cfg.seed)
        model = DiffusionLM(config)
    return with_run_settings(model, cfg, tokenizer)


def with_run_settings(model: DiffusionLM, cfg: TrainConfig, tokenizer) -> DiffusionLM:
    """The run's `--shift-logits` override (unset: the model's own) and the tokenizer check, shared by
    a new run and a resumed one."""
    if cfg.shift_logits is not None:
        model.config.shift_logits = bool(cfg.shift_logits)
    check_tokenizer_matches(tokenizer, model.config.vocab_size, model.config.mask_token_id)
    return model
