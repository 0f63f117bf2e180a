"""Dream's samplers (`schedule="dream"`, remasking = Dream's `alg`) against Dream's `diffusion_generate`
written here from its published algorithm, on tiny random float64 models (docs/method.md §2).

The reference follows Dream's loop: timesteps `linspace(1, eps, steps + 1)` (float32, as Dream's), a full
forward per step with the logits shifted (row i-1 predicts token i), `sample_tokens` (temperature, top-p,
top-k, then the confidence of the alg), `int(n_masked * (1 - s/t))` commits of the top confidences, every
mask at the last step; `origin` reveals each mask with probability 1 - s/t. Two documented choices of
sinkdlm are shared with it: the [MASK] id is never predicted, and origin's uniforms are drawn `[B, gen_length]`
in float64 from the call's generator before the step's other draws (so, at temperature 0, the same
generator gives the same reveals). Temperature > 0 is checked for reproducibility and, by chi-square
tests, for the distribution of origin's reveal counts, of the drawn tokens and of alg_temp's positions.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from helpers import tiny_model
from sinkdlm import generate
from sinkdlm.config import ModelConfig

ALGS = ("maskgit_plus", "topk_margin", "entropy", "origin")


def dream_model(seed: int = 0, **kw):
    return tiny_model(seed, shift_logits=True, family="dream", **kw)


def prompt_rows(model, lengths=(5, 3), seed=1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.mask_token_id, (n,), generator=g) for n in lengths]


# ----------------------------------------------------------------------------- Dream's algorithm, written here
def top_p_logits(logits, top_p):
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove = cumulative > top_p
    remove[..., 1:] = remove[..., :-1].clone()
    remove[..., 0] = False
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_indices, remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_logits(logits, top_k):
    remove = logits < torch.topk(logits, min(top_k, logits.size(-1)))[0][..., -1, None]
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


def sample_tokens(logits, alg, top_p=None, top_k=None):
    """Dream's `sample_tokens` at temperature 0: (confidence of `alg`, argmax)."""
    if top_p is not None and top_p < 1:
        logits = top_p_logits(logits, top_p)
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    confidence, x0 = probs.max(dim=-1)
    if alg == "topk_margin":
        top = torch.sort(probs, dim=-1, descending=True)[0]
        confidence = top[:, 0] - top[:, 1]
    if alg == "entropy":
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


@torch.no_grad()
def dream_reference(model, rows, gen_length, steps, alg, *, eps=1e-3, top_p=None, top_k=None, generator=None):
    """Dream's `_sample` at temperature 0 on left-padded prompts (one block, no cache)."""
    mask_id = model.config.mask_token_id
    b, p = len(rows), max(len(r) for r in rows)
    x = torch.full((b, p + gen_length), mask_id, dtype=torch.long)
    attn = torch.ones(b, p + gen_length, dtype=torch.bool)
    for i, r in enumerate(rows):
        x[i, p - len(r):p] = r
        attn[i, :p - len(r)] = False
        x[i, :p - len(r)] = 0
    padded = not attn.all()
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = model(x, attention_mask=attn if padded else None).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        logits[..., mask_id] = float("-inf")  # sinkdlm never predicts [MASK]
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            u = torch.rand((b, gen_length), generator=generator, dtype=torch.float64)
            transfer = torch.zeros_like(mask_index)
            transfer[:, p:] = u < float(p_transfer)
            transfer &= mask_index
            _, x0 = sample_tokens(logits[transfer], alg, top_p, top_k)
            x[transfer] = x0
            continue
        confidence, x0 = sample_tokens(mask_logits, alg, top_p, top_k)
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        number = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full_confidence[mask_index] = confidence
        if number > 0:
            _, transfer_index = torch.topk(full_confidence, number)
            x_ = torch.zeros_like(x) + mask_id
            x_[mask_index] = x0
            row = torch.arange(b).unsqueeze(1).expand_as(transfer_index)
            x[row, transfer_index] = x_[row, transfer_index]
    return x[:, p:]


# ----------------------------------------------------------------------------- token identity at temperature 0
@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("gen_length,steps", [(8, 8), (12, 5), (10, 16), (16, 4)])
def test_dream_schedule_equals_dreams_algorithm(alg, gen_length, steps):
    model = dream_model(num_sink_tokens=1)
    rows = prompt_rows(model)
    want = dream_reference(model, rows, gen_length, steps, alg, generator=torch.Generator().manual_seed(3))
    out = generate(model, rows, gen_length=gen_length, steps=steps, remasking=alg, schedule="dream",
                   generator=torch.Generator().manual_seed(3), return_dict=True)
    got = out.sequences[:, out.prompt_length:]
    assert torch.equal(got, want), (alg, (got == want).float().mean().item())
    assert out.steps_taken == steps or alg == "origin"  # Dream runs every step, zero-commit ones included


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("top_p,top_k", [(0.5, None), (None, 3), (0.8, 4)])
def test_top_p_and_top_k_change_the_confidences_as_dreams(alg, top_p, top_k):
    model = dream_model(seed=2)
    rows = prompt_rows(model, (4, 6))
    want = dream_reference(model, rows, 12, 6, alg, top_p=top_p, top_k=top_k)
    got = generate(model, rows, gen_length=12, steps=6, remasking=alg, schedule="dream", top_p=top_p, top_k=top_k)
    assert torch.equal(got[:, -12:], want)


def test_a_dream_model_defaults_to_dreams_schedule_and_entropy():
    model = dream_model()
    rows = prompt_rows(model)
    want = dream_reference(model, rows, 8, 8, "entropy", eps=0.01)
    assert torch.equal(generate(model, rows, gen_length=8, steps=8, eps=0.01)[:, -8:], want)
    llada = tiny_model(shift_logits=True)  # the same weights, the LLaDA family: the even split
    assert torch.equal(generate(llada, rows, gen_length=8, steps=8),
                       generate(model, rows, gen_length=8, steps=8, schedule="llada", remasking="low_confidence"))


def test_the_schedules_differ_where_the_issue_says():
    """Dream's count of a step, int(n(1 - s/t)), is not the even split: at n = steps = 8 the first step
    commits int(8 * 0.999/8 ...) = 0 tokens (and the last several), LLaDA's one per step."""
    from sinkdlm.diffusion.remasking import dream_counts, dream_timesteps, transfer_schedule

    counts = dream_counts(8, dream_timesteps(8, 1e-3))
    want = []
    left = 8
    for i in range(8):  # the formula, in float64: differs from float32 only where it lands on an integer
        t, s = 1 - i * (1 - 1e-3) / 8, 1 - (i + 1) * (1 - 1e-3) / 8
        want.append(left if i == 7 else math.floor(left * (1 - s / t)))
        left -= want[-1]
    assert counts == want and sum(counts) == 8 and counts != transfer_schedule(8, 8)


@pytest.mark.parametrize("n,steps,eps", [(8, 8, 1e-3), (32, 7, 1e-3), (64, 64, 1e-3), (17, 5, 0.2), (256, 31, 1e-4)])
def test_the_counts_planned_on_the_host_are_dream_s_float32_counts(n, steps, eps):
    """Dream's own arithmetic, on torch float32 tensors: `mask_index.sum() / batch * (1 - s / t)`."""
    from sinkdlm.diffusion.remasking import dream_counts, dream_timesteps

    ts = torch.linspace(1, eps, steps + 1)
    left, want = torch.tensor(n) * 3 / 3, []  # a batch of 3 rows: float32, as Dream's
    for i in range(steps):
        want.append(int(left) if i == steps - 1 else int(left * (1 - ts[i + 1] / ts[i])))
        left = left - want[-1]
    assert dream_counts(n, dream_timesteps(steps, eps)) == want


# ----------------------------------------------------------------------------- temperature > 0
@pytest.mark.parametrize("alg", ALGS + ("low_confidence",))
def test_sampling_is_reproducible_with_a_fixed_generator(alg):
    model = dream_model()
    rows = prompt_rows(model)
    kw = dict(gen_length=8, steps=4, remasking=alg, schedule="dream", temperature=0.9, top_p=0.95, top_k=10,
              alg_temp=0.0 if alg == "origin" else 0.5)
    a = generate(model, rows, **kw, generator=torch.Generator().manual_seed(7))
    b = generate(model, rows, **kw, generator=torch.Generator().manual_seed(7))
    c = generate(model, rows, **kw, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a[:, -8:] != model.config.mask_token_id).all()


def chi_square_p(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value, bins with an expected count under 5 pooled into one."""
    n = observed.sum().item()
    expected = expected_probs.double() * n
    small = expected < 5
    obs = torch.cat([observed[~small].double(), observed[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    return float(stats.chisquare(obs[keep].numpy(), exp[keep].numpy() * obs[keep].sum().item() / exp[keep].sum().item()).pvalue)


ROWS = 600  # identical rows: at step 0 they see the same logits, so their draws are i.i.d.


def first_step(model, **kw):
    """The state after the first step of ROWS copies of one prompt (generation stops there)."""
    seen = []

    class Stop(Exception):
        pass

    def callback(state):
        seen.append(state)
        raise Stop

    prompt = prompt_rows(model, (4,))[0].expand(ROWS, -1)
    with pytest.raises(Stop):  # one stream for the batch: the copies' draws are independent (a seed gives each the same)
        generate(model, prompt, callback=callback, generator=torch.Generator().manual_seed(11), **kw)
    return seen[0], prompt


def test_origin_reveal_counts_are_binomial():
    """origin reveals each of the n masks with probability 1 - s/t: the count is Binomial(n, 1 - s/t)."""
    from sinkdlm.diffusion.remasking import dream_timesteps

    model = dream_model()
    n, steps = 8, 3
    state, _ = first_step(model, gen_length=n, steps=steps, remasking="origin", schedule="dream", temperature=1.0)
    ts = dream_timesteps(steps, 1e-3)
    q = float(1 - ts[1] / ts[0])
    counts = torch.bincount(state.committed.sum(-1), minlength=n + 1)
    pvalue = chi_square_p(counts, torch.tensor([stats.binom.pmf(j, n, q) for j in range(n + 1)]))
    assert pvalue > 1e-3, pvalue


def test_drawn_tokens_follow_the_tempered_filtered_distribution():
    """A token origin reveals at temperature T with top-k is drawn from softmax(l/T) restricted to the top k
    (origin chooses the positions independently of the values, so the revealed ones are an unbiased sample)."""
    model = dream_model()
    T, top_k, n = 0.7, 6, 8
    state, prompt = first_step(model, gen_length=n, steps=3, remasking="origin", schedule="dream", temperature=T,
                               top_k=top_k)
    col = prompt.shape[1]  # the first generated column; its prediction comes from the row before (shifted)
    with torch.no_grad():
        logits = model(state.input_ids[:1]).logits[0, col - 1].clone()
    logits[model.config.mask_token_id] = float("-inf")
    z = logits / T
    z[z < z.topk(top_k).values[-1]] = float("-inf")
    probs = torch.softmax(z, -1)
    counts = torch.bincount(state.x[state.committed[:, col], col], minlength=len(probs))
    assert counts[probs == 0].sum() == 0
    pvalue = chi_square_p(counts, probs)
    assert pvalue > 1e-3, pvalue


def test_alg_temp_draws_positions_from_the_softmax_of_the_confidences():
    """With alg_temp the first step's single commit (int(8 * (1 - t1)) = 1) lands on position j with
    probability softmax(confidence / alg_temp)_j: Dream's torch.multinomial."""
    model = dream_model()
    alg_temp, n = 0.05, 8
    state, prompt = first_step(model, gen_length=n, steps=4, remasking="maskgit_plus", schedule="dream",
                               alg_temp=alg_temp)
    assert (state.committed.sum(-1) == 1).all()
    p = prompt.shape[1]
    with torch.no_grad():
        logits = model(state.input_ids[:1]).logits[0, p - 1:p + n - 1].clone()  # rows predicting the block
    logits[:, model.config.mask_token_id] = float("-inf")
    conf = torch.softmax(logits, -1).max(-1).values
    expected = torch.softmax(conf / alg_temp, -1)
    counts = state.committed[:, p:].sum(0)
    pvalue = chi_square_p(counts, expected)
    assert pvalue > 1e-3, pvalue


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs,match", [
    (dict(remasking="confidence"), r"remasking must be one of low_confidence, random, maskgit_plus"),
    (dict(schedule="cosine"), r"schedule must be one of llada, dream"),
    (dict(top_p=0.0), r"top_p must lie in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must lie in \(0, 1\]"),
    (dict(top_k=0), r"top_k must be an integer >= 1"),
    (dict(alg_temp=-1.0), r"alg_temp must be a number >= 0"),
    (dict(eps=0.0), r"eps must lie in \(0, 1\)"),
    (dict(remasking="origin", schedule="llada"), r"only schedule='dream' defines"),
    (dict(remasking="entropy", threshold=0.9), r"threshold decoding needs a probability"),
    (dict(remasking="random", alg_temp=0.5), r"alg_temp samples the committed positions"),
])
def test_bad_settings_are_one_line_errors(kwargs, match):
    model = dream_model()
    with pytest.raises(ValueError, match=match) as e:
        generate(model, [1, 2, 3], gen_length=4, steps=4, **kwargs)
    assert "\n" not in str(e.value)


def test_family_is_checked_and_saved(tmp_path):
    with pytest.raises(ValueError, match="family must be one of llada, dream"):
        ModelConfig(family="mdlm")
    model = dream_model()
    model.save_pretrained(tmp_path)
    from sinkdlm import DiffusionLM

    assert DiffusionLM.from_pretrained(tmp_path).config.family == "dream"


# ----------------------------------------------------------------------------- the other samplers and commands
def test_top_k_one_makes_autoregressive_sampling_greedy():
    """top-k applies to the autoregressive path too: with k = 1 a draw at any temperature is the argmax."""
    model = tiny_model(causal=True, shift_logits=True, mask_token_id=None)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in (5, 3)]
    greedy = generate(model, rows, gen_length=6)
    assert torch.equal(generate(model, rows, gen_length=6, temperature=1.5, top_k=1, seed=4), greedy)
    assert not torch.equal(generate(model, rows, gen_length=6, temperature=1.5, seed=4), greedy)


def test_analyze_flags_build_the_sample_config():
    """`sinkdlm analyze --remasking ... --top-p ...` (flattened options) land in its SampleConfig."""
    from sinkdlm.cli.options import build_config
    from sinkdlm.config import AnalyzeConfig

    cfg = build_config(AnalyzeConfig, dict(gen_length=8, steps=None, block_length=None, remasking="topk_margin",
                                           schedule="dream", eps=None, alg_temp=0.3, top_p=0.9, top_k=None,
                                           out="o"))
    s = cfg.sample
    assert (s.remasking, s.schedule, s.eps, s.alg_temp, s.top_p, s.top_k) == ("topk_margin", "dream", 1e-3, 0.3, 0.9, None)


def test_python_generate_on_an_ar_model_refuses_exactly_the_diffusion_settings_given():
    """The library call runs the command line's one rule (config/checks.check_sample_settings): nothing a
    user gives is silently ignored, and the line names exactly what was given."""
    model = tiny_model(causal=True, shift_logits=True, mask_token_id=None)
    ids = [torch.tensor([1, 2, 3])]
    with pytest.raises(ValueError) as e:
        generate(model, ids, gen_length=4, remasking="entropy", schedule="dream")
    msg = str(e.value)
    assert "remasking=entropy and schedule=dream apply to diffusion decoding only" in msg and "cache" not in msg
    with pytest.raises(ValueError, match=r"cache=prefix applies to diffusion decoding only"):
        generate(model, ids, gen_length=4, cache="prefix")
    assert generate(model, ids, gen_length=4, steps=4).shape == (1, 7)  # one step per token: no conflict


def test_python_generate_speaks_the_users_words_when_steps_are_missing():
    with pytest.raises(ValueError) as e:
        generate(tiny_model(), [torch.tensor([1, 2, 3])], gen_length=4)
    assert "steps is required" in str(e.value) and "None" not in str(e.value)
