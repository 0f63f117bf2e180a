"""Initialisation from scratch: every variant of a seed starts its shared parameters identical (a paired
comparison compares the switch, not the draw), seeds differ, and the draws have the declared scale."""

from __future__ import annotations

import pytest
import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.experiment.presets import STUDY_VARIANTS, VANILLA

SMALL = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64)


def _model(seed: int, **switches) -> DiffusionLM:
    torch.manual_seed(seed)  # as the trainer seeds a new run
    return DiffusionLM(ModelConfig.from_preset("tiny", **SMALL, **switches))


@pytest.mark.parametrize("variant", STUDY_VARIANTS[1:], ids=lambda v: v.name)
def test_shared_parameters_equal_across_variants_of_a_seed(variant):
    base = dict(_model(7, **VANILLA.switches).named_parameters())
    other = dict(_model(7, **{**VANILLA.switches, **variant.switches}).named_parameters())
    shared = sorted(set(base) & set(other))
    assert len(shared) == len(base)  # a switch only adds parameters
    for name in shared:
        assert torch.equal(base[name], other[name]), name


def test_seeds_differ_and_the_scale_is_the_declared_one():
    a, b = _model(0), _model(1)
    std = a.config.initializer_range
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        if name.endswith("norm.weight") or "layernorm" in name:
            assert torch.all(p == 1) and torch.all(q == 1), name
            continue
        assert not torch.equal(p, q), name
        assert abs(p.std().item() / std - 1) < 0.1, name  # N(0, initializer_range)


def test_sink_rows_nest_and_the_tied_head_is_the_embedding():
    one, two = _model(3, num_sink_tokens=1), _model(3, num_sink_tokens=2)
    assert torch.equal(one.sink_embeddings[0], two.sink_embeddings[0])
    tied = _model(3, tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.embed_tokens.weight
    assert torch.equal(tied.embed_tokens.weight, _model(3).embed_tokens.weight)
