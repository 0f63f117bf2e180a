"""Attention-sink analysis (docs/method.md §6): pure tensor metrics, the generation recorder, the
sink-masking ablation, and `analyze` / `compare` (analysis.json, figures, report).

The metrics, `SinkRecorder`, the ablation helpers, `analyze` and `compare` are re-exported
here. The figure functions live in :mod:`sinkdlm.analysis.figures` and are imported from
there (and by `analyze`/`compare` only when they draw), so that `import sinkdlm.analysis`
never pulls in matplotlib.
"""

from sinkdlm.analysis.ablation import (
    AblationTask,
    SinkMasker,
    continuation_elbo,
    run_ablation,
    sink_key_masks,
    split_continuation,
)

from sinkdlm.analysis.metrics import (
    DEFAULT_EPSILONS,
    SCALES,
    TOKEN_TYPES,
    count_token_types,
    detect_sinks,
    extra_sink_share,
    largest_sink,
    largest_sink_change_rate,
    largest_sink_positions,
    non_sink_fraction,
    received_attention,
    sink_counts,
    sink_mass,
    sink_set_change_rate,
    sink_set_jaccard,
    token_type,
    value_norms,
)
from sinkdlm.analysis.recorder import SinkRecorder
from sinkdlm.analysis.comparison import compare
from sinkdlm.analysis.report import ANALYSIS_KEYS, FIGURES, analyze, prompts_from_documents

__all__ = [
    "ANALYSIS_KEYS",
    "AblationTask",
    "FIGURES",
    "SinkMasker",
    "SinkRecorder",
    "analyze",
    "compare",
    "continuation_elbo",
    "prompts_from_documents",
    "run_ablation",
    "sink_key_masks",
    "split_continuation",
    "DEFAULT_EPSILONS",
    "SCALES",
    "TOKEN_TYPES",
    "count_token_types",
    "detect_sinks",
    "extra_sink_share",
    "largest_sink",
    "largest_sink_change_rate",
    "largest_sink_positions",
    "non_sink_fraction",
    "received_attention",
    "sink_counts",
    "sink_mass",
    "sink_set_change_rate",
    "sink_set_jaccard",
    "token_type",
    "value_norms",
]
