"""Tokenizers: byte-level BPE training, round trip, special tokens, loading, model checks."""

import shutil

import pytest

from sinkdlm.data import (
    EOS_TOKEN,
    MASK_TOKEN,
    PAD_TOKEN,
    check_tokenizer_matches,
    encode_texts,
    load_tokenizer,
    tokenizer_fingerprint,
    train_bpe_tokenizer,
)

TEXTS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "The slings and arrows of outrageous fortune,\n\nOr to take arms against a sea of troubles.",
    "Natalia sold 48 clips in April and half as many clips in May.",
] * 20


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, vocab_size=300)


@pytest.mark.parametrize(
    "text",
    [
        "Hello  world,\n\n  two spaces, a\ttab and trailing space ",
        "\n\nleading newlines and ünïcødé 🤗 never seen in training\n",
        "Digits 12,345 and <<48/2=24>>24\n#### 72",
    ],
)
def test_round_trip(tok, text):
    ids = encode_texts(tok, [text])[0]
    assert tok.decode(ids) == text


def test_special_tokens(tok):
    backend = tok.backend_tokenizer
    assert tok.mask_token == MASK_TOKEN and tok.eos_token == EOS_TOKEN and tok.pad_token == PAD_TOKEN
    assert tok.mask_token_id == backend.token_to_id(MASK_TOKEN)
    assert tok.eos_token_id == backend.token_to_id(EOS_TOKEN)
    assert len({tok.mask_token_id, tok.eos_token_id, tok.pad_token_id}) == 3
    assert len(tok) <= 300
    # Special-token text inside data stays text: never the mask id or a document break.
    ids = encode_texts(tok, [f"a {MASK_TOKEN} b {EOS_TOKEN}"])[0]
    assert tok.mask_token_id not in ids and tok.eos_token_id not in ids
    assert tok.decode(ids) == f"a {MASK_TOKEN} b {EOS_TOKEN}"


def test_training_is_deterministic(tok):
    again = train_bpe_tokenizer(iter(TEXTS), vocab_size=300)
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)
    other = train_bpe_tokenizer(TEXTS, vocab_size=290)
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tok)


def test_save_and_load(tmp_path, tok):
    out = tmp_path / "tok"
    trained = train_bpe_tokenizer(TEXTS, vocab_size=300, out_dir=out)
    text = "Or to take arms, 48 clips."
    expected = encode_texts(trained, [text])[0]
    for path in (out, out / "tokenizer.json"):
        loaded = load_tokenizer(path)
        assert encode_texts(loaded, [text])[0] == expected
        assert loaded.mask_token_id == trained.mask_token_id and loaded.eos_token_id == trained.eos_token_id
    # A bare tokenizer.json (no config beside it) still gets its eos/pad/mask roles.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(out / "tokenizer.json", bare / "tokenizer.json")
    loaded = load_tokenizer(bare / "tokenizer.json")
    assert (loaded.mask_token_id, loaded.eos_token_id, loaded.pad_token_id) == (
        trained.mask_token_id, trained.eos_token_id, trained.pad_token_id
    )


def test_load_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="no tokenizer.json or tokenizer_config.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("a\n")
    with pytest.raises(ValueError, match="not a tokenizer.json"):
        load_tokenizer(tmp_path / "vocab.txt")


def test_train_errors():
    with pytest.raises(ValueError, match="at least 259"):
        train_bpe_tokenizer(TEXTS, vocab_size=100)
    with pytest.raises(ValueError, match="not one string"):
        train_bpe_tokenizer("just one string", vocab_size=300)
    with pytest.raises(ValueError, match="no texts"):
        train_bpe_tokenizer([], vocab_size=300)


def test_check_tokenizer_matches(tok):
    check_tokenizer_matches(tok, vocab_size=len(tok), mask_token_id=tok.mask_token_id)
    check_tokenizer_matches(tok, vocab_size=len(tok) + 64, mask_token_id=tok.mask_token_id)
    wrong = tok.mask_token_id + 7
    with pytest.raises(ValueError, match=rf"mask token id is {tok.mask_token_id} .* mask_token_id is {wrong}"):
        check_tokenizer_matches(tok, vocab_size=len(tok), mask_token_id=wrong)
    with pytest.raises(ValueError, match=rf"has {len(tok)} tokens .* vocab_size is {len(tok) - 1}"):
        check_tokenizer_matches(tok, vocab_size=len(tok) - 1, mask_token_id=tok.mask_token_id)
