"""GGUF files (llama.cpp's single-file checkpoints) at the bottom of the stack: metadata and tensors.

Reading and dequantisation are ggml's own `gguf` package (`GGUFReader`, `gguf.quants.dequantize`);
this module only checks a file before any weight is read and hands tensors up one at a time, so
the float model is the only full copy in memory (the file itself is memory-mapped). What the
names and metadata mean (llama.cpp names -> sinkdlm names, the Q/K row order) is a mapping, and
lives with the other format adapters in `sinkdlm.model.formats`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from sinkdlm.files import CheckpointError

# The tensor types read here: float, the legacy block quants and the k-quants (what llama.cpp's
# quantize produces for LLaMA/Qwen2 files). Anything else is refused by name before reading.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
# Metadata arrays kept whole (the tokenizer); every other array is only counted.
_FULL_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


class GGUFFile:
    """An opened, checked GGUF file: `metadata` (scalars and the tokenizer arrays), `tensor_names`,
    and `tensors()` to dequantise them one by one.

    Opening refuses, with one line naming the file: a file that is not GGUF or is truncated (every
    tensor's bytes must lie inside the file), an architecture other than llama/qwen2, and a tensor
    type outside `SUPPORTED_TYPES`.
    """

    def __init__(self, path: str | Path):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self._reader = GGUFReader(str(self.path), "r")
        except (ValueError, OSError, IndexError, KeyError) as e:
            # GGUFReader maps the file and builds a view per tensor: a short file fails there.
            raise CheckpointError(
                f"{self.path} is not a readable GGUF file (truncated or corrupt: {e}); re-download it"
            ) from e
        self.metadata = self._read_metadata()
        arch = self.metadata.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(
                f"{self.path}: GGUF architecture {arch!r} is not supported; sinkdlm opens "
                f"{list(SUPPORTED_ARCHITECTURES)} files"
            )
        self.architecture: str = arch
        size = self.path.stat().st_size
        for t in self._reader.tensors:
            kind = t.tensor_type.name
            if kind not in SUPPORTED_TYPES:
                raise CheckpointError(
                    f"{self.path}: tensor {t.name} has quantisation type {kind}, which sinkdlm does not "
                    f"read; supported: {', '.join(SUPPORTED_TYPES)}"
                )
            if t.data_offset + t.n_bytes > size:
                raise CheckpointError(f"{self.path} is truncated (tensor {t.name} runs past the end); re-download it")
        self.tensor_names = [t.name for t in self._reader.tensors]

    def _read_metadata(self) -> dict:
        out = {}
        for name, field in self._reader.fields.items():
            if name.startswith("GGUF."):
                continue
            is_array = len(field.types) > 1 or (field.types and field.types[0].name == "ARRAY")
            if is_array and name not in _FULL_ARRAYS:
                out[name] = len(field.data)  # e.g. the chat template's token scores: not needed
                continue
            try:
                out[name] = field.contents()
            except (ValueError, TypeError, IndexError) as e:
                raise CheckpointError(f"{self.path}: metadata {name!r} cannot be read ({e})") from e
        return out

    def tensor_types(self) -> dict[str, str]:
        return {t.name: t.tensor_type.name for t in self._reader.tensors}

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(llama.cpp name, float32 tensor in PyTorch's [out, in] order), dequantised one at a time."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        for t in self._reader.tensors:
            if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                array = np.array(t.data, dtype=np.float32)  # a copy: the mapped file is read-only
            else:
                array = dequantize(t.data, t.tensor_type)
            # GGUF lists dimensions fastest-first (ggml's ne); PyTorch's shape is the reverse.
            shape = tuple(int(d) for d in reversed(t.shape))
            yield t.name, torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32).reshape(shape))
