"""Sink-masking ablation (Rulli et al. Table 1): K = 0 is the unablated run, masked sinks get zero
attention, the extra sink is spared unless asked, and the ELBO follows `loglikelihood`."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model

from sinkdlm import generate, loglikelihood
from sinkdlm.diffusion.sampling import StepProbe
from sinkdlm.model import Probe
from sinkdlm.analysis import (
    SinkMasker,
    continuation_elbo,
    detect_sinks,
    received_attention,
    run_ablation,
    sink_key_masks,
    split_continuation,
)

VARIANTS = {
    "vanilla": dict(num_sink_tokens=0),
    "sink-front": dict(num_sink_tokens=1),
    "2sinks-end": dict(num_sink_tokens=2, sink_position="end"),
}


def reference_masks(attn: torch.Tensor, k: int, eps: float, spared=(), sink_rows=()) -> torch.Tensor:
    """Plain loops: per (row, head) hide the k sinks with the largest column sums, never `spared`;
    the column sums run over the content queries (the extra sinks' rows `sink_rows` left out)."""
    b, h, s, _ = attn.shape
    keep = torch.ones(b, h, s, dtype=torch.bool)
    rows = [i for i in range(s) if i not in sink_rows]
    c = attn[..., rows, :].sum(-2)
    for i in range(b):
        for j in range(h):
            col = c[i, j]
            sinks = [x for x in range(s) if col[x] > (col.sum() - col[x]) / (s - 1) + eps and x not in spared]
            for x in sorted(sinks, key=lambda x: -float(col[x]))[:k]:
                keep[i, j, x] = False
    return keep


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_k0_reproduces_the_unablated_generation_exactly(variant):
    model = tiny_model(**VARIANTS[variant])
    prompt = [[5, 6, 7, 8, 9], [10, 11]]  # padded batch too
    plain = generate(model, prompt, gen_length=12, steps=6, block_length=6, probe=StepProbe(attentions=True))
    masker = SinkMasker(model, 0, epsilon=0.0)
    assert torch.equal(generate(model, prompt, gen_length=12, steps=6, block_length=6, probe=StepProbe(key_masks=masker, attentions=True)),
                       plain)
    assert masker.masked_keys == 0
    hidden = SinkMasker(model, 3, epsilon=0.0)
    ablated = generate(model, prompt, gen_length=12, steps=6, block_length=6, probe=StepProbe(key_masks=hidden, attentions=True))
    assert hidden.masked_keys > 0 and not torch.equal(ablated, plain)  # the ablation does something


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_masked_sinks_get_exactly_zero_attention(variant):
    """The top-K sinks of the unablated map, found by plain loops here, get probability 0 at every
    query of their head in the ablated forward; every row still sums to 1."""
    model = tiny_model(**VARIANTS[variant])
    cfg = model.config
    ids = torch.randint(0, cfg.mask_token_id, (2, 10), generator=torch.Generator().manual_seed(3))
    ids[:, 4:] = cfg.mask_token_id
    with torch.no_grad():
        out = model(ids, probe=Probe(attentions=True))
        masks = sink_key_masks(out.attentions, 2, epsilon=0.5, num_sink_tokens=cfg.num_sink_tokens,
                               sink_position=cfg.sink_position)
        ablated = model(ids, probe=Probe(key_masks=masks, attentions=True)).attentions
    spared = set(range(cfg.num_sink_tokens)) if cfg.sink_position == "front" else {10, 11}
    for attn, keep, after in zip(out.attentions, masks, ablated):
        assert torch.equal(keep, reference_masks(attn, 2, 0.5, spared, sink_rows=spared))
        assert (~keep).any()
        hidden = (~keep)[:, :, None, :].expand_as(after)  # [B, H, S, S]: the masked key's column
        content_rows = torch.ones(after.shape[-1], dtype=torch.bool)
        content_rows[sorted(spared) if cfg.num_sink_tokens else []] = False
        assert (after[hidden & content_rows[None, None, :, None]] == 0).all()
        assert torch.allclose(after.sum(-1), torch.ones((), dtype=after.dtype))
        assert not torch.allclose(after, attn)


def test_extra_sink_is_never_masked_unless_asked():
    """Hand-built map: column 0 (the extra sink) is the largest sink, columns 3 and 5 the next."""
    s = 8
    attn = torch.full((1, 1, s, s), 0.02)
    attn[..., 0], attn[..., 3], attn[..., 5] = 0.56, 0.2, 0.14  # rows sum to 1
    assert torch.allclose(attn.sum(-1), torch.ones(()))
    assert detect_sinks(attn, 0.1)[0, 0].nonzero().squeeze(-1).tolist() == [0, 3, 5]
    spare = sink_key_masks([attn], 1, epsilon=0.1, num_sink_tokens=1)[0][0, 0]
    assert spare.tolist() == [True, True, True, False, True, True, True, True]  # the next sink instead
    spare2 = sink_key_masks([attn], 10, epsilon=0.1, num_sink_tokens=1)[0][0, 0]  # only sinks, never others
    assert (~spare2).nonzero().squeeze(-1).tolist() == [3, 5]
    hit = sink_key_masks([attn], 1, epsilon=0.1, num_sink_tokens=1, include_extra_sink=True)[0][0, 0]
    assert (~hit).nonzero().squeeze(-1).tolist() == [0]
    vanilla = sink_key_masks([attn], 1, epsilon=0.1, num_sink_tokens=0)[0][0, 0]  # column 0 is content here
    assert (~vanilla).nonzero().squeeze(-1).tolist() == [0]


@pytest.mark.parametrize("include", [False, True])
def test_ablated_protocol_masks_come_from_step_t_minus_1_maps(include):
    """protocol="ablated": at step t the masker hides the sinks of step t-1's (ablated) maps (step 0
    is unmasked); the masked keys have zero attention at step t, and the extra sink is masked only
    with include_extra_sink."""
    model = tiny_model(num_sink_tokens=1)
    masker = SinkMasker(model, 2, epsilon=0.0, include_extra_sink=include, protocol="ablated")
    seen, states = [], []

    def key_masks_fn(step, prev):
        masks = masker(step, prev)
        seen.append((step, None if prev is None else prev.step, masks))
        if prev is not None:
            for attn, keep in zip(prev.attentions, masks):
                assert torch.equal(keep, reference_masks(attn, 2, 0.0, () if include else {0}, sink_rows={0}))
        return masks

    generate(model, [[3, 4, 5]], gen_length=8, steps=4, probe=StepProbe(key_masks=key_masks_fn, attentions=True),
             callback=lambda s: states.append(s))
    assert seen[0][1:] == (None, None) and [p for _, p, _ in seen[1:]] == [0, 1, 2]
    sink_masked = False
    for (_, _, masks), state in zip(seen[1:], states[1:]):
        for keep, attn in zip(masks, state.attentions):
            assert (attn[:, :, 1:][(~keep)[:, :, None, :].expand(-1, -1, attn.shape[2] - 1, -1)] == 0).all()
            sink_masked |= bool((~keep[:, :, 0]).any())
    assert sink_masked == include


def test_k0_elbo_equals_loglikelihood_and_no_sink_means_no_change():
    model = tiny_model(num_sink_tokens=1)
    prefixes, conts = [[1, 2, 3, 4, 5, 6], [7, 8, 9]], [[10, 11, 12, 13], [14, 15]]
    res = continuation_elbo(model, prefixes, conts, [1, 4], mc_num=8, epsilon=0.0, seed=3, batch_size=3)
    ll = loglikelihood(model, prefixes, conts, mc_num=8, seed=3)
    # the eager backend's softmax runs in float32 (sdpa in float64 here): agreement to ~1e-7
    torch.testing.assert_close(res["elbo"][0], ll.logprob / torch.tensor([4.0, 2.0]), rtol=1e-6, atol=1e-6)
    assert res["masked_keys"][1] > 0 and res["masked_keys"][4] > res["masked_keys"][1]
    assert not torch.allclose(res["elbo"][1], res["elbo"][0])
    none = continuation_elbo(model, prefixes, conts, [5], mc_num=8, epsilon=1e6, seed=3)  # no key is a sink
    assert none["masked_keys"][5] == 0 and torch.equal(none["elbo"][5], none["elbo"][0])


def test_run_ablation_elbo_and_task_protocol():
    model = tiny_model()
    pairs = [split_continuation(list(range(1, 12)), 4), split_continuation([20, 21, 22], 4)]
    assert pairs == [(list(range(1, 8)), [8, 9, 10, 11]), ([20, 21], [22])]
    assert split_continuation([5], 4) is None
    res = run_ablation(model, [5, 1], epsilon=0.0, prefixes=[p for p, _ in pairs],
                       continuations=[c for _, c in pairs], mc_num=4)
    assert res["k"] == [0, 1, 5] and res["source"] == "elbo" and res["metric"] == "continuation_elbo_per_token"
    assert res["delta"]["0"] == 0.0 and set(res["scores"]) == {"0", "1", "5"}
    assert res["delta"]["5"] == pytest.approx(res["scores"]["5"] - res["scores"]["0"])

    reference = generate(model, [[3, 4, 5]], gen_length=8, steps=4, probe=StepProbe(attentions=True))
    calls = []

    class SameTokens:
        """A task: the share of generated tokens equal to the unablated run."""
        name = "same_tokens"

        def __call__(self, model, generate_kwargs):
            calls.append(generate_kwargs)
            out = generate(model, [[3, 4, 5]], gen_length=8, steps=4, **generate_kwargs)
            return float((out == reference).float().mean())

    res = run_ablation(model, [2], epsilon=0.0, ablation_task=SameTokens())
    assert res["source"] == "task" and res["metric"] == "same_tokens" and res["scores"]["0"] == 1.0
    assert [set(c) for c in calls] == [{"probe"}] * 2 and all(c["probe"].key_masks is not None for c in calls)
    assert res["masked_keys_per_head"]["2"] > 0


def test_ablation_input_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="integers >= 0"):
        run_ablation(model, [-1], prefixes=[[1]], continuations=[[2]])
    with pytest.raises(ValueError, match="integers >= 0"):
        run_ablation(model, [], prefixes=[[1]], continuations=[[2]])
    with pytest.raises(ValueError, match="epsilon"):
        SinkMasker(model.config, 1, epsilon=-0.5)
    with pytest.raises(ValueError, match="scale"):
        sink_key_masks([torch.eye(3)[None, None]], 1, scale="max")
    with pytest.raises(ValueError, match="held-out"):
        run_ablation(model, [1])
    with pytest.raises(ValueError, match="attentions=True"):
        generate(model, [1, 2], gen_length=4, steps=2, probe=StepProbe(key_masks=SinkMasker(model, 1, protocol="ablated")))
    assert received_attention(torch.eye(3)).tolist() == [1.0, 1.0, 1.0]  # re-exported metric still there


def test_clean_protocol_masks_the_unablated_sinks_of_step_t_minus_1_again_and_again():
    """protocol="clean": the masks of step t are the top-K sinks of the *un-ablated* attention at
    step t-1's input (a reference forward here), so a key that stays a top sink stays masked at
    every step; the "ablated" protocol unmasks it at the next step (it got no attention)."""
    torch.manual_seed(0)
    model = tiny_model(num_sink_tokens=1)
    cfg = model.config
    prompt = torch.randint(0, cfg.mask_token_id, (1, 12), generator=torch.Generator().manual_seed(5)).tolist()

    def run(protocol):
        masker = SinkMasker(model, 1, epsilon=0.5, protocol=protocol)
        seen = []

        def key_masks_fn(step, prev):
            masks = masker(step, prev)
            if prev is not None:
                seen.append((prev.input_ids.clone(), masks))
            return masks

        generate(model, prompt, gen_length=8, steps=8, block_length=8,
                 probe=StepProbe(key_masks=key_masks_fn, attentions=protocol == "ablated"))
        return seen

    clean = run("clean")
    assert len(clean) == 7
    hidden = []
    for ids, masks in clean:
        with torch.no_grad():
            ref = model(ids, probe=Probe(attentions=True)).attentions  # step t-1, un-ablated
        for attn, keep in zip(ref, masks):
            assert torch.equal(keep, reference_masks(attn, 1, 0.5, {0}, sink_rows={0}))
        hidden.append(torch.stack([~m for m in masks]))  # [L, B, H, S]
    # a key masked at t because it was the top sink at t-1 is masked again at t+1 when it still is
    again = sum(int((a & b).sum()) for a, b in zip(hidden, hidden[1:]))
    assert again > 0
    # the "ablated" protocol never re-detects a key it just masked (it received no attention)
    ablated = [torch.stack([~m for m in masks]) for _, masks in run("ablated")]
    assert sum(int((a & b).sum()) for a, b in zip(ablated, ablated[1:])) == 0


def test_unknown_protocol_and_config_without_model_are_refused():
    model = tiny_model(num_sink_tokens=1)
    with pytest.raises(ValueError, match="unknown ablation protocol"):
        SinkMasker(model, 1, protocol="dirty")
    with pytest.raises(ValueError, match="pass the model"):
        SinkMasker(model.config, 1, protocol="clean")


# ----------------------------------------------------------------------------- causal (AR) models
def causal_model(seed=0):
    from sinkdlm import DiffusionLM, ModelConfig

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=48, max_position_embeddings=64, mask_token_id=None, causal=True,
                      shift_logits=True, initializer_range=0.5)
    return DiffusionLM(cfg).eval()


def test_masking_a_causal_models_first_key_keeps_rows_finite_and_leaves_query_0_alone():
    """Hiding key 0 (the AR sink) from every query leaves query 0 no key under the causal mask: it keeps
    its own key (so its output is unchanged), and every later row equals an eager softmax over keys
    1..i — the masked sink hidden from the others, as Rulli et al.'s masking reads."""
    model = causal_model()
    x = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(3))
    layers, heads, s = model.config.num_hidden_layers, model.config.num_attention_heads, 7
    km = [torch.ones(1, heads, s, dtype=torch.bool) for _ in range(layers)]
    for m in km:
        m[..., 0] = False
    with torch.no_grad():
        clean = model(x, probe=Probe(attentions=True))
        masked = model(x, probe=Probe(key_masks=km, backend="eager", attentions=True))
    assert torch.isfinite(masked.logits).all()
    for attn in masked.attentions:
        assert torch.allclose(attn[0, :, 0, 0], torch.ones(heads))  # query 0: itself only
        assert (attn[0, :, 1:, 0] == 0).all()  # nobody else sees the masked key
        torch.testing.assert_close(attn.sum(-1), torch.ones(1, heads, s))
    # the first layer's query 0 is computed from the same input either way
    torch.testing.assert_close(masked.attentions[0][0, :, 0], clean.attentions[0][0, :, 0])


def test_causal_ablation_is_finite_for_every_k():
    model = causal_model(1)
    prefixes = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13]]
    continuations = [[20, 21, 22, 23], [30, 31, 32]]
    res = run_ablation(model, [1, 5, 10], prefixes=prefixes, continuations=continuations, epsilon=0.0)
    assert res["metric"] == "continuation_logprob_per_token"
    for k in ("0", "1", "5", "10"):
        assert res["scores"][k] == pytest.approx(res["scores"][k]) and abs(res["scores"][k]) < 1e6  # not NaN/inf
    assert res["masked_keys_per_head"]["1"] > 0


def test_a_sink_model_is_scored_with_and_without_masking_its_extra_sink():
    """issue 30: sparing the extra sink makes masking look cheap, so a model with one is scored both ways.
    The `alternative` setting equals a direct call with the extra sink a candidate (same noise: the same
    K = 0), and its masked-key count per (row, layer, head) equals plain loops over the unablated maps
    of the very draws `continuation_elbo` makes (`mc_draw` with the same seed)."""
    from sinkdlm.config.train import TrainConfig
    from sinkdlm.diffusion.likelihood import mc_draw

    model = tiny_model(num_sink_tokens=1)
    cfg = model.config
    prefixes, conts = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]], [[11, 12, 13], [14, 15]]
    res = run_ablation(model, [1, 3], epsilon=0.0, prefixes=prefixes, continuations=conts, mc_num=4, seed=2)
    assert res["include_extra_sink"] is False and res["alternative"]["include_extra_sink"] is True
    direct = continuation_elbo(model, prefixes, conts, [1, 3], mc_num=4, epsilon=0.0, seed=2, include_extra_sink=True)
    for k in ("0", "1", "3"):
        assert res["alternative"]["per_request"][k] == pytest.approx(direct["elbo"][int(k)].tolist(), abs=1e-12)
    assert res["alternative"]["per_request"]["0"] == pytest.approx(res["per_request"]["0"], abs=1e-12)
    assert res["alternative"]["scores"] != res["scores"]  # masking the extra sink changes the score

    gen = torch.Generator().manual_seed(2)
    hidden = {False: {1: 0, 3: 0}, True: {1: 0, 3: 0}}
    slots = 0
    for pre, cont in zip(prefixes, conts):
        xt, _, masked, _ = mc_draw(torch.tensor(pre + cont), len(pre), 4, TrainConfig.eps, cfg.mask_token_id, gen)
        rows = masked.any(-1)
        with torch.no_grad():
            maps = model(xt[rows], probe=Probe(attentions=True)).attentions
        slots += int(rows.sum()) * cfg.num_hidden_layers * cfg.num_attention_heads
        for include in (False, True):
            for k in (1, 3):
                hidden[include][k] += sum(int((~reference_masks(a, k, 0.0, () if include else {0}, sink_rows={0})).sum())
                                          for a in maps)
    for include, block in ((False, res), (True, res["alternative"])):
        for k in (1, 3):
            assert block["masked_keys_per_head"][str(k)] == pytest.approx(hidden[include][k] / slots)
    assert "alternative" not in run_ablation(tiny_model(), [1], epsilon=0.0, prefixes=prefixes, continuations=conts,
                                             mc_num=2)  # no extra sink: one setting
