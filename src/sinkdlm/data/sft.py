"""Supervised fine-tuning data: prompt/response pairs from JSONL or GSM8K files, a built-in
synthetic GSM8K-style `arithmetic` set, and tokenisation into fixed-length rows with a
prompt mask (docs/method.md §1: the prompt is never masked; only response positions are trained).

Every example is ``{"prompt": str, "response": str}``; the GSM8K-style sets add
``"question"`` (the bare question) and ``"answer"`` (the final integer). Responses use the
augmented GSM8K format: calculator annotations ``<<48/2=24>>24`` and a last line ``#### 72``.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sinkdlm.io.jsonl import iter_jsonl

from .corpus import stable_hash
from .tokenizer import encode_texts

ANSWER_MARK = "####"
ARITHMETIC_SPLITS = ("train", "test")
ARITHMETIC_TEST_BUCKETS = 10  # a question is in test iff its hash % 10 == 0 (~10 % of all questions)


def format_prompt(question: str) -> str:
    """The prompt a model sees for a question; the response follows on the next line."""
    return question + "\n"


def _read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"SFT file {str(path)!r} does not exist; pass a JSON Lines file (one object per line)")
    records = []
    for lineno, record in iter_jsonl(path):
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{lineno} is a JSON {type(record).__name__}; expected an object")
        records.append((lineno, record))
    if not records:
        raise ValueError(f"SFT file {str(path)!r} is empty; it needs one JSON object per line")
    return records


def _field(record: dict, name: str, path: str | Path, lineno: int) -> str:
    if name not in record:
        raise ValueError(
            f"{path}:{lineno} has no field {name!r}; fields present: {', '.join(map(repr, record)) or 'none'}. "
            "Pass the field names that hold the prompt and the response"
        )
    if not isinstance(record[name], str):
        raise ValueError(f"{path}:{lineno}: field {name!r} is a {type(record[name]).__name__}, expected a string")
    return record[name]


def load_sft_jsonl(path: str | Path, prompt_field: str = "prompt", response_field: str = "response") -> list[dict]:
    """``[{"prompt", "response"}]`` from a JSON Lines file, taken verbatim (no template added)."""
    return [
        {"prompt": _field(r, prompt_field, path, n), "response": _field(r, response_field, path, n)}
        for n, r in _read_jsonl(path)
    ]


def parse_final_answer(text: str) -> int:
    """The integer after the last ``####`` (thousands commas removed), as GSM8K writes it."""
    if ANSWER_MARK not in text:
        raise ValueError(f"no {ANSWER_MARK!r} final-answer line in {text[-80:]!r}")
    tail = text.rsplit(ANSWER_MARK, 1)[1].strip().replace(",", "")
    try:
        return int(tail)
    except ValueError:
        raise ValueError(f"final answer {tail!r} after {ANSWER_MARK!r} is not an integer") from None


def _example(question: str, response: str, answer: int) -> dict:
    return {"question": question, "prompt": format_prompt(question), "response": response, "answer": answer}


def load_gsm8k_jsonl(path: str | Path) -> list[dict]:
    """The published GSM8K JSONL (``question``/``answer`` fields) as SFT examples."""
    examples = []
    for n, r in _read_jsonl(path):
        question, response = _field(r, "question", path, n), _field(r, "answer", path, n)
        try:
            answer = parse_final_answer(response)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: {exc}") from None
        examples.append(_example(question, response, answer))
    return examples


# --- the synthetic `arithmetic` set ---------------------------------------------------------

NAMES = [
    ("Natalia", "she"), ("James", "he"), ("Aisha", "she"), ("Carlos", "he"), ("Mei", "she"),
    ("Tom", "he"), ("Priya", "she"), ("Liam", "he"), ("Sofia", "she"), ("Omar", "he"),
    ("Hannah", "she"), ("Kenji", "he"), ("Fatima", "she"), ("Lucas", "he"), ("Zoe", "she"),
    ("Ben", "he"),
]
OBJECTS = [
    "clips", "apples", "pencils", "stickers", "marbles", "cookies", "books", "cards",
    "shells", "stamps", "balloons", "eggs", "oranges", "candles",
]
Problem = tuple[str, list[str], int]  # question, solution lines with <<...>> steps, final answer
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August"]


def _calc(a: int, op: str, b: int) -> tuple[str, int]:
    """A GSM8K calculator annotation ``<<a op b=c>>c`` and c; only integer results exist here."""
    c = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    assert c >= 0 and (op != "/" or a == b * c), (a, op, b)
    return f"<<{a}{op}{b}={c}>>{c}", c


def _people(rng: random.Random) -> tuple[str, str, str]:
    (name, pron), (other, _) = rng.sample(NAMES, 2)
    return name, pron, other


def _t_add(rng: random.Random) -> Problem:
    n, p, _ = _people(rng)
    o, a, b = rng.choice(OBJECTS), rng.randint(2, 80), rng.randint(2, 80)
    s, c = _calc(a, "+", b)
    q = f"{n} has {a} {o}. {p.capitalize()} finds {b} more {o}. How many {o} does {n} have now?"
    return q, [f"{n} has {s} {o} now."], c


def _t_sub(rng: random.Random) -> Problem:
    n, p, m = _people(rng)
    o, a = rng.choice(OBJECTS), rng.randint(10, 99)
    b = rng.randint(1, a - 1)
    s, c = _calc(a, "-", b)
    q = f"{n} had {a} {o} and gave {b} of them to {m}. How many {o} does {n} have left?"
    return q, [f"{n} has {s} {o} left."], c


def _t_mul(rng: random.Random) -> Problem:
    n, p, _ = _people(rng)
    o, a, b = rng.choice(OBJECTS), rng.randint(2, 12), rng.randint(2, 12)
    s, c = _calc(a, "*", b)
    q = f"{n} buys {a} bags of {o}. Each bag holds {b} {o}. How many {o} does {n} buy?"
    return q, [f"{n} buys {s} {o}."], c


def _t_div(rng: random.Random) -> Problem:
    n, p, _ = _people(rng)
    o, b, k = rng.choice(OBJECTS), rng.randint(2, 9), rng.randint(2, 12)
    s, c = _calc(b * k, "/", b)
    q = f"{n} shares {b * k} {o} equally among {b} friends. How many {o} does each friend get?"
    return q, [f"Each friend gets {s} {o}."], c


def _t_half(rng: random.Random) -> Problem:  # the first GSM8K training problem, generalised
    n, p, _ = _people(rng)
    o, a = rng.choice(OBJECTS), 2 * rng.randint(3, 50)
    m1, m2 = rng.sample(MONTHS, 2)
    s1, h = _calc(a, "/", 2)
    s2, t = _calc(a, "+", h)
    q = f"{n} sold {a} {o} in {m1} and half as many in {m2}. How many {o} did {p} sell altogether?"
    return q, [f"In {m2} {p} sold {s1} {o}.", f"Altogether {p} sold {s2} {o}."], t


def _t_packs(rng: random.Random) -> Problem:
    n, p, m = _people(rng)
    o, a, b = rng.choice(OBJECTS), rng.randint(2, 9), rng.randint(3, 12)
    s1, x = _calc(a, "*", b)
    c = rng.randint(1, x - 1)
    s2, y = _calc(x, "-", c)
    q = (
        f"{n} buys {a} packs of {o} with {b} {o} in each pack and gives {c} {o} to {m}. "
        f"How many {o} does {n} have left?"
    )
    return q, [f"{n} buys {s1} {o}.", f"After giving {c} away, {p} has {s2} {o} left."], y


def _t_times(rng: random.Random) -> Problem:
    n, _, m = _people(rng)
    o, a, k = rng.choice(OBJECTS), rng.randint(2, 30), rng.randint(2, 5)
    s1, x = _calc(a, "*", k)
    s2, y = _calc(a, "+", x)
    q = f"{n} has {a} {o} and {m} has {k} times as many. How many {o} do they have together?"
    return q, [f"{m} has {s1} {o}.", f"Together they have {s2} {o}."], y


def _t_wage(rng: random.Random) -> Problem:
    n, p, _ = _people(rng)
    a, b, c = rng.randint(5, 20), rng.randint(2, 8), rng.randint(2, 6)
    s1, x = _calc(a, "*", b)
    s2, y = _calc(x, "*", c)
    d = rng.randint(1, y - 1)
    s3, z = _calc(y, "-", d)
    q = (
        f"{n} earns {a} dollars an hour and works {b} hours a day for {c} days. "
        f"Then {p} spends {d} dollars. How many dollars does {n} have left?"
    )
    steps = [f"{n} earns {s1} dollars a day.", f"In {c} days {p} earns {s2} dollars."]
    steps.append(f"After spending, {p} has {s3} dollars left.")
    return q, steps, z


def _t_shop(rng: random.Random) -> Problem:
    o, d, z = rng.choice(OBJECTS), rng.randint(2, 8), rng.randint(2, 15)
    b, c = rng.randint(1, 40), rng.randint(1, 40)
    a = b + c + d * z
    s1, x = _calc(b, "+", c)
    s2, y = _calc(a, "-", x)
    s3, w = _calc(y, "/", d)
    q = (
        f"A shop has {a} {o}. It sells {b} in the morning and {c} in the afternoon, then packs "
        f"the rest equally into {d} boxes. How many {o} are in each box?"
    )
    return q, [f"The shop sells {s1} {o}.", f"It has {s2} {o} left.", f"Each box gets {s3} {o}."], w


TEMPLATES: list[Callable[[random.Random], Problem]] = [
    _t_add, _t_sub, _t_mul, _t_div, _t_half, _t_packs, _t_times, _t_wage, _t_shop,
]


def arithmetic_split_of(question: str) -> str:
    """Which split a question belongs to: a fixed partition of all questions by hash, so
    train and test are disjoint by construction, whatever the seeds and sizes."""
    return "test" if stable_hash(question) % ARITHMETIC_TEST_BUCKETS == 0 else "train"


def arithmetic_dataset(split: str = "train", n: int = 1000, seed: int = 0) -> list[dict]:
    """`n` distinct GSM8K-style word problems (1-3 steps of + - * / with integer results)."""
    if split not in ARITHMETIC_SPLITS:
        raise ValueError(f"unknown arithmetic split {split!r}; use one of {', '.join(ARITHMETIC_SPLITS)}")
    if n < 1:
        raise ValueError(f"n must be a positive number of examples, got {n}")
    rng = random.Random(seed)  # Mersenne Twister: the same stream for a seed on every platform
    seen: set[str] = set()
    examples = []
    for _ in range(50 * n + 1000):
        question, steps, answer = rng.choice(TEMPLATES)(rng)
        if question in seen or arithmetic_split_of(question) != split:
            continue
        seen.add(question)
        response = "\n".join(steps + [f"{ANSWER_MARK} {answer}"])
        examples.append(_example(question, response, answer))
        if len(examples) == n:
            return examples
    raise ValueError(f"could not draw {n} distinct {split} problems; ask for fewer examples")


# --- tokenisation ---------------------------------------------------------------------------


def tokenize_sft(examples: Sequence[dict], tokenizer, seq_len: int) -> dict[str, torch.Tensor]:
    """Rows ``prompt + response + EOS padding`` of exactly `seq_len` tokens.

    Returns ``input_ids [N, seq_len]`` long, ``prompt_mask [N, seq_len]`` bool (True on
    prompt positions: never masked, never in the loss), ``prompt_length [N]`` and
    ``response_length [N]`` (the response's own tokens, before padding). LLaDA's SFT
    normaliser, the answer length *including* the EOS padding, is ``(~prompt_mask).sum(-1)``.
    A response that does not fit is cut (with a warning); a prompt that fills the row is an error.
    """
    if not examples:
        raise ValueError("tokenize_sft got no examples")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no eos token, which pads SFT responses; set eos_token")
    prompts = encode_texts(tokenizer, [e["prompt"] for e in examples])
    responses = encode_texts(tokenizer, [e["response"] for e in examples])
    # LLaDA pads SFT rows with EOS and trains on the padding (it is response, not prompt): the
    # model learns to emit EOS after the answer, which is how generation ends early.
    input_ids = torch.full((len(examples), seq_len), eos, dtype=torch.long)
    prompt_mask = torch.zeros(len(examples), seq_len, dtype=torch.bool)
    prompt_length = torch.zeros(len(examples), dtype=torch.long)
    response_length = torch.zeros(len(examples), dtype=torch.long)
    cut = 0
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if len(p) >= seq_len:
            raise ValueError(
                f"example {i}: the prompt alone is {len(p)} tokens, leaving no room for a response in "
                f"seq_len={seq_len}; raise seq_len or shorten the prompt"
            )
        r = r[: seq_len - len(p)]
        cut += len(p) + len(responses[i]) > seq_len
        input_ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        input_ids[i, len(p) : len(p) + len(r)] = torch.tensor(r, dtype=torch.long)
        prompt_mask[i, : len(p)] = True
        prompt_length[i], response_length[i] = len(p), len(r)
    if cut:
        warnings.warn(
            f"{cut} of {len(examples)} responses were cut to fit seq_len={seq_len}; raise --seq-len to keep them whole",
            stacklevel=2,
        )
    return {
        "input_ids": input_ids,  # [N, seq_len]
        "prompt_mask": prompt_mask,  # [N, seq_len]
        "prompt_length": prompt_length,  # [N]
        "response_length": response_length,  # [N]
    }
