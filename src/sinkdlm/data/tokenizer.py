"""Tokenizers: load a local Hugging Face tokenizer, train a small byte-level BPE, and check
that a tokenizer agrees with a model's vocabulary (`vocab_size`, `mask_id`, docs/method.md §1).

Everything here is `tokenizers`/`transformers`; nothing is hand-written BPE. Loading is
local only (`local_files_only=True`): a missing path is a user error, never a download.
"""

from __future__ import annotations

import sys

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from sinkdlm.io.files import CONFIG_NAME, read_json, without_loader_args

# Special tokens of tokenizers trained here. The end-of-text token separates documents in
# the packed corpus and pads SFT responses; [MASK] is the diffusion mask (docs/method.md §1).
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
MASK_TOKEN = "[MASK]"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, MASK_TOKEN)  # ids 0, 1, 2 in a trained tokenizer

# 256 byte symbols + the special tokens: below this a byte-level BPE cannot encode all text.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def _wrap(tok: Tokenizer, **special: str) -> PreTrainedTokenizerFast:
    # clean_up_tokenization_spaces=False: the clean-up rewrites " ." to "." and would break
    # the exact decode(encode(text)) == text round trip byte-level BPE otherwise gives.
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **special)


def load_tokenizer(path: str | Path, *, sinkdlm_checkpoint: bool = False) -> PreTrainedTokenizerFast:
    """Load a Hugging Face tokenizer directory, a single `tokenizer.json` or a `.gguf` file's tokenizer,
    local files only. `sinkdlm_checkpoint=True`: the caller has parsed the directory's config.json
    already (`sinkdlm.checkpoint.manager`), so it is not read again."""
    path = Path(path).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return gguf_tokenizer(path)
    if not path.exists():
        raise ValueError(
            f"tokenizer path {str(path)!r} does not exist; pass a tokenizer directory (with "
            "tokenizer.json / tokenizer_config.json) or a tokenizer.json file"
        )
    if path.is_file():
        if path.suffix != ".json":
            raise ValueError(f"tokenizer file {str(path)!r} is not a tokenizer.json; pass the JSON file or its directory")
        if path.name == "tokenizer.json" and (path.parent / "tokenizer_config.json").exists():
            path = path.parent  # the directory also knows which tokens are eos/mask/pad
        else:
            # A bare tokenizer.json says which tokens are special but not their roles; assign
            # the roles of this module's names when the vocabulary has them.
            tok = Tokenizer.from_file(str(path))
            vocab = tok.get_vocab()
            roles = {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN, "mask_token": MASK_TOKEN}
            return _wrap(tok, **{k: v for k, v in roles.items() if v in vocab})
    files = {p.name for p in path.iterdir()}
    if not files & {"tokenizer.json", "tokenizer_config.json"}:
        raise ValueError(
            f"tokenizer directory {str(path)!r} has no tokenizer.json or tokenizer_config.json; "
            "point to a directory written by save_pretrained (or a checkpoint directory with tokenizer files)"
        )
    loader = AutoTokenizer
    if sinkdlm_checkpoint:
        loader = PreTrainedTokenizerFast  # see below
    elif (path / CONFIG_NAME).is_file():  # a checkpoint directory
        raw = read_json(path / CONFIG_NAME)
        if raw.get("model_type", "sinkdlm") != "sinkdlm":  # LLaDA / Dream / Qwen2 / LLaMA: no remote code
            return load_pretrained_tokenizer(path, raw.get("mask_token_id"))
        # AutoTokenizer would look up config.json's model_type "sinkdlm" among transformers' models;
        # the tokenizer sinkdlm saves is always a fast tokenizer, so open it as one.
        loader = PreTrainedTokenizerFast
    try:
        tokenizer = without_loader_args(loader.from_pretrained(str(path), local_files_only=True))
    except (OSError, ValueError) as exc:
        raise ValueError(f"could not load the tokenizer in {str(path)!r}: {exc}") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(
            f"tokenizer in {str(path)!r} loaded as the slow {type(tokenizer).__name__}; "
            "sinkdlm needs a fast tokenizer (a tokenizer.json file)"
        )
    return tokenizer


_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token")


def _token_text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _with_mask(tok: PreTrainedTokenizerFast, mask_token_id: int | None, where) -> PreTrainedTokenizerFast:
    """A diffusion model's `[MASK]` (its config's mask_token_id) becomes the tokenizer's mask token."""
    if mask_token_id is not None and tok.mask_token is None:
        mask = tok.convert_ids_to_tokens(mask_token_id)
        if mask is None:
            raise ValueError(f"{where} has no token with the model's mask_token_id {mask_token_id}")
        tok.mask_token = mask
    return tok


def load_pretrained_tokenizer(directory: str | Path, mask_token_id: int | None = None) -> PreTrainedTokenizerFast:
    """The fast tokenizer of a foreign-format directory (LLaDA, Dream, Qwen2, LLaMA) from `tokenizer.json`
    and the special-token roles in `tokenizer_config.json` / `special_tokens_map.json` — read as JSON,
    so a `tokenizer_config.json` that names its own tokenizer class (`auto_map`) runs nothing."""
    directory = Path(directory)
    file = directory / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{file} is missing: sinkdlm reads a pretrained model's fast tokenizer (tokenizer.json) only")
    roles: dict[str, str] = {}
    template = None
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins
        if (directory / name).is_file():
            meta = read_json(directory / name, "tokenizer settings")
            roles.update({r: t for r in _ROLES if (t := _token_text(meta.get(r))) is not None})
            template = meta.get("chat_template", template)
    if (directory / "chat_template.jinja").is_file():  # where transformers >= 4.43 saves it
        template = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(file), clean_up_tokenization_spaces=False, **roles)
    if isinstance(template, str):  # (a list of named templates is left to transformers' own loader)
        tok.chat_template = template
    return _with_mask(tok, mask_token_id, file)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 bytes (the alphabet of every byte-level BPE vocabulary):
    printable Latin-1 bytes stand for themselves, the rest map to code points from 256 upward."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


# The split before byte-level BPE for the `tokenizer.ggml.pre` names of llama/qwen2 files that do not
# use GPT-2's own (Llama 3 and Qwen2 learned their merges on these splits; llama.cpp's llama-vocab.cpp).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GGUF_PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# llama.cpp's token types (gguf.TokenType): CONTROL tokens are special, USER_DEFINED ones are added
# tokens matched whole but not special.
_CONTROL, _USER_DEFINED = 3, 4


def _byte_level_from_gguf(meta: dict) -> Tokenizer:
    """A byte-level BPE (`tokenizer.ggml.model` "gpt2") from the file's vocabulary and merges, built
    with `tokenizers` as GPT-2's tokenizer is: ByteLevel pre-tokenizer (after the split the file's
    `tokenizer.ggml.pre` names, if any) and decoder; control tokens special, user-defined ones added."""
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    tokens = list(meta["tokenizer.ggml.tokens"])
    # A token written in raw UTF-8 instead of the byte alphabet (some converters do) is respelled.
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i for i, t in enumerate(tokens)
    }
    merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges", ())]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    split = GGUF_PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")  # no BOS/EOS added
    types = list(meta.get("tokenizer.ggml.token_type") or ())
    # A "control" token outside the byte alphabet is a converter's mislabel: adding it would grow the
    # vocabulary past the model's embedding table, so it is left as an ordinary vocabulary entry.
    control = [t for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= alphabet]
    if control:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, k in zip(tokens, types) if k == _USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return tok


def gguf_tokenizer(path: str | Path, mask_token_id: int | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer a `.gguf` file describes in its `tokenizer.ggml.*` metadata.

    A byte-level BPE (`tokenizer.ggml.model` "gpt2": SmolLM2, Qwen2, Llama 3 files) is built here from
    the metadata with `gguf` and `tokenizers`, the same ids on every transformers version (checked against
    `AutoTokenizer.from_pretrained(..., gguf_file=...)` in tests/test_gguf.py and tests/test_real_model.py).
    Any other kind (a sentencepiece vocabulary) goes through that public transformers API. The roles
    bos/eos/unk/pad come from the file's `tokenizer.ggml.*_token_id`."""
    from sinkdlm.io.gguf_file import read_tokenizer_metadata

    path = Path(path)
    meta = read_tokenizer_metadata(path)
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{path} carries no tokenizer (tokenizer.ggml.tokens is missing); use a GGUF written with its vocabulary")
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        try:
            backend = _byte_level_from_gguf(meta)
        except Exception as e:  # tokenizers' own errors (a malformed merge) are plain Exceptions
            raise ValueError(f"{path}: its byte-level BPE metadata (tokenizer.ggml.*) is malformed ({e})") from e
    else:
        try:
            backend = AutoTokenizer.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True
            ).backend_tokenizer
        except (OSError, KeyError, ValueError, TypeError, IndexError, NotImplementedError, AttributeError) as e:
            raise ValueError(
                f"{path}: transformers cannot build its {kind!r} tokenizer ({e!r}); convert the model to a directory "
                "with transformers (save_pretrained) and load that"
            ) from e
    roles = {}
    for role, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        if isinstance(index, int) and 0 <= index < len(tokens):
            roles[role] = tokens[index]
    tok = _wrap(backend, **roles)
    if isinstance(meta.get("tokenizer.chat_template"), str):  # generate --chat applies it
        tok.chat_template = meta["tokenizer.chat_template"]
    return _with_mask(tok, mask_token_id, path)


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int, out_dir: str | Path | None = None
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` with eos/pad/[MASK] special tokens (ids 0, 1, 2).

    Deterministic for the same texts and vocab size (no dropout, sorted byte alphabet).
    Saved with `save_pretrained(out_dir)` when `out_dir` is given.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for a byte-level BPE: it needs at least "
            f"{MIN_VOCAB_SIZE} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)"
        )
    if isinstance(texts, str):
        raise ValueError("train_bpe_tokenizer takes an iterable of texts, not one string; wrap it in a list")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols up front, so any text (unseen bytes too) stays encodable.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=sys.stderr.isatty(),  # the tokenizers library's own bar, on a terminal only
    )
    seen = 0

    def counted() -> Iterable[str]:
        nonlocal seen
        for text in texts:
            seen += 1
            yield text

    tok.train_from_iterator(counted(), trainer)
    if seen == 0:
        raise ValueError("train_bpe_tokenizer got no texts; pass at least one document")
    tokenizer = _wrap(tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, mask_token=MASK_TOKEN)
    if out_dir is not None:
        tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def check_tokenizer_matches(tokenizer: PreTrainedTokenizerFast, vocab_size: int, mask_token_id: int | None) -> None:
    """Raise `ValueError` when the tokenizer cannot drive a model with this vocabulary.

    `mask_token_id` None: an autoregressive model, which has no mask token to agree on."""
    tok_mask = tokenizer.mask_token_id
    if mask_token_id is not None and tok_mask != mask_token_id:
        raise ValueError(
            f"tokenizer mask token id is {tok_mask} but the model's mask_token_id is {mask_token_id}; "
            "use the tokenizer the model was trained with, or set the model's mask_token_id to match"
        )
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}; "
            "ids past the embedding table would crash: train a smaller tokenizer or enlarge vocab_size"
        )


def encode_texts(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Token ids of raw data texts: no BOS/EOS added, and special-token *text* stays text.

    split_special_tokens: a literal "[MASK]" or "<|endoftext|>" inside a corpus must never
    become the mask id (it would corrupt x0) or a spurious document break.
    """
    return tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """A content hash of the tokenizer (vocab, merges, normalisers, special tokens): cache key."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        content = backend.to_str()
    else:  # a slow tokenizer: its vocabulary is what decides the ids
        content = json.dumps(sorted(tokenizer.get_vocab().items()))
    content += json.dumps({k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())})
    return hashlib.sha256(content.encode()).hexdigest()
