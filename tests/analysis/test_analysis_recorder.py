"""SinkRecorder (running statistics from the sampler callback) against the metrics functions
applied to the full attention maps and values of every step, stored by a plain callback here."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import tiny_model

from sinkdlm import generate
from sinkdlm.diffusion.sampling import StepProbe
from sinkdlm.analysis import (
    SinkRecorder,
    count_token_types,
    detect_sinks,
    extra_sink_share,
    largest_sink_change_rate,
    largest_sink,
    non_sink_fraction,
    sink_mass,
    sink_set_change_rate,
    sink_set_jaccard,
    value_norms,
)
from sinkdlm.analysis.recorder import Reservoir
from sinkdlm.config import AnalyzeConfig
from sinkdlm.model.sink import sink_indices

VARIANTS = {
    "vanilla": dict(num_sink_tokens=0),
    "sink-front": dict(num_sink_tokens=1),
    "2sinks-end": dict(num_sink_tokens=2, sink_position="end"),
}
EPS = {"sum": 1.0, "mean": 0.02}  # thresholds at which a tiny random model has some sinks


def decode(i: int) -> str:  # a toy vocabulary with every token type
    return " " if i % 7 == 0 else ("," if i % 7 == 1 else f"w{i}")


def run(model, prompt, recorder, gen_length=8, steps=6):
    """Generate with the recorder and a plain callback that stores everything."""
    stored = []

    def callback(state):
        recorder(state)
        stored.append((state.input_ids.clone(), [a.clone() for a in state.attentions],
                       [v.clone() for v in state.values], state.attention_mask))

    generate(model, prompt, gen_length=gen_length, steps=steps, callback=callback, probe=StepProbe(attentions=True, values=True))
    return stored


def layout_tokens(ids: torch.Tensor, cfg) -> torch.Tensor:
    """`[B, L]` -> `[B, S]` with -1 at the extra sinks (what the recorder counts as "sink")."""
    n = cfg.num_sink_tokens
    col = ids.new_full((ids.shape[0], n), -1)
    return torch.cat([col, ids] if cfg.sink_position == "front" else [ids, col], dim=1)


@pytest.mark.parametrize("scale", ["sum", "mean"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_recorder_equals_statistics_of_the_full_maps(variant, scale):
    model = tiny_model(**VARIANTS[variant])
    cfg = model.config
    eps = EPS[scale]
    rec = SinkRecorder(cfg, AnalyzeConfig(epsilon=eps, scale=scale, figure_layer=1), decode=decode)
    prompt = torch.randint(0, cfg.mask_token_id, (2, 5), generator=torch.Generator().manual_seed(1))
    stored = run(model, prompt, rec)
    s = rec.summary()

    attn = torch.stack([torch.stack(a) for _, a, _, _ in stored])  # [T, L, B, H, S, S]
    values = torch.stack([torch.stack(v) for _, _, v, _ in stored])  # [T, L, B, KVH, S, hd]
    t, n_layers, b, h, size, _ = attn.shape
    n = cfg.num_sink_tokens
    sinks = sink_indices(size - n, n, cfg.sink_position)
    content = torch.ones(size, dtype=torch.bool)
    content[sinks] = False

    # non-sink fraction: every ϵ of the curve, and per layer; content queries only (the extra
    # sinks' forced one-hot rows never count)
    q = content
    want = non_sink_fraction(attn, rec.epsilons, scale, query_mask=q)
    assert s["non_sink_fraction_by_epsilon"] == pytest.approx({f"{e:g}": v for e, v in want.items()}, abs=1e-12)
    assert s["non_sink_fraction"] == pytest.approx(want[eps], abs=1e-12)
    per_layer = [non_sink_fraction(attn[:, i], eps, scale, query_mask=q)[eps] for i in range(n_layers)]
    assert s["non_sink_fraction_per_layer"] == pytest.approx(per_layer, abs=1e-12)

    is_sink = detect_sinks(attn, eps, scale, query_mask=q)  # [T, L, B, H, S]
    assert is_sink.any() and not is_sink.all()
    assert s["sinks_per_head"] == pytest.approx((is_sink.sum((0, 2, 3, 4)) / (t * b * h)).tolist())

    # moving sinks, per layer
    mv = s["moving"]
    assert mv["sink_set_change_rate"] == pytest.approx(sink_set_change_rate(is_sink, keep_leading=1).tolist())
    assert mv["sink_set_jaccard"] == pytest.approx(sink_set_jaccard(is_sink, keep_leading=1).tolist())
    # the like-for-like version: the extra sinks' keys left out of the sets
    assert mv["content_sink_set_change_rate"] == pytest.approx(
        sink_set_change_rate(is_sink, keep_leading=1, key_mask=content).tolist())
    assert mv["content_sink_set_jaccard"] == pytest.approx(sink_set_jaccard(is_sink, keep_leading=1, key_mask=content).tolist())
    if n == 0:  # no extra key: both definitions agree
        assert mv["content_sink_set_jaccard"] == mv["sink_set_jaccard"]
    largest = largest_sink(attn, epsilon=eps, scale=scale, query_mask=q)  # [T, L, B, H]
    assert torch.equal(rec.largest_sink_positions().long(), largest.permute(0, 2, 1, 3))
    assert mv["largest_sink_change_rate"] == pytest.approx(largest_sink_change_rate(largest, keep_leading=1).tolist())

    # the sparse sink positions are exactly the sinks
    want_pos = {(ti, bi, li, hi, j) for ti, li, bi, hi, j in is_sink.nonzero().tolist()}
    assert {tuple(r) for r in rec.sink_positions().tolist()} == want_pos

    # tokens under the sinks (every head that sinks on a token counts)
    types = Counter()
    for ti, (ids, *_rest) in enumerate(stored):
        tok = layout_tokens(ids, cfg)  # [B, S]
        for li in range(n_layers):
            sel = is_sink[ti, li]  # [B, H, S]
            types += count_token_types(tok[:, None].expand_as(sel)[sel], decode, cfg.mask_token_id,
                                       sink_ids={-1} if n else ())
    got = {k: v for k, v in rec.token_type_counts().items() if v}
    assert got == dict(types) and s["sink_token_types"]["total"] == sum(types.values())

    # value norms (eq. 16): a token is a sink token of a layer when any head sinks on it
    r = value_norms(values)  # [T, L, B, S]
    on_sink = is_sink.any(3) & content
    normal = ~is_sink.any(3) & content
    vn = s["value_norm"]
    assert vn["sink_mean"] == pytest.approx(float(r[on_sink].mean()))
    assert vn["normal_mean"] == pytest.approx(float(r[normal].mean()))
    assert vn["per_layer"]["normal_mean"] == pytest.approx([float(r[:, i][normal[:, i]].mean()) for i in range(n_layers)])
    assert len(rec.sink_norms.values) == min(int(on_sink.sum()), 10_000)

    # attention on the detected sinks, over content queries
    rows = attn[..., content, :]  # [T, L, B, H, S-n, S]
    mass = (rows * is_sink[..., None, :]).sum((0, 2, 3, 4, 5)) / rows.sum((0, 2, 3, 4, 5))
    assert s["sink_attention_mass"] == pytest.approx(mass.tolist())

    if n:  # the extra sink token(s): One-Token Fig. 3
        e = s["extra_sink"]
        by_layer = attn.transpose(0, 1)  # [L, T, B, H, S, S]
        assert e["attention_mass"] == pytest.approx(
            sink_mass(by_layer, sinks, exclude_query_index=sinks, keep_leading=1).tolist())
        assert e["value_norm"] == pytest.approx(r[..., sinks].mean((0, 2, 3)).tolist())
        assert e["others_value_norm"] == pytest.approx(r[..., content].mean((0, 2, 3)).tolist())
        share = extra_sink_share(largest.transpose(0, 1), sinks, keep_leading=1)
        assert e["largest_sink_share"] == pytest.approx(share.tolist()) == mv["extra_sink_share"]
    else:
        assert s["extra_sink"] is None and mv["extra_sink_share"] is None

    # the figure keeps the whole map of one head at the first and the last step only
    maps, steps, head = rec.figure_maps()
    assert steps == [0, t - 1]
    assert torch.equal(maps[0], attn[0, 1, 0, head].float()) and torch.equal(maps[1], attn[-1, 1, 0, head].float())


def real_positions(mask_row, cfg):
    """Layout indices of one row's real positions (its sinks and its non-padding content)."""
    n = cfg.num_sink_tokens
    offset = n if cfg.sink_position == "front" else 0
    pos = (mask_row.nonzero().squeeze(-1) + offset).tolist() + sink_indices(len(mask_row), n, cfg.sink_position)
    return sorted(pos)


@pytest.mark.parametrize("variant", ["vanilla", "2sinks-end"])
def test_padded_batch_is_analysed_on_each_rows_real_positions(variant):
    """Left-padded rows: the statistics equal those of every row's own (unpadded) sub-map."""
    model = tiny_model(**VARIANTS[variant])
    cfg = model.config
    rec = SinkRecorder(cfg, AnalyzeConfig(epsilon=1.0), decode=decode)
    stored = run(model, [[3, 4, 5, 6, 7, 8], [9, 10], [11, 12, 13]], rec)
    s = rec.summary()
    am = stored[0][3]  # [B, L] attention mask of the generation
    assert am is not None and not am.all()
    attn = torch.stack([torch.stack(a) for _, a, _, _ in stored])  # [T, L, B, H, S, S]
    non, total, changed, jac, pairs = 0, 0, 0.0, 0.0, 0
    for row in range(attn.shape[2]):
        pos = torch.tensor(real_positions(am[row], cfg))
        sub = attn[:, :, row][..., pos, :][..., pos]  # [T, L, H, S', S']
        assert torch.allclose(sub.sum(-1), torch.ones(()).double())  # padding got no attention
        sink_layout = set(sink_indices(len(am[row]), cfg.num_sink_tokens, cfg.sink_position))
        q = torch.tensor([p not in sink_layout for p in pos.tolist()])  # content queries only
        non_row = non_sink_fraction(sub, 1.0, query_mask=q)[1.0]
        non += non_row * sub[..., 0].numel()
        total += sub[..., 0].numel()
        is_sink = detect_sinks(sub, 1.0, query_mask=q)  # [T, L, H, S']
        changed += float(sink_set_change_rate(is_sink)) * (is_sink.shape[0] - 1) * is_sink[0, ..., 0].numel()
        jac += float(sink_set_jaccard(is_sink)) * (is_sink.shape[0] - 1) * is_sink[0, ..., 0].numel()
        pairs += (is_sink.shape[0] - 1) * is_sink[0, ..., 0].numel()
    assert s["non_sink_fraction"] == pytest.approx(non / total)
    assert s["moving"]["mean"]["sink_set_change_rate"] == pytest.approx(changed / pairs)
    assert s["moving"]["mean"]["sink_set_jaccard"] == pytest.approx(jac / pairs)


def test_memory_does_not_grow_with_the_steps_beyond_the_largest_sink_positions():
    """No map is kept per step: going from 8 to 24 steps adds exactly the int16 largest-sink
    positions `[T, B, L, H]` (with the sparse positions off and a full norm reservoir)."""
    model = tiny_model(num_sink_tokens=1)
    cfg = model.config
    sizes = {}
    for steps in (8, 24):
        rec = SinkRecorder(cfg, AnalyzeConfig(epsilon=1.0), keep_sink_positions=False, max_norm_samples=8)
        run(model, [[1, 2, 3, 4]], rec, gen_length=24, steps=steps)
        assert len(rec.sink_norms.values) == len(rec.normal_norms.values) == 8
        sizes[steps] = rec.nbytes()
    per_step = 1 * cfg.num_hidden_layers * cfg.num_attention_heads * 2
    assert sizes[24] - sizes[8] == 16 * per_step


def test_one_recorder_over_several_generations_and_reset_at_step_zero():
    model = tiny_model()
    both = SinkRecorder(model.config, AnalyzeConfig(epsilon=1.0))
    run(model, [[1, 2, 3]], both)
    run(model, [[4, 5, 6]], both)
    one, two = SinkRecorder(model.config, AnalyzeConfig(epsilon=1.0)), SinkRecorder(model.config, AnalyzeConfig(epsilon=1.0))
    run(model, [[1, 2, 3]], one)
    run(model, [[4, 5, 6]], two)
    s, s1, s2 = both.summary(), one.summary(), two.summary()
    assert s["counts"]["rows"] == 2 and s["counts"]["generations"] == 2
    # equal weights per generation: pooled = mean (no pair spans the two generations)
    assert s["moving"]["mean"]["sink_set_change_rate"] == pytest.approx(
        (s1["moving"]["mean"]["sink_set_change_rate"] + s2["moving"]["mean"]["sink_set_change_rate"]) / 2)
    pos = both.largest_sink_positions()
    assert torch.equal(pos, torch.cat([one.largest_sink_positions(), two.largest_sink_positions()], dim=1))


def test_reservoir_keeps_a_seeded_uniform_sample_of_the_stream():
    res = Reservoir(100, seed=0)
    for chunk in torch.arange(10_000.0).split(37):
        res.add(chunk)
    assert len(res.values) == 100 and res.seen == 10_000 and len(set(res.values.tolist())) == 100
    assert 3_500 < float(res.values.mean()) < 6_500  # uniform over 0..9999, not the first 100
    again = Reservoir(100, seed=0)
    for chunk in torch.arange(10_000.0).split(37):
        again.add(chunk)
    assert torch.equal(res.values, again.values)


def test_recorder_input_errors():
    cfg = tiny_model().config
    with pytest.raises(ValueError, match="epsilon"):
        SinkRecorder(cfg, AnalyzeConfig(epsilon=-1))
    with pytest.raises(ValueError, match="scale"):
        SinkRecorder(cfg, AnalyzeConfig(scale="max"))
    with pytest.raises(ValueError, match="figure_layer"):
        SinkRecorder(cfg, AnalyzeConfig(figure_layer=5))
    rec = SinkRecorder(cfg)
    with pytest.raises(ValueError, match="no step"):
        rec.summary()
    with pytest.raises(ValueError, match="attentions=True"):
        generate(tiny_model(), [1, 2], gen_length=4, steps=2, callback=rec)
