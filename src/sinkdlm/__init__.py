"""sinkdlm: masked diffusion language models with a stable attention sink.

Train, sample, evaluate and analyse DLMs with the extra sink token of "One Token Is Enough"
(and the sink analysis of Rulli et al.). `import sinkdlm` also registers the checkpoint format
with `transformers.AutoModelForMaskedLM`.
"""

from sinkdlm.config import PRESETS, ModelConfig
from sinkdlm.diffusion.likelihood import loglikelihood
from sinkdlm.diffusion.sampling import generate
from sinkdlm.model import CheckpointError, DiffusionLM, DiffusionLMOutput
from sinkdlm.model.hf import register as _register_hf

_register_hf()

__all__ = [
    "PRESETS", "CheckpointError", "DiffusionLM", "DiffusionLMOutput", "ModelConfig", "generate", "loglikelihood",
]
__version__ = "0.1.0"
