"""Checkpoint files at the bottom of the stack: names, `CheckpointError`, JSON and safetensors I/O.

A checkpoint directory holds `config.json` + `model.safetensors` (or shards listed in
`model.safetensors.index.json`) + tokenizer files. This module reads and writes those files and
nothing else: it imports no model, tokenizer or format code, so everything above (the format
adapters in `sinkdlm.model.formats`, the loader in `sinkdlm.checkpoint.manager`) can use it without cycles.
Writes are atomic (temp file + `os.replace`). Only JSON and safetensors are ever read — never
pickle. Every failure names the file and what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError

from sinkdlm.io.atomic import atomic_write, atomic_write_json

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
GGUF_SUFFIX = ".gguf"


def default_cache_dir() -> Path:
    """Where packed corpora, trained tokenizers and the example model are cached: $SINKDLM_CACHE
    or ~/.cache/sinkdlm."""
    return Path(os.environ.get("SINKDLM_CACHE") or Path.home() / ".cache" / "sinkdlm")


class CheckpointError(ValueError):
    """A model (directory or .gguf file) that cannot be read; the message names the file."""


def read_json(path: str | Path, what: str = "config") -> dict:
    """A JSON object from `path`, or a CheckpointError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: a model directory needs its {CONFIG_NAME}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object (the model {what}), got {type(raw).__name__}")
    return raw


def check_model_path(path: str | Path, flag: str = "model") -> Path:
    """`path` as a Path when it can name a model (a directory or a .gguf file), else one clear line naming
    `flag` (the argument's name; the command line re-spells it as its flag): a Hugging Face Hub id given as
    a path is told to download it first, a missing model of sinkdlm's cache how to fetch it."""
    given = str(path)
    path = Path(path).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        if path.suffix.lower() == GGUF_SUFFIX:
            return path
        raise CheckpointError(
            f"{flag} {str(path)!r} is a file, not a model: pass a model directory ({CONFIG_NAME} + "
            f"safetensors weights) or a {GGUF_SUFFIX} file"
        )
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", given) and not Path(given.split("/")[0]).exists():
        raise CheckpointError(
            f"{flag} {given!r} is not a local file or directory (it looks like a Hugging Face Hub id): sinkdlm reads "
            f"local files; download it first (`huggingface-cli download {given} --local-dir models/{path.name}`), "
            f"then pass models/{path.name}"
        )
    if path.parent == Path(default_cache_dir()).expanduser() / "models":
        raise CheckpointError(
            f"{flag} {str(path)!r} does not exist: fetch the example model with `make example-model` (or "
            f"`python -m sinkdlm.checkpoint.example_model`; from Python, "
            f"`sinkdlm.checkpoint.example_model.fetch_example_model()`, which returns its path)"
        )
    raise CheckpointError(
        f"{flag} {str(path)!r} does not exist: pass a model directory ({CONFIG_NAME} + safetensors "
        f"weights) or a {GGUF_SUFFIX} file"
    )


def read_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """Read `model.safetensors`, or the shards listed in `model.safetensors.index.json`."""
    directory = Path(directory)
    single, index = directory / WEIGHTS_NAME, directory / WEIGHTS_INDEX_NAME
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError, TypeError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index (needs a 'weight_map'): {e}") from e
        files = [directory / name for name in sorted(set(weight_map.values()))]
    else:
        pickled = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt")]
        hint = (
            f" (found {pickled}: pickle files are never read; re-save them as safetensors)" if pickled else ""
        )
        raise CheckpointError(f"{single} is missing{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f} is missing (listed in {index.name})")
        tensors.update(read_weights_file(f))
    return tensors


def read_weights_file(f: Path) -> dict[str, torch.Tensor]:
    """One safetensors file's tensors (aligned); a missing, corrupt or truncated file is a `CheckpointError`."""
    try:
        loaded = safetensors.torch.load_file(str(f))
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{f} is missing, corrupt or truncated ({e}); re-save or re-download it") from e
    return {name: aligned(loaded.pop(name)) for name in list(loaded)}  # one at a time: the peak grows by one tensor


def aligned(t: torch.Tensor) -> torch.Tensor:
    """A copy in torch's own (64-byte aligned) memory when safetensors' buffer is not aligned.

    safetensors allocates tensors at 8-byte alignment; CPU kernels then take other SIMD paths,
    and a reloaded model's logits differ from the saved model's in the last bits (seen on the
    batch-1 sink stream). Aligned copies make save -> load bit-exact.
    """
    return t.clone() if t.data_ptr() % 64 else t


def save_state_dict(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict | None = None) -> None:
    """safetensors `save_file`, atomically."""
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    # save_file is looked up on the module at call time (not imported by name) so tests can
    # simulate a crash in the middle of the write.
    atomic_write(path, lambda tmp: safetensors.torch.save_file(tensors, tmp, metadata=metadata))


def model_state_dict(model, state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The state dict to store: a tied head is stored once (as `embed_tokens.weight`).

    `state_dict`: the model's full state dict when it was gathered elsewhere (FSDP).
    """
    sd = dict(model.state_dict() if state_dict is None else state_dict)
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


SINKS_NAME = "sink_parameters.safetensors"  # trained sink parameters (a --trainable sink or lora checkpoint)
SINK_BASE_NAME = "sink_base.json"  # a --trainable sink checkpoint's frozen base: {"base": path, "sha256": ...}


def sha256_of(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def weights_sha256(path: str | Path) -> str:
    """The sha256 that names a model's weights: of its .gguf file, its model.safetensors, or (shards) of the
    shards' own sha256s in order; a --trainable sink checkpoint's: of its sink parameters (its base has its own)."""
    path = Path(path)
    if path.is_file():
        return sha256_of(path)
    for name in (WEIGHTS_NAME, SINKS_NAME):
        if (path / name).is_file():
            return sha256_of(path / name)
    index = read_json(path / WEIGHTS_INDEX_NAME)
    shards = sorted(set(index.get("weight_map", {}).values()))
    return hashlib.sha256("".join(sha256_of(path / s) for s in shards).encode()).hexdigest()


# what `from_pretrained` was called with, which transformers keeps in a tokenizer's `init_kwargs` and would save
# into tokenizer_config.json as if it were the tokenizer's own configuration
LOADER_ARGS = ("local_files_only", "is_local", "gguf_file", "cache_dir", "force_download", "proxies", "token",
               "revision", "subfolder", "trust_remote_code", "_from_auto", "_commit_hash")


def without_loader_args(tokenizer):
    """`tokenizer` (just loaded) with the arguments it was loaded with forgotten: what a save writes is its
    configuration alone (`LOADER_ARGS`)."""
    for name in LOADER_ARGS:
        tokenizer.init_kwargs.pop(name, None)
    return tokenizer


def save_checkpoint(model, directory: str | Path, tokenizer=None, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """config.json + model.safetensors (+ tokenizer). `state_dict`: as for `model_state_dict`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_state_dict(model_state_dict(model, state_dict), directory / WEIGHTS_NAME, metadata={"format": "pt"})
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    # config.json last: a directory with a config has complete weights beside it.
    atomic_write_json(directory / CONFIG_NAME, model.config.to_dict())
    return directory


def ensure_writable_dir(path: str | Path, flag: str = "--out") -> Path:
    """Create `path` if needed and prove we can write into it — before any work starts."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{flag} {path} is not writable ({e.strerror}); choose another directory") from e
    return path


def resolve_dtype(name: str | None) -> torch.dtype | None:
    """A dtype name checked by `config.checks.check_dtype` (None: as stored) -> the torch dtype."""
    return None if name is None else getattr(torch, name)
