"""The main job: the paper's comparison end to end (`presets`; one run as a plan, `plan`, and its stages,
`stages` and `records`, listed by `runner`; the statistics, `summary`; the pages, `report`; docs/architecture.md)."""

from sinkdlm.experiment.presets import PRESETS, ExperimentPreset, Variant, get_preset
from sinkdlm.experiment.runner import run_experiment

__all__ = ["PRESETS", "ExperimentPreset", "Variant", "get_preset", "run_experiment"]
