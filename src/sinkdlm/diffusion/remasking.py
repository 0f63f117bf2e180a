"""Which masked positions a reverse step commits, and how many (docs/method.md §2): LLaDA's and
Dream's schedules and remasking rules, the sampling filters (top-p, top-k) and the Gumbel noise.

Two schedules (`schedule=`) say how many positions a block's step commits:
  * "llada": the block's masked count spread evenly over its steps, remainder first
    (`transfer_schedule`, LLaDA's `get_num_transfer_tokens`);
  * "dream": Dream's `diffusion_generate`: timesteps `t_i = linspace(1, eps, steps + 1)`; the step
    t -> s commits `int(n_masked * (1 - s/t))` positions and the last step every remaining mask
    (`dream_counts`, computed in float32 as Dream does, so the counts are Dream's own).

The remasking rule (`remasking=`) says which ones, and what is predicted there (`predict`, `select`):
  * LLaDA: "low_confidence" (probability of the predicted token), "random" (uniform scores);
  * Dream's `alg`: "maskgit_plus" (probability of the chosen token), "topk_margin" (top-1 minus
    top-2 probability), "entropy" (negative entropy of the prediction) and "origin" (every mask is
    revealed independently with probability 1 - s/t, its token drawn; schedule "dream" only).
  `alg_temp > 0` draws the committed positions instead of taking the top k: k draws without
  replacement from softmax(confidence / alg_temp) (Dream's `torch.multinomial`), done here as
  Gumbel-top-k, which has the same distribution.

Sampling controls follow Dream's `sample_tokens`: the logits are divided by `temperature`, then
top-p and then top-k remove tokens, and the prediction is drawn from (at temperature 0: the argmax
of) what is left. Draws use float64 Gumbel noise from the caller's generator (LLaDA's choice), so a
fixed generator repeats the output; the draws are Dream's in distribution, not its random stream.

Every draw goes through `uniform`, whose `generator` is torch's global one (None), one `torch.Generator`
shared by the batch, or `RowGenerators`: one stream per row, so that a row's draws never depend on the
rows batched with it (what `generate(seed=...)` uses: each row gets exactly the tokens it gets alone).
"""

from __future__ import annotations

import numpy as np
import torch

REMASKING = ("low_confidence", "random", "maskgit_plus", "topk_margin", "entropy", "origin")
SCHEDULES = ("llada", "dream")
# The rules whose confidence is the probability of the predicted token: what threshold decoding compares.
PROBABILITY_RULES = ("low_confidence", "maskgit_plus")
# Each model family's sampler when `schedule`/`remasking` are not given (`ModelConfig.family`);
# Dream's is "entropy", the alg of its README's examples (`diffusion_generate`'s own fallback is "origin").
FAMILY_DEFAULTS = {"llada": ("llada", "low_confidence"), "dream": ("dream", "entropy")}


def resolve_rule(family: str, schedule: str | None, remasking: str | None, threshold) -> tuple[str, str]:
    """(schedule, remasking) with None filled from the model family; threshold decoding, which compares
    a probability, takes the family's probability rule (Fast-dLLM's)."""
    default_schedule, default_remasking = FAMILY_DEFAULTS[family]
    if remasking is None and threshold is not None:
        remasking = "maskgit_plus" if family == "dream" else "low_confidence"
    return schedule or default_schedule, remasking or default_remasking


def check_rule(schedule, remasking, *, threshold, temperature, alg_temp, top_p, top_k, eps) -> None:
    """Every user error of the remasking settings, one line each, before any work starts."""
    if remasking not in REMASKING:
        raise ValueError(f"remasking must be one of {', '.join(REMASKING)} (the last four are Dream's `alg` names), "
                         f"got {remasking!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    from types import SimpleNamespace

    from sinkdlm.config.checks import check_sampler_values

    check_sampler_values(SimpleNamespace(temperature=temperature, alg_temp=alg_temp, top_p=top_p, top_k=top_k, eps=eps))
    if remasking == "origin" and schedule != "dream":
        raise ValueError("remasking='origin' reveals each mask with probability 1 - s/t, which only "
                         "schedule='dream' defines; use schedule='dream'")
    if threshold is not None and remasking not in PROBABILITY_RULES:
        raise ValueError(f"threshold decoding needs a probability confidence: remasking "
                         f"{' or '.join(PROBABILITY_RULES)}, got {remasking!r}")
    if alg_temp and (remasking in ("random", "origin") or threshold is not None):
        raise ValueError("alg_temp samples the committed positions from their confidences: it needs a confidence "
                         "rule (low_confidence, maskgit_plus, topk_margin, entropy) and no threshold")


# ----------------------------------------------------------------------------- randomness
class RowGenerators:
    """One random stream per row of a batch (`generators[i]` draws row i's numbers and nothing else).

    A draw of shape `[B, ...]` takes `[...]` from each row's generator in turn, so row i consumes its stream
    exactly as it would alone (`torch.rand([1, ...])` and `torch.rand([...])` read the same numbers).
    `active`: the rows that draw at this step (None: all). A row whose block is finished draws nothing
    (alone, its loop would have moved on to the next block), and its numbers are then a constant that is
    never used, so an adaptive step count (threshold decoding, `origin`) keeps every row's stream its own."""

    def __init__(self, generators):
        self.generators = list(generators)
        self.active: list[int] | None = None

    def uniform(self, shape, device) -> torch.Tensor:
        if len(shape) == 0 or shape[0] != len(self.generators):
            raise ValueError(f"RowGenerators holds {len(self.generators)} rows' streams; a draw of shape "
                             f"{tuple(shape)} is not one row each")
        out = torch.full(tuple(shape), 0.5, dtype=torch.float64, device=device)
        for i in range(len(self.generators)) if self.active is None else self.active:
            out[i] = torch.rand(tuple(shape[1:]), generator=self.generators[i], device=device, dtype=torch.float64)
        return out


def uniform(shape, generator, device) -> torch.Tensor:
    """`shape` float64 numbers in [0, 1) from `generator`: None (torch's global generator), a
    `torch.Generator` (one stream for the whole batch) or `RowGenerators` (a stream per row)."""
    if isinstance(generator, RowGenerators):
        return generator.uniform(shape, device)
    return torch.rand(tuple(shape), generator=generator, device=device, dtype=torch.float64)


# ----------------------------------------------------------------------------- schedules
def transfer_schedule(num_masked: int, steps: int) -> list[int]:
    """LLaDA's `get_num_transfer_tokens`: `num_masked` spread over `steps`, remainder first."""
    base, rem = divmod(num_masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


def steps_per_block(steps: int, num_blocks: int) -> list[int]:
    """`steps / num_blocks` per block (LLaDA); a remainder goes to the first blocks."""
    base, rem = divmod(steps, num_blocks)
    return [base + (1 if b < rem else 0) for b in range(num_blocks)]


def dream_timesteps(steps: int, eps: float) -> torch.Tensor:
    """`[steps + 1]` Dream's timesteps `linspace(1, eps, steps + 1)`, float32 on the CPU (as Dream's)."""
    return torch.linspace(1, eps, steps + 1, dtype=torch.float32)


def dream_counts(num_masked: int, timesteps: torch.Tensor) -> list[int]:
    """Dream's count of every step of a block with `num_masked` masks, before any forward: `int(n (1 - s/t))`
    with t = t_i, s = t_{i+1} and n the masks left, and every mask at the last step. In float32 as Dream
    computes it (`mask_index.sum() / batch`; every row has the same count under a confidence rule), on
    the host (numpy's float32 rounds as torch's), so the loop never asks the device for a count."""
    ts = timesteps.numpy()  # float32
    counts = []
    for i in range(len(ts) - 1):
        k = num_masked if i == len(ts) - 2 else int(np.float32(num_masked) * (np.float32(1) - ts[i + 1] / ts[i]))
        counts.append(k)
        num_masked -= k
    return counts


def reveal_probability(timesteps: torch.Tensor, i: int) -> float:
    """`origin`'s chance that a mask is revealed at step i: 1 - s/t, and 1 at the last step."""
    return 1.0 if i == len(timesteps) - 2 else float(1 - timesteps[i + 1] / timesteps[i])


# ----------------------------------------------------------------------------- prediction
def add_gumbel_noise(logits: torch.Tensor, temperature: float, generator=None):
    """LLaDA's float64 Gumbel-max: `argmax exp(l) / (-log u)^T` samples softmax(l / T).

    float64 because in low precision the perturbation collapses ties and hurts quality (LLaDA).
    """
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    u = uniform(logits.shape, generator, logits.device)
    return logits.exp() / (-torch.log(u)) ** temperature


def gumbel(shape, generator, device) -> torch.Tensor:
    """Standard Gumbel noise `-log(-log u)`, float64: `argmax(z + g)` samples softmax(z)."""
    u = uniform(shape, generator, device)
    return -torch.log(-torch.log(u))


def filter_logits(logits: torch.Tensor, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """Dream's `top_p_logits` then `top_k_logits`: removed tokens get -inf (probability 0).

    top-p keeps the smallest prefix of the tokens sorted by probability whose mass reaches top_p (the
    token that crosses it included); top-k keeps the tokens at least as likely as the k-th."""
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative > top_p
        drop[..., 1:] = drop[..., :-1].clone()  # shift right: keep the token that crosses top_p
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter_(-1, order, drop), float("-inf"))
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def predict(logits: torch.Tensor, remasking: str, temperature: float, top_p, top_k,
            generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Block logits `[B, n, V]` -> (predicted tokens `[B, n]`, confidence `[B, n]`; None for origin).

    LLaDA's rules keep LLaDA's computation (Gumbel on the logits, confidence = softmax of the logits at
    the prediction); top-p/top-k, when set, first remove tokens from the tempered distribution.
    Dream's rules are its `sample_tokens` on the tempered, filtered distribution p."""
    if remasking in ("low_confidence", "random"):
        if top_p is not None or top_k is not None:
            keep = filter_logits(logits / temperature if temperature else logits, top_p, top_k) > float("-inf")
            logits = logits.masked_fill(~keep, float("-inf"))
        x0 = add_gumbel_noise(logits, temperature, generator).argmax(-1)
        if remasking == "low_confidence":
            conf = torch.softmax(logits, dim=-1).gather(-1, x0[..., None]).squeeze(-1)
        else:  # random remasking: a uniform score per position
            conf = uniform(x0.shape, generator, x0.device)
        return x0, conf
    z = filter_logits(logits / temperature if temperature else logits, top_p, top_k)
    probs = torch.softmax(z, dim=-1)  # [B, n, V]
    if temperature:
        x0 = (z.to(torch.float64) + gumbel(z.shape, generator, z.device)).argmax(-1)
    else:
        x0 = probs.argmax(-1)
    if remasking == "maskgit_plus":
        conf = probs.gather(-1, x0[..., None]).squeeze(-1)
    elif remasking == "topk_margin":
        top2 = probs.topk(2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    elif remasking == "entropy":  # negative entropy; Dream's 1e-10 keeps log finite at p = 0
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    else:  # origin: the positions are drawn before the step (`reveal_probability`), not ranked
        conf = None
    return x0, conf


def select(conf: torch.Tensor, masked: torch.Tensor, k: int | None, threshold: float | None,
           alg_temp: float = 0.0, generator=None) -> torch.Tensor:
    """Which masked positions to commit, `[B, n]` bool (never an unmasked one).

    k given (an int, or a count per row `[B]`): the k most confident, or with `alg_temp > 0` k drawn
    without replacement from
    softmax(conf / alg_temp) (Gumbel-top-k); every row has >= k masked (the schedules). threshold
    given (Fast-dLLM): every position above it, plus the most confident one."""
    if alg_temp:
        conf = conf.to(torch.float64) / alg_temp + gumbel(conf.shape, generator, conf.device)
    conf = conf.masked_fill(~masked, float("-inf"))
    if threshold is None and isinstance(k, torch.Tensor):  # a count per row `[B]` (a block model's rows differ)
        rank = conf.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)  # each position's rank in its row
        return (rank < k[:, None]) & masked
    if threshold is None:
        idx = conf.topk(k, dim=-1).indices
    else:
        idx = conf.argmax(-1, keepdim=True)
    pick = torch.zeros_like(masked).scatter_(-1, idx, True)
    if threshold is not None:
        pick |= conf > threshold
    return pick & masked
