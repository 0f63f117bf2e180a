"""Packed token cache: documents -> one token stream -> fixed-length rows in a memory-mapped
``.npy``, plus the torch dataset and the deterministic, resumable, rank-sharded batch order.

The stream is ``doc_0 EOS doc_1 EOS ... doc_n`` (documents joined by the eos token), cut
into rows of `seq_len` tokens; the tail shorter than a row is dropped. The file lives in a
cache dir (`SINKDLM_CACHE`, default ``~/.cache/sinkdlm``) under a key of everything that
decides its contents, so a second call opens it without reading or tokenising anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from sinkdlm.config.train import TrainConfig  # the one home of text_field
from .corpus import check_split, corpus_fingerprint, iter_documents
from .tokenizer import encode_texts, tokenizer_fingerprint
from sinkdlm.io.files import default_cache_dir  # noqa: F401  (re-exported: sinkdlm.data.default_cache_dir)
from sinkdlm.config.checks import check_int

# Bump when the packing layout changes (separator, dtype rule, document splitting), so old
# cache files are never read as new ones.
PACK_FORMAT_VERSION = 1
ENCODE_BATCH = 256  # documents per tokenizer call: the Rust tokenizer parallelises a batch



def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (ids < 65536), else uint32: halves the cache for small vocabs."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def _check_seq_len(seq_len: int, max_seq_len: int | None) -> None:
    """`max_seq_len` is the model's `ModelConfig.max_content_length` (positions minus sinks)."""
    check_int("seq_len", seq_len, 1)
    if max_seq_len is not None and seq_len > max_seq_len:
        raise ValueError(
            f"seq_len={seq_len} is longer than the {max_seq_len} positions the model leaves for "
            "tokens (max_position_embeddings minus the sink tokens, which take positions of their "
            "own); lower seq_len or use a model with a longer context"
        )


def pack_documents(
    documents: Iterable[str],
    tokenizer,
    seq_len: int,
    out_path: str | Path,
    *,
    max_tokens: int | None = None,
    max_seq_len: int | None = None,
    progress: bool = False,
) -> Path:
    """Tokenise, join with eos, pack into ``[num_sequences, seq_len]`` rows at `out_path`.

    Streams through a temporary flat file, so memory stays bounded for large corpora;
    `max_tokens` stops reading the documents once that many tokens are in the stream.
    `progress` shows a tqdm bar of tokens packed (callers pass `sys.stderr.isatty()`).
    The ``.npy`` appears atomically (temp file + `os.replace`).
    """
    _check_seq_len(seq_len, max_seq_len)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token, which packing uses to separate documents; set eos_token")
    dtype = token_dtype(len(tokenizer))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, flat_name = tempfile.mkstemp(dir=out_path.parent, prefix=".flat-", suffix=".bin")
    flat_path = Path(flat_name)
    tmp_npy = None
    try:
        total, num_docs = 0, 0
        bar = tqdm(total=max_tokens, disable=not progress, unit="tok", unit_scale=True, desc="packing", leave=False)
        with bar, os.fdopen(fd, "wb") as flat:
            it = iter(documents)
            while max_tokens is None or total < max_tokens:
                batch = list(islice(it, ENCODE_BATCH))
                if not batch:
                    break
                pieces = []
                for ids in encode_texts(tokenizer, batch):
                    if num_docs:  # eos before every document but the first: joined by eos
                        pieces.append(np.asarray([eos], dtype=dtype))
                    pieces.append(np.asarray(ids, dtype=dtype))
                    num_docs += 1
                chunk = np.concatenate(pieces)
                chunk.tofile(flat)
                total += len(chunk)
                bar.update(len(chunk))
        if max_tokens is not None:
            total = min(total, max_tokens)
        num_sequences = total // seq_len
        if num_sequences == 0:
            raise ValueError(
                f"the corpus gives {total} tokens from {num_docs} documents, fewer than one sequence "
                f"of seq_len={seq_len}; use more text or a shorter seq_len"
            )
        stream = np.memmap(flat_path, dtype=dtype, mode="r", shape=(num_sequences * seq_len,))
        fd2, tmp_name = tempfile.mkstemp(dir=out_path.parent, prefix=".pack-", suffix=".npy")
        os.close(fd2)
        tmp_npy = Path(tmp_name)
        rows = np.lib.format.open_memmap(tmp_npy, mode="w+", dtype=dtype, shape=(num_sequences, seq_len))
        step = max(1, (1 << 24) // seq_len)  # ~16M tokens per copy: bounded memory
        for r in range(0, num_sequences, step):
            rows[r : r + step] = stream[r * seq_len : (r + step) * seq_len].reshape(-1, seq_len)
        rows.flush()
        del rows, stream
        os.replace(tmp_npy, out_path)
        tmp_npy = None
    finally:
        flat_path.unlink(missing_ok=True)
        if tmp_npy is not None:
            tmp_npy.unlink(missing_ok=True)
    return out_path


def cache_key(
    spec: str, tokenizer, seq_len: int, split: str, text_field: str = TrainConfig.text_field, max_tokens: int | None = None
) -> str:
    """Hash of what decides the packed contents; validates the spec (paths, extensions)."""
    parts = {
        "version": PACK_FORMAT_VERSION,
        "corpus": corpus_fingerprint(spec, text_field),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "seq_len": seq_len,
        "split": split,
        "max_tokens": max_tokens,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def pack_corpus(
    spec: str,
    tokenizer,
    seq_len: int,
    split: str = "train",
    *,
    text_field: str = TrainConfig.text_field,
    cache_dir: str | Path | None = None,
    max_seq_len: int | None = None,
    max_tokens: int | None = None,
) -> Path:
    """Path of the packed ``.npy`` for this corpus split, built on the first call only.

    With data-parallel training, build on one rank first (then barrier): concurrent builds
    are safe (atomic replace) but wasted work.
    """
    check_split(split)
    _check_seq_len(seq_len, max_seq_len)
    if max_tokens is not None and max_tokens < seq_len:
        raise ValueError(f"max_tokens={max_tokens} is below seq_len={seq_len}: not even one sequence would fit")
    key = cache_key(spec, tokenizer, seq_len, split, text_field, max_tokens)
    name = "".join(c if c.isalnum() else "_" for c in Path(spec).name or spec)[:40]
    path = Path(cache_dir or default_cache_dir()).expanduser() / "packed" / f"{name}-{split}-L{seq_len}-{key}.npy"
    if path.exists():
        return path
    docs = iter_documents(spec, split, text_field)
    print(f"[sinkdlm] packing the {split} split of {spec} into {seq_len}-token rows (first run only; "
          f"cached in {path.parent})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    out = pack_documents(docs, tokenizer, seq_len, path, max_tokens=max_tokens, progress=sys.stderr.isatty())
    rows = np.load(out, mmap_mode="r").shape[0]
    print(f"[sinkdlm] packed {rows} rows ({rows * seq_len} tokens) in {time.perf_counter() - start:.1f} s",
          file=sys.stderr, flush=True)
    return out


class PackedTokens(Dataset):
    """Rows of a packed ``.npy`` as ``torch.long`` tensors ``[seq_len]`` (memory-mapped)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"packed token file {str(path)!r} does not exist; build it with pack_corpus()")
        self.path = path
        self.tokens = np.load(path, mmap_mode="r")  # [N, seq_len], uint16/uint32
        if self.tokens.ndim != 2 or self.tokens.dtype not in (np.uint16, np.uint32):
            raise ValueError(f"{path} is not a packed token file (shape {self.tokens.shape}, dtype {self.tokens.dtype})")

    def __getstate__(self) -> dict:
        return {"path": self.path}  # DataLoader workers reopen the map instead of copying it

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.tokens[index].astype(np.int64))  # [seq_len]

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> torch.Tensor:
        """Rows `indices` stacked: ``[len(indices), seq_len]`` long (one gather, no collate)."""
        return torch.from_numpy(self.tokens[np.asarray(indices)].astype(np.int64))


def batch_indices(
    num_sequences: int, batch_size: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1
) -> np.ndarray:
    """This rank's row indices for every batch of one epoch: ``[num_batches, batch_size // world_size]``.

    `batch_size` is the global batch. The epoch's order is a permutation drawn from
    ``(seed, epoch)`` only, so a resumed run sees exactly the batches it would have seen;
    rank r takes the r-th contiguous slice of each global batch (disjoint, covering it).
    The incomplete last batch is dropped so every step has the same shape.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if batch_size < 1 or batch_size % world_size:
        raise ValueError(f"global batch_size={batch_size} must be a positive multiple of world_size={world_size}")
    if num_sequences < batch_size:
        raise ValueError(
            f"{num_sequences} packed sequences cannot fill one batch of {batch_size}; "
            "use a smaller batch_size or seq_len, or more data"
        )
    order = np.random.default_rng([seed, epoch]).permutation(num_sequences)
    num_batches = num_sequences // batch_size
    per_rank = batch_size // world_size
    batches = order[: num_batches * batch_size].reshape(num_batches, world_size, per_rank)
    return batches[:, rank]


def batch_for_step(
    step: int, num_sequences: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1
) -> np.ndarray:
    """Indices of global training step `step` (0-based) over repeated epochs: the whole
    resume state is the step number."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    num_batches = num_sequences // batch_size if batch_size > 0 else 0
    epoch, b = divmod(step, max(num_batches, 1))
    return batch_indices(num_sequences, batch_size, seed, epoch, rank, world_size)[b]
