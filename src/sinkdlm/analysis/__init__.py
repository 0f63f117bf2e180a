"""Attention-sink analysis (docs/method.md §6): pure tensor metrics, the generation recorder, the
sink-masking ablation, and `analyze` / `compare` (analysis.json, figures, report).

Computation: `metrics`, `recorder`, `ablation`, `run` (`analyze`, its option checks, the schema and
the prompt extractor `prompts_from_documents`), `comparison` (`compare`), `over_prompts`.
Rendering: `report` (figures and documents of `analyze` and `compare`), `over_prompts_report`,
`figures` (the plot functions). The metrics, `SinkRecorder`, the ablation helpers, `analyze` and
`compare` are re-exported here. The figure functions are imported from `figures` only when a
figure is drawn, so that `import sinkdlm.analysis` never pulls in matplotlib.
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
from sinkdlm.config.checks import SCALES  # the received-attention scales, declared beside their check
from sinkdlm.analysis.comparison import compare
from sinkdlm.analysis.report import FIGURES
from sinkdlm.analysis.analyzer import ANALYSIS_KEYS, analyze, check_options, prompts_from_documents

__all__ = [
    "ANALYSIS_KEYS",
    "AblationTask",
    "FIGURES",
    "SinkMasker",
    "SinkRecorder",
    "analyze",
    "check_options",
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
