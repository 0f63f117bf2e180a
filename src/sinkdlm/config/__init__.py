"""Typed configs, one home for every option (torch-free, so `--help` stays fast).

* `model.py`  — `ModelConfig` (architecture, the model switches, presets of shapes).
* `train.py`  — `TrainConfig` (a training or SFT run).
* `commands.py` — `SampleConfig`/`GenerateConfig`, `AnalyzeConfig`, `EvalConfig`, `ConvertConfig`, `MergeConfig`,
  `ExperimentConfig`: the commands that use a model; `LMEvalConfig`, the lm-eval model's settings (its
  `ScoringOptions` are `EvalConfig`'s).
* `fields.py` — attribute docstrings as help text, field metadata, the shared `--device`.

Each field is declared once with its default and a docstring; the command line
(`sinkdlm.cli.options`) and the experiment presets are built from these classes.
"""

from sinkdlm.config.fields import DeviceOption, field_docs, field_types
from sinkdlm.config.model import (
    MODEL_SWITCH_DEFAULTS,
    MODEL_SWITCHES,
    MODEL_TYPE,
    PRESETS,
    SINK_POSITIONS,
    SWITCHES_BY_NAME,
    ModelConfig,
    ModelSwitch,
    check_model_switches,
)
from sinkdlm.config.commands import (
    AnalyzeConfig,
    ConvertConfig,
    EvalConfig,
    ExperimentConfig,
    GenerateConfig,
    MergeConfig,
    ModelOptions,
    SampleConfig,
)
from sinkdlm.config.train import TrainConfig

__all__ = [
    "AnalyzeConfig", "ConvertConfig", "DeviceOption", "EvalConfig", "ExperimentConfig", "GenerateConfig",
    "MergeConfig", "MODEL_SWITCHES", "MODEL_SWITCH_DEFAULTS", "MODEL_TYPE", "ModelConfig", "ModelOptions", "ModelSwitch",
    "PRESETS", "SINK_POSITIONS", "SWITCHES_BY_NAME", "SampleConfig", "TrainConfig", "check_model_switches",
    "field_docs", "field_types",
]
