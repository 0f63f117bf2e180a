"""tools/quant_real.py: a real AR model's Δ_quant on fixed sequences, against references written here on a tiny
causal model: the per-sequence next-token cross-entropy of F.cross_entropy(logits[:, :-1], x[:, 1:]), each
scheme's Δ the difference of two such eager computations (the model quantized here), its interval a Student t
interval over the sequences (scipy), and the FFN ∞-norm the max |MLP output| read by a hook."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from scipy import stats as sps

pytest.importorskip("torchao")

from helpers import _load_tool, tiny_model  # noqa: E402
from sinkdlm.model.quantize import quantize_model  # noqa: E402

tool = _load_tool("quant_real")


def _ar_model():
    """A float32 tiny causal AR model (shifted logits, no [MASK]); torchao's int8 tensors take float32."""
    return tiny_model(causal=True, shift_logits=True, mask_token_id=None, initializer_range=0.05, hidden_size=64,
                      intermediate_size=128, tie_word_embeddings=False).float()


def _x(model, n=6, length=12):
    return torch.randint(0, model.config.vocab_size, (n, length), generator=torch.Generator().manual_seed(1))


@torch.no_grad()
def _eager_ce(model, x):
    logits = model(x).logits.float()
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(), reduction="none").view(len(x), -1)
    return ce.double().mean(-1)


def test_the_per_sequence_ce_is_the_mean_next_token_cross_entropy():
    model = _ar_model()
    x = _x(model)
    got = tool.sequence_ce(model, x, batch_size=4)
    assert got.dtype == torch.float64 and got.shape == (len(x),)
    torch.testing.assert_close(got, _eager_ce(model, x), rtol=1e-5, atol=1e-6)


def test_a_dlm_is_refused():
    dlm = tiny_model().float()
    with pytest.raises(ValueError, match="autoregressive"):
        tool.sequence_ce(dlm, _x(dlm))


def test_each_schemes_delta_is_the_difference_of_two_eager_computations_with_a_t_interval(tmp_path):
    model = _ar_model()
    x = _x(model)
    r = tool.measure(model, x, ("int8-weight",), batch_size=4)
    ref = _eager_ce(model, x)
    quantized = quantize_model(copy.deepcopy(model), "int8-weight")
    d = _eager_ce(quantized, x) - ref
    s = r["schemes"]["int8-weight"]
    reference = torch.tensor(r["reference_per_sequence"], dtype=torch.float64)
    torch.testing.assert_close(reference, ref, rtol=1e-5, atol=1e-6)
    per_sequence = torch.tensor(s["per_sequence"], dtype=torch.float64)
    got = per_sequence - torch.tensor(r["reference_per_sequence"], dtype=torch.float64)
    torch.testing.assert_close(got, d, rtol=1e-4, atol=1e-6)
    assert s["delta"] == pytest.approx(float(got.mean()), rel=1e-12, abs=1e-15)
    assert getattr(model, "quantization", None) is None  # the scored model was a copy
    iv = s["interval"]
    n = len(x)
    se = float(got.std()) / math.sqrt(n)
    half = sps.t.ppf(0.975, n - 1) * se
    assert iv["method"] == "paired t over sequences" and iv["n"] == n and iv["df"] == n - 1
    assert iv["low"] == pytest.approx(s["delta"] - half, rel=1e-9)
    assert iv["high"] == pytest.approx(s["delta"] + half, rel=1e-9)
    assert (r["sequences"], r["seq_len"], r["tokens"], r["predicted_tokens"]) == (6, 12, 72, 66)

    # the FFN ∞-norm per layer: the max |MLP output| over every position, read by a hook
    seen = [0.0] * model.config.num_hidden_layers

    def hook(i):
        def record(module, args, out):
            seen[i] = max(seen[i], float(out.abs().max()))
        return record

    handles = [layer.mlp.register_forward_hook(hook(i)) for i, layer in enumerate(model.layers)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    assert r["ffn_inf_norm"] == pytest.approx(seen, rel=1e-5)

    r = {"model": "tiny", "data": "planted", **r, "argv": "--tokens 72",
         "machine": {"cpu": "a CPU", "threads": 1, "torch": torch.__version__, "torchao": "0.18", "python": "3.11"}}
    tool.write(tmp_path, r)
    assert json.loads((tmp_path / "results.json").read_text())["schemes"]["int8-weight"]["delta"] == s["delta"]
    readme = (tmp_path / "README.md").read_text()
    assert "| `int8-weight` |" in readme and "DLM conversions" in readme and "no seed" in readme
