"""Attention-sink analysis (SPEC §6): pure tensor metrics and figures.

The metrics are re-exported here. The figure functions live in
:mod:`sinkdlm.analysis.figures` and are imported from there, so that using the
metrics never pulls in matplotlib.
"""

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

__all__ = [
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
