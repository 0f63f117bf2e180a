"""The model: architecture (`transformer`), attention backends (`attention`), the sink rule (`sink`),
the Fast-dLLM key/value cache (`cache`), attention probing (`probe`), checkpoint formats (`formats`),
opening a model file (`loader`, the body of `DiffusionLM.from_pretrained`) and Hugging Face integration
(`hf`)."""

from sinkdlm.io.files import CheckpointError
from sinkdlm.model.cache import KVCache
from sinkdlm.model.probe import Probe
from sinkdlm.model.sink import SinkCache
from sinkdlm.model.transformer import DiffusionLM, DiffusionLMOutput

__all__ = ["CheckpointError", "DiffusionLM", "DiffusionLMOutput", "KVCache", "Probe", "SinkCache"]
