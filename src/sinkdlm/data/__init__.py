"""Data: tokenizers, corpora (shakespeare, local files, hf:), the packed token cache with its
resumable batch order, and SFT sets (JSONL, GSM8K, the synthetic `arithmetic` set)."""

from .corpus import SPLITS, corpus_fingerprint, iter_documents, load_documents, parse_hf_spec, strip_gutenberg
from .packing import (
    PackedTokens,
    batch_for_step,
    batch_indices,
    default_cache_dir,
    pack_corpus,
    pack_documents,
)
from .sft import (
    arithmetic_dataset,
    format_prompt,
    load_gsm8k_jsonl,
    load_sft_jsonl,
    parse_final_answer,
    tokenize_sft,
)
from .tokenizer import (
    EOS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    check_tokenizer_matches,
    encode_texts,
    load_tokenizer,
    tokenizer_fingerprint,
    train_bpe_tokenizer,
)

__all__ = [
    "EOS_TOKEN",
    "MASK_TOKEN",
    "PAD_TOKEN",
    "SPLITS",
    "PackedTokens",
    "arithmetic_dataset",
    "batch_for_step",
    "batch_indices",
    "check_tokenizer_matches",
    "corpus_fingerprint",
    "default_cache_dir",
    "encode_texts",
    "format_prompt",
    "iter_documents",
    "load_documents",
    "load_gsm8k_jsonl",
    "load_sft_jsonl",
    "load_tokenizer",
    "pack_corpus",
    "pack_documents",
    "parse_final_answer",
    "parse_hf_spec",
    "strip_gutenberg",
    "tokenize_sft",
    "tokenizer_fingerprint",
    "train_bpe_tokenizer",
]
