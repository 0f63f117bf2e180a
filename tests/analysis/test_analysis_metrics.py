"""Tests of sinkdlm.analysis.metrics against docs/method.md §6 formulas and explicit loops."""

import math

import pytest
import torch

from sinkdlm.analysis import (
    count_token_types,
    detect_sinks,
    extra_sink_share,
    largest_sink,
    largest_sink_change_rate,
    largest_sink_positions,
    non_sink_fraction,
    received_attention,
    sink_counts,
    sink_mass,
    sink_set_change_rate,
    sink_set_jaccard,
    token_type,
    value_norms,
)

EPSILONS = (0.0, 0.5, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0)


def random_maps(*shape, seed=0, sharpness=3.0):
    """Row-stochastic float64 maps ``[*lead, S, S]`` with a few strongly attended keys."""
    gen = torch.Generator().manual_seed(seed)
    *lead, s = shape[:-1]
    logits = sharpness * torch.randn(*shape, generator=gen, dtype=torch.float64)
    boost = torch.rand(*lead, 1, s, generator=gen, dtype=torch.float64) < 0.15  # same keys for all queries
    return torch.softmax(logits + 6.0 * boost, dim=-1)


def brute_sinks(c_row, eps):
    """Exclusive-mean definition, one key at a time (independent of the vectorised code)."""
    out = []
    for j, cj in enumerate(c_row):
        others = [ck for k, ck in enumerate(c_row) if k != j]
        out.append(cj > sum(others) / len(others) + eps)
    return out


# --- received attention and detection -------------------------------------------------


def test_received_attention_column_sum_and_mean():
    attn = random_maps(2, 3, 7, 7)
    c = received_attention(attn)
    loop = torch.tensor([[[sum(attn[b, h, i, j].item() for i in range(7)) for j in range(7)]
                          for h in range(3)] for b in range(2)], dtype=torch.float64)
    torch.testing.assert_close(c, loop)
    torch.testing.assert_close(c.mean(-1), torch.ones(2, 3, dtype=torch.float64))  # docs/method.md §6
    torch.testing.assert_close(received_attention(attn, scale="mean"), loop / 7)


@pytest.mark.parametrize("size", [2, 5, 16, 64])
def test_detect_sinks_matches_closed_form_on_random_maps(size):
    attn = random_maps(4, 3, size, size, seed=size)
    c = attn.sum(-2)
    seen_sink = seen_normal = False
    for eps in EPSILONS:
        closed = c > 1 + eps * (size - 1) / size  # docs/method.md §6 closed form, sum scale
        got = detect_sinks(attn, eps)
        assert torch.equal(got, closed), eps
        seen_sink |= bool(got.any())
        seen_normal |= bool((~got).any())
    assert seen_sink and seen_normal  # the maps exercise both outcomes


def test_detect_sinks_mean_scale_closed_form():
    size = 9
    attn = random_maps(3, 2, size, size, seed=1, sharpness=5.0)
    c_mean = attn.mean(-2)
    for eps in (0.0, 0.05, 0.2, 0.5):
        # mean of c_mean is 1/S, so c_j > (1/S - c_j/S) * S/(S-1) + ϵ  <=>  c_j > 1/S + ϵ (S-1)/S
        closed = c_mean > 1 / size + eps * (size - 1) / size
        assert torch.equal(detect_sinks(attn, eps, scale="mean"), closed)
    # ϵ = 3 can never be passed on the mean scale (docs/method.md §6)
    assert not detect_sinks(attn, 3.0, scale="mean").any()


def test_detect_sinks_exclusive_mean_on_unnormalised_input():
    # no row normalisation: the closed form does not apply, the definition does
    gen = torch.Generator().manual_seed(3)
    attn = torch.rand(2, 6, 6, generator=gen, dtype=torch.float64) * 4
    for eps in (0.0, 1.0, 2.5):
        got = detect_sinks(attn, eps)
        for b in range(2):
            assert got[b].tolist() == brute_sinks(attn[b].sum(0).tolist(), eps)


def test_threshold_is_strict():
    # S = 4, ϵ = 2: threshold 1 + 2 * 3/4 = 2.5; every value below is exact in binary
    at = torch.tensor([0.625, 0.125, 0.125, 0.125]).expand(4, 4)  # c = [2.5, .5, .5, .5]
    assert not detect_sinks(at, 2.0).any()
    above = torch.tensor([0.75, 0.25 / 3, 0.25 / 3, 0.25 / 3]).expand(4, 4)  # c_0 = 3
    assert detect_sinks(above, 2.0).tolist() == [True, False, False, False]
    # mean scale, S = 2, ϵ = 0.5: threshold 1/2 + 0.5 * 1/2 = 0.75 and c_0 = 0.75 exactly
    at_mean = torch.tensor([[0.75, 0.25], [0.75, 0.25]])
    assert not detect_sinks(at_mean, 0.5, scale="mean").any()
    assert detect_sinks(at_mean, 0.49, scale="mean").tolist() == [True, False]


def test_uniform_attention_has_no_sinks_even_at_zero():
    attn = torch.full((3, 8, 8), 1 / 8)
    assert not detect_sinks(attn, 0.0).any()
    assert not detect_sinks(attn, 0.0, scale="mean").any()
    assert non_sink_fraction(attn, (0.0,)) == {0.0: 1.0}


def test_batch_dims_match_per_slice():
    attn = random_maps(2, 3, 4, 10, 10, seed=7)
    got = detect_sinks(attn, 2.0)
    assert got.shape == (2, 3, 4, 10)
    for idx in [(0, 0, 0), (1, 2, 3), (0, 1, 2)]:
        assert torch.equal(got[idx], detect_sinks(attn[idx], 2.0))
    assert detect_sinks(attn[0, 0, 0], 2.0).shape == (10,)  # no leading dims at all


def test_half_precision_is_upcast():
    attn = random_maps(2, 8, 8).to(torch.bfloat16)
    assert received_attention(attn).dtype == torch.float32


# --- non-sink fraction -------------------------------------------------------------------


def test_non_sink_fraction_matches_python_loop():
    attn = random_maps(2, 3, 12, 12, seed=11)
    got = non_sink_fraction(attn, EPSILONS)
    nested = attn.sum(-2).tolist()  # [2][3][12]
    for eps in EPSILONS:
        flags = [f for per_b in nested for c_row in per_b for f in brute_sinks(c_row, eps)]
        assert got[eps] == pytest.approx(sum(not f for f in flags) / len(flags))
    assert got[0.0] < 1.0 and got[10.0] == 1.0


def test_sink_counts_accumulate_over_steps():
    steps = [random_maps(2, 2, 9, 9, seed=s) for s in range(3)]
    total = {e: [0, 0] for e in EPSILONS}
    for attn in steps:  # what a streaming recorder does
        for e, (non, n) in sink_counts(attn, EPSILONS).items():
            total[e][0] += non
            total[e][1] += n
    whole = non_sink_fraction(torch.stack(steps), EPSILONS)
    for e in EPSILONS:
        assert total[e][1] == 3 * 2 * 2 * 9
        assert total[e][0] / total[e][1] == pytest.approx(whole[e])
    assert set(sink_counts(steps[0], 3).keys()) == {3.0}  # a single ϵ is accepted


# --- sink mass and value norms -------------------------------------------------------


def sink_front_map(size):
    """Sink at 0 (one-hot row); every other query gives 1/2 to the sink, the rest uniform."""
    attn = torch.full((size, size), 0.5 / (size - 1), dtype=torch.float64)
    attn[:, 0] = 0.5
    attn[0] = 0.0
    attn[0, 0] = 1.0
    return attn


def test_sink_mass_known_share():
    size = 8
    attn = sink_front_map(size).expand(2, 3, size, size)
    assert sink_mass(attn, 0, exclude_query_index=0).item() == pytest.approx(0.5)
    assert sink_mass(attn, 0).item() == pytest.approx((1 + 0.5 * (size - 1)) / size)
    mask = torch.zeros(size, dtype=torch.bool)
    mask[0] = True
    assert sink_mass(attn, mask, exclude_query_index=[0]).item() == pytest.approx(0.5)
    # two keys: the sink plus one ordinary key that gets 0.5/(S-1) from every content row
    assert sink_mass(attn, [0, 3], exclude_query_index=0).item() == pytest.approx(0.5 + 0.5 / (size - 1))
    # a sink at the end, addressed with a negative index
    flipped = attn.flip(-1).flip(-2)
    assert sink_mass(flipped, -1, exclude_query_index=-1).item() == pytest.approx(0.5)


def test_sink_mass_random_against_loop_and_keep_leading():
    attn = random_maps(3, 2, 2, 6, 6, seed=5)  # [L, B, H, S, S]
    keys, dropped = [1, 4], [1]
    per_layer = sink_mass(attn, keys, exclude_query_index=dropped, keep_leading=1)
    assert per_layer.shape == (3,)
    for layer in range(3):
        num = den = 0.0
        for b in range(2):
            for h in range(2):
                for i in range(6):
                    if i in dropped:
                        continue
                    row = attn[layer, b, h, i].tolist()
                    num += sum(row[k] for k in keys)
                    den += sum(row)
        assert per_layer[layer].item() == pytest.approx(num / den)
        assert sink_mass(attn[layer], keys, exclude_query_index=dropped).item() == pytest.approx(num / den)


def test_value_norms_against_loop():
    gen = torch.Generator().manual_seed(2)
    values = torch.randn(2, 3, 4, 5, generator=gen)  # [B, KVH, S, d]
    got = value_norms(values)
    assert got.shape == (2, 4)
    for b in range(2):
        for j in range(4):
            per_head = [math.sqrt(sum(x * x for x in values[b, m, j].tolist())) for m in range(3)]  # eq. 15
            assert got[b, j].item() == pytest.approx(sum(per_head) / 3, rel=1e-5)  # eq. 16
    assert value_norms(values[0]).shape == (4,)  # [M, S, d]


# --- moving sinks --------------------------------------------------------------------


def test_largest_sink():
    attn = torch.stack([sink_front_map(6), sink_front_map(6).flip(-1).flip(-2), torch.full((6, 6), 1 / 6)])
    assert largest_sink(attn).tolist() == [0, 5, 0]  # uniform: ties go to the first key
    assert largest_sink(attn, epsilon=1.0).tolist() == [0, 5, -1]
    assert largest_sink(attn, epsilon=10.0).tolist() == [-1, -1, -1]
    maps = random_maps(4, 2, 3, 7, 7, seed=9)  # [T, L, H, S, S]
    stacked = largest_sink_positions(maps, epsilon=2.0)
    assert stacked.shape == (4, 2, 3)
    assert torch.equal(stacked, largest_sink_positions(list(maps), epsilon=2.0))
    assert torch.equal(largest_sink_positions(maps), maps.sum(-2).argmax(-1))


def hand_sets():
    """[T=4, 2, S=5]: entry 0 moves ({0}, {0}, {0, 3}, {}), entry 1 never has a sink."""
    sets = torch.zeros(4, 2, 5, dtype=torch.bool)
    sets[0, 0, 0] = sets[1, 0, 0] = sets[2, 0, 0] = sets[2, 0, 3] = True
    return sets


def test_sink_set_change_rate_and_jaccard():
    sets = hand_sets()
    # entry 0: pairs same, differ, differ; entry 1: empty -> empty never changes
    assert sink_set_change_rate(sets).item() == pytest.approx(2 / 6)
    torch.testing.assert_close(sink_set_change_rate(sets, keep_leading=1), torch.tensor([2 / 3, 0.0]))
    # Jaccard entry 0: 1, 1/2, 0; entry 1: 1 (both empty) three times
    assert sink_set_jaccard(sets).item() == pytest.approx((1 + 0.5 + 0 + 3) / 6)
    torch.testing.assert_close(sink_set_jaccard(sets, keep_leading=1), torch.tensor([0.5, 1.0]))
    assert sink_set_change_rate(sets[:, 0]).item() == pytest.approx(2 / 3)  # [T, S]


def test_moving_sinks_over_content_keys_compare_like_for_like():
    """{0, 5} -> {0, 9} with the extra sink at key 0 is the same move as {5} -> {9} without one: over
    every key the first scores Jaccard 1/3 and the second 0; over the content keys both score 0."""
    with_sink, without = torch.zeros(2, 12, dtype=torch.bool), torch.zeros(2, 12, dtype=torch.bool)
    with_sink[0, [0, 5]] = with_sink[1, [0, 9]] = True
    without[0, 5] = without[1, 9] = True
    content = torch.ones(12, dtype=torch.bool)
    content[0] = False
    assert sink_set_jaccard(with_sink).item() == pytest.approx(1 / 3)  # the named alternative: every key
    assert sink_set_jaccard(without).item() == 0.0
    assert sink_set_jaccard(with_sink, key_mask=content).item() == 0.0
    assert sink_set_jaccard(with_sink, key_mask=list(range(1, 12))).item() == 0.0  # positions work too
    assert sink_set_change_rate(with_sink, key_mask=content).item() == sink_set_change_rate(without).item() == 1.0
    # a step where only the extra sink stays: the content sets are empty on both sides, Jaccard 1
    only = torch.zeros(2, 12, dtype=torch.bool)
    only[:, 0] = True
    assert sink_set_jaccard(only, key_mask=content).item() == 1.0
    assert sink_set_change_rate(only, key_mask=content).item() == 0.0


def test_largest_sink_change_rate_and_extra_share():
    assert largest_sink_change_rate(torch.tensor([3, 3, 5, 3])).item() == pytest.approx(2 / 3)
    pos = torch.tensor([[[1, 1], [2, 2]], [[1, 0], [2, 2]]])  # [T=2, L=2, H=2]
    torch.testing.assert_close(largest_sink_change_rate(pos, keep_leading=1), torch.tensor([0.5, 0.0]))
    lh = torch.tensor([[0, 0, 5], [0, -1, 2]])  # [L, H]
    assert extra_sink_share(lh, 0).item() == pytest.approx(3 / 6)
    assert extra_sink_share(lh, [0, 2]).item() == pytest.approx(4 / 6)
    torch.testing.assert_close(extra_sink_share(lh, [0], keep_leading=1), torch.tensor([2 / 3, 1 / 3]))


# --- token types ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token_id", "text", "expected"),
    [
        (99, "whatever", "mask"),
        (1, " ", "whitespace"),
        (1, "\n\n", "whitespace"),
        (1, "Ġ", "whitespace"),  # byte-level BPE space
        (1, "ĊĊ", "whitespace"),  # byte-level BPE newlines
        (1, "▁", "whitespace"),  # SentencePiece space
        (1, ",", "punctuation"),
        (1, " .", "punctuation"),
        (1, "Ġ?", "punctuation"),
        (1, "+", "punctuation"),
        (1, "the", "other"),
        (1, " the", "other"),
        (1, "3", "other"),
        (1, "", "other"),
        (7, "[SINK]", "sink"),
    ],
)
def test_token_type(token_id, text, expected):
    assert token_type(token_id, text, mask_id=99, sink_ids={7}) == expected


def test_token_type_sink_only_when_asked():
    assert token_type(7, "[SINK]", mask_id=99) == "other"


def test_count_token_types():
    vocab = ["a", " ", ",", "Ċ", "[MASK]"]
    calls = []

    def decode(i):
        calls.append(i)
        return vocab[i]

    ids = torch.tensor([[4, 4, 1, 0], [2, 3, 4, 0]])
    counts = count_token_types(ids, decode, mask_id=4)
    assert counts == {"mask": 3, "whitespace": 2, "punctuation": 1, "other": 2}
    assert sorted(calls) == [0, 1, 2, 3, 4]  # one decode per distinct id
    assert count_token_types([0, 2], vocab, mask_id=4) == {"other": 1, "punctuation": 1}
    # counting the tokens under sinks of one sequence across [L, H]
    xt = torch.tensor([4, 0, 1])
    is_sink = torch.tensor([[[True, False, False], [False, False, True]]])  # [L=1, H=2, S=3]
    assert count_token_types(xt.expand_as(is_sink)[is_sink], vocab, mask_id=4) == {"mask": 1, "whitespace": 1}


# --- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: detect_sinks(a, -1.0), "epsilon"),
        (lambda a: detect_sinks(a, float("nan")), "epsilon"),
        (lambda a: non_sink_fraction(a, (3.0, -0.5)), "epsilon"),
        (lambda a: non_sink_fraction(a, ()), "epsilons"),
        (lambda a: detect_sinks(a, 3.0, scale="max"), "scale"),
        (lambda a: received_attention(a, scale="Sum"), "scale"),
        (lambda a: detect_sinks(a[..., :3]), "square"),
        (lambda a: detect_sinks(a[0, 0, 0]), "S, S"),
        (lambda a: detect_sinks(torch.ones(2, 1, 1)), "at least 2 keys"),
        (lambda a: sink_mass(a, 4), "out of range"),
        (lambda a: sink_mass(a, []), "selects no position"),
        (lambda a: sink_mass(a, torch.ones(3, dtype=torch.bool)), "shape"),
        (lambda a: sink_mass(a, 0, exclude_query_index=[0, 1, 2, 3]), "every query"),
        (lambda a: sink_mass(a, 0, keep_leading=3), "keep_leading"),
        (lambda a: largest_sink(a, epsilon=-2), "epsilon"),
        (lambda a: largest_sink_positions([]), "empty"),
        (lambda a: value_norms(torch.ones(4, 5)), "M, S, d"),
        (lambda a: sink_set_change_rate(torch.zeros(1, 4, dtype=torch.bool)), "T >= 2"),
        (lambda a: sink_set_jaccard(torch.zeros(3, 4)), "dtype"),
        (lambda a: largest_sink_change_rate(torch.tensor([1])), "T >= 2"),
        (lambda a: extra_sink_share(torch.tensor([1, 2]), [-1]), "non-negative"),
        (lambda a: extra_sink_share(torch.tensor([1.0]), [0]), "integer"),
    ],
)
def test_bad_input_raises(call, message):
    attn = torch.full((2, 1, 4, 4), 0.25)
    with pytest.raises(ValueError, match=message):
        call(attn)


def test_query_mask_leaves_the_extra_sinks_forced_row_out():
    """A planted map, S = 64: the extra sink (column 0) gets 3.5 units from the 63 content queries;
    its own eq. 6 row adds 1 more. Counted on content queries it is not a sink at ϵ = 3
    (3.5 < 59.5/63 + 3 = 3.94); with every row counted it is (4.5 > 59.5/63 + 3)."""
    s = 64
    attn = torch.zeros(s, s, dtype=torch.float64)
    attn[0, 0] = 1.0  # the sink's own row, one-hot (eq. 6)
    attn[1:, 0] = 3.5 / 63  # content rows: 3.5 units in total on the sink
    attn[1:, 1:] = (1 - 3.5 / 63) / 63  # the rest spread evenly over the content keys
    assert torch.allclose(attn.sum(-1), torch.ones(s, dtype=torch.float64))
    content = torch.ones(s, dtype=torch.bool)
    content[0] = False
    c_all = received_attention(attn)
    c_content = received_attention(attn, query_mask=content)
    assert float(c_all[0]) == pytest.approx(4.5) and float(c_content[0]) == pytest.approx(3.5)
    assert bool(detect_sinks(attn, 3.0)[0])  # the one-hot row tips it over
    assert not bool(detect_sinks(attn, 3.0, query_mask=content)[0])
    # the mean scale divides by the number of counted queries
    assert float(received_attention(attn, "mean", query_mask=content)[0]) == pytest.approx(3.5 / 63)
    with pytest.raises(ValueError, match="query_mask"):
        received_attention(attn, query_mask=torch.zeros(s, dtype=torch.bool))
    with pytest.raises(ValueError, match="query_mask"):
        received_attention(attn, query_mask=torch.ones(s - 1, dtype=torch.bool))
