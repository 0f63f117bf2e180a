"""Evaluation: offline tasks built from held-out data (`tasks`), their scoring (`scoring`), the
predictor interface and its DLM implementation (`predictor`), and `evaluate` (`run`).

The lm-evaluation-harness model lives in `sinkdlm.evaluation.lm_eval_model` and is imported only on
demand (lm-eval is an optional dependency): `import sinkdlm.evaluation.lm_eval_model` registers it as
`--model sinkdlm`.
"""

from sinkdlm.evaluation.predictor import DLMPredictor, GenRequest, Predictor
from sinkdlm.evaluation.evaluator import evaluate, evaluate_dir, format_table
from sinkdlm.evaluation.scoring import answer_matches, binomial_stderr, extract_answer, score
from sinkdlm.evaluation.tasks import TASKS, AnswerItem, ChoiceItem, Task, get_task, resolve_tasks

__all__ = [
    "TASKS",
    "AnswerItem",
    "ChoiceItem",
    "DLMPredictor",
    "GenRequest",
    "Predictor",
    "Task",
    "answer_matches",
    "binomial_stderr",
    "evaluate",
    "evaluate_dir",
    "extract_answer",
    "format_table",
    "get_task",
    "resolve_tasks",
    "score",
]
