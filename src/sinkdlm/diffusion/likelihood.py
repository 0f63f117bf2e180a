"""Log-likelihood of a continuation given a prefix (docs/method.md §1), for multiple-choice evaluation.

`method="mc"` — the Monte-Carlo ELBO of docs/method.md §1 (SMDM/LLaDA eval): mask only the continuation y,
each position with probability t, `t_b = (u0 + b/B) mod 1` low-discrepancy over the `mc_num`
samples, and average `-sum_i 1[masked_i] CE_i / t` (eq. 3-4 without the 1/L):

    log p(y | p) >= E_t E_{xt|t} [ sum_{i masked} log p_theta(y_i | p, xt) / t ].

`method="mc_count"` — LLaDA's lower-variance form of the same bound: the number of masked tokens
l ~ U{1..|y|} (low-discrepancy), a uniformly random l-subset, weight |y|/l. With t ~ U(0, 1] the two
have the same expectation (given l masked tokens, E[1/t] = (|y|+1)/l); for a one-token
continuation every sample is the exact log-probability, so `mc_num=1` suffices.

`method="chain"` — the chain rule for short y: unmask y left to right, one position per forward,
`sum_k log p_theta(y_k | p, y_<k, [MASK]...)` (|y| forwards, deterministic; not a bound).

All forwards are batched across samples and requests (`batch_size` rows, left-padded). Samples that
mask nothing contribute exactly 0 and are not run. The standard error is the sample standard
deviation over sqrt(mc_num) — exact for i.i.d. t, conservative for the stratified t used here.
`loglikelihood` checks its requests (`_checked_requests`), draws each one's rows (`_request_rows`) into
the `_Batcher`, then reduces them per request (`_estimates`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sinkdlm.config.train import TrainConfig  # the one home of eps
from sinkdlm.diffusion.block import block_loglikelihood, xt_forward
from sinkdlm.diffusion.loss import weighted_masked_ce
from sinkdlm.diffusion.noise import forward_mask, sample_t
from sinkdlm.config.checks import check_int

MC_NUM = 128  # Monte-Carlo samples per request: LLaDA's setting, the default of loglikelihood and lm-eval

METHODS = ("mc", "mc_count", "chain")


@dataclass
class LoglikelihoodOutput:
    logprob: torch.Tensor  # [N] float64 (0-dim for one request): the ELBO ("mc*") or chain-rule log p
    stderr: torch.Tensor  # [N] Monte-Carlo standard error (0 for "chain"; nan for mc_num = 1)
    num_forward: int  # model rows actually run (samples masking nothing are skipped)
    method: str


def _rows(x, name: str) -> tuple[list[torch.Tensor], bool]:
    """Ids -> (list of 1-D long tensors, single?). One sequence: `[L]` tensor or list of ints."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer token ids, got dtype {x.dtype}")
        if x.dim() == 1:
            return [x.long().cpu()], True
        if x.dim() == 2:
            return [r.long().cpu() for r in x], False
        raise ValueError(f"{name} must be [length] or [batch, length], got shape {tuple(x.shape)}")
    if isinstance(x, Sequence) and not isinstance(x, (str, bytes)):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in x):  # [] is one empty sequence
            return [torch.tensor(list(x), dtype=torch.long)], True
        out = []
        for r in x:
            r = torch.as_tensor(r, dtype=torch.long) if not isinstance(r, torch.Tensor) else r.long().cpu()
            if r.dim() != 1:
                raise ValueError(f"each sequence in {name} must be 1-D token ids, got shape {tuple(r.shape)}")
            out.append(r)
        return out, False
    raise ValueError(f"{name} must be a tensor or a list of token ids, got {type(x).__name__}")


class _Batcher:
    """Collects rows (input, target, score mask, t) from many requests; runs them `batch_size` at a time.

    Rows arrive in blocks of one request (same length). Left padding aligns every row's end, so the
    continuations occupy the last columns and only those columns' logits enter the cross-entropy
    (`weighted_masked_ce`, the eq. 4 numerator).
    """

    def __init__(self, model, batch_size: int, shift_logits: bool):
        self.model, self.batch_size, self.shift_logits = model, batch_size, shift_logits
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.num_pending = 0
        self.values: list[torch.Tensor] = []  # per request [slots] float64 log-probability terms
        self.num_forward = 0

    def add(self, xt: torch.Tensor, x0: torch.Tensor, score: torch.Tensor, t: torch.Tensor) -> None:
        """One request's rows: xt, x0, score `[m, L]`, t `[m]`. Rows scoring nothing are exactly 0."""
        req = len(self.values)
        self.values.append(torch.zeros(len(xt), dtype=torch.float64))
        keep = score.any(-1).nonzero().squeeze(-1)
        if len(keep):
            self.pending.append((req, keep, xt[keep], x0[keep], score[keep], t[keep].double()))
            self.num_pending += len(keep)
        while self.num_pending >= self.batch_size:
            self._run(self._take(self.batch_size))

    def flush(self) -> None:
        while self.num_pending:
            self._run(self._take(self.batch_size))

    def _take(self, n: int):
        taken = []
        while n and self.pending:
            req, slots, xt, x0, score, t = self.pending[0]
            k = min(n, len(slots))
            taken.append((req, slots[:k], xt[:k], x0[:k], score[:k], t[:k]))
            if k == len(slots):
                self.pending.pop(0)
            else:
                self.pending[0] = (req, slots[k:], xt[k:], x0[k:], score[k:], t[k:])
            n -= k
            self.num_pending -= k
        return taken

    def _run(self, blocks) -> None:
        model = self.model
        device = model.device
        width = max(b[2].shape[1] for b in blocks)

        def left_pad(x, value):  # [m, L] -> [m, width]
            return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

        pad = model.config.mask_token_id or 0  # padding is never attended to; an AR model has no [MASK]
        xt = torch.cat([left_pad(b[2], pad) for b in blocks]).to(device)
        x0 = torch.cat([left_pad(b[3], 0) for b in blocks]).to(device)
        score = torch.cat([left_pad(b[4], False) for b in blocks]).to(device)
        real = torch.cat([left_pad(torch.ones_like(b[4]), False) for b in blocks]).to(device)
        t = torch.cat([b[5] for b in blocks]).to(device)
        # The head runs only on the columns some row scores (masked continuation tokens): the
        # largest matmul for 126k-151k vocabularies, and most columns are the unscored prefix.
        cols = score.any(0).nonzero().squeeze(-1)  # [K]
        attn = None if real.all() else real
        shift = 1 if self.shift_logits else 0  # logits[:, i-1] predicts x0[:, i]
        # The sinks' keys/values come from the sink cache outside training (bitwise equal to recomputing
        # them; `with model.sink_cache_mode(False):` around the call recomputes)
        logits = model(xt, attention_mask=attn, logits_index=cols - shift).logits  # [m, K, V]
        per_row = -weighted_masked_ce(logits, x0[:, cols], score[:, cols], t).cpu()
        self.num_forward += len(xt)
        start = 0
        for req, slots, *_ in blocks:
            self.values[req][slots] = per_row[start: start + len(slots)].double()
            start += len(slots)


def mc_draw(
    seq: torch.Tensor, prefix_length: int, mc_num: int, eps: float, mask_id: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `method="mc"` noise of one request: (xt, x0, masked `[mc, L]`, t `[mc]`).

    Only the continuation `seq[prefix_length:]` may be masked (docs/method.md §1); `t` is low-discrepancy
    over the samples. The one implementation of this draw: the sink ablation's
    `continuation_elbo` uses it too, so its K = 0 term equals `loglikelihood` draw for draw.
    """
    x0 = seq[None].expand(mc_num, -1)  # [mc, L]
    maskable = torch.zeros(mc_num, len(seq), dtype=torch.bool)
    maskable[:, prefix_length:] = True
    t = sample_t(mc_num, eps, low_discrepancy=True, generator=generator)  # [mc]
    xt, masked = forward_mask(x0, t, mask_id, maskable, generator=generator)
    return xt, x0, masked, t


@torch.no_grad()
def loglikelihood(
    model,
    prefix_ids,
    continuation_ids,
    mc_num: int = MC_NUM,
    *,
    method: str = "mc",
    batch_size: int = 32,
    eps: float = TrainConfig.eps,
    seed: int | Sequence[int] | None = None,
) -> LoglikelihoodOutput:
    """log p(continuation | prefix) of a masked diffusion LM (docs/method.md §1). See the module docstring.

    prefix_ids / continuation_ids: one sequence each (`[L]` tensor or list of ints; results are
                   0-dim) or N of each (`[N, L]` tensors or lists of sequences; results `[N]`).
                   The prefix may be empty (unconditional); the continuation may not.
    mc_num         Monte-Carlo samples per request ("mc", "mc_count"); LLaDA uses 128.
    method         "mc" (docs/method.md §1, masking probability t), "mc_count" (LLaDA's masked-count form),
                   "chain" (chain rule, |y| forwards per request).
    batch_size     model rows per forward.
    eps            "mc": t ~ U(eps, 1] as in training (bounds the 1/t weight).
    seed           the (CPU) randomness of t and the masks: a fixed seed repeats the estimate (None:
                   torch's global generator); the requests draw one after the other from it. A list of
                   one seed per request gives each request its own generator: its draws, and so its
                   estimate, then depend on nothing else in the call (how the evaluation batches).
    Read from the model: `config.shift_logits` (position i-1 predicts token i) and its sink-cache mode
    (`with model.sink_cache_mode(False):` recomputes the sinks' keys/values; the numbers are the same).

    An autoregressive model (`config.causal`) gets its exact log-likelihood, one forward per request
    (`method` is then reported as "exact", with standard error 0), docs/method.md §10. A block model
    (`config.block_size`) gets the block NELBO (`diffusion/block.py`, docs/method.md §13) from `mc_num` draws of
    the masked-count form in every block, one pass each request (reported as "block_nelbo"; `method` and
    `batch_size` do not apply).
    """
    cfg = model.config
    prefixes, conts, single = _checked_requests(cfg, prefix_ids, continuation_ids, mc_num, method, batch_size, eps)
    generators = _request_generators(seed, len(prefixes))
    if cfg.block_size is not None:  # a block model: the block NELBO, one x_t ⊕ x_0 pass a request (§13)
        lp_t, se_t = block_loglikelihood(model, prefixes, conts, mc_num, generators)
        return LoglikelihoodOutput(logprob=lp_t[0] if single else lp_t, stderr=se_t[0] if single else se_t,
                                   num_forward=len(prefixes), method="block_nelbo")
    batcher = _Batcher(model, batch_size, cfg.shift_logits)
    for pre, cont, generator in zip(prefixes, conts, generators):
        batcher.add(*_request_rows(cfg, pre, cont, method, mc_num, eps, generator))
    batcher.flush()
    if cfg.causal:
        method = "exact"
    lp_t, se_t = _estimates(batcher.values, method)
    if single:
        lp_t, se_t = lp_t[0], se_t[0]
    return LoglikelihoodOutput(logprob=lp_t, stderr=se_t, num_forward=batcher.num_forward, method=method)


def _request_generators(seed, n: int) -> list[torch.Generator | None]:
    """Each request's generator: one shared by all (an int seed), one per request (a list), or None
    (torch's global generator)."""
    if seed is None or isinstance(seed, int):
        shared = None if seed is None else torch.Generator().manual_seed(seed)
        return [shared] * n
    if len(seed) != n:
        raise ValueError(f"seed must be an int or a list of one seed per request ({n}), got {len(seed)} seeds")
    return [torch.Generator().manual_seed(int(s)) for s in seed]


def _checked_requests(cfg, prefix_ids, continuation_ids, mc_num: int, method: str, batch_size: int, eps: float):
    """Every user error of a `loglikelihood` call, before any forward: (prefixes, continuations, single?)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    check_int("mc_num", mc_num, 1)
    check_int("batch_size", batch_size, 1)
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps must lie in [0, 1), got {eps}")
    prefixes, single_p = _rows(prefix_ids, "prefix_ids")
    conts, single_c = _rows(continuation_ids, "continuation_ids")
    if single_p != single_c or len(prefixes) != len(conts):
        raise ValueError(
            f"prefix_ids and continuation_ids must both be one sequence or both N sequences "
            f"(got {len(prefixes)} prefix(es) and {len(conts)} continuation(s))"
        )
    for i, (pre, cont) in enumerate(zip(prefixes, conts)):
        if len(cont) == 0:
            raise ValueError(f"continuation {i} is empty; a likelihood needs at least one continuation token")
        if cfg.shift_logits and len(pre) == 0:
            raise ValueError(f"prefix {i} is empty; shift_logits needs a prefix token to predict the first one")
        both = torch.cat([pre, cont])
        if both.min() < 0 or both.max() >= cfg.vocab_size:
            raise ValueError(f"request {i}: token ids must lie in [0, vocab_size={cfg.vocab_size})")
        if len(both) > cfg.max_content_length:
            raise ValueError(
                f"request {i}: prefix + continuation = {len(both)} tokens is longer than the model's "
                f"{cfg.content_length_note()} positions; truncate the prefix"
            )
    return prefixes, conts, single_p


def _request_rows(cfg, pre: torch.Tensor, cont: torch.Tensor, method: str, mc_num: int, eps: float,
                  generator: torch.Generator | None):
    """One request's rows for `_Batcher.add`: (xt, x0, score `[m, L]`, t `[m]`) of its method."""
    seq = torch.cat([pre, cont])  # [L]
    lp, n, length = len(pre), len(cont), len(pre) + len(cont)
    mask_id = cfg.mask_token_id
    if cfg.causal:  # log p(y | x) = sum_k log p(y_k | x, y_<k), all from one causal forward
        score = torch.zeros(1, length, dtype=torch.bool)
        score[:, lp:] = True
        return seq[None], seq[None], score, torch.ones(1)
    if method == "chain":
        # Row k: y_<k clean, y_k.. masked; score position lp + k only.
        k = torch.arange(n)[:, None]
        cols = torch.arange(length)[None] - lp  # [1, L]
        xt = seq[None].expand(n, -1).masked_fill(cols >= k, mask_id)
        return xt, seq[None].expand(n, -1), cols == k, torch.ones(n)
    if method == "mc":
        return mc_draw(seq, lp, mc_num, eps, mask_id, generator)
    # "mc_count": l ~ U{1..n} stratified, a uniform l-subset, weight n / l
    u0 = torch.rand((), generator=generator)
    u = (u0 + torch.arange(mc_num) / mc_num) % 1.0
    count = (u * n).long().clamp(max=n - 1) + 1  # [mc] in 1..n
    ranks = torch.rand(mc_num, n, generator=generator).argsort(-1).argsort(-1)
    masked = torch.zeros(mc_num, length, dtype=torch.bool)
    masked[:, lp:] = ranks < count[:, None]
    x0 = seq[None].expand(mc_num, -1)  # [mc, L]
    return x0.masked_fill(masked, mask_id), x0, masked, count.double() / n


def _estimates(values: list[torch.Tensor], method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request (log-probability, standard error) `[N]` float64 from its rows' terms: the chain rule's
    (and an AR model's exact) sum, or the Monte-Carlo mean and its standard error over sqrt(mc_num)."""
    logprob, stderr = [], []
    for vals in values:
        slots = len(vals)
        if method in ("chain", "exact"):
            logprob.append(vals.sum())
            stderr.append(torch.zeros((), dtype=torch.float64))
        else:
            logprob.append(vals.mean())
            stderr.append(vals.std() / slots**0.5 if slots > 1 else torch.tensor(float("nan"), dtype=torch.float64))
    return torch.stack(logprob), torch.stack(stderr)


# ----------------------------------------------------------------------------- fixed validation of a study
# The experiment's validation loss (docs/method.md §1, "Validation of a study"): one fixed set of
# sequences and one fixed noise, drawn from `noise_seed`, for every run and variant of a study, so that
# a paired difference of two runs carries no noise of its own draws. LLaDA's masked-count form of
# eq. 3-4, stratified over l: for draw d of a sequence with M maskable positions,
#     u = (d + U) / D, U ~ U[0, 1),   l = floor(u M) + 1,   a uniform l-subset masked,
#     value = (1/l) * sum_{i masked} CE_i
# whose mean over l ~ U{1..M} is exactly E_t[(1/(t M)) sum_{i masked} CE_i] with t ~ U(0, 1]
# (given l, E[1/t] = (M + 1)/l), the per-token ELBO bound of eq. 3-4.
VALIDATION_ESTIMATOR = "masked_count_stratified"


@dataclass
class ValidationELBO:
    values: torch.Tensor  # [N, D] float64: per sequence and draw, (1/l) sum_masked CE (nats per token)
    val_loss: float  # mean over sequences and draws: the per-token ELBO bound
    val_loss_se: float  # its Monte-Carlo standard error (collapsed strata, `stratified_se`)


def validation_noise(num_sequences: int, length: int, draws: int, noise_seed: int,
                     first_maskable: int = 0, first_sequence: int = 0) -> torch.Tensor:
    """The fixed masks `[N, D, L]` bool of a study's validation: a function of the arguments only.

    Sequence n's draws come from their own generator, seeded by (noise_seed, n), so a slice of the
    set (`first_sequence` onwards, as a resumed validation scores it) gets the same noise as the whole.
    Positions before `first_maskable` are never masked (1 with shift_logits: position 0 has no
    logit before it). Draw d of every sequence has its masked count in stratum d of D (see above).
    """
    check_int("draws", draws, 2)
    if draws % 2:
        raise ValueError(f"draws must be even (its standard error pairs neighbouring strata), got {draws}")
    m = length - first_maskable
    if m < 1:
        raise ValueError(f"sequences of {length} tokens leave nothing to mask")
    masked = torch.zeros(num_sequences, draws, length, dtype=torch.bool)
    for i in range(num_sequences):
        gen = torch.Generator().manual_seed(noise_seed * 1_000_003 + first_sequence + i)
        u = (torch.arange(draws, dtype=torch.float64) + torch.rand(draws, generator=gen, dtype=torch.float64)) / draws
        count = (u * m).long().clamp(max=m - 1) + 1  # [D] in 1..M
        ranks = torch.rand(draws, m, generator=gen).argsort(-1).argsort(-1)  # a uniform permutation per draw
        masked[i, :, first_maskable:] = ranks < count[:, None]
    return masked


def stratified_se(values: torch.Tensor) -> float:
    """Monte-Carlo standard error of `values.mean()` for `values [N, D]`, D strata (in order) per row.

    One draw per stratum leaves no within-stratum variance to estimate; neighbouring strata are
    collapsed in pairs: Var(mean_d v_nd) ~= (1/D^2) sum_k (v_n,2k - v_n,2k+1)^2 (conservative: it
    adds the squared difference of the two strata's means). Sequences are independent given the
    fixed set: SE = sqrt(sum_n Var_n) / N.
    """
    n, d = values.shape
    assert d % 2 == 0
    pair_diff = values[:, 0::2] - values[:, 1::2]  # [N, D/2]
    var_rows = (pair_diff.double() ** 2).sum(-1) / d**2  # [N]
    return float(var_rows.sum().sqrt() / n)


@torch.no_grad()
def validation_elbo(model, x0: torch.Tensor, draws: int, noise_seed: int, *, batch_size: int = 8,
                    shift_logits: bool | None = None, first_sequence: int = 0, probe=None) -> ValidationELBO:
    """The per-token ELBO bound of `x0 [N, L]` with the fixed noise `validation_noise(N, L, draws, noise_seed)`.

    Every model scored with the same (x0, draws, noise_seed) sees the same masked inputs, whatever its
    variant (extra sinks are the model's own, outside x0).
    `first_sequence`: the index of x0's first row in the whole set (a slice scored on its own).
    `probe`: a `model.probe.Probe` handed to every forward (rows `n * draws + d` in order, `batch_size` at a
    time): the escape probe reads the attention of the very forwards it scores (experiment/endpoints/escape/probe.py).
    """
    cfg = model.config
    if cfg.mask_token_id is None:
        raise ValueError("the fixed validation scores a diffusion LM; this model is autoregressive (no [MASK])")
    check_int("batch_size", batch_size, 1)
    shift = cfg.shift_logits if shift_logits is None else bool(shift_logits)
    n, length = x0.shape
    block = cfg.block_size is not None  # the block NELBO: each block scored beside the clean blocks before it
    if block and shift:
        raise ValueError("the fixed validation of a block model with shifted logits (a Fast-dLLM v2 checkpoint) is not "
                         "written: its shared masks would hit each block's first token, which such a model reads "
                         "from the block before; score it with loglikelihood (`sinkdlm eval`) instead")
    if block and length % cfg.block_size:
        raise ValueError(f"the fixed validation of a block model scores whole blocks: its {length}-token sequences "
                         f"are not a multiple of block_size={cfg.block_size}; use a sequence length that is")
    masked = validation_noise(n, length, draws, noise_seed, first_maskable=1 if shift else 0,
                              first_sequence=first_sequence)  # [N, D, L]
    rows_x0 = x0[:, None].expand(n, draws, length).reshape(n * draws, length)  # [N*D, L]
    rows_mask = masked.reshape(n * draws, length)
    values = torch.empty(n * draws, dtype=torch.float64)
    device = model.device
    was_training = model.training
    model.eval()
    for lo in range(0, n * draws, batch_size):
        x = rows_x0[lo: lo + batch_size].to(device)
        msk = rows_mask[lo: lo + batch_size].to(device)
        xt = x.masked_fill(msk, cfg.mask_token_id)
        need = torch.zeros_like(msk)
        if shift:  # logits[:, i-1] predict x0[:, i]
            need[:, :-1] = msk[:, 1:]
        else:
            need = msk
        if block:  # x_t ⊕ x_0 under BD3-LM's mask (docs/method.md §13): the same masks, the block NELBO's terms
            logits = xt_forward(model, xt, x, logits_index=torch.cat([need, torch.zeros_like(need)], 1),
                                probe=probe).logits
        else:
            logits = model(xt, logits_index=need, probe=probe).logits  # [K, V], row-major as `msk`
        ce = torch.nn.functional.cross_entropy(logits.float(), x[msk], reduction="none").double()
        rows = msk.nonzero()[:, 0]
        per_row = torch.zeros(len(x), dtype=torch.float64, device=ce.device).index_add_(0, rows, ce)
        values[lo: lo + len(x)] = (per_row / msk.sum(-1)).cpu()
    model.train(was_training)
    values = values.view(n, draws)
    return ValidationELBO(values=values, val_loss=float(values.mean()), val_loss_se=stratified_se(values))
