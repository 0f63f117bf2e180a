"""ModelConfig: the one dataclass that describes a sinkdlm model, plus named presets.

Field names follow Hugging Face (`hidden_size`, `num_key_value_heads`, ...) so a Qwen2/LLaMA
`config.json` maps onto it directly. The model switches (sink tokens, gated attention, the
per-head sink logit, softmax-off-by-one) are the fields declared with `switch(...)`: each is one
line plus its docstring here, and `MODEL_SWITCHES` (derived below) generates TrainConfig's
optional copies, the `train`/`convert` options, `convert_hf_checkpoint`'s checks and the
experiment runner's variants from them. `config.json` of a checkpoint is this dataclass as JSON
plus `model_type: "sinkdlm"` (so `transformers.AutoConfig` can route it).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinkdlm.config.fields import field_docs, field_types, switch

MODEL_TYPE = "sinkdlm"
SINK_POSITIONS = ("front", "end")
FAMILIES = ("llada", "dream")  # `ModelConfig.family`: whose sampler defaults apply (diffusion/remasking.py)


@dataclass
class ModelConfig:
    """Shape fields (Hugging Face names), the model switches, and the diffusion/AR head settings."""

    vocab_size: int = 2048
    """Vocabulary size, [MASK] included."""
    hidden_size: int = 128
    """Width of the residual stream."""
    num_hidden_layers: int = 4
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Query heads per layer."""
    num_key_value_heads: int = 2
    """Key/value heads per layer (grouped-query attention when fewer than the query heads)."""
    intermediate_size: int = 384
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 1024
    """Positions the model takes, sink tokens included."""
    rope_theta: float = 10000.0
    """Rotary embedding base."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_word_embeddings: bool = True
    """The LM head shares the embedding matrix."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2)."""
    qk_norm: bool = False
    """RMSNorm of each head's query and key before the rotary embedding (Qwen3, SDAR)."""
    initializer_range: float = 0.02
    """Standard deviation of the initial weights."""

    # ---- the model switches: one line each (docs/method.md §3-4); a new one is added here
    num_sink_tokens: int = switch(0, minimum=0)
    """Extra sink tokens (One-Token eq. 5-7); 0 = vanilla DLM."""
    sink_position: str = switch("front", choices=SINK_POSITIONS)
    """Where the sink tokens sit: front | end."""
    sink_zero_value: bool = switch(False)
    """Force the sink tokens' value vectors to zero (One-Token Table 5)."""
    gated_attention: bool = switch(False)
    """Sigmoid gate on the attention output (One-Token eq. 8-10)."""
    sink_logit: bool = switch(False)
    """A learned logit per head: an extra softmax column with a zero value (gpt-oss attention sinks)."""
    softmax_one: bool = switch(False)
    """softmax-off-by-one (Miller's softmax_1): the extra zero-value column with its logit fixed at 0."""
    block_size: int | None = switch(None, minimum=1)
    """Block diffusion (BD3-LM, docs/method.md §13): attention bidirectional within blocks of this many tokens and causal across them; None = the whole sequence (a masked DLM)."""

    mask_token_id: int | None = None
    """The id of [MASK] inside the vocabulary (docs/method.md §1). Default: the last id; None only for
    an autoregressive model (`causal`), which has no mask token."""
    shift_logits: bool = False
    """The logits of position i predict token i+1 (Dream, models trained with --shift-logits, and every
    autoregressive model): samplers, likelihood, loss and analysis read it from here (docs/method.md §10)."""
    causal: bool = False
    """An autoregressive model (a Qwen2/LLaMA causal LM opened as is): causal attention, next-token
    head, greedy left-to-right generation; the AR contrast of the sink analysis (§10)."""
    family: str = "llada"
    """The diffusion family whose sampler `generate` uses when no schedule/remasking is given: llada (even split,
    low_confidence) | dream (Dream's timestep schedule, entropy remasking). Set when a Dream checkpoint or GGUF is
    opened, and saved with the model (docs/method.md §2)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance (e.g. the HF checkpoint it was converted from); not used by the model."""

    def __post_init__(self) -> None:
        if self.mask_token_id is None and not self.causal:
            self.mask_token_id = self.vocab_size - 1
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise ValueError naming the offending field; called on every construction."""
        positive = (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "max_position_embeddings",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"ModelConfig.num_attention_heads={self.num_attention_heads} must divide "
                f"hidden_size={self.hidden_size}"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"ModelConfig.hidden_size/num_attention_heads = "
                f"{self.hidden_size // self.num_attention_heads} must be even for rotary embeddings"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelConfig.num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        check_model_switches(self.switches())
        if self.num_sink_tokens >= self.max_position_embeddings:  # they take positions of their own
            raise ValueError(f"num_sink_tokens={self.num_sink_tokens} leaves no position for tokens: it must be "
                             f"below max_position_embeddings={self.max_position_embeddings}")
        for name in ("shift_logits", "causal"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"ModelConfig.family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.causal and not self.shift_logits:
            raise ValueError("ModelConfig.causal=True needs shift_logits=True: a causal model's position i "
                             "predicts token i+1 (it cannot see token i+1 itself)")
        if self.mask_token_id is None:
            if not self.causal:
                raise ValueError("ModelConfig.mask_token_id is required for a diffusion model (causal=False)")
        elif not (0 <= self.mask_token_id < self.vocab_size):
            raise ValueError(
                f"ModelConfig.mask_token_id={self.mask_token_id} must lie in [0, vocab_size="
                f"{self.vocab_size})"
            )
        if self.block_size is not None and self.causal:  # a shifted block model (Fast-dLLM v2) is a diffusion model
            raise ValueError("block_size (block diffusion) applies to a diffusion model; this one is autoregressive "
                             "(causal=True): leave block_size unset")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("ModelConfig.rope_theta and ModelConfig.rms_norm_eps must be > 0")

    # ------------------------------------------------------------------ derived
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def has_sink_column(self) -> bool:
        """True when every softmax row has the extra zero-value column (sink_logit or softmax_one)."""
        return self.sink_logit or self.softmax_one

    def switches(self) -> dict[str, Any]:
        """{switch name: value} for every switch of `MODEL_SWITCHES`."""
        return switch_values(self)

    @property
    def max_content_length(self) -> int:
        """Positions left for real tokens (prompt + answer, or a training sequence).

        The sink tokens occupy positions of their own (One-Token eq. 5), so content + sinks must
        fit in `max_position_embeddings`: e.g. 1024 positions with 4 sinks leave 1020.
        """
        return self.max_position_embeddings - self.num_sink_tokens

    def content_length_note(self) -> str:
        """`max_content_length` with its arithmetic, for error messages."""
        if self.num_sink_tokens == 0:
            return f"{self.max_content_length} (max_position_embeddings)"
        return (
            f"{self.max_content_length} (max_position_embeddings={self.max_position_embeddings} "
            f"minus {self.num_sink_tokens} sink token{'s' if self.num_sink_tokens > 1 else ''})"
        )

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model_type"] = MODEL_TYPE
        d["architectures"] = ["DiffusionLM"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Build from a dict, ignoring keys that are not fields (model_type, HF bookkeeping)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names - {"model_type", "architectures", "transformers_version"}
        kwargs = {k: v for k, v in d.items() if k in names}
        if unknown:
            kwargs.setdefault("extra", {})
            kwargs["extra"] = {**kwargs["extra"], "ignored_config_keys": sorted(unknown)}
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


# ----------------------------------------------------------------------------- model switches
@dataclass(frozen=True)
class ModelSwitch:
    """One architectural switch, read off its `ModelConfig` field: name, type, default, help, checks."""

    name: str
    type: type  # int | str | bool
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None  # allowed values (str switches)
    minimum: int | None = None  # smallest allowed value (int switches)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any, where: str = "ModelConfig") -> None:
        """Raise ValueError saying what is wrong with `value` and what would be accepted."""
        label = self.flag if where == "--" else f"{where}.{self.name}" if where else self.name  # "": the bare name
        if value is None and self.default is None:  # an optional switch left off (block_size: the whole sequence)
            return
        if self.type is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{label} must be true or false, got {value!r}")
        elif self.type is int or self.type == int | None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{label} must be an integer, got {value!r}")
        elif not isinstance(value, self.type):
            raise ValueError(f"{label} must be a {self.type.__name__}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{label} must be one of {self.choices}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{label} must be >= {self.minimum} ({self.help}), got {value!r}")


MODEL_SWITCHES: tuple[ModelSwitch, ...] = tuple(
    ModelSwitch(f.name, field_types(ModelConfig)[f.name], f.default, field_docs(ModelConfig)[f.name],
                f.metadata["choices"], f.metadata["minimum"])
    for f in dataclasses.fields(ModelConfig) if f.metadata.get("switch")
)
SWITCHES_BY_NAME: dict[str, ModelSwitch] = {s.name: s for s in MODEL_SWITCHES}
MODEL_SWITCH_DEFAULTS: dict[str, Any] = {s.name: s.default for s in MODEL_SWITCHES}


def switch_values(config: Any) -> dict[str, Any]:
    """{switch name: value} of any config holding the switch fields (ModelConfig, ConvertConfig)."""
    return {s.name: getattr(config, s.name) for s in MODEL_SWITCHES}


def switch_fields(*, optional: bool, note: str = "") -> list[tuple[str, Any, Any]]:
    """`make_dataclass` field specs copying every switch into another config: at its `ModelConfig`
    default, or `optional` (None = keep the preset's / checkpoint's value); `note` ends the help."""
    return [(s.name, s.type | None if optional else s.type,
             field(default=None if optional else s.default, metadata={"help": s.help + note, "switch": True}))
            for s in MODEL_SWITCHES]


def check_model_switches(values: dict[str, Any], where: str = "ModelConfig") -> None:
    """Validate a {switch name: value} mapping (unknown names included) before any work starts."""
    unknown = sorted(set(values) - set(SWITCHES_BY_NAME))
    if unknown:
        raise ValueError(f"unknown model switch(es) {unknown}; valid ones: {sorted(SWITCHES_BY_NAME)}")
    for name, value in values.items():
        SWITCHES_BY_NAME[name].check(value, where)
    if values.get("sink_logit") and values.get("softmax_one"):
        raise ValueError(
            "sink_logit and softmax_one are two versions of the same extra softmax column (learned logit vs "
            "logit fixed at 0); choose one"
        )


# Named presets. `tiny` is the CPU preset used by the demo and the tests; the `smdm-*` sizes follow
# the SMDM scaling suite (Nie et al. 2025a: LLaMA layout, MHA, untied head, SwiGLU 4x->8/3 widths);
# the Qwen2.5 shapes are those of the public base checkpoints (Table 1 of the paper); their
# embedding matrix is padded past the tokenizer (151,665 tokens), so [MASK] fits in a spare row.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=2048, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=384, max_position_embeddings=1024,
    ),
    "small": dict(
        vocab_size=8192, hidden_size=256, num_hidden_layers=6, num_attention_heads=8,
        num_key_value_heads=4, intermediate_size=768, max_position_embeddings=2048,
    ),
    "smdm-85m": dict(
        vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=12, intermediate_size=2048, max_position_embeddings=2048,
        tie_word_embeddings=False, rms_norm_eps=1e-5,
    ),
    "smdm-170m": dict(
        vocab_size=32000, hidden_size=1024, num_hidden_layers=14, num_attention_heads=16,
        num_key_value_heads=16, intermediate_size=2816, max_position_embeddings=2048,
        tie_word_embeddings=False, rms_norm_eps=1e-5,
    ),
    "smdm-470m": dict(
        vocab_size=32000, hidden_size=1280, num_hidden_layers=20, num_attention_heads=20,
        num_key_value_heads=20, intermediate_size=3584, max_position_embeddings=2048,
        tie_word_embeddings=False, rms_norm_eps=1e-5,
    ),
    "qwen2.5-0.5b": dict(
        vocab_size=151936, mask_token_id=151665, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, qkv_bias=True,
    ),
    "qwen2.5-1.5b": dict(
        vocab_size=151936, mask_token_id=151665, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, qkv_bias=True,
    ),
}
