"""The endpoints of a study, one room each: the questions it answers, from measurement to figure.

Every endpoint implements the one interface in `base.py` (`Endpoint`): measure (per run), summarise (into
results.json), report line and figure. The runner, `summary.summarise` and the report iterate over `ENDPOINTS` in
this order (the order fixes where each stands in results.json and in report.md; an endpoint may read what one before
it stored):

* `trajectory`: every compared pair's gap over the scored steps, Δ_train, the learning curves;
* `primary`: the declared primary comparison, the study's final loss by its declared test;
* `equivalence`: the declared claims of "≈" (TOST);
* `plateau`: the declared plateau criterion;
* `escape`: when each run leaves the unigram plateau (a package: probe, summary, report, figures);
* `quant`: each run's final checkpoint scored quantized, Δ_quant per arm and scheme (a package: measure, summary,
  report);
* `block_sizes`: each arm's moving-sink rate against its block size (block diffusion; described, not tested);
* `sinks`: the attention-sink analysis, its takeover question and tables (a package: stats, tables).

A new endpoint is one new module here with its `Endpoint` subclass, one line in `ENDPOINTS`, and its preset's
declaration (`presets.ExperimentPreset`, copied into results.json's `declared`).
"""

from __future__ import annotations

from sinkdlm.experiment.endpoints.base import Endpoint
from sinkdlm.experiment.endpoints.block_sizes import BlockSizes
from sinkdlm.experiment.endpoints.equivalence import Equivalence
from sinkdlm.experiment.endpoints.escape import Escape
from sinkdlm.experiment.endpoints.plateau import Plateau
from sinkdlm.experiment.endpoints.primary import Primary
from sinkdlm.experiment.endpoints.quant import Quant
from sinkdlm.experiment.endpoints.sinks import SinkAnalysis
from sinkdlm.experiment.endpoints.trajectory import Trajectory

ENDPOINTS: tuple[Endpoint, ...] = (Trajectory(), Primary(), Equivalence(), Plateau(), Escape(), Quant(),
                                      BlockSizes(), SinkAnalysis())
