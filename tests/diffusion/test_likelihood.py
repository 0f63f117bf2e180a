"""Likelihood estimators (docs/method.md §1) against brute-force enumeration and a plain chain-rule loop."""

from __future__ import annotations

import itertools

import pytest
import torch

from sinkdlm import DiffusionLM, ModelConfig, loglikelihood


def tiny_model(seed: int = 0, **kw) -> DiffusionLM:
    cfg = dict(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, initializer_range=0.3, num_sink_tokens=1,
    )
    torch.manual_seed(seed)
    return DiffusionLM(ModelConfig(**{**cfg, **kw})).double().eval()


@torch.no_grad()
def logp_masked(model, prefix, cont, pattern, score=None) -> float:
    """sum_{i in score} log p(y_i | prefix, y with the pattern's positions masked); score = pattern."""
    mask_id = model.config.mask_token_id
    x = torch.tensor(prefix + cont)
    for i in pattern:
        x[len(prefix) + i] = mask_id
    logp = torch.log_softmax(model(x[None]).logits[0], -1)
    return sum(float(logp[len(prefix) + i, cont[i]]) for i in (pattern if score is None else score))


def brute_force_elbo(model, prefix, cont, eps: float) -> float:
    """E_{t~U(eps,1]} E_m [ sum_{i in m} log p_i / t ] by enumerating every masking pattern m:
    P(m | t) / t = t^{|m|-1} (1-t)^{n-|m|}, integrated over t in closed form (numerically here)."""
    n = len(cont)
    ts = torch.linspace(eps, 1.0, 200001, dtype=torch.float64)
    total = 0.0
    for k in range(1, n + 1):
        weight = torch.trapezoid(ts ** (k - 1) * (1 - ts) ** (n - k), ts) / (1 - eps)
        for pattern in itertools.combinations(range(n), k):
            total += float(weight) * logp_masked(model, prefix, cont, pattern)
    return total


PREFIX, CONT = [3, 17, 5, 9], [21, 8]


@pytest.mark.parametrize("method,eps", [("mc", 1e-3), pytest.param("mc", 0.05, marks=pytest.mark.slow),
                                        ("mc_count", 0.0)])
def test_elbo_equals_brute_force_enumeration(method, eps):
    model = tiny_model()
    want = brute_force_elbo(model, PREFIX, CONT, eps)
    few = loglikelihood(model, PREFIX, CONT, mc_num=128, method=method, eps=eps, seed=0)
    assert abs(float(few.logprob) - want) < 3 * float(few.stderr), (float(few.logprob), want, float(few.stderr))
    many = loglikelihood(model, PREFIX, CONT, mc_num=20000, method=method, eps=eps, seed=1, batch_size=2048)
    assert abs(float(many.logprob) - want) < max(3 * float(many.stderr), 1e-9)
    assert float(many.stderr) < 0.02 * abs(want)  # "closely"
    assert many.num_forward <= 20000


def test_count_estimator_is_exact_for_one_token():
    """One continuation token: every 'mc_count' sample is log p(y | prefix) itself (LLaDA: mc_num=1)."""
    model = tiny_model()
    exact = logp_masked(model, PREFIX, [21], [0])
    one = loglikelihood(model, PREFIX, [21], mc_num=1, method="mc_count", seed=0)
    assert float(one.logprob) == pytest.approx(exact, rel=1e-6)
    chain = loglikelihood(model, PREFIX, [21], method="chain")
    assert float(chain.logprob) == pytest.approx(exact, rel=1e-6) and float(chain.stderr) == 0.0


def test_chain_rule_matches_plain_loop():
    model = tiny_model(num_sink_tokens=2, sink_position="end")
    cont = [21, 8, 30, 2]
    n = len(cont)
    want = sum(logp_masked(model, PREFIX, cont, range(k, n), score=[k]) for k in range(n))  # y_<k clean
    got = loglikelihood(model, PREFIX, cont, method="chain")
    assert float(got.logprob) == pytest.approx(want, rel=1e-6)
    assert got.num_forward == len(cont)


def test_batched_requests_equal_one_at_a_time():
    """Different lengths, batched with left padding and any batch size: the same numbers."""
    model = tiny_model()
    prefixes = [[3, 17, 5, 9], [1], [7, 7, 2], []]
    conts = [[21, 8], [4, 5, 6], [9], [11, 12]]
    chain = loglikelihood(model, prefixes, conts, method="chain", batch_size=3)
    for i, (p, c) in enumerate(zip(prefixes, conts)):
        alone = loglikelihood(model, p, c, method="chain")
        assert float(chain.logprob[i]) == pytest.approx(float(alone.logprob), rel=1e-6)
    kw = dict(mc_num=16, seed=5)
    ref = loglikelihood(model, prefixes, conts, batch_size=64, **kw)
    for bs in (1, 7):
        got = loglikelihood(model, prefixes, conts, batch_size=bs, **kw)
        assert torch.allclose(got.logprob, ref.logprob, atol=1e-9) and torch.allclose(got.stderr, ref.stderr, atol=1e-9)
    first = loglikelihood(model, prefixes[0], conts[0], **kw)  # request 0 draws first from the seed
    assert float(first.logprob) == pytest.approx(float(ref.logprob[0]), rel=1e-6)
    assert ref.logprob.shape == ref.stderr.shape == (4,)
    two_d = loglikelihood(model, torch.tensor([PREFIX, PREFIX]), torch.tensor([CONT, [1, 2]]), method="chain")
    assert two_d.logprob.shape == (2,)


def test_sink_cache_on_equals_off_and_seed_repeats():
    model = tiny_model(num_sink_tokens=2)
    with model.sink_cache_mode(True):
        a = loglikelihood(model, PREFIX, CONT, mc_num=32, seed=3)
    with model.sink_cache_mode(False):
        b = loglikelihood(model, PREFIX, CONT, mc_num=32, seed=3)
    assert torch.equal(a.logprob, b.logprob) and torch.equal(a.stderr, b.stderr)
    c = loglikelihood(model, PREFIX, CONT, mc_num=32, seed=4)
    assert not torch.equal(a.logprob, c.logprob)


def test_shift_logits_scores_with_the_previous_position():
    model = tiny_model()
    cont = [21, 8]
    mask_id = model.config.mask_token_id
    x = torch.tensor([PREFIX + [mask_id, mask_id], PREFIX + [21, mask_id]])
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits, -1)
    p = len(PREFIX)
    want = float(logp[0, p - 1, 21] + logp[1, p, 8])  # position i-1 predicts token i
    model.config.shift_logits = True  # read from the model, as every estimator does
    got = loglikelihood(model, PREFIX, cont, method="chain")
    assert float(got.logprob) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((PREFIX, []), {}, "continuation 0 is empty"),
        ((PREFIX, CONT), dict(method="exact"), "method must be one of"),
        ((PREFIX, CONT), dict(mc_num=0), "mc_num must be"),
        ((PREFIX, CONT), dict(batch_size=0), "batch_size must be"),
        ((PREFIX, CONT), dict(eps=1.0), "eps must lie"),
        (([PREFIX, PREFIX], [CONT]), {}, "both be one sequence or both N"),
        ((PREFIX, [[1], [2]]), {}, "both be one sequence or both N"),
        (([1] * 62, CONT), {}, "is longer than the model.s .* positions"),
        ((PREFIX, [99]), {}, "vocab_size"),
        (([], CONT), dict(shift_logits=True), "shift_logits needs a prefix"),  # a model config field
        ((torch.tensor([1.0]), CONT), {}, "integer token ids"),
    ],
)
def test_bad_input_raises_clear_errors(args, kwargs, match):
    model = tiny_model()
    kwargs = dict(kwargs)
    if kwargs.pop("shift_logits", False):
        model.config.shift_logits = True
    with pytest.raises(ValueError, match=match):
        loglikelihood(model, *args, **kwargs)
