"""sinkdlm: masked diffusion language models with a stable attention sink.

Train, sample, evaluate and analyse DLMs with the extra sink token of "One Token Is Enough"
(and the sink analysis of Rulli et al.).

`import sinkdlm` is cheap: the top-level names below are imported on first use (PEP 562), so
the command line starts without torch's heavy neighbours (transformers, datasets, matplotlib).
The checkpoint format is registered with `transformers.AutoConfig` / `AutoModelForMaskedLM` by
`sinkdlm.register_hf()`, which also runs the first time `sinkdlm.DiffusionLM` (or any other
top-level model name) is looked up: after `from sinkdlm import DiffusionLM`,
`AutoModelForMaskedLM.from_pretrained(dir)` opens a sinkdlm checkpoint.
"""

from __future__ import annotations

import importlib

# public name -> module that defines it
_LAZY = {
    "PRESETS": "sinkdlm.config",
    "ModelConfig": "sinkdlm.config",
    "loglikelihood": "sinkdlm.diffusion.likelihood",
    "generate": "sinkdlm.diffusion.sampling",
    "StepProbe": "sinkdlm.diffusion.sampling",
    "CheckpointError": "sinkdlm.io.files",
    "DiffusionLM": "sinkdlm.model.transformer",
    "DiffusionLMOutput": "sinkdlm.model.transformer",
}
# Names whose lookup also registers the Hugging Face Auto classes (what `import sinkdlm` did before).
_REGISTERS_HF = {"DiffusionLM", "DiffusionLMOutput", "CheckpointError", "generate", "loglikelihood"}

__all__ = [
    "PRESETS", "CheckpointError", "DiffusionLM", "DiffusionLMOutput", "ModelConfig", "StepProbe", "generate",
    "loglikelihood", "register_hf",
]
__version__ = "0.1.0"


def register_hf() -> None:
    """Register `model_type: "sinkdlm"` with transformers' AutoConfig and AutoModelForMaskedLM.

    Idempotent. Imports transformers, which is why `import sinkdlm` does not do it by itself.
    """
    from sinkdlm.model.hf import register

    register()


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'sinkdlm' has no attribute {name!r}")
    from sinkdlm.versions import check_versions

    check_versions()  # a dependency older than its floor: one ImportError line naming the version needed
    value = getattr(importlib.import_module(_LAZY[name]), name)
    if name in _REGISTERS_HF:
        register_hf()
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
