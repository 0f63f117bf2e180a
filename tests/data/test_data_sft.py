"""SFT data: the synthetic arithmetic set (answers recomputed here), GSM8K/JSONL loading,
and tokenisation with a prompt mask."""

import json
import re
from fractions import Fraction

import pytest
import torch

from sinkdlm.data.sft import (
    arithmetic_dataset,
    load_gsm8k_jsonl,
    load_sft_jsonl,
    parse_final_answer,
    tokenize_sft,
)
from sinkdlm.data.tokenizer import train_bpe_tokenizer

STEP = re.compile(r"<<(\d+)([-+*/])(\d+)=(\d+)>>(\d+)")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: Fraction(a, b)}

GSM8K_LINE = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
}


@pytest.fixture(scope="module")
def tok():
    ex = arithmetic_dataset("train", n=200, seed=5)
    return train_bpe_tokenizer([e["prompt"] + e["response"] for e in ex], vocab_size=400)


def test_arithmetic_answers_are_correct():
    examples = arithmetic_dataset("train", n=500, seed=0)
    ops, step_counts = set(), set()
    for ex in examples:
        lines = ex["response"].split("\n")
        assert lines[-1] == f"#### {ex['answer']}"
        steps = [STEP.findall(line) for line in lines[:-1]]
        assert all(len(s) == 1 for s in steps)  # one calculator annotation per line
        for a, op, b, c, shown in (s[0] for s in steps):
            assert OPS[op](int(a), int(b)) == int(c) == int(shown)  # exact, integer results
            ops.add(op)
        assert int(steps[-1][0][3]) == ex["answer"] == parse_final_answer(ex["response"])
        assert ex["prompt"] == ex["question"] + "\n"
        step_counts.add(len(steps))
    assert ops == set("+-*/") and step_counts == {1, 2, 3}
    assert len({e["question"] for e in examples}) == 500


def test_arithmetic_deterministic_and_splits_disjoint():
    a = arithmetic_dataset("train", n=300, seed=3)
    assert a == arithmetic_dataset("train", n=300, seed=3)
    assert a != arithmetic_dataset("train", n=300, seed=4)
    train = {e["question"] for s in (0, 1) for e in arithmetic_dataset("train", n=2000, seed=s)}
    test = {e["question"] for s in (0, 1) for e in arithmetic_dataset("test", n=300, seed=s)}
    assert len(test) > 300 and not train & test
    with pytest.raises(ValueError, match="unknown arithmetic split 'validation'"):
        arithmetic_dataset("validation", n=3)


def test_gsm8k_jsonl(tmp_path):
    f = tmp_path / "gsm8k.jsonl"
    big = {"question": "How many?", "answer": "It is <<1000+234=1234>>1234.\n#### 1,234"}
    f.write_text(json.dumps(GSM8K_LINE) + "\n" + json.dumps(big) + "\n")
    first, second = load_gsm8k_jsonl(f)
    assert first["answer"] == 72 and second["answer"] == 1234
    assert first["response"] == GSM8K_LINE["answer"] and first["prompt"] == GSM8K_LINE["question"] + "\n"
    f.write_text(json.dumps(GSM8K_LINE) + "\n" + json.dumps({"question": "q", "answer": "about #### 7.5"}))
    with pytest.raises(ValueError, match=r"gsm8k.jsonl:2: final answer '7.5' .* not an integer"):
        load_gsm8k_jsonl(f)
    f.write_text(json.dumps({"question": "q", "solution": "#### 1"}))
    with pytest.raises(ValueError, match=r"gsm8k.jsonl:1 has no field 'answer'; fields present: 'question', 'solution'"):
        load_gsm8k_jsonl(f)


def test_load_sft_jsonl(tmp_path):
    f = tmp_path / "sft.jsonl"
    f.write_text('{"q": "Say hi.", "a": "hi"}\n\n{"q": "Count.", "a": "1 2 3"}\n')
    assert load_sft_jsonl(f, "q", "a") == [{"prompt": "Say hi.", "response": "hi"}, {"prompt": "Count.", "response": "1 2 3"}]
    with pytest.raises(ValueError, match=r"sft.jsonl:1 has no field 'prompt'; fields present: 'q', 'a'"):
        load_sft_jsonl(f)
    f.write_text("\n\n")
    with pytest.raises(ValueError, match="is empty"):
        load_sft_jsonl(f)
    with pytest.raises(ValueError, match="does not exist"):
        load_sft_jsonl(tmp_path / "missing.jsonl")


def test_tokenize_sft_marks_exactly_the_prompt(tok):
    examples = arithmetic_dataset("test", n=6, seed=0)
    seq_len = 128
    out = tokenize_sft(examples, tok, seq_len)
    assert out["input_ids"].shape == out["prompt_mask"].shape == (6, seq_len)
    assert out["input_ids"].dtype == torch.long and out["prompt_mask"].dtype == torch.bool
    for i, ex in enumerate(examples):
        p = tok.backend_tokenizer.encode(ex["prompt"], add_special_tokens=False).ids
        r = tok.backend_tokenizer.encode(ex["response"], add_special_tokens=False).ids
        expected = p + r + [tok.eos_token_id] * (seq_len - len(p) - len(r))
        assert out["input_ids"][i].tolist() == expected
        assert out["prompt_mask"][i].tolist() == [True] * len(p) + [False] * (seq_len - len(p))
        assert (out["prompt_length"][i], out["response_length"][i]) == (len(p), len(r))
        assert tok.decode(expected[: len(p) + len(r)]) == ex["prompt"] + ex["response"]


def test_tokenize_sft_limits(tok):
    ex = [{"prompt": "Question: how many clips in all?\n", "response": "In May she sold 24 clips.\n#### 72"}]
    p = len(tok.backend_tokenizer.encode(ex[0]["prompt"], add_special_tokens=False).ids)
    with pytest.raises(ValueError, match=rf"prompt alone is {p} tokens.*seq_len={p}"):
        tokenize_sft(ex, tok, p)
    with pytest.warns(UserWarning, match="1 of 1 responses were cut"):
        out = tokenize_sft(ex, tok, p + 2)
    assert out["response_length"].tolist() == [2] and out["prompt_mask"].sum() == p
