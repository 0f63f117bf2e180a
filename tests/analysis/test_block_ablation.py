"""The sink-masking ablation of a block model (docs/method.md §15): the block NELBO of held-out continuations with
the top-K sinks of its x_t ⊕ x_0 pass masked, checked against a loop over blocks written here: each block's own
forward over the clean blocks before it and its noisy block, its sinks summed from those passes' maps, and the
masked keys removed by an explicit bool mask per layer and head."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from helpers import tiny_model, word_tokenizer
from sinkdlm import loglikelihood
import sinkdlm.analysis.figures as figures
from sinkdlm.analysis import analyze, continuation_elbo, run_ablation
from sinkdlm.config import AnalyzeConfig, SampleConfig
from sinkdlm.diffusion.block import block_draws
from sinkdlm.model import Probe

BLOCK = 4
PREFIXES, CONTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9]], [[10, 11, 12, 13, 14], [15, 16]]
VARIANTS = {"vanilla": dict(num_sink_tokens=0), "sink-front": dict(num_sink_tokens=1),
            "2sinks-end": dict(num_sink_tokens=2, sink_position="end")}


def _canvas(x0: torch.Tensor, xt: torch.Tensor, k: int) -> tuple[torch.Tensor, int, int]:
    """Block k's input `[1, L]`: the clean blocks before it, then its noisy block, and the noisy blocks after it,
    which no query of block k sees (they keep the end sinks' rotary positions at L, L+1, ... as in x_t ⊕ x_0);
    with block k's columns lo .. hi."""
    lo = k * BLOCK
    return torch.cat([x0[:lo], xt[lo:]])[None], lo, min(lo + BLOCK, len(x0))


def _num_blocks(length: int) -> int:
    return -(-length // BLOCK)


def _reference_hidden(model, x0, xt, top: int, eps: float) -> list[list[list[int]]]:
    """Per layer and head the content positions to hide. Each key's received attention: the sum over every block's
    queries in that block's own unablated pass; a sink when above the mean of the other keys (the extra sinks
    among them) + ϵ; the `top` largest content sinks (an extra sink is never a candidate)."""
    cfg = model.config
    n, length, front = cfg.num_sink_tokens, len(x0), cfg.sink_position == "front"
    c = torch.zeros(cfg.num_hidden_layers, cfg.num_attention_heads, length + n, dtype=torch.float64)
    for k in range(_num_blocks(length)):
        ids, lo, hi = _canvas(x0, xt, k)
        with torch.no_grad():
            maps = model(ids, probe=Probe(attentions=True)).attentions  # block-causal: the model's own rule
        first = n if front else 0  # the first content row / column
        for layer, a in enumerate(maps):
            got = a[0, :, first + lo:first + hi, :].sum(1)  # block k's queries, per key [H, L + n]
            c[layer, :, :length] += got[:, first:first + length]
            c[layer, :, length:] += got[:, :n] if front else got[:, length:]
    hidden = []
    for layer in range(cfg.num_hidden_layers):
        heads = []
        for col in c[layer]:
            sinks = [j for j in range(length) if col[j] > (col.sum() - col[j]) / (length + n - 1) + eps]
            heads.append(sorted(sorted(sinks, key=lambda j: -float(col[j]))[:top]))
        hidden.append(heads)
    return hidden


def _forward_with_masks(model, ids: torch.Tensor, content_masks: list[torch.Tensor]) -> torch.Tensor:
    """Logits `[1, L, V]` of `ids` with layer i's attention under `content_masks[i]` (`[1, H, L, L]` bool, True =
    attend) over the content keys, every sink visible: each layer's mask argument replaced by a pre-hook."""
    cfg = model.config
    n, front = cfg.num_sink_tokens, cfg.sink_position == "front"

    def replace(i):
        def hook(module, args):
            m = content_masks[i]
            sinks = m.new_ones(*m.shape[:3], n)
            full = torch.cat([sinks, m] if front else [m, sinks], dim=-1)
            return (*args[:4], full, *args[5:])
        return hook

    handles = [layer.register_forward_pre_hook(replace(i)) for i, layer in enumerate(model.layers)]
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        for h in handles:
            h.remove()


def _hidden_key_masks(cfg, length: int, hidden) -> list[torch.Tensor]:
    """Per layer `[1, H, L, L]`: block-causal over `length` columns, each head's `hidden[layer][h]` keys removed
    from every query's view."""
    blocks = torch.arange(length) // BLOCK
    allow = (blocks[None, :] <= blocks[:, None])[None, None].repeat(1, cfg.num_attention_heads, 1, 1)
    masks = []
    for layer in range(cfg.num_hidden_layers):
        m = allow.clone()
        for h, keys in enumerate(hidden[layer]):
            m[0, h, :, keys] = False  # no query sees a hidden key
        masks.append(m)
    return masks


def _reference_nelbo(model, x0, xt, masked, weight, hidden) -> float:
    """One draw's `Σ_i masked_i weight_i CE_i`, block by block, the hidden keys removed from every query's view."""
    cfg = model.config
    total = 0.0
    for k in range(_num_blocks(len(x0))):
        ids, lo, hi = _canvas(x0, xt, k)
        if not masked[lo:hi].any():
            continue
        logits = _forward_with_masks(model, ids, _hidden_key_masks(cfg, len(x0), hidden))[0, lo:hi]
        ce = torch.nn.functional.cross_entropy(logits, x0[lo:hi], reduction="none")
        total += float((ce * weight[lo:hi] * masked[lo:hi]).sum())
    return total


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_masked_block_nelbo_equals_a_loop_over_blocks_with_the_sink_keys_removed(variant):
    model = tiny_model(block_size=BLOCK, **VARIANTS[variant])
    mc, top, eps, seed = 3, 2, 0.0, 5
    got = continuation_elbo(model, PREFIXES, CONTS, [top], mc_num=mc, epsilon=eps, seed=seed, batch_size=2)
    gen = torch.Generator().manual_seed(seed)  # the draws of `loglikelihood(..., seed=seed)`: one generator in turn
    hidden_keys, slots = 0, 0
    for i, (pre, cont) in enumerate(zip(PREFIXES, CONTS)):
        seq = torch.tensor(pre + cont)
        masked, weight = block_draws(seq, len(pre), BLOCK, mc, gen)
        plain, ablated = [], []
        for d in range(mc):
            xt = seq.masked_fill(masked[d], model.config.mask_token_id)
            none = [[[] for _ in range(model.config.num_attention_heads)]] * model.config.num_hidden_layers
            plain.append(-_reference_nelbo(model, seq, xt, masked[d], weight[d], none))
            hidden = _reference_hidden(model, seq, xt, top, eps)
            hidden_keys += sum(len(keys) for heads in hidden for keys in heads)
            slots += model.config.num_hidden_layers * model.config.num_attention_heads
            ablated.append(-_reference_nelbo(model, seq, xt, masked[d], weight[d], hidden))
        assert float(got["elbo"][0][i]) == pytest.approx(sum(plain) / mc / len(cont), rel=1e-10, abs=1e-12)
        assert float(got["elbo"][top][i]) == pytest.approx(sum(ablated) / mc / len(cont), rel=1e-10, abs=1e-12)
    assert got["masked_keys"][top] == hidden_keys > 0 and got["head_slots"] == slots  # one key a masked position
    assert not torch.allclose(got["elbo"][top], got["elbo"][0])  # the ablation does something


def test_k0_is_the_block_loglikelihood_and_masking_no_sink_changes_nothing():
    model = tiny_model(block_size=BLOCK, num_sink_tokens=1)
    ll = loglikelihood(model, PREFIXES, CONTS, mc_num=4, seed=3)
    per_token = ll.logprob / torch.tensor([float(len(c)) for c in CONTS])
    alone = continuation_elbo(model, PREFIXES, CONTS, [0], mc_num=4, seed=3)  # no maps: the very same pass
    assert torch.equal(alone["elbo"][0], per_token)
    with_maps = continuation_elbo(model, PREFIXES, CONTS, [1], mc_num=4, epsilon=0.0, seed=3)  # eager K = 0
    torch.testing.assert_close(with_maps["elbo"][0], per_token, rtol=1e-12, atol=1e-12)
    none = continuation_elbo(model, PREFIXES, CONTS, [3], mc_num=4, epsilon=1e6, seed=3)  # no key is a sink
    assert none["masked_keys"][3] == 0 and torch.equal(none["elbo"][3], none["elbo"][0])


def test_a_block_models_extra_sink_is_scored_spared_and_masked():
    model = tiny_model(block_size=BLOCK, num_sink_tokens=1)
    res = run_ablation(model, [1], epsilon=0.0, prefixes=PREFIXES, continuations=CONTS, mc_num=2, seed=1)
    assert res["metric"] == "continuation_block_elbo_per_token" and res["mc_num"] == 2
    assert res["include_extra_sink"] is False and res["alternative"]["include_extra_sink"] is True
    assert res["alternative"]["per_request"]["0"] == pytest.approx(res["per_request"]["0"], abs=1e-12)
    direct = continuation_elbo(model, PREFIXES, CONTS, [1], mc_num=2, epsilon=0.0, seed=1, include_extra_sink=True)
    assert res["alternative"]["per_request"]["1"] == pytest.approx(direct["elbo"][1].tolist(), abs=1e-12)


def test_analyze_runs_the_ablation_of_a_block_model(tmp_path, monkeypatch):
    # the figures are built but not rendered to PNG (most of the time here; rendering: test_analysis_figures.py)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: Path(path).write_bytes(b"") or Path(path))
    model = tiny_model(vocab_size=47, mask_token_id=46, num_sink_tokens=1, block_size=2)
    tok = word_tokenizer()
    prompts = ["w1 w2 w3 w4 w5", "w6 w7 w8"]
    config = AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), ablation_k="1,3", mc_num=2, epsilon=0.0,
                           out=tmp_path / "a", quiet=True)
    a = analyze(model, tok, prompts, config)
    ab = a["ablation"]
    assert ab["k"] == [0, 1, 3] and ab["delta"]["0"] == 0.0 and ab["source"] == "elbo"
    assert ab["metric"] == "continuation_block_elbo_per_token" and "x_t ⊕ x_0" in ab["protocol_description"]
    assert set(ab["scores"]) == set(ab["per_request"]) == {"0", "1", "3"} and ab["num_requests"] == 2
    assert ab["masked_keys_per_head"]["1"] > 0 and ab["alternative"]["include_extra_sink"] is True
    ids = [tok.encode(p) for p in prompts]  # the held-out continuation: each prompt's last min(4, len // 2) tokens
    ll = loglikelihood(model, [r[:-(len(r) // 2)] for r in ids], [r[-(len(r) // 2):] for r in ids], mc_num=2,
                       seed=config.seed)
    assert ab["per_request"]["0"] == pytest.approx((ll.logprob / torch.tensor([len(r) // 2 for r in ids])).tolist(),
                                                   abs=1e-10)
    assert "Sink-masking ablation" in (tmp_path / "a" / "report.md").read_text()
    with pytest.raises(ValueError, match="leave out ablation_task"):  # its decoding takes no key masks yet
        analyze(model, tok, prompts, dataclasses.replace(config, out=tmp_path / "b"),
                ablation_task=lambda model, kwargs: 0.0)
    assert not (tmp_path / "b").exists()


# ----------------------------------------------------------------------------- shifted logits (Fast-dLLM v2)
def _reference_shifted_nelbo(model, x0, xt, masked, weight, first, hidden) -> float:
    """One draw's shifted block NELBO term, block by block, the hidden keys removed from every query's view: block
    k's masked token at column c read at column c - 1 of block k's own pass (its noisy block beside the clean blocks
    before it), and each block's first token (`first`) exactly, at the previous block's last column of a clean
    block-causal pass."""
    cfg = model.config
    masks = _hidden_key_masks(cfg, len(x0), hidden)
    total = 0.0
    for k in range(_num_blocks(len(x0))):
        ids, lo, hi = _canvas(x0, xt, k)
        if not masked[lo:hi].any():
            continue
        assert not masked[lo]  # a block's first column is never masked
        logits = _forward_with_masks(model, ids, masks)[0, lo:hi - 1]  # column c - 1 predicts c
        ce = torch.nn.functional.cross_entropy(logits, x0[lo + 1:hi], reduction="none")
        total += float((ce * weight[lo + 1:hi] * masked[lo + 1:hi]).sum())
    if len(first):
        logits = _forward_with_masks(model, x0[None], masks)[0, first - 1]  # the clean previous block's last column
        total += float(torch.nn.functional.cross_entropy(logits, x0[first], reduction="sum"))
    return total


def test_a_shifted_block_models_k0_is_its_loglikelihood():
    """Fast-dLLM v2 (shifted logits): K = 0 is `loglikelihood`'s shifted block NELBO, each block's first token read
    exactly from the clean previous block's last column."""
    model = tiny_model(block_size=BLOCK, num_sink_tokens=1, shift_logits=True)
    ll = loglikelihood(model, PREFIXES, CONTS, mc_num=4, seed=3)
    per_token = ll.logprob / torch.tensor([float(len(c)) for c in CONTS])
    alone = continuation_elbo(model, PREFIXES, CONTS, [0], mc_num=4, seed=3)  # no maps: the very same pass
    assert torch.equal(alone["elbo"][0], per_token)
    with_maps = continuation_elbo(model, PREFIXES, CONTS, [1], mc_num=4, epsilon=0.0, seed=3)  # eager K = 0
    torch.testing.assert_close(with_maps["elbo"][0], per_token, rtol=1e-12, atol=1e-12)
    none = continuation_elbo(model, PREFIXES, CONTS, [3], mc_num=4, epsilon=1e6, seed=3)  # no key is a sink
    assert none["masked_keys"][3] == 0
    torch.testing.assert_close(none["elbo"][3], none["elbo"][0], rtol=1e-12, atol=1e-12)  # per-draw exact terms
    with pytest.raises(ValueError, match="prefix is empty"):
        continuation_elbo(model, [[]], [[1, 2]], [1], mc_num=2)


@pytest.mark.parametrize("sinks", [0, 1])
def test_a_shifted_block_models_masked_nelbo_equals_a_loop_over_blocks_with_the_sink_keys_removed(sinks):
    model = tiny_model(block_size=BLOCK, num_sink_tokens=sinks, shift_logits=True)
    mc, top, eps, seed = 3, 2, 0.0, 5
    got = continuation_elbo(model, PREFIXES, CONTS, [top], mc_num=mc, epsilon=eps, seed=seed, batch_size=2)
    gen = torch.Generator().manual_seed(seed)  # the draws of `loglikelihood(..., seed=seed)`: one generator in turn
    hidden_keys = 0
    for i, (pre, cont) in enumerate(zip(PREFIXES, CONTS)):
        seq = torch.tensor(pre + cont)
        masked, weight = block_draws(seq, len(pre), BLOCK, mc, gen, shift=True)
        first = torch.tensor([c for c in range(len(pre), len(seq)) if c % BLOCK == 0], dtype=torch.long)
        plain, ablated = [], []
        for d in range(mc):
            xt = seq.masked_fill(masked[d], model.config.mask_token_id)
            none = [[[] for _ in range(model.config.num_attention_heads)]] * model.config.num_hidden_layers
            plain.append(-_reference_shifted_nelbo(model, seq, xt, masked[d], weight[d], first, none))
            hidden = _reference_hidden(model, seq, xt, top, eps)
            hidden_keys += sum(len(keys) for heads in hidden for keys in heads)
            ablated.append(-_reference_shifted_nelbo(model, seq, xt, masked[d], weight[d], first, hidden))
        assert float(got["elbo"][0][i]) == pytest.approx(sum(plain) / mc / len(cont), rel=1e-10, abs=1e-12)
        assert float(got["elbo"][top][i]) == pytest.approx(sum(ablated) / mc / len(cont), rel=1e-10, abs=1e-12)
    assert got["masked_keys"][top] == hidden_keys > 0
    assert not torch.allclose(got["elbo"][top], got["elbo"][0])  # the ablation does something


def test_a_shifted_block_models_analyze_runs_its_ablation_and_run_ablation_scores_it(tmp_path, monkeypatch):
    """`analyze` records a shifted block model's decoding and scores its block NELBO ablation (block_size=1, whose
    decoding has no denoising step, is refused before any work); `run_ablation` scores it without analyze."""
    # the figures are built but not rendered to PNG (most of the time here; rendering: test_analysis_figures.py)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: Path(path).write_bytes(b"") or Path(path))
    model = tiny_model(vocab_size=47, mask_token_id=46, block_size=2, shift_logits=True)
    config = AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), ablation_k="1", mc_num=2, out=tmp_path / "a",
                           quiet=True)
    got = analyze(model, word_tokenizer(), ["w1 w2 w3 w4 w5"], config)
    assert got["ablation"]["metric"] == "continuation_block_elbo_per_token" and got["ablation"]["k"] == [0, 1]
    assert (tmp_path / "a" / "analysis.json").is_file()
    one = tiny_model(vocab_size=47, mask_token_id=46, block_size=1, shift_logits=True)
    with pytest.raises(ValueError, match="block_size=1 .*no denoising step"):
        analyze(one, word_tokenizer(), ["w1 w2 w3"], dataclasses.replace(config, out=tmp_path / "b"))
    assert not (tmp_path / "b").exists()
    res = run_ablation(model, [1], epsilon=0.0, prefixes=PREFIXES, continuations=CONTS, mc_num=2, seed=1)
    assert res["metric"] == "continuation_block_elbo_per_token" and res["k"] == [0, 1]
    ll = loglikelihood(model, PREFIXES, CONTS, mc_num=2, seed=1)
    assert res["per_request"]["0"] == pytest.approx((ll.logprob / torch.tensor([float(len(c)) for c in CONTS])).tolist(),
                                                    abs=1e-12)
