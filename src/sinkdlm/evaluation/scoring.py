"""Scoring: accuracies with their binomial standard errors, multiple-choice decisions from candidate
log-likelihoods, and GSM8K-style answer extraction.

Everything here is pure Python on numbers and strings, so any predictor — a DLM, a hand-made
perfect or random stand-in — is scored by the same code.

Standard error of an accuracy p over n items: the binomial `sqrt(p (1 - p) / n)` (the items are the
sample; the Monte-Carlo noise of each ELBO is inside the per-item outcomes).

GSM8K answers (`extract_answer`): the number after the first `####` (GSM8K's final-answer mark;
what follows the first committed answer is ignored, like lm-eval's "strict-match"), else the last
number in the text (lm-eval's "flexible-extract"). Numbers may carry thousands commas (`1,234`),
a sign (`-5`, `$-5`, `-$5`), a `$`, decimals (`72.0` equals `72`) and trailing text (`#### 72 apples`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

from sinkdlm.data.sft import ANSWER_MARK

# A sign only when it does not follow a word character: "5-3" is five and three, not 5 and -3.
_NUMBER = re.compile(
    r"(?:(?<![\w.])(?P<sign>[-\u2212]))?\s?\$?\s?(?P<sign2>[-\u2212])?"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
)


# ----------------------------------------------------------------------------- accuracies
def binomial_stderr(p: float, n: int) -> float:
    """`sqrt(p (1 - p) / n)`, the standard error of an accuracy over n independent items."""
    if n <= 0:
        return float("nan")
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)


def score(values: Sequence[float | bool], items: str | None = None) -> dict:
    """Mean of per-item outcomes (1/0) -> `{"value", "stderr", "n", "per_item", "items"}` with the
    binomial stderr. `per_item` keeps every outcome so that two models scored on the same items can
    be compared item by item (`sinkdlm.stats.paired_accuracy_difference`); `items` is a digest of
    the item set (`items_digest`) that such a comparison checks first."""
    n = len(values)
    if n == 0:
        return {"value": float("nan"), "stderr": float("nan"), "n": 0, "per_item": [], "items": items}
    outcomes = [float(v) for v in values]
    p = sum(outcomes) / n
    return {"value": p, "stderr": binomial_stderr(p, n), "n": n, "per_item": outcomes, "items": items}


def items_digest(keys: Sequence) -> str:
    """A short, stable fingerprint of an ordered item set (e.g. the items' sources or questions)."""
    return hashlib.sha1(repr(list(keys)).encode()).hexdigest()[:16]


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties (as `numpy.argmax`)."""
    if not values:
        raise ValueError("argmax of an empty sequence")
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def choice_outcomes(
    loglikelihoods: Sequence[Sequence[float]], labels: Sequence[int], choices: Sequence[Sequence[str]]
) -> dict[str, list[bool]]:
    """Per-item correctness of the multiple-choice decisions lm-eval makes.

    acc       argmax of the candidates' log-likelihoods;
    acc_norm  argmax of log-likelihood per character of the candidate text (lm-eval's `acc_norm`,
              which divides by `len(choice)`), so long candidates are not penalised for length.
    """
    if not (len(loglikelihoods) == len(labels) == len(choices)):
        raise ValueError(
            f"got {len(loglikelihoods)} log-likelihood lists, {len(labels)} labels and {len(choices)} choice lists"
        )
    acc, acc_norm = [], []
    for lls, label, cands in zip(loglikelihoods, labels, choices):
        if len(lls) != len(cands):
            raise ValueError(f"{len(lls)} log-likelihoods for {len(cands)} candidates")
        acc.append(argmax(lls) == label)
        acc_norm.append(argmax([ll / max(len(c), 1) for ll, c in zip(lls, cands)]) == label)
    return {"acc": acc, "acc_norm": acc_norm}


# ----------------------------------------------------------------------------- numbers
def _to_decimal(m: re.Match) -> Decimal:
    negative = bool(m.group("sign")) != bool(m.group("sign2"))  # "--5" is not a thing; "-$5" is
    text = m.group("int").replace(",", "") + (m.group("frac") or "")
    value = Decimal(text)
    return -value if negative else value


def canonical_number(value: Decimal) -> str:
    """`Decimal('72.0') -> '72'`, `Decimal('3.50') -> '3.5'`, `-0 -> '0'`: one spelling per number."""
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def parse_number(text: str) -> str | None:
    """The first number in `text` in canonical form (`"$1,234.50 left" -> "1234.5"`), or None."""
    m = _NUMBER.search(text)
    return canonical_number(_to_decimal(m)) if m else None


def extract_answer(text: str) -> str | None:
    """A GSM8K-style final answer in canonical form (see the module docstring), or None if the text
    holds no number at all."""
    if ANSWER_MARK in text:
        after = parse_number(text.split(ANSWER_MARK, 1)[1])
        if after is not None:
            return after
    matches = list(_NUMBER.finditer(text))
    return canonical_number(_to_decimal(matches[-1])) if matches else None


def normalize_gold(answer: int | float | str) -> str:
    """A reference answer (int from `arithmetic_dataset`, or a GSM8K answer string) in canonical form."""
    if isinstance(answer, bool):
        raise ValueError(f"a reference answer must be a number, got {answer!r}")
    if isinstance(answer, int):
        return str(answer)
    if isinstance(answer, float):
        return canonical_number(Decimal(repr(answer)))
    got = extract_answer(str(answer))
    if got is None:
        raise ValueError(f"reference answer {answer!r} holds no number")
    return got


def answer_matches(generation: str, gold: int | float | str) -> bool:
    """Exact match of the extracted answer with the reference, as numbers (`72.0` == `72`)."""
    pred = extract_answer(generation)
    if pred is None:
        return False
    try:
        return Decimal(pred) == Decimal(normalize_gold(gold))
    except InvalidOperation:  # pragma: no cover - both sides are canonical numbers
        return False
