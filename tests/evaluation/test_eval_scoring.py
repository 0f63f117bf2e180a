"""Scoring: GSM8K answer extraction on the published format, exact numeric match, accuracies with the
binomial standard error, and lm-eval's acc / acc_norm decisions (recomputed here by hand)."""

from __future__ import annotations

import math

import pytest

from sinkdlm.evaluation.scoring import (
    answer_matches,
    argmax,
    binomial_stderr,
    choice_outcomes,
    extract_answer,
    normalize_gold,
    parse_number,
    score,
)

# The first GSM8K training answer, verbatim (calculator annotations and the #### line).
NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    "text,want",
    [
        (NATALIA, "72"),
        ("He pays 1,200 + 300 = <<1200+300=1500>>1500\n#### 1,500", "1500"),  # thousands commas
        ("so the total is\n#### 1,234,567", "1234567"),
        ("The temperature drops 3 - 8 = -5 degrees.\n#### -5", "-5"),  # negative
        ("#### 72.0", "72"),  # a decimal spelling of an integer
        ("#### 3.50", "3.5"),
        ("#### 72 clips in total.", "72"),  # trailing text
        ("#### $1,000", "1000"),  # dollar sign
        ("#### -$5", "-5"),
        ("#### $-5", "-5"),
        ("####72", "72"),  # no space
        ("#### 12\nJames has 12 apples.\n#### 40", "12"),  # the first committed answer
        ("She has 5 apples and buys 7 more, so 12 apples.", "12"),  # no ####: the last number
        ("It costs $2,500.75 in all", "2500.75"),
        ("5-3=2", "2"),  # a minus between numbers is not a sign
        ("#### none\nso the answer is 9", "9"),  # #### without a number: fall back to the last number
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer_handles_the_gsm8k_format(text, want):
    assert extract_answer(text) == want


def test_answer_matches_compares_numbers():
    assert answer_matches(NATALIA, 72)
    assert answer_matches("#### 72.00 clips", 72)
    assert answer_matches("The answer is $1,500.", "#### 1,500")
    assert answer_matches("#### -5", -5)
    assert not answer_matches("#### 73", 72)
    assert not answer_matches("#### 72", -72)
    assert not answer_matches("I do not know", 72)
    assert normalize_gold(2.5) == "2.5" and normalize_gold("#### 1,000") == "1000" and parse_number("x") is None
    with pytest.raises(ValueError, match="no number"):
        normalize_gold("none")


def test_score_is_the_mean_with_binomial_stderr():
    outcomes = [True] * 30 + [False] * 70
    s = score(outcomes)
    assert s == {"value": 0.3, "stderr": pytest.approx(math.sqrt(0.3 * 0.7 / 100)), "n": 100,
                 "per_item": [1.0] * 30 + [0.0] * 70, "items": None}
    assert score([1, 1, 1], "abc") == {"value": 1.0, "stderr": 0.0, "n": 3, "per_item": [1.0] * 3, "items": "abc"}
    assert math.isnan(score([])["value"]) and score([])["n"] == 0
    assert binomial_stderr(0.5, 4) == pytest.approx(0.25)


def test_choice_outcomes_follow_lm_eval_acc_and_acc_norm():
    choices = [(" a", " bbbbbbbbbb"), (" xx", " y", " zzzz")]
    lls = [[-2.0, -5.0], [-9.0, -3.0, -4.0]]
    labels = [1, 2]
    out = choice_outcomes(lls, labels, choices)
    # acc: argmax ll -> item 0 picks 0 (wrong), item 1 picks 1 (wrong).
    # acc_norm: ll / len(choice) -> item 0: -1.0 vs -0.45 -> 1 (right); item 1: -3, -1.5, -0.8 -> 2 (right).
    assert out == {"acc": [False, False], "acc_norm": [True, True]}
    assert argmax([1.0, 3.0, 3.0]) == 1  # ties: the first, as numpy
    with pytest.raises(ValueError, match="candidates"):
        choice_outcomes([[0.0]], [0], [(" a", " b")])
