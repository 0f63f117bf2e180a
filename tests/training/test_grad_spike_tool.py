"""tools/diagnose_grad_spike.py: the per-row gradient norm and the massive-activation ratio it reports."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from helpers import _load_tool
from sinkdlm.checkpoint.manager import load_model_and_tokenizer
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.model.hf import convert_hf_checkpoint


@pytest.fixture(scope="module")
def ar(tmp_path_factory):
    """A tiny Qwen2 directory with its tokenizer, written once for both cases (the BPE training is most of the time;
    three plays give its 300 tokens in a tenth of the time of all 38)."""
    from sinkdlm.data import load_documents, train_bpe_tokenizer

    tok = train_bpe_tokenizer(load_documents("shakespeare", "train")[:3], 300)
    assert len(tok) == 300
    torch.manual_seed(0)
    ar = tmp_path_factory.mktemp("grad_spike") / "ar"
    tok.save_pretrained(str(ar))
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 tie_word_embeddings=True)).save_pretrained(str(ar))
    return ar


@pytest.mark.parametrize("sinks", [0, 1])
def test_row_gradient_norm_and_content_rows(tmp_path, ar, sinks):
    torch.manual_seed(0)
    ckpt = tmp_path / "dlm"
    convert_hf_checkpoint(str(ar), ckpt, num_sink_tokens=sinks)
    x0 = torch.randint(0, 250, (2, 16), generator=torch.Generator().manual_seed(1))
    rows = _load_tool("diagnose_grad_spike").measure(ckpt, x0, layer=1)
    model, _ = load_model_and_tokenizer(str(ckpt))
    model.config.shift_logits = True
    model.train()
    for i, row in enumerate(rows):  # the same row and noise, the norm by torch's own total-norm
        model.zero_grad(set_to_none=True)
        diffusion_loss(model, x0[i: i + 1], MaskNoise(generator=torch.Generator().manual_seed(i))).loss.backward()
        want = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        assert row["grad_norm"] == pytest.approx(float(want), rel=1e-5)
        assert row["massive_ratio"] >= 1.0
        assert ("sink_norm" in row) == bool(sinks)
