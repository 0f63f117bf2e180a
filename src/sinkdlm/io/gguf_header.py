"""A GGUF file's metadata keys read straight from its header, without torch, numpy or ggml's reader.

`GGUFFile` (ggml's `GGUFReader`) builds a view per element of every metadata array, seconds for a
50k-token vocabulary; an argument check only needs a few scalars (`general.architecture`, whether
`tokenizer.chat_template` is there), so it walks the key/value section itself (GGUF v2/v3, little-endian).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# GGUF value types (ggml's `GGUFValueType`) -> struct format of a scalar; 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def read_gguf_keys(path: str | Path, keys: tuple[str, ...]) -> dict | None:
    """{key: value} of the scalar or string `keys` present in the header of GGUF file `path` (an array's
    value is its length); None when the file cannot be parsed as GGUF (the full load then says why)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _walk(data, set(keys))
    except (OSError, ValueError, struct.error, UnicodeDecodeError, KeyError):
        return None


def _walk(data, wanted: set[str]) -> dict | None:
    if data[:4] != b"GGUF" or struct.unpack_from("<I", data, 4)[0] < 2:
        return None
    count = struct.unpack_from("<Q", data, 16)[0]  # after magic, version and the tensor count
    pos, found = 24, {}

    def string(at: int) -> tuple[str, int]:
        n = struct.unpack_from("<Q", data, at)[0]
        return data[at + 8:at + 8 + n].decode("utf-8"), at + 8 + n

    def skip(kind: int, at: int) -> int:  # the offset after one value of type `kind`
        if kind == _STRING:
            return at + 8 + struct.unpack_from("<Q", data, at)[0]
        return at + struct.calcsize("<" + _SCALARS[kind])

    for _ in range(count):
        if not wanted - found.keys():
            break
        key, pos = string(pos)
        kind = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if kind == _ARRAY:
            inner, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if inner in _SCALARS:
                pos += n * struct.calcsize("<" + _SCALARS[inner])
            else:  # strings (tokens, merges): each carries its own length
                for _ in range(n):
                    pos = skip(inner, pos)
            value = n
        elif kind == _STRING:
            value, pos = string(pos)
        else:
            value = struct.unpack_from("<" + _SCALARS[kind], data, pos)[0]
            pos = skip(kind, pos)
        if key in wanted:
            found[key] = value
    return found
