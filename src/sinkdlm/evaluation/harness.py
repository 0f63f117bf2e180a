"""`evaluate_harness`: lm-evaluation-harness tasks (the One-Token paper's Table 1: ARC-e/c,
HellaSwag, PIQA, RACE, SIQA, LAMBADA) through the project's lm-eval model, returned in the offline
tasks' score format — `{task: {metric: {"value", "stderr", "n", "per_item", "items"}}}` — so an
experiment compares variants on them item by item like any other task.

lm-eval reads its datasets through `datasets`: they must be in the local Hugging Face cache (or
`HF_DATASETS_OFFLINE=0` with a reachable hub). Nothing here downloads on its own.
"""

from __future__ import annotations

import math
from pathlib import Path

from sinkdlm.diffusion.likelihood import MC_NUM
from sinkdlm.evaluation.scoring import binomial_stderr, items_digest

# The One-Token paper's Table 1 (zero-shot, lm-eval task names).
TABLE1_TASKS = ("arc_easy", "arc_challenge", "hellaswag", "piqa", "race", "siqa", "lambada_openai")
ACCURACY_METRICS = ("acc", "acc_norm", "exact_match")


def evaluate_harness(
    model_dir: str | Path,
    tasks: list[str] | tuple[str, ...],
    *,
    limit: int | None = None,
    mc_num: int = MC_NUM,
    seed: int = 0,
    device: str | None = None,
    include_path: str | Path | None = None,
    batch_size: int = 32,
) -> dict[str, dict[str, dict]]:
    """Score the checkpoint `model_dir` on lm-eval `tasks`; per-item outcomes from lm-eval's samples.

    include_path  a folder of extra task YAMLs (e.g. local copies of the datasets); with it, only
                  those tasks are indexed (indexing lm-eval's thousands of tasks takes seconds).
    """
    if not tasks:
        raise ValueError("no lm-eval task given; e.g. tasks=['arc_easy']")
    if not (Path(model_dir) / "config.json").is_file():
        raise ValueError(f"{model_dir} is not a model directory (no config.json)")
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError as err:  # pragma: no cover - lm-eval is a declared extra
        raise ValueError("lm-eval tasks need the lm-eval package: pip install 'sinkdlm[eval]'") from err
    import sinkdlm.evaluation.lm_eval_model  # noqa: F401  (registers the "sinkdlm" model)

    manager = TaskManager(include_path=str(include_path), include_defaults=False) if include_path else TaskManager()
    args = f"pretrained={model_dir},mc_num={mc_num},seed={seed},batch_size={batch_size}"
    if device:
        args += f",device={device}"
    out = lm_eval.simple_evaluate(model="sinkdlm", model_args=args, tasks=list(tasks), limit=limit,
                                  task_manager=manager, log_samples=True, random_seed=seed, numpy_random_seed=seed,
                                  torch_random_seed=seed)
    scores: dict[str, dict[str, dict]] = {}
    for task, samples in out["samples"].items():
        samples = sorted(samples, key=lambda s: s["doc_id"])
        digest = items_digest([s["doc_id"] for s in samples])
        per_task = {}
        for metric in ACCURACY_METRICS:
            if not samples or metric not in samples[0]:
                continue
            outcomes = [float(s[metric]) for s in samples]
            p = sum(outcomes) / len(outcomes)
            per_task[metric] = {"value": p, "stderr": binomial_stderr(p, len(outcomes)), "n": len(outcomes),
                                "per_item": outcomes, "items": digest}
        reported = out["results"].get(task, {})
        for metric, s in per_task.items():  # our mean must be lm-eval's own number
            theirs = reported.get(f"{metric},none")
            assert theirs is None or math.isclose(theirs, s["value"], abs_tol=1e-9), (task, metric, theirs, s["value"])
        if per_task:
            scores[task] = per_task
    return scores
