"""Packed token cache: contents vs an independent join of the documents, cache reuse,
atomic writes, the torch dataset, and the seeded, resumable, rank-sharded batch order."""

import json
import os
import pickle

import numpy as np
import pytest
import torch

from sinkdlm.data import corpus, packing
from sinkdlm.data.packing import PackedTokens, batch_for_step, batch_indices, pack_corpus, token_dtype
from sinkdlm.data.tokenizer import train_bpe_tokenizer

TEXTS = [f"Doc {i}: the quick brown fox jumps {i % 7} times over {i * 13} lazy dogs.\nThe end." for i in range(80)]


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, vocab_size=300)


@pytest.fixture
def corpus_file(tmp_path):
    f = tmp_path / "docs.jsonl"
    f.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    return f


def reference_rows(tok, docs, seq_len):
    """The brief's definition, written independently: documents joined by eos, cut into rows."""
    stream = []
    for i, doc in enumerate(docs):
        if i:
            stream.append(tok.eos_token_id)
        stream += tok.backend_tokenizer.encode(doc, add_special_tokens=False).ids
    n = len(stream) // seq_len
    return np.array(stream[: n * seq_len]).reshape(n, seq_len)


@pytest.mark.parametrize("split", ["train", "validation"])
def test_rows_equal_joined_token_stream(tmp_path, tok, corpus_file, split):
    seq_len = 8 if split == "validation" else 32
    path = pack_corpus(str(corpus_file), tok, seq_len, split, cache_dir=tmp_path / "cache")
    rows = np.load(path)
    docs = corpus.load_documents(str(corpus_file), split)
    np.testing.assert_array_equal(rows, reference_rows(tok, docs, seq_len))
    assert rows.dtype == np.uint16 and token_dtype(70_000) == np.uint32
    # Atomic write: nothing but the finished file is left in the cache folder.
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_deterministic_and_cache_reused(tmp_path, tok, corpus_file, monkeypatch):
    first = pack_corpus(str(corpus_file), tok, 16, cache_dir=tmp_path / "a")
    other = pack_corpus(str(corpus_file), tok, 16, cache_dir=tmp_path / "b")
    np.testing.assert_array_equal(np.load(first), np.load(other))
    stamp = first.stat().st_mtime_ns

    def boom(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    with monkeypatch.context() as m:  # neither the corpus nor the tokenizer may be touched
        m.setattr(type(tok), "__call__", boom)
        m.setattr(packing, "iter_documents", boom)
        assert pack_corpus(str(corpus_file), tok, 16, cache_dir=tmp_path / "a") == first
    assert first.stat().st_mtime_ns == stamp
    # Anything that changes the contents changes the key.
    assert pack_corpus(str(corpus_file), tok, 12, cache_dir=tmp_path / "a") != first
    assert pack_corpus(str(corpus_file), tok, 16, "validation", cache_dir=tmp_path / "a") != first
    corpus_file.write_text(corpus_file.read_text() + "\n" + json.dumps({"text": "one more document"}))
    os.utime(corpus_file, ns=(stamp + 10**9, stamp + 10**9))
    assert pack_corpus(str(corpus_file), tok, 16, cache_dir=tmp_path / "a") != first


def test_cache_dir_from_environment(tmp_path, tok, corpus_file, monkeypatch):
    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "env"))
    path = pack_corpus(str(corpus_file), tok, 16)
    assert path.parent == tmp_path / "env" / "packed"


def test_max_tokens(tmp_path, tok, corpus_file):
    path = pack_corpus(str(corpus_file), tok, 10, cache_dir=tmp_path, max_tokens=55)
    docs = corpus.load_documents(str(corpus_file))
    np.testing.assert_array_equal(np.load(path), reference_rows(tok, docs, 10)[:5])


def test_packed_tokens_dataset(tmp_path, tok, corpus_file):
    path = pack_corpus(str(corpus_file), tok, 16, cache_dir=tmp_path)
    rows = np.load(path)
    ds = PackedTokens(path)
    assert len(ds) == rows.shape[0] and ds.seq_len == 16
    assert ds[3].dtype == torch.long and ds[3].shape == (16,)
    assert ds[3].tolist() == rows[3].tolist()
    assert ds.get_batch([5, 0, 5]).tolist() == rows[[5, 0, 5]].tolist()
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch.shape == (4, 16) and batch.tolist() == rows[:4].tolist()
    clone = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker receives
    assert isinstance(clone.tokens, np.memmap) and clone[3].tolist() == rows[3].tolist()
    with pytest.raises(ValueError, match="does not exist"):
        PackedTokens(tmp_path / "missing.npy")


def test_errors(tmp_path, tok, corpus_file):
    with pytest.raises(ValueError, match="seq_len=4096 is longer than the 1024 positions the model leaves for tokens"):
        pack_corpus(str(corpus_file), tok, 4096, cache_dir=tmp_path, max_seq_len=1024)
    small = tmp_path / "small.txt"
    small.write_text("a tiny corpus\n\nof two paragraphs")
    with pytest.raises(ValueError, match=r"fewer than one sequence of seq_len=512"):
        pack_corpus(str(small), tok, 512, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown split"):
        pack_corpus(str(corpus_file), tok, 16, "dev", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        pack_corpus(str(tmp_path / "nope.jsonl"), tok, 16, cache_dir=tmp_path)
    assert not list((tmp_path / "packed").glob(".*"))  # failed builds leave no temp files


def test_batch_order():
    n, bs = 103, 12
    epoch0 = batch_indices(n, bs, seed=1, epoch=0)
    assert epoch0.shape == (103 // 12, 12)
    np.testing.assert_array_equal(epoch0, batch_indices(n, bs, seed=1, epoch=0))
    assert len(np.unique(epoch0)) == epoch0.size and epoch0.max() < n  # no row twice in an epoch
    assert not np.array_equal(epoch0, batch_indices(n, bs, seed=1, epoch=1))
    assert not np.array_equal(epoch0, batch_indices(n, bs, seed=2, epoch=0))
    # Rank shards: disjoint, and together (in rank order) exactly the global batch.
    shards = [batch_indices(n, bs, seed=1, epoch=0, rank=r, world_size=3) for r in range(3)]
    assert all(s.shape == (8, 4) for s in shards)
    np.testing.assert_array_equal(np.concatenate(shards, axis=1), epoch0)
    # Resuming needs only the step number.
    for step in (0, 7, 8, 20):
        epoch, b = divmod(step, 8)
        np.testing.assert_array_equal(
            batch_for_step(step, n, bs, seed=1, rank=2, world_size=3),
            batch_indices(n, bs, seed=1, epoch=epoch, rank=2, world_size=3)[b],
        )
    with pytest.raises(ValueError, match="multiple of world_size=5"):
        batch_indices(n, bs, 0, 0, world_size=5)
    with pytest.raises(ValueError, match=r"rank=3 must be in \[0, world_size=3\)"):
        batch_indices(n, bs, 0, 0, rank=3, world_size=3)
    with pytest.raises(ValueError, match="cannot fill one batch of 12"):
        batch_indices(5, bs, 0, 0)
