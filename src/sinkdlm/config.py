"""ModelConfig: the one dataclass that describes a sinkdlm model, plus named presets.

Field names follow Hugging Face (`hidden_size`, `num_key_value_heads`, ...) so a Qwen2/LLaMA
`config.json` maps onto it directly; the paper's switches (`num_sink_tokens`, `sink_position`,
`sink_zero_value`, `gated_attention`) sit beside them. `config.json` of a checkpoint is this
dataclass as JSON plus `model_type: "sinkdlm"` (so `transformers.AutoConfig` can route it).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_TYPE = "sinkdlm"
SINK_POSITIONS = ("front", "end")


@dataclass
class ModelConfig:
    vocab_size: int = 2048
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    qkv_bias: bool = False
    initializer_range: float = 0.02
    # Diffusion: the id of [MASK] inside the vocabulary (SPEC §1). Defaults to the last id.
    mask_token_id: int | None = None
    # The paper's switches (SPEC §3-4). num_sink_tokens=0 is the vanilla DLM.
    num_sink_tokens: int = 0
    sink_position: str = "front"
    sink_zero_value: bool = False
    gated_attention: bool = False
    # Free-form provenance (e.g. the HF checkpoint it was converted from); not used by the model.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mask_token_id is None:
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
        if not isinstance(self.num_sink_tokens, int) or isinstance(self.num_sink_tokens, bool) or self.num_sink_tokens < 0:
            raise ValueError(
                f"ModelConfig.num_sink_tokens must be an integer >= 0 (0 = vanilla DLM), "
                f"got {self.num_sink_tokens!r}"
            )
        if self.sink_position not in SINK_POSITIONS:
            raise ValueError(
                f"ModelConfig.sink_position must be one of {SINK_POSITIONS}, got {self.sink_position!r}"
            )
        if not (0 <= self.mask_token_id < self.vocab_size):
            raise ValueError(
                f"ModelConfig.mask_token_id={self.mask_token_id} must lie in [0, vocab_size="
                f"{self.vocab_size})"
            )
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("ModelConfig.rope_theta and ModelConfig.rms_norm_eps must be > 0")

    # ------------------------------------------------------------------ derived
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

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
