"""GGUF files (llama.cpp's single-file checkpoints) at the bottom of the stack: metadata and tensors.

Reading and dequantisation are ggml's own `gguf` package (`GGUFReader`, `gguf.quants.dequantize`);
this module only checks a file before any weight is read and hands tensors up one at a time, so
the float model is the only full copy in memory (the file itself is memory-mapped). What the
names and metadata mean (llama.cpp names -> sinkdlm names, the Q/K row order) is a mapping, and
lives with the other format adapters in `sinkdlm.model.formats`.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from sinkdlm.io.files import CheckpointError

# The tensor types read here: float, the legacy block quants and the k-quants (what llama.cpp's
# quantize produces for LLaMA/Qwen2 files). Anything else is refused by name before reading.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# Causal LMs, and the diffusion LMs llama.cpp runs with llama-diffusion-cli (bidirectional, a [MASK] id).
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "dream", "llada")
# Rows dequantised at a time: about this many bytes of float32 (the transient of a load).
_BLOCK_BYTES = 8 << 20


def _is_array(field) -> bool:
    return len(field.types) > 1 or bool(field.types and field.types[0].name == "ARRAY")


def _contents(field):
    """A metadata field's value as Python objects (str, int, float, bool, or a list of them).

    What `ReaderField.contents()` of newer gguf releases returns (0.11 has none), written against the reader's `parts`/`data`
    layout that every gguf release since 0.10 has, so the declared floor reads files too."""
    def one(index):
        part = field.parts[index]
        return bytes(part).decode("utf-8") if kind.name == "STRING" else part.tolist()[0]

    if _is_array(field):
        kind = field.types[-1]
        return [one(i) for i in field.data]
    kind = field.types[0]
    return one(field.data[0])


class GGUFFile:
    """An opened, checked GGUF file: `metadata` (scalars; arrays as their length), `tensor_names`,
    and `tensors()` to dequantise them one by one.

    Opening refuses, with one line naming the file: a file that is not GGUF or is truncated (every
    tensor's bytes must lie inside the file), an architecture outside `SUPPORTED_ARCHITECTURES`, and a tensor
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
        # The reader keeps a numpy view per element of every metadata array (50k tokens, 49k merges:
        # ~160 MB for SmolLM2). Only their counts are needed here (the tokenizer is built from the
        # file by `sinkdlm.data.tokenizer.gguf_tokenizer`), so they are dropped before any weight.
        for name in [n for n, f in self._reader.fields.items() if _is_array(f)]:
            del self._reader.fields[name]
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
            if _is_array(field):
                out[name] = len(field.data)  # the number of elements (e.g. tokens), not the elements
                continue
            try:
                out[name] = _contents(field)
            except (ValueError, TypeError, IndexError) as e:
                raise CheckpointError(f"{self.path}: metadata {name!r} cannot be read ({e})") from e
        return out

    def tensors(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """(llama.cpp name, tensor in PyTorch's [out, in] order and `dtype`), dequantised one at a time.

        Each tensor is dequantised in blocks of rows straight into its destination, and the file's pages
        it was read from are handed back to the OS (the file is memory-mapped): the peak stays near the
        float model plus one block, not the model plus a whole tensor's float32 intermediates."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        mapped = getattr(self._reader.data, "_mmap", None)
        for t in self._reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists ne fastest-first
            out = torch.empty(shape, dtype=dtype)
            flat = out.view(-1, shape[-1]) if out.dim() > 1 else out.view(1, -1)
            raw = t.data.reshape(flat.shape[0], -1)
            rows = max(1, _BLOCK_BYTES // max(1, 4 * flat.shape[1]))
            for r in range(0, flat.shape[0], rows):
                chunk = raw[r:r + rows]
                if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                    values = np.asarray(chunk, dtype=np.float32)
                else:
                    values = dequantize(chunk, t.tensor_type)
                flat[r:r + rows] = torch.from_numpy(np.array(values, dtype=np.float32, copy=True))
            if mapped is not None:  # best effort: clean file pages, re-read from disk if touched again
                start = (t.data_offset // mmap.PAGESIZE) * mmap.PAGESIZE
                end = t.data_offset + t.n_bytes
                try:
                    mapped.madvise(mmap.MADV_DONTNEED, start, end - start)
                except (OSError, ValueError, AttributeError):
                    pass
            yield t.name, out


def read_tokenizer_metadata(path: str | Path) -> dict:
    """`general.architecture` and every `tokenizer.*` entry of a GGUF file, arrays in full (tokens,
    merges, token types), read with ggml's `gguf` package; no tensor is touched.

    A separate reader from `GGUFFile` (which drops the arrays before any weight is read): this one
    is gone once the tokenizer is built, so its per-element views never coexist with the weights."""
    from gguf import GGUFReader

    path = Path(path)
    try:
        reader = GGUFReader(str(path), "r")
        return {
            name: _contents(field)
            for name, field in reader.fields.items()
            if name == "general.architecture" or name.startswith("tokenizer.")
        }
    except (ValueError, OSError, IndexError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: its tokenizer metadata (tokenizer.*) cannot be read ({e!r}); re-download it") from e
