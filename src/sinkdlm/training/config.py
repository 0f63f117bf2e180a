"""TrainConfig: everything a training (or SFT) run needs, resolvable from a YAML/JSON file + flags.

Resolution order: dataclass defaults < `--config FILE` < explicit command-line flags. The resolved
config is written to `OUT/train_config.json`, so every run says exactly what it did.
Defaults follow Appendix A.1 (AdamW β = (0.9, 0.95), weight decay 0.1, cosine schedule with 1 %
linear warm-up; peak/min lr 2e-4/2e-5 from scratch, 1e-4/1e-5 from an AR checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sinkdlm.config import MODEL_SWITCHES, PRESETS, SWITCHES_BY_NAME, check_model_switches
from sinkdlm.device import check_device

SCRATCH_LR = (2e-4, 2e-5)
AR_INIT_LR = (1e-4, 1e-5)


# One optional field per model switch (`sinkdlm.config.MODEL_SWITCHES`); None = the preset's /
# checkpoint's value. Generated, so a new switch needs no edit here.
_TrainSwitchFields = dataclasses.make_dataclass(
    "_TrainSwitchFields", [(s.name, s.type | None, field(default=None)) for s in MODEL_SWITCHES]
)


@dataclass
class TrainConfig(_TrainSwitchFields):
    # where
    out: str = "runs/train"
    data: str = "shakespeare"
    text_field: str = "text"
    tokenizer: str | None = None  # HF tokenizer dir / tokenizer.json; None: train a BPE on `data`
    cache_dir: str | None = None
    # model
    preset: str = "tiny"
    init_from: str | None = None  # a sinkdlm, LLaDA or Dream checkpoint, or a Qwen2/LLaMA one (converted on load)
    # the model switches (num_sink_tokens, ..., sink_logit, softmax_one) are inherited fields
    model_overrides: dict[str, Any] = field(default_factory=dict)  # any other ModelConfig field
    # schedule
    max_steps: int = 200
    batch_size: int = 16  # global, in sequences per optimizer step
    grad_accum: int = 1  # micro-batches per step (batch_size must divide by grad_accum * world)
    seq_len: int = 128
    lr: float | None = None  # None: Appendix A.1 default for scratch / AR init
    min_lr: float | None = None
    warmup_frac: float = 0.01
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eps: float = 1e-3  # t ~ U(eps, 1]
    # AR init recipes (docs/method.md §5)
    shift_logits: bool | None = None  # None: the model's own config.shift_logits (True for Dream)
    attention_anneal_steps: int = 0
    # SFT (set by `sinkdlm sft`)
    sft: bool = False
    sft_epochs: float | None = None
    # bookkeeping
    seed: int = 0
    log_every: int = 10
    eval_every: int = 50
    eval_batches: int = 4
    save_every: int = 100
    keep_last: int = 3
    resume: bool = False
    overwrite: bool = False  # delete the run already in `out` (only what the trainer wrote) and start anew
    bf16: bool = False
    device: str = "auto"
    max_tokens: int | None = None  # cap on the tokens packed from the corpus (quick runs)
    fsdp: bool = False  # FSDP2 sharding under torchrun (sharded checkpoints: training/sharded.py)
    activation_checkpointing: bool = False  # recompute each block in backward (memory for time)
    compile: bool = False  # torch.compile each block
    compile_backend: str = "inductor"
    tensorboard: bool = True

    # ------------------------------------------------------------------ resolution
    @classmethod
    def resolve(cls, config_file: str | Path | None = None, **flags: Any) -> "TrainConfig":
        """defaults < config file < flags that are not None."""
        values: dict[str, Any] = {}
        if config_file is not None:
            values.update(read_config_file(config_file))
        values.update({k: v for k, v in flags.items() if v is not None})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; valid ones: {sorted(names)}")
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        from sinkdlm.validation import check_seed

        if self.preset not in PRESETS and self.init_from is None:
            raise ValueError(f"unknown model preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        check_seed(self.seed, "--seed")
        for name in ("max_steps", "batch_size", "grad_accum", "seq_len", "log_every", "eval_every", "save_every", "keep_last"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"--batch-size {self.batch_size} must be divisible by --grad-accum {self.grad_accum}")
        for switch in MODEL_SWITCHES:
            if getattr(self, switch.name) is not None:
                switch.check(getattr(self, switch.name), where="--")
        switches = {k: v for k, v in self.model_switches().items() if k in SWITCHES_BY_NAME}
        check_model_switches(switches, where="ModelConfig")
        for name in ("lr", "min_lr"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):  # nan passes `v < 0`; torch then says "Invalid learning rate"
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {v}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must lie in [0, 1), got {self.warmup_frac}")
        if self.attention_anneal_steps < 0:
            raise ValueError("--attention-anneal-steps must be >= 0")
        if self.resume and self.overwrite:
            raise ValueError("--resume continues the run in --out and --overwrite deletes it: give only one of them")
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise ValueError(f"--compile-backend must name a torch.compile backend, got {self.compile_backend!r}")
        check_device(self.device)

    @property
    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else (AR_INIT_LR if self.init_from else SCRATCH_LR)[0]

    @property
    def final_lr(self) -> float:
        if self.min_lr is not None:
            return self.min_lr
        return self.peak_lr / 10  # both A.1 settings end at a tenth of the peak

    def model_switches(self) -> dict[str, Any]:
        """The ModelConfig fields this run sets explicitly."""
        switches = dict(self.model_overrides)
        for switch in MODEL_SWITCHES:
            if getattr(self, switch.name) is not None:
                switches[switch.name] = getattr(self, switch.name)
        return switches

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_config_file(path: str | Path) -> dict[str, Any]:
    from sinkdlm.validation import read_text_file

    path = Path(path)
    text = read_text_file(path, "--config")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"--config file {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"--config file {path} must hold a mapping of option: value")
    return {k.replace("-", "_"): v for k, v in data.items()}
