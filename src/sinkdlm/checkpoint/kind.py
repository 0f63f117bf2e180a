"""What kind of model a path holds, read from its header alone, so a command can check its flags against
the model before any weight is read: autoregressive or diffusion, the sampler family, a chat template.

A `.gguf` is read with `sinkdlm.io.gguf_header` (no torch: a refusal on the example GGUF takes well under
a second); a directory's `config.json` is parsed by `sinkdlm.model.loader.open_source`, weights untouched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# llama.cpp's diffusion architectures (llama-diffusion-cli); every other architecture sinkdlm opens is causal.
_GGUF_DIFFUSION = ("dream", "llada")


@dataclass(frozen=True)
class ModelKind:
    """The facts about a model that decide which flags apply, from its header."""

    autoregressive: bool
    family: str  # the sampler family (`ModelConfig.family`): "llada" or "dream"
    chat_template: bool  # the tokenizer carries a chat template
    block_size: int | None = None  # a block diffusion model's (`ModelConfig.block_size`, docs/method.md §13)


def model_kind(path: str | Path, flag: str = "model") -> ModelKind | None:
    """The `ModelKind` of the model at `path`; None when a GGUF header cannot tell (loading then says why).
    Nothing there, or a file that is no .gguf: the loader's one-line error, naming `flag`."""
    path = Path(path).expanduser()
    if not path.is_dir() and not (path.is_file() and path.suffix.lower() == ".gguf"):
        from sinkdlm.io.files import check_model_path

        check_model_path(path, flag)  # raises
    if path.is_file() and path.suffix.lower() == ".gguf":
        from sinkdlm.io.gguf_header import read_gguf_keys

        meta = read_gguf_keys(path, ("general.architecture", "tokenizer.chat_template"))
        arch = (meta or {}).get("general.architecture")
        if not isinstance(arch, str):
            return None
        return ModelKind(autoregressive=arch not in _GGUF_DIFFUSION, family="dream" if arch == "dream" else "llada",
                         chat_template=bool(meta.get("tokenizer.chat_template")))
    from sinkdlm.model.loader import open_source

    config = open_source(path, flag).config  # config.json only
    return ModelKind(autoregressive=config.causal, family=config.family, chat_template=_has_chat_template(path),
                     block_size=config.block_size)


def _has_chat_template(directory: Path) -> bool:
    """A tokenizer directory's chat template: `chat_template.jinja`, or `chat_template` in tokenizer_config.json."""
    if (directory / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False
