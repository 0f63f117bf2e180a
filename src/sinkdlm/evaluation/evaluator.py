"""`evaluate`: score a model on named offline tasks; `evaluate_dir` opens a checkpoint directory first;
`format_table` renders the scores.

The scores are `{task: {metric: {"value", "stderr", "n", "per_item", "items"}}}` with the binomial
standard error of each accuracy (`scoring.score`).
"""

from __future__ import annotations

import math
from pathlib import Path

from sinkdlm.evaluation.predictor import DLMPredictor, check_decoding_options
from sinkdlm.evaluation.tasks import resolve_tasks
from sinkdlm.validation import check_int, check_optional_int, check_seed
from sinkdlm.config.commands import EvalConfig  # the one home of the default (its field docstring)

DEFAULT_BATCH_SIZE = 64


def _check_options(limit, seed, mc_num, gen_steps) -> None:
    check_optional_int("limit", limit, 1, none_means="all items")
    check_seed(seed)
    check_int("mc_num", mc_num, 1)
    check_optional_int("gen_steps", gen_steps, 1, none_means="one token per step")


def evaluate(
    model,
    tokenizer,
    tasks: list[str],
    *,
    limit: int | None = None,
    seed: int = 0,
    mc_num: int = EvalConfig.mc_num,
    gen_steps: int | None = None,
    progress: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    method: str = "mc_count",
    gen_cache: str | None = None,
    gen_threshold: float | None = None,
) -> dict[str, dict[str, dict]]:
    """Score `model` (a `DiffusionLM`) with its `tokenizer` on `tasks` (names from `TASKS`, or
    `gsm8k:PATH`). Returns `{task: {metric: {"value", "stderr", "n", "per_item", "items"}}}`.

    limit      items per task (None = all: 713 cloze passages, 1095 next-line items, 500 arithmetic
               problems, or the whole GSM8K file). The items for a seed are fixed; a larger limit
               extends a smaller one.
    seed       chooses the items (and their distractors) and seeds the ELBO's Monte-Carlo draws.
    mc_num     ELBO samples per candidate (default 16) for multi-token candidates (next-line lines).
               Cloze candidates are single words: `min(mc_num, 4)` samples, and 1 for a one-token
               word, where the "mc_count" estimate is exact (docs/method.md §1: one sample suffices).
    gen_steps  denoising steps per generation; None (default) = one token per step. Cloze words are
               generated as exactly as many tokens as the true word has; arithmetic answers as 128
               tokens (256 for gsm8k:) in blocks of 32, cut at EOS.
    batch_size model rows per forward (default 64: a CPU-friendly size for the tiny preset).
    method     likelihood estimator (default "mc_count", LLaDA's lower-variance form of the ELBO).
    gen_cache / gen_threshold: Fast-dLLM decoding for the generation tasks: KV cache None |
               "prefix" | "dual" and confidence threshold (e.g. 0.9); see `DLMPredictor`.

    Cost of the defaults: `limit=100` on both shakespeare tasks is ~1,800 rows of ~70 tokens for the
    cloze ELBO (most words are one or two tokens), ~6,400 rows for next-line (4 candidates x 16
    samples), plus one to three batched greedy steps for the cloze words.
    """
    _check_options(limit, seed, mc_num, gen_steps)
    check_decoding_options(gen_cache, gen_threshold)
    resolved = resolve_tasks(tasks)  # every name checked before any work
    results: dict[str, dict[str, dict]] = {}
    for task in resolved:
        samples = min(mc_num, task.max_mc_num) if task.max_mc_num else mc_num
        predictor = DLMPredictor(
            model, tokenizer, mc_num=samples, method=method, batch_size=batch_size,
            gen_steps=gen_steps, seed=seed, progress=progress, gen_cache=gen_cache, gen_threshold=gen_threshold,
        )
        results[task.name] = task.evaluate(predictor, limit=limit, seed=seed)
    return results


def evaluate_dir(
    model_dir: str | Path,
    tasks: list[str],
    *,
    device: str | None = None,
    dtype=None,
    **kwargs,
) -> dict[str, dict[str, dict]]:
    """`evaluate` the checkpoint in `model_dir` (config.json + model.safetensors + tokenizer files).

    Task names and options are checked first, then the directory (a `CheckpointError` names the
    missing file), and only then is the model loaded. Keyword arguments are those of `evaluate`.
    """
    from sinkdlm.loading import load_model_and_tokenizer, read_config

    _check_options(kwargs.get("limit"), kwargs.get("seed", 0), kwargs.get("mc_num", EvalConfig.mc_num), kwargs.get("gen_steps"))
    check_decoding_options(kwargs.get("gen_cache"), kwargs.get("gen_threshold"))
    resolve_tasks(tasks)
    model_dir = Path(model_dir)
    read_config(model_dir)  # a missing directory or config.json: CheckpointError before anything loads
    model, tokenizer = load_model_and_tokenizer(model_dir, device=device, dtype=dtype)
    return evaluate(model, tokenizer, tasks, **kwargs)


def format_table(scores: dict[str, dict[str, dict]]) -> str:
    """A plain-text table: task, metric, value ± stderr, n."""
    rows = [("task", "metric", "value", "± stderr", "n")]
    for task, metrics in scores.items():
        for metric, s in metrics.items():
            err = s["stderr"]
            rows.append((task, metric, f"{s['value']:.4f}", "" if math.isnan(err) else f"± {err:.4f}", str(s["n"])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
