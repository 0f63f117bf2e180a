"""Helpers shared by several test files (the one-thread setting lives in conftest.py)."""

import torch

from sinkdlm import DiffusionLM, ModelConfig


def tiny_model(seed: int = 0, **kw) -> DiffusionLM:
    """A float64 random model large-init enough (0.3) to have attention sinks at small ϵ."""
    cfg = dict(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, max_position_embeddings=96, initializer_range=0.3)
    torch.manual_seed(seed)
    return DiffusionLM(ModelConfig(**{**cfg, **kw})).double().eval()
