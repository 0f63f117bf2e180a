"""Offline evaluation tasks: built from held-out data only, deterministic for a seed, no download.

  shakespeare_cloze      LAMBADA-style. A passage of >= 50 words of the held-out works (the fewest
                         whole lines, so speaker names and verse breaks stay) whose last line ends in a
                         word followed by . ! ? ; or : (a sentence or clause end, not a prose wrap);
                         the model sees the passage without that word and the punctuation after it.
                         metrics: `exact_match` — greedy generation of exactly as many tokens as the
                         true word's tokenisation (with its leading space) after the passage, decoded
                         and stripped, equals the word; `acc` — the true word has the highest ELBO
                         among it and `CLOZE_DISTRACTORS` distractor words (chance 1/5).
  shakespeare_next_line  HellaSwag-style. >= 30 words of context (whole lines); choose the true next
                         line among 4 (3 distractor lines from other places of the held-out text, of
                         about the same word count, so length alone does not give it away).
                         metrics: `acc`, `acc_norm` (ELBO per character, lm-eval's acc_norm); chance 1/4.
  shakespeare_word_order BLiMP-style minimal pairs. After the line(s) before it (>= 8 words), choose a line of
                         >= 6 words over the same line with its words (and the punctuation attached to
                         them) in a random other order: the same characters, so neither length nor word
                         frequency tells them apart, only word order. metric: `acc`; chance 1/2. The
                         easiest task here: a model that has learned any local order passes it, so it
                         shows a small model leaving the unigram plateau before the other tasks can.
  arithmetic             GSM8K-style word problems of the `arithmetic` test split (disjoint from the SFT
                         training split); greedy generation (`ARITHMETIC_GEN_TOKENS` tokens in blocks of
                         `GEN_BLOCK_LENGTH`), the answer after `####`, exact numeric match. metric: `exact_match`.
  gsm8k:PATH             the same on a local GSM8K JSONL (`question`/`answer`), e.g. the published test.jsonl.

Held-out data: the shakespeare validation works (`load_documents("shakespeare", "validation")`), never
trained on; items never share text. 713 cloze, 1095 next-line and 2121 word-order items in all.

Determinism: the item list is the shuffled list of all candidate items (the shuffle seeded by the task
name and `seed`), cut at `limit` — a larger limit extends a smaller one. Each item's distractors and
candidate order come from a generator seeded by the task, `seed` and the item's place in the text,
so they do not depend on `limit` either.

Why distractors are drawn as they are: cloze distractors have the same capitalisation pattern as the
true word and sit next to it in the frequency ranking of the held-out vocabulary (±`RANK_WINDOW`
ranks), so neither case nor word frequency alone tells them apart.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sinkdlm.data import arithmetic_dataset, load_documents, load_gsm8k_jsonl
from sinkdlm.evaluation.predictor import GenRequest, Predictor
from sinkdlm.evaluation.scoring import answer_matches, choice_outcomes, items_digest, score
from sinkdlm.config.checks import check_optional_int
from sinkdlm.config.commands import GEN_BLOCK_LENGTH  # semi-autoregressive blocks for generated answers

CLOZE_MIN_WORDS = 50
CLOZE_DISTRACTORS = 4
CLOZE_MC_NUM = 4  # one-word candidates: at most this many ELBO samples (1 for a one-token word: exact)
RANK_WINDOW = 50
NEXT_LINE_MIN_WORDS = 30
NEXT_LINE_CHOICES = 4
MIN_LINE_WORDS = 4
WORD_ORDER_CONTEXT_WORDS = 8
WORD_ORDER_MIN_WORDS = 6
FAR_LINES = 50  # a distractor line lies at least this many lines away from the item (or in another work)
ARITHMETIC_DEFAULT_N = 500  # items when no limit is given
ARITHMETIC_GEN_TOKENS = 128
GSM8K_GEN_TOKENS = 256
GSM8K_PREFIX = "gsm8k:"

WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
# A line ending in a word and then a sentence or clause end (. ! ? ; :, maybe quotes/brackets):
# (everything before the word, the word). A bare line end is not enough: prose is wrapped mid-sentence.
LAST_WORD = re.compile(r"^(.*\S)\s+([A-Za-z]+(?:'[A-Za-z]+)*)['\")\]]*[.!?;:][^\w\s]*$")


# ----------------------------------------------------------------------------- items
@dataclass(frozen=True)
class ChoiceItem:
    """Pick `choices[label]` after `context`. `target` is the true answer's bare text; `source` is
    (work index, line index) of the answer in the held-out text."""

    context: str
    choices: tuple[str, ...]
    label: int
    target: str
    source: tuple[int, int]


@dataclass(frozen=True)
class AnswerItem:
    """A word problem: the model continues `prompt`; `answer` is the reference final answer."""

    question: str
    prompt: str
    answer: int | str
    response: str  # the reference solution (a perfect predictor's output)


# ----------------------------------------------------------------------------- held-out text
@lru_cache(maxsize=1)
def _heldout_lines() -> tuple[tuple[str, ...], ...]:
    """Lines (right-stripped) of each held-out work, in the corpus's work order."""
    docs = load_documents("shakespeare", "validation")
    return tuple(tuple(line.rstrip() for line in doc.splitlines()) for doc in docs)


def is_content_line(line: str) -> bool:
    """A line of speech or verse: >= 4 words, not a speaker heading ("ANGELO."), act/scene title
    or stage direction ("[Exit.]")."""
    text = line.strip()
    if not text or text.startswith("[") or text.upper().startswith(("ACT ", "SCENE ")):
        return False
    letters = [c for c in text if c.isalpha()]
    if sum(c.isupper() for c in letters) > 0.5 * len(letters):
        return False
    return len(WORD.findall(text)) >= MIN_LINE_WORDS


def _whole_content_line(line: str) -> tuple[str, str] | None:
    """The next-line task's ending: a content line, all of it the answer."""
    return ("", line.strip()) if is_content_line(line) else None


def _join(lines) -> str:
    return "\n".join(lines).strip("\n")


@lru_cache(maxsize=8)  # per (task rule): an experiment scores every run on the same items
def _passages(min_words: int, ending) -> tuple[tuple[int, int, str, str], ...]:
    """Non-overlapping (work, line, context, answer) in text order. `ending(line)` says whether a line
    can end an item: None, or (the part of the line that stays in the context, the answer). The
    context is the fewest whole lines before it (after the previous item) that hold >= `min_words`
    words together with that part, so contexts stay short and items never share text."""
    out = []
    for w, lines in enumerate(_heldout_lines()):
        counts = [len(WORD.findall(line)) for line in lines]
        start = 0
        for i, line in enumerate(lines):
            end = ending(line)
            if end is None:
                continue
            head, answer = end
            need = min_words - len(WORD.findall(head))
            total = sum(counts[start:i])
            if total < need:
                continue
            first = start
            while first < i and total - counts[first] >= need:  # drop leading lines not needed
                total -= counts[first]
                first += 1
            out.append((w, i, _join([*lines[first:i], head] if head else lines[first:i]), answer))
            start = i + 1
    return tuple(out)


def case_class(word: str) -> str:
    if word.islower():
        return "lower"
    if word.isupper():
        return "upper"
    if word[0].isupper() and (len(word) == 1 or word[1:].islower()):
        return "title"
    return "mixed"


@lru_cache(maxsize=1)
def _vocabulary() -> dict[str, list[str]]:
    """Held-out word forms per capitalisation class, most frequent first (ties alphabetical)."""
    counts = Counter(w for work in _heldout_lines() for line in work for w in WORD.findall(line))
    by_class: dict[str, list[str]] = defaultdict(list)
    for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        by_class[case_class(w)].append(w)
    return dict(by_class)


def _item_rng(task: str, seed: int, source: tuple[int, int]) -> random.Random:
    # str seeds hash with SHA-512 (random's version 2): identical in every process and platform.
    return random.Random(f"{task}/{seed}/{source[0]}/{source[1]}")


def _pick(candidates: list, k: int, rng: random.Random, task: str) -> list:
    if len(candidates) < k:
        raise ValueError(f"{task}: {len(candidates)} candidates for {k} distractors; the held-out text is too small")
    return rng.sample(candidates, k)


def _shuffled_choices(true: str, distractors: list[str], rng: random.Random) -> tuple[tuple[str, ...], int]:
    choices = [true, *distractors]
    rng.shuffle(choices)
    return tuple(choices), choices.index(true)


def _first(candidates: list, limit: int | None, task: str, seed: int) -> list:
    order = list(candidates)
    random.Random(f"{task}/{seed}").shuffle(order)
    return order if limit is None else order[:limit]


# ----------------------------------------------------------------------------- tasks
class Task:
    """A named task: deterministic `items(limit, seed)` and `evaluate(predictor, ...)` -> metrics."""

    name: str = ""
    metrics: tuple[str, ...] = ()
    max_mc_num: int | None = None  # cap on ELBO samples per candidate (None: the caller's mc_num)
    chance: dict[str, float] = {}  # metric -> accuracy of a uniform random guess (choice metrics)

    def items(self, limit: int | None = None, seed: int = 0) -> list:
        raise NotImplementedError

    def evaluate(self, predictor: Predictor, limit: int | None = None, seed: int = 0) -> dict[str, dict]:
        raise NotImplementedError


class ShakespeareCloze(Task):
    name = "shakespeare_cloze"
    metrics = ("exact_match", "acc")
    max_mc_num = CLOZE_MC_NUM
    chance = {"acc": 1 / (1 + CLOZE_DISTRACTORS)}

    @staticmethod
    def _ending(line: str) -> tuple[str, str] | None:
        m = LAST_WORD.match(line.strip()) if is_content_line(line) else None
        return (m.group(1), m.group(2)) if m and len(m.group(2)) >= 2 else None

    def _positions(self) -> tuple[tuple[int, int, str, str], ...]:
        return _passages(CLOZE_MIN_WORDS, self._ending)

    def items(self, limit: int | None = None, seed: int = 0) -> list[ChoiceItem]:
        check_optional_int("limit", limit, 1, none_means="all items")
        vocab = _vocabulary()
        rank = {w: r for words in vocab.values() for r, w in enumerate(words)}
        items = []
        for w, i, context, word in _first(self._positions(), limit, self.name, seed):
            rng = _item_rng(self.name, seed, (w, i))
            same = vocab[case_class(word)]
            r = rank[word]
            window = RANK_WINDOW
            while True:  # widen the rank window until it holds enough other words
                near = [x for x in same[max(0, r - window): r + window + 1] if x.lower() != word.lower()]
                if len(near) >= CLOZE_DISTRACTORS or window > len(same):
                    break
                window *= 2
            distractors = _pick(near, CLOZE_DISTRACTORS, rng, self.name)
            choices, label = _shuffled_choices(" " + word, [" " + d for d in distractors], rng)
            items.append(ChoiceItem(context, choices, label, word, (w, i)))
        return items

    def evaluate(self, predictor: Predictor, limit: int | None = None, seed: int = 0) -> dict[str, dict]:
        items = self.items(limit, seed)
        lls = predictor.loglikelihood([(it.context, c) for it in items for c in it.choices], desc=f"{self.name} ELBO")
        gens = predictor.generate(
            [GenRequest(it.context, length_of=" " + it.target) for it in items], desc=f"{self.name} greedy"
        )
        return self.score(items, lls, gens)

    @staticmethod
    def score(items: list[ChoiceItem], loglikelihoods: list[float], generations: list[str]) -> dict[str, dict]:
        """`loglikelihoods`: flat, candidates of item 0 then item 1 ...; `generations`: one per item."""
        per_item = _split(loglikelihoods, [len(it.choices) for it in items])
        acc = choice_outcomes(per_item, [it.label for it in items], [it.choices for it in items])["acc"]
        em = [g.strip() == it.target for g, it in zip(generations, items, strict=True)]
        key = items_digest([it.source for it in items])
        return {"exact_match": score(em, key), "acc": score(acc, key)}


class LineChoiceTask(Task):
    """Choose the true line among `ChoiceItem.choices` by ELBO; scores every metric of `metrics`
    that `choice_outcomes` computes (`acc`, `acc_norm`)."""

    def evaluate(self, predictor: Predictor, limit: int | None = None, seed: int = 0) -> dict[str, dict]:
        items = self.items(limit, seed)
        lls = predictor.loglikelihood([(it.context, c) for it in items for c in it.choices], desc=f"{self.name} ELBO")
        return self.score(items, lls)

    @classmethod
    def score(cls, items: list[ChoiceItem], loglikelihoods: list[float]) -> dict[str, dict]:
        per_item = _split(loglikelihoods, [len(it.choices) for it in items])
        out = choice_outcomes(per_item, [it.label for it in items], [it.choices for it in items])
        key = items_digest([it.source for it in items])
        return {m: score(out[m], key) for m in cls.metrics}


class ShakespeareNextLine(LineChoiceTask):
    name = "shakespeare_next_line"
    metrics = ("acc", "acc_norm")
    chance = {"acc": 1 / NEXT_LINE_CHOICES, "acc_norm": 1 / NEXT_LINE_CHOICES}

    @staticmethod
    def _pool() -> tuple[list[tuple[int, int, str]], dict[int, list[int]]]:
        """All content lines (work, line, text) and their indices by word count."""
        pool = [
            (w, i, line.strip())
            for w, lines in enumerate(_heldout_lines())
            for i, line in enumerate(lines)
            if is_content_line(line)
        ]
        by_len: dict[int, list[int]] = defaultdict(list)
        for k, (_, _, text) in enumerate(pool):
            by_len[len(WORD.findall(text))].append(k)
        return pool, by_len

    def _positions(self) -> tuple[tuple[int, int, str, str], ...]:
        return _passages(NEXT_LINE_MIN_WORDS, _whole_content_line)

    def items(self, limit: int | None = None, seed: int = 0) -> list[ChoiceItem]:
        check_optional_int("limit", limit, 1, none_means="all items")
        pool, by_len = self._pool()
        items = []
        for w, i, context, line in _first(self._positions(), limit, self.name, seed):
            rng = _item_rng(self.name, seed, (w, i))
            n = len(WORD.findall(line))
            tol = max(1, round(0.2 * n))
            while True:  # lines of about the same length, far from this one, not equal to it
                near = [
                    pool[k][2]
                    for m in range(n - tol, n + tol + 1)
                    for k in by_len.get(m, ())
                    if (pool[k][0] != w or abs(pool[k][1] - i) >= FAR_LINES) and pool[k][2] != line
                ]
                near = sorted(set(near))
                if len(near) >= NEXT_LINE_CHOICES - 1 or tol > 20:
                    break
                tol *= 2
            distractors = _pick(near, NEXT_LINE_CHOICES - 1, rng, self.name)
            choices, label = _shuffled_choices("\n" + line, ["\n" + d for d in distractors], rng)
            items.append(ChoiceItem(context, choices, label, line, (w, i)))
        return items


class ShakespeareWordOrder(LineChoiceTask):
    name = "shakespeare_word_order"
    metrics = ("acc",)
    chance = {"acc": 0.5}

    @staticmethod
    def _ending(line: str) -> tuple[str, str] | None:
        ok = is_content_line(line) and len(line.split()) >= WORD_ORDER_MIN_WORDS
        return ("", line.strip()) if ok else None

    def _positions(self) -> tuple[tuple[int, int, str, str], ...]:
        return _passages(WORD_ORDER_CONTEXT_WORDS, self._ending)

    def items(self, limit: int | None = None, seed: int = 0) -> list[ChoiceItem]:
        check_optional_int("limit", limit, 1, none_means="all items")
        items = []
        for w, i, context, line in _first(self._positions(), limit, self.name, seed):
            rng = _item_rng(self.name, seed, (w, i))
            words = line.split()
            shuffled = line
            while shuffled == line:  # >= 6 words, not all equal (content lines): ends quickly
                rng.shuffle(words)
                shuffled = " ".join(words)
            choices, label = _shuffled_choices("\n" + line, ["\n" + shuffled], rng)
            items.append(ChoiceItem(context, choices, label, line, (w, i)))
        return items


class AnswerTask(Task):
    """Generation + the final answer after `####`, exact match (GSM8K-style)."""

    metrics = ("exact_match",)
    gen_tokens = ARITHMETIC_GEN_TOKENS

    def examples(self, limit: int | None, seed: int) -> list[dict]:
        raise NotImplementedError

    def items(self, limit: int | None = None, seed: int = 0) -> list[AnswerItem]:
        check_optional_int("limit", limit, 1, none_means="all items")
        return [AnswerItem(e["question"], e["prompt"], e["answer"], e["response"]) for e in self.examples(limit, seed)]

    def evaluate(self, predictor: Predictor, limit: int | None = None, seed: int = 0) -> dict[str, dict]:
        items = self.items(limit, seed)
        requests = [GenRequest(it.prompt, max_tokens=self.gen_tokens, block_length=GEN_BLOCK_LENGTH) for it in items]
        return self.score(items, predictor.generate(requests, desc=self.name))

    @staticmethod
    def score(items: list[AnswerItem], generations: list[str]) -> dict[str, dict]:
        key = items_digest([it.question for it in items])
        return {"exact_match": score([answer_matches(g, it.answer) for g, it in zip(generations, items, strict=True)], key)}


class Arithmetic(AnswerTask):
    name = "arithmetic"

    def examples(self, limit: int | None, seed: int) -> list[dict]:
        return arithmetic_dataset("test", limit or ARITHMETIC_DEFAULT_N, seed)


class GSM8K(AnswerTask):
    """`gsm8k:PATH`: a local GSM8K JSONL. Items are the file's first `limit` problems (in file order,
    as lm-eval takes them); the seed does not change them."""

    gen_tokens = GSM8K_GEN_TOKENS

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.name = GSM8K_PREFIX + str(path)
        if not self.path.is_file():
            raise ValueError(
                f"GSM8K file {str(self.path)!r} does not exist; pass gsm8k:PATH with a local JSONL of "
                "'question'/'answer' records (e.g. the published test.jsonl)"
            )

    def examples(self, limit: int | None, seed: int) -> list[dict]:
        return load_gsm8k_jsonl(self.path)[:limit]  # prompts are `format_prompt(question)`, as in SFT


def _split(flat: list[float], sizes: list[int]) -> list[list[float]]:
    if len(flat) != sum(sizes):
        raise ValueError(f"got {len(flat)} log-likelihoods for {sum(sizes)} candidates")
    out, k = [], 0
    for n in sizes:
        out.append(list(flat[k: k + n]))
        k += n
    return out


TASKS: dict[str, type[Task]] = {
    ShakespeareCloze.name: ShakespeareCloze,
    ShakespeareNextLine.name: ShakespeareNextLine,
    ShakespeareWordOrder.name: ShakespeareWordOrder,
    Arithmetic.name: Arithmetic,
}


def get_task(name: str) -> Task:
    """A task by name: one of `TASKS`, or `gsm8k:PATH`. Unknown names list the known ones."""
    if not isinstance(name, str):
        raise ValueError(f"a task name must be a string, got {type(name).__name__}")
    if name.startswith(GSM8K_PREFIX):
        path = name[len(GSM8K_PREFIX):]
        if not path:
            raise ValueError("gsm8k: needs a path, e.g. gsm8k:data/gsm8k/test.jsonl")
        return GSM8K(path)
    if name not in TASKS:
        raise ValueError(
            f"unknown task {name!r}; known tasks: {', '.join(TASKS)}, and gsm8k:PATH (a local GSM8K JSONL)"
        )
    return TASKS[name]()


def resolve_tasks(names) -> list[Task]:
    """Task objects for a list (or a comma-separated string) of names; every name checked first."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"no task given; known tasks: {', '.join(TASKS)}, and gsm8k:PATH")
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"task(s) listed twice: {', '.join(dup)}")
    return [get_task(n) for n in names]
