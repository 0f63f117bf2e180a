"""`evaluate(model, tokenizer, EvalConfig)`: score a model on named offline tasks; `evaluate_dir(EvalConfig)`
opens the config's model first; `format_table` renders the scores.

The scores are `{task: {metric: {"value", "stderr", "n", "per_item", "items"}}}` with the binomial
standard error of each accuracy (`scoring.score`).
"""

from __future__ import annotations

import dataclasses

import math
from pathlib import Path

from sinkdlm.evaluation.predictor import DLMPredictor, check_scoring_options
from sinkdlm.evaluation.tasks import resolve_tasks
from sinkdlm.config.checks import check_optional_int, check_seed
from sinkdlm.config.commands import EvalConfig

def task_names(tasks: str) -> list[str]:
    """`EvalConfig.tasks` ("shakespeare_cloze,gsm8k:PATH") as a list of names, checked for an empty list
    or a `gsm8k:` without its file."""
    names = [t.strip() for t in tasks.split(",") if t.strip()] if isinstance(tasks, str) else []
    if not names:
        raise ValueError(f"--tasks {tasks!r} names no task; give comma-separated names, e.g. shakespeare_cloze,arithmetic")
    if any(n.startswith("gsm8k:") and not n[len("gsm8k:"):].strip() for n in names):
        raise ValueError("--tasks gsm8k: needs the file after the colon: gsm8k:PATH (a local GSM8K JSONL)")
    return names


def _check_options(config: EvalConfig) -> list:
    """Every user error of the settings, before any work; returns the resolved tasks."""
    if not isinstance(config, EvalConfig):
        raise TypeError(f"evaluate() takes an EvalConfig as config, got {type(config).__name__}")
    check_optional_int("limit", config.limit, 1, none_means="all items")
    check_seed(config.seed)
    check_scoring_options(config)  # mc_num, batch_size, gen_steps, cache, threshold, method, max_length
    return resolve_tasks(task_names(config.tasks))  # every name checked before any work


def evaluate(model, tokenizer, config: EvalConfig) -> dict[str, dict[str, dict]]:
    """Score `model` (a `DiffusionLM`) with its `tokenizer` on `config.tasks` (names from `TASKS`, or
    `gsm8k:PATH`, comma-separated). Returns `{task: {metric: {"value", "stderr", "n", "per_item", "items"}}}`.

    The settings are an `EvalConfig` (`sinkdlm.config`, the one home of their defaults; `model`, `device`,
    `dtype` and `out` are `evaluate_dir`'s and the command's):
    limit      items per task (None = all: 713 cloze passages, 1095 next-line items, 500 arithmetic
               problems, or the whole GSM8K file). The items for a seed are fixed; a larger limit
               extends a smaller one.
    seed       chooses the items (and their distractors) and seeds the ELBO's Monte-Carlo draws.
    mc_num     ELBO samples per candidate for multi-token candidates (next-line lines). Cloze
               candidates are single words: `min(mc_num, 4)` samples, and 1 for a one-token word,
               where the "mc_count" estimate is exact (docs/method.md §1: one sample suffices).
    gen_steps  denoising steps per generation; None = one token per step. Cloze words are generated
               as exactly as many tokens as the true word has; arithmetic answers as 128 tokens (256
               for gsm8k:) in blocks of 32, cut at EOS.
    batch_size model rows per forward (default 64: a CPU-friendly size for the tiny preset).
    cache / threshold: Fast-dLLM decoding for the generation tasks: KV cache None | "prefix" | "dual"
               and confidence threshold (e.g. 0.9); see `DLMPredictor`.
    remasking, schedule, eps, alg_temp, top_p, top_k: the generation tasks' sampler (`RemaskingOptions`,
               docs/method.md §2); None = the model family's.
    progress   progress bars.
    method     the likelihood estimator (not a flag): "mc_count" (LLaDA's lower-variance form of the ELBO).

    Cost of the defaults: `limit=100` on both shakespeare tasks is ~1,800 rows of ~70 tokens for the
    cloze ELBO (most words are one or two tokens), ~6,400 rows for next-line (4 candidates x 16
    samples), plus one to three batched greedy steps for the cloze words.
    """
    resolved = _check_options(config)
    results: dict[str, dict[str, dict]] = {}
    for task in resolved:
        samples = min(config.mc_num, task.max_mc_num) if task.max_mc_num else config.mc_num
        predictor = DLMPredictor(model, tokenizer, dataclasses.replace(config, mc_num=samples))
        results[task.name] = task.evaluate(predictor, limit=config.limit, seed=config.seed)
    return results


def evaluate_dir(config: EvalConfig) -> dict[str, dict[str, dict]]:
    """`evaluate` the model at `config.model` (a checkpoint directory or .gguf), on `config.device` in
    `config.dtype`.

    Task names and options are checked first, then the model's files (a `CheckpointError` names the
    missing file; config.json is parsed once, for the whole load), and only then is the model loaded.
    """
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer, open_source

    _check_options(config)
    if config.model is None:
        raise ValueError("--model is required: a checkpoint directory or a .gguf file")
    source = open_source(Path(config.model))  # a missing directory or config.json: CheckpointError now
    check_scoring_options(config, block_model=source.config.block_size is not None)
    model, tokenizer = load_model_and_tokenizer(source, device=config.device, dtype=config.dtype,
                                                quantize=config.quantize)
    return evaluate(model, tokenizer, config)


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
