"""TrainConfig: everything a training (or SFT) run needs, resolvable from a YAML/JSON file + flags.

Every field is declared once below with its default and a docstring; `sinkdlm train` and `sinkdlm
sft` generate one option per field from them (`sinkdlm.cli.options`). Resolution order: dataclass
defaults < `--config FILE` < explicit command-line flags. The resolved config is written to
`OUT/train_config.json`, so every run says exactly what it did. Defaults follow Appendix A.1 (AdamW
β = (0.9, 0.95), weight decay 0.1, cosine schedule with 1 % linear warm-up; peak/min lr 2e-4/2e-5
from scratch, 1e-4/1e-5 from an AR checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sinkdlm.config.fields import DeviceOption, option
from sinkdlm.config.model import MODEL_SWITCHES, PRESETS, SWITCHES_BY_NAME, check_model_switches, switch_fields
from sinkdlm.config.fields import check_device

SCRATCH_LR = (2e-4, 2e-5)
AR_INIT_LR = (1e-4, 1e-5)
TRAINABLE = ("all", "sink", "lora")  # --trainable
BLOCK_NOISE = ("block", "sequence")  # --block-noise
LORA_GROUPS = {"attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}
LORA_TARGETS = (*LORA_GROUPS, *LORA_GROUPS["attn"], "g_proj", *LORA_GROUPS["mlp"])  # --lora-targets: every block's nn.Linear


# One optional field per model switch (declared in `ModelConfig`); None = the preset's /
# checkpoint's value. Generated from the switch fields, so a new switch needs no edit here.
_TrainSwitchFields = dataclasses.make_dataclass(
    "_TrainSwitchFields", switch_fields(optional=True, note=" Default: the preset's or the --init-from model's."),
)


@dataclass
class TrainConfig(_TrainSwitchFields, DeviceOption):
    """A training run: data, model, schedule, optimiser, bookkeeping (the model switches and --device inherited)."""

    # ---- where
    out: str = "runs/train"
    """Run directory (train_config.json, metrics.jsonl, checkpoints/)."""
    data: str = "shakespeare"
    """shakespeare | a .txt/.jsonl/.json/.parquet file or folder | hf:OWNER/NAME[:CONFIG] (SFT: arithmetic | FILE.jsonl | gsm8k:PATH)."""
    text_field: str = "text"
    """Field holding the text in .jsonl/.json/.parquet data."""
    tokenizer: str | None = None
    """HF tokenizer dir or tokenizer.json (default: train a BPE on --data)."""
    cache_dir: str | None = None
    """Cache of trained tokenizers and packed corpora (default: $SINKDLM_CACHE or ~/.cache/sinkdlm)."""
    # ---- model
    preset: str = "tiny"
    """Model preset (tiny, small, smdm-85m, qwen2.5-0.5b, ...); ignored with --init-from."""
    init_from: str | None = None
    """Start from a sinkdlm, LLaDA or Dream checkpoint, or a Qwen2/LLaMA directory or .gguf (converted on load)."""
    model_overrides: dict[str, Any] = option(default_factory=dict, cli=False)
    """Any other ModelConfig field, e.g. {hidden_size: 64} (config file only)."""
    # ---- schedule
    max_steps: int = 200
    """Optimizer steps."""
    batch_size: int = 16
    """Global batch in sequences per optimizer step."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (--batch-size must divide by it times the world size)."""
    seq_len: int = 128
    """Tokens per training sequence."""
    lr: float | None = None
    """Peak lr (default: 2e-4 from scratch, 1e-4 from an AR init; Appendix A.1)."""
    min_lr: float | None = None
    """Final lr of the cosine (default: a tenth of the peak)."""
    warmup_frac: float = 0.01
    """Fraction of the steps spent in linear warm-up."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW β1."""
    beta2: float = 0.95
    """AdamW β2."""
    grad_clip: float = 1.0
    """Clip the gradient norm to this value."""
    eps: float = 1e-3
    """Smallest masking ratio: t ~ U(eps, 1] (docs/method.md §1)."""
    # ---- AR init recipes (docs/method.md §5)
    shift_logits: bool | None = None
    """Position i predicts token i+1 (AR head); default: the model's own setting (True for Dream)."""
    attention_anneal_steps: int = 0
    """Causal -> full attention over this many steps (AR init recipe)."""
    # ---- block diffusion (a model with --block-size, docs/method.md §13)
    block_noise: str = "block"
    """block | sequence: a block model's masking probability t is drawn per block (BD3-LM) or once per sequence."""
    complementary_masks: bool = False
    """Fast-dLLM v2's recipe (block models only): each sequence is trained twice in the step, once with its masks and once with their complement, so every maskable token is a target exactly once; the complement's tokens weigh 1/max(1 - t, eps) (docs/method.md §13). The step passes twice the rows; validation is unchanged."""
    # ---- SFT (set by `sinkdlm sft`)
    sft: bool = option(False, cli=False)
    """Supervised fine-tuning: prompt never masked, loss normalised by the response length."""
    # ---- what trains (docs/method.md §12)
    trainable: str = "all"
    """all | sink (only the sink embeddings and sink logits train; the rest frozen, no optimizer state for it) | lora (peft LoRA adapters on --lora-targets plus the sink parameters; checkpoints hold the adapters, `sinkdlm merge` folds them in)."""
    lora_rank: int = 8
    """LoRA rank r (--trainable lora)."""
    lora_alpha: float = 16.0
    """LoRA alpha: the update is (alpha / r) B A (--trainable lora)."""
    lora_targets: str = "attn,mlp"
    """Projections of every block that get LoRA adapters (--trainable lora), comma-separated: attn (q/k/v/o_proj), mlp (gate/up/down_proj) or single ones, e.g. q_proj,v_proj."""
    merge: bool = False
    """After the last step of a --trainable lora run, also write OUT/merged: a plain sinkdlm checkpoint with the adapters folded in (as `sinkdlm merge`), which generate, analyze, eval and lm-eval open."""
    # ---- bookkeeping
    seed: int = 0
    """Random seed (initialisation, data order, masking)."""
    log_every: int = 10
    """Log every N steps."""
    eval_every: int = 50
    """Validation loss every N steps."""
    eval_batches: int = 4
    """Validation batches per evaluation."""
    save_every: int = 100
    """Checkpoint every N steps."""
    keep_last: int = 3
    """Checkpoints to keep."""
    resume: bool = False
    """Continue from the newest checkpoint in --out."""
    overwrite: bool = False
    """Replace what --out holds: the new run is written beside it and swapped in when it ends or stops (a failed start leaves it as it was); train() called from Python deletes only the files training writes."""
    bf16: bool = False
    """bf16 autocast."""
    max_tokens: int | None = None
    """Cap on corpus tokens packed (quick runs; default: the whole corpus)."""
    fsdp: bool = False
    """FSDP2 sharding instead of DDP (needs torchrun, any --nproc_per_node; sharded checkpoints)."""
    activation_checkpointing: bool = False
    """Recompute each block in backward: less memory, ~1/3 more compute."""
    compile: bool = False
    """torch.compile every block."""
    compile_backend: str = "inductor"
    """torch.compile backend for --compile."""
    tensorboard: bool = True
    """Write TensorBoard event files beside metrics.jsonl (when tensorboard is installed)."""

    # ------------------------------------------------------------------ resolution
    @classmethod
    def resolve(cls, config_file: str | Path | None = None, base: dict[str, Any] | None = None,
                **flags: Any) -> "TrainConfig":
        """defaults < `base` (a command's own defaults, e.g. sft's --out) < config file < flags that are not None."""
        values: dict[str, Any] = dict(base or {})
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
        from sinkdlm.config.checks import check_seed

        if self.preset not in PRESETS and self.init_from is None:
            raise ValueError(f"unknown model preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        check_seed(self.seed, "seed")
        for name in ("max_steps", "batch_size", "grad_accum", "seq_len", "log_every", "eval_every", "save_every", "keep_last"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.batch_size % self.grad_accum:
            raise ValueError(f"batch_size {self.batch_size} must be divisible by grad_accum {self.grad_accum}")
        for switch in MODEL_SWITCHES:
            if getattr(self, switch.name) is not None:
                switch.check(getattr(self, switch.name), where="")
        switches = {k: v for k, v in self.model_switches().items() if k in SWITCHES_BY_NAME}
        check_model_switches(switches, where="ModelConfig")
        for name in ("lr", "min_lr"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):  # nan passes `v < 0`; torch then says "Invalid learning rate"
                raise ValueError(f"{name} must be a finite number >= 0, got {v}")
        for name in ("beta1", "beta2"):  # nan passes a range check written with `<`; torch's own message names no flag
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0.0 <= v < 1.0):
                raise ValueError(f"{name} must lie in [0, 1), got {v}")
        if not 0.0 <= self.warmup_frac < 1.0:
            raise ValueError(f"warmup_frac must lie in [0, 1), got {self.warmup_frac}")
        if self.attention_anneal_steps < 0:
            raise ValueError(f"attention_anneal_steps must be >= 0, got {self.attention_anneal_steps}")
        if self.block_noise not in BLOCK_NOISE:
            raise ValueError(f"block_noise must be one of {', '.join(BLOCK_NOISE)}, got {self.block_noise!r}")
        self.check_block_size(self.model_switches().get("block_size"))
        if self.init_from is None or "block_size" in self.model_switches():  # else the --init-from model's, on opening it
            self.check_complementary_masks(self.model_switches().get(
                "block_size", PRESETS[self.preset].get("block_size") if self.init_from is None else None))
        if self.resume and self.overwrite:
            raise ValueError("resume=True continues the run in the output directory and overwrite=True deletes it: "
                             "give only one of them")
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise ValueError(f"compile_backend must name a torch.compile backend, got {self.compile_backend!r}")
        check_device(self.device)
        self.check_trainable()

    def check_trainable(self) -> None:
        """--trainable and its LoRA settings (the model's sinks are checked once it is opened: `training.trainable`)."""
        if self.trainable not in TRAINABLE:
            raise ValueError(f"trainable must be one of {', '.join(TRAINABLE)}, got {self.trainable!r}")
        if not isinstance(self.lora_rank, int) or isinstance(self.lora_rank, bool) or self.lora_rank < 1:
            raise ValueError(f"lora_rank must be a positive integer, got {self.lora_rank!r}")
        if not (isinstance(self.lora_alpha, (int, float)) and math.isfinite(self.lora_alpha) and self.lora_alpha > 0):
            raise ValueError(f"lora_alpha must be a finite number > 0, got {self.lora_alpha!r}")
        targets = self.lora_target_modules()
        unknown = sorted(set(targets) - set(LORA_TARGETS))
        if not targets or unknown:
            raise ValueError(f"lora_targets must name some of {', '.join(LORA_TARGETS)}, got {self.lora_targets!r}")
        if self.merge and self.trainable != "lora":
            raise ValueError(f"merge=True folds LoRA adapters in: it needs trainable='lora' (a {self.trainable!r} run's "
                             "checkpoints are plain sinkdlm checkpoints already)")
        if self.trainable == "all":
            return
        if self.fsdp:
            raise ValueError(f"--trainable {self.trainable} is not supported with --fsdp (sharding frozen weights saves "
                             "nothing worth the sharded checkpoints); train it without --fsdp")
        if self.trainable != "lora":
            return
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            raise ValueError("--trainable lora needs peft, which is not installed: pip install 'sinkdlm[lora]' "
                             "(or pip install peft)")

    def check_block_size(self, block_size: int | None) -> None:
        """A block model's training settings (the flag's before any work; a checkpoint's once it is opened)."""
        if block_size is None:
            return
        if block_size > self.seq_len:
            raise ValueError(f"block_size={block_size} is larger than the training sequence (seq_len={self.seq_len}); "
                             "use a block size <= --seq-len")
        if self.attention_anneal_steps:
            raise ValueError("attention_anneal_steps anneals causal -> full attention; a block model's attention is "
                             "block-causal by construction: leave it at 0 with --block-size")

    def check_complementary_masks(self, block_size: int | None) -> None:
        """--complementary-masks is Fast-dLLM v2's rule for a block model (its code has no other): refused on a
        whole-sequence model (`block_size` None), from the flags or the --init-from model's header, before any weight."""
        if self.complementary_masks and block_size is None:
            raise ValueError("complementary_masks=True is Fast-dLLM v2's recipe for a block model, and this model is a "
                             "whole-sequence one (no block_size): give --block-size B, or leave --complementary-masks off")

    def lora_target_modules(self) -> list[str]:
        """--lora-targets as a list of projection names (attn and mlp spelled out), in the order given."""
        names = [t.strip() for t in str(self.lora_targets).split(",") if t.strip()]
        return list(dict.fromkeys(p for n in names for p in LORA_GROUPS.get(n, (n,))))

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
    import yaml  # only a --config file needs it

    from sinkdlm.config.checks import read_text_file

    path = Path(path)
    text = read_text_file(path, "--config")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"--config file {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"--config file {path} must hold a mapping of option: value")
    return {k.replace("-", "_"): v for k, v in data.items()}
