"""The main job: the paper's comparison end to end (`presets`, `runner`, `report`)."""

from sinkdlm.experiment.presets import PRESETS, ExperimentPreset, Variant, get_preset
from sinkdlm.experiment.runner import run_experiment

__all__ = ["PRESETS", "ExperimentPreset", "Variant", "get_preset", "run_experiment"]
