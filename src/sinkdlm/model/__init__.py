"""The model: architecture (`transformer`), attention backends (`attention`), the sink rule (`sink`),
checkpoint files (`checkpoint`) and Hugging Face integration (`hf`)."""

from sinkdlm.files import CheckpointError
from sinkdlm.model.sink import SinkCache
from sinkdlm.model.transformer import DiffusionLM, DiffusionLMOutput

__all__ = ["CheckpointError", "DiffusionLM", "DiffusionLMOutput", "SinkCache"]
