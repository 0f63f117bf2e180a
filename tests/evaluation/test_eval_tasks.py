"""Offline tasks without a network: deterministic items from held-out text only, a hand-made perfect
predictor scores 100 %, a random one scores chance (within 4 binomial standard errors)."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from sinkdlm.data import load_documents
from sinkdlm.evaluation import TASKS, GenRequest, get_task, resolve_tasks
from sinkdlm.evaluation.tasks import WORD, case_class

CHANCE = {"shakespeare_cloze": {"acc": 1 / 5, "exact_match": 0.0},
          "shakespeare_next_line": {"acc": 1 / 4, "acc_norm": 1 / 4},
          "shakespeare_word_order": {"acc": 1 / 2},
          "arithmetic": {"exact_match": 0.0}}


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.fixture(scope="module")
def heldout() -> str:
    return squash("\n".join(load_documents("shakespeare", "validation")))


class Oracle:
    """Knows every answer: log-likelihood 0 for the true candidate, -5 otherwise; generates the truth."""

    def __init__(self, items):
        self.true = {(it.context, it.choices[it.label]) for it in items if hasattr(it, "choices")}
        self.words = {it.context: " " + it.target for it in items if hasattr(it, "choices")}
        self.solutions = {it.prompt: it.response for it in items if hasattr(it, "prompt")}

    def loglikelihood(self, requests, *, desc=""):
        return [0.0 if r in self.true else -5.0 for r in requests]

    def generate(self, requests, *, desc=""):
        assert all(isinstance(r, GenRequest) for r in requests)
        return [self.words[r.context] if r.length_of is not None else self.solutions[r.context] for r in requests]


class Random:
    """Uniform log-likelihoods and made-up answers."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)

    def loglikelihood(self, requests, *, desc=""):
        return [-self.rng.uniform(1, 50) for _ in requests]

    def generate(self, requests, *, desc=""):
        return [
            f" word{self.rng.randint(0, 9)}" if r.length_of else f"#### {self.rng.randint(0, 999)}" for r in requests
        ]


@pytest.mark.parametrize(
    "name,limit",
    [("shakespeare_cloze", 200), ("shakespeare_next_line", 200), ("shakespeare_word_order", 200), ("arithmetic", 100)],
)
def test_perfect_predictor_scores_100_percent(name, limit):
    task = get_task(name)
    scores = task.evaluate(Oracle(task.items(limit, seed=1)), limit=limit, seed=1)
    assert set(scores) == set(task.metrics)
    for metric, s in scores.items():
        assert {k: s[k] for k in ("value", "stderr", "n")} == {"value": 1.0, "stderr": 0.0, "n": limit}, (metric, s)
        assert s["per_item"] == [1.0] * limit and len(s["items"]) == 16
    # the item digest changes with the item set (what a paired comparison checks)
    other = task.evaluate(Oracle(task.items(limit, seed=2)), limit=limit, seed=2)
    assert all(other[m]["items"] != scores[m]["items"] for m in scores)


@pytest.mark.parametrize("name", ["shakespeare_cloze", "shakespeare_next_line", "shakespeare_word_order", "arithmetic"])
def test_random_predictor_scores_chance(name):
    task = get_task(name)
    scores = task.evaluate(Random(7), limit=None, seed=0)
    for metric, s in scores.items():
        p = CHANCE[name][metric]
        n = s["n"]
        assert n >= 500
        tol = 4 * math.sqrt(max(p * (1 - p), 0.25 / n) / n)
        assert abs(s["value"] - p) <= tol, (metric, s, p)
        assert s["stderr"] == pytest.approx(math.sqrt(s["value"] * (1 - s["value"]) / n))


def test_gsm8k_jsonl_in_the_published_format(tmp_path):
    rows = [
        {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
                     "in May. How many clips did Natalia sell altogether in April and May?",
         "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
                   "clips altogether in April and May.\n#### 72"},
        {"question": "A house costs $1,200 more than a car that costs $300. What does the house cost?",
         "answer": "The house costs 1,200 + 300 = <<1200+300=1500>>1500 dollars.\n#### 1,500"},
        {"question": "It was 3 degrees and fell by 8. What is the temperature?", "answer": "3-8=<<3-8=-5>>-5\n#### -5"},
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(f"gsm8k:{path}")
    items = task.items()
    assert [it.answer for it in items] == [72, 1500, -5] and items[0].prompt.startswith("Natalia sold clips")
    got = task.evaluate(Oracle(items))["exact_match"]
    assert {k: got[k] for k in ("value", "stderr", "n")} == {"value": 1.0, "stderr": 0.0, "n": 3} and got["per_item"] == [1.0] * 3
    assert task.evaluate(Oracle(items), limit=2)["exact_match"]["n"] == 2

    class Paraphrase(Oracle):  # the right numbers in other spellings
        def generate(self, requests, *, desc=""):
            return ["... so 72.0 clips.\n#### 72.0 clips", "#### $1,500", "#### -5 degrees"]

    assert task.evaluate(Paraphrase(items))["exact_match"]["value"] == 1.0
    with pytest.raises(ValueError, match="does not exist"):
        get_task(f"gsm8k:{tmp_path / 'missing.jsonl'}")


def test_items_are_deterministic_and_a_larger_limit_extends_a_smaller_one():
    for name in ("shakespeare_cloze", "shakespeare_next_line", "shakespeare_word_order", "arithmetic"):
        task = get_task(name)
        a, b = task.items(30, seed=3), task.items(30, seed=3)
        assert a == b
        assert task.items(60, seed=3)[:30] == a
        assert task.items(30, seed=4) != a


def test_cloze_items_come_from_held_out_text_with_matched_distractors(heldout):
    items = get_task("shakespeare_cloze").items(150, seed=0)
    vocab = set(WORD.findall(heldout))
    for it in items:
        assert squash(it.context + " " + it.target) in heldout
        assert it.choices[it.label] == " " + it.target
        assert len(set(it.choices)) == len(it.choices) == 5
        words = [c[1:] for c in it.choices]
        assert len({w.lower() for w in words}) == 5  # no distractor is the target in another case
        assert all(w in vocab and case_class(w) == case_class(it.target) for w in words)
        assert len(WORD.findall(it.context)) >= 49


def test_next_line_items_come_from_held_out_text_with_distractors_from_elsewhere(heldout):
    items = get_task("shakespeare_next_line").items(150, seed=0)
    labels = [it.label for it in items]
    assert set(labels) == {0, 1, 2, 3}
    for it in items:
        assert squash(it.context + "\n" + it.target) in heldout
        assert it.choices[it.label] == "\n" + it.target
        assert len(set(it.choices)) == 4
        n = len(WORD.findall(it.target))
        for c in it.choices:
            assert squash(c) in heldout
            assert abs(len(WORD.findall(c)) - n) <= max(1, round(0.2 * n)) * 2
            if c != "\n" + it.target:
                assert squash(c) not in squash(it.context)[-2000:]  # not a nearby line


def test_word_order_pairs_are_a_held_out_line_and_the_same_characters_in_another_word_order(heldout):
    items = get_task("shakespeare_word_order").items(300, seed=0)
    labels = [it.label for it in items]
    assert 0.4 < sum(labels) / len(labels) < 0.6  # the true line is first or second about equally often
    for it in items:
        assert squash(it.context + "\n" + it.target) in heldout
        assert len(WORD.findall(it.context)) >= 8 and len(it.target.split()) >= 6
        true, other = it.choices[it.label], it.choices[1 - it.label]
        assert true == "\n" + it.target and other != true
        # the same words (punctuation attached), so length and word frequency say nothing
        assert sorted(other.split()) == sorted(true.split()) and len(other) == len(true)


def test_task_names_are_checked():
    assert set(TASKS) == {"shakespeare_cloze", "shakespeare_next_line", "shakespeare_word_order", "arithmetic"}
    with pytest.raises(ValueError, match="unknown task 'lambada'.*: shakespeare_cloze, shakespeare_next_line, shakespeare_word_order, arithm"):
        resolve_tasks(["shakespeare_cloze", "lambada"])
    with pytest.raises(ValueError, match="listed twice"):
        resolve_tasks("arithmetic,arithmetic")
    with pytest.raises(ValueError, match="no task"):
        resolve_tasks(" , ")
    with pytest.raises(ValueError, match="needs a path"):
        get_task("gsm8k:")
    with pytest.raises(ValueError, match="limit"):
        get_task("arithmetic").items(0)
