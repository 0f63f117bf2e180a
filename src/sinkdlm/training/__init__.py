"""Training: the config (`config`), the loop with exact resume (`trainer`), atomic training
checkpoints (`checkpointing`) and data-parallel plumbing (`distributed`)."""

from sinkdlm.training.config import TrainConfig
from sinkdlm.training.trainer import train

__all__ = ["TrainConfig", "train"]
