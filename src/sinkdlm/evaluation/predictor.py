"""The predictor interface the tasks score, and its implementation for a masked diffusion LM.

A *predictor* answers two kinds of text requests, batched over a whole task:
  * `loglikelihood([(context, continuation), ...]) -> [float]` — log p(continuation | context);
  * `generate([GenRequest, ...]) -> [str]` — a continuation of each context.
Tasks (`tasks.py`) only talk to this interface, so a hand-made perfect or random predictor can be
scored without a network (tests/test_eval_tasks.py).

`DLMPredictor` implements it with the library's estimators (docs/method.md §1-2):
  * log-likelihoods are the Monte-Carlo ELBO of `sinkdlm.diffusion.likelihood.loglikelihood`
    (default `method="mc_count"`, LLaDA's lower-variance form of the same bound). Requests are
    sorted by length and sent many at a time, so one forward holds the samples of many candidates.
    A one-token continuation under "mc_count" always masks exactly that token with weight 1: its
    estimate is the exact log-probability, so it gets one sample whatever `mc_num` says;
  * generation is `sinkdlm.diffusion.sampling.generate` at temperature 0 (low-confidence
    remasking), by default one token per step; the text is cut at the first EOS token and then at
    the first stop string.
Tokenisation follows lm-eval: trailing whitespace of the context moves into the continuation, and
the continuation's tokens are those of `context + continuation` after the context's own tokens, so
word-boundary merges are scored where a left-to-right reader would see them.
"""

from __future__ import annotations

import hashlib
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from tqdm.auto import tqdm

from sinkdlm.data.tokenizer import check_tokenizer_matches, encode_texts
from sinkdlm.diffusion.likelihood import METHODS
from sinkdlm.diffusion.likelihood import loglikelihood as elbo
from sinkdlm.diffusion.remasking import check_rule, resolve_rule
from sinkdlm.config.checks import CACHE_CHOICES as CACHES
from sinkdlm.diffusion.sampling import generate as sample
from sinkdlm.config.checks import (check_block_model_options, check_int, check_kv_cache_dtype, check_optional_int,
                                   check_sub_block_length, sub_block_steps)
from sinkdlm.config.commands import ScoringOptions  # the one home of the defaults (field docstrings)

ROWS_PER_CALL = 8  # likelihood requests per library call: about this many forward batches (progress granularity)


@dataclass(frozen=True)
class GenRequest:
    """Generate a continuation of `context`.

    Length: exactly `max_tokens` tokens are sampled, or — with `length_of` — exactly as many as the
    tokenisation of `length_of` after the context (the cloze task's "as many tokens as the true
    word"). The text is cut at the first EOS token and then at the first of the `until` strings.
    `block_length` sets semi-autoregressive blocks (docs/method.md §2; None = one block); on a block model
    (docs/method.md §13) its sub-blocks when shorter than the model's block, else the whole block
    (`sub_block_length`).
    """

    context: str
    max_tokens: int | None = None
    length_of: str | None = None
    until: tuple[str, ...] = ()
    block_length: int | None = None
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if (self.max_tokens is None) == (self.length_of is None):
            raise ValueError("a GenRequest needs exactly one of max_tokens or length_of")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


class Predictor(Protocol):
    def loglikelihood(self, requests: Sequence[tuple[str, str]], *, desc: str = "") -> list[float]: ...

    def generate(self, requests: Sequence[GenRequest], *, desc: str = "") -> list[str]: ...


def sub_block_length(block_length: int | None, block_size: int | None) -> int | None:
    """What an evaluation's `block_length` means on a model of `block_size` (None: a whole-sequence model, whose
    `block_length` is its semi-autoregressive blocks, returned as given). On a block model (docs/method.md §13) it
    is `generate`'s: the sub-block length (Fast-dLLM v2's small_block_size) when shorter than the block, which it
    must divide (`check_sub_block_length`, the one check of it); as long as the block or longer (the default 32 on a
    block of 32 or fewer), None: one sub-block, the whole block, as a semi-autoregressive block_length >=
    gen_length is one block."""
    if block_size is None or block_length is None:
        return block_length
    if block_length >= block_size:
        return None
    check_sub_block_length(block_length, block_size)
    return block_length


def request_seed(seed: int, *ids: Sequence[int]) -> int:
    """A request's own seed: a function of the evaluation's `seed` and the request's token ids only (its
    prompt, or its context and continuation), so its draws never depend on how the requests are batched."""
    h = hashlib.blake2b(str(seed).encode(), digest_size=8)
    for part in ids:
        h.update(b"|" + ",".join(map(str, part)).encode())
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """`text` up to the earliest occurrence of any stop string (all of it if none occurs)."""
    cut = len(text)
    for stop in until:
        if stop:
            i = text.find(stop)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]


def check_decoding_options(cache, threshold) -> None:
    """The fast-decoding options of evaluation (`generate(cache=..., threshold=...)`), checked up front."""
    if cache is not None and cache not in CACHES:
        raise ValueError(f"cache must be one of {', '.join(CACHES)} (or none), got {cache!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0.0 <= threshold <= 1.0):
        raise ValueError(f"threshold must be a probability in [0, 1] (e.g. 0.9), got {threshold!r}")


def check_scoring_options(o: ScoringOptions, block_model: bool | None = None) -> None:
    """Every option `DLMPredictor` reads that needs no weights, checked up front (the remasking rule, which
    depends on the model's family, is checked when the predictor is built). `block_model`: whether the model is a
    block model (docs/method.md §13, read from its header; None: not known yet). A block model refuses `cache`
    (its own exact cache is always on) and keeps that cache in `kv_cache_dtype`; any other model's
    `kv_cache_dtype` needs a `cache`, which is checked once the model's kind is known."""
    check_decoding_options(o.cache, o.threshold)
    if block_model:
        check_block_model_options(o)
    # of a model of unknown kind, only the dtype's name for now ("blocks": a cache that may be the block model's)
    check_kv_cache_dtype(o.kv_cache_dtype, o.cache if block_model is False else "blocks")
    if o.method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {o.method!r}")
    check_int("mc_num", o.mc_num, 1)
    check_int("batch_size", o.batch_size, 1)
    check_optional_int("gen_steps", o.gen_steps, 1, none_means="one token per step")
    if o.max_length is not None:
        check_int("max_length", o.max_length, 2)


class DLMPredictor:
    """A `DiffusionLM` + its tokenizer behind the predictor interface (see the module docstring).

    `options` (`ScoringOptions`, or the `EvalConfig` / `LMEvalConfig` that holds them; default: their
    defaults, without progress bars) are read once, here:
    mc_num       Monte-Carlo samples per multi-token continuation.
    method       likelihood estimator: "mc_count" (default), "mc" (docs/method.md §1 as written) or "chain".
    batch_size   model rows per forward (likelihood samples, or prompts being sampled).
    gen_steps    denoising steps per generation; None = one token per step (LLaDA's best setting).
    seed         seeds the ELBO's masks and times and the sampler: each request draws from its own generator,
                 seeded from this seed and its tokens (`request_seed`), so a request's numbers do not depend
                 on batch_size, on the requests beside it or on --limit, and two models asked the same
                 requests see the same draws (paired comparison).
    max_length   content tokens per row; default the model's positions minus its sink tokens.
    cache        Fast-dLLM KV cache for generation: None, "prefix" or "dual" (`generate(cache=...)`);
                 a request of a single block has nothing after its block, so "dual" runs it as
                 "prefix" (the same computation). The greedy check of `greedy_matches` is exact
                 decoding and uses neither the cache nor the threshold.
    threshold    Fast-dLLM confidence-threshold decoding for generation (e.g. 0.9); the step count
                 then adapts and `gen_steps` is a no-op.
    remasking, schedule, eps, alg_temp, top_p, top_k: the sampler's remasking settings for generation
                 (`RemaskingOptions`); None = those of the model's family. The greedy check keeps its
                 one-commit-per-step LLaDA rule.
    progress     progress bars (`self.progress`, which a caller may switch per call).
    """

    def __init__(self, model, tokenizer, options: ScoringOptions | None = None):
        o = ScoringOptions(progress=False) if options is None else options
        cfg, threshold = model.config, o.threshold
        check_scoring_options(o, block_model=cfg.block_size is not None)
        self.remasking = o.remasking_options()  # RemaskingOptions' fields only
        if not cfg.causal:  # its errors before any work (`generate` checks them so)
            full = self.remasking
            check_rule(*resolve_rule(cfg.family, full["schedule"], full["remasking"], threshold), threshold=threshold,
                       temperature=0.0, alg_temp=full["alg_temp"], top_p=full["top_p"], top_k=full["top_k"],
                       eps=full["eps"])
        check_tokenizer_matches(tokenizer, cfg.vocab_size, cfg.mask_token_id)
        self.model, self.tokenizer = model, tokenizer
        self.mc_num, self.method, self.batch_size = o.mc_num, o.method, o.batch_size
        self.gen_steps, self.seed, self.progress = o.gen_steps, o.seed, o.progress
        self.max_length = cfg.max_content_length if o.max_length is None else min(cfg.max_content_length, o.max_length)
        self.cache, self.threshold, self.kv_cache_dtype = o.cache, threshold, o.kv_cache_dtype
        self.eos_id = tokenizer.eos_token_id
        self._warned_truncation = False

    # ------------------------------------------------------------------ tokenisation
    def encode(self, text: str) -> list[int]:
        return encode_texts(self.tokenizer, [text])[0] if text else []

    @property
    def prefix_token(self) -> list[int]:
        """What an empty context becomes (lm-eval's convention: the EOS token)."""
        return [self.eos_id] if self.eos_id is not None else []

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) as lm-eval splits them (see the module docstring)."""
        if not context:
            return self.prefix_token, self.encode(continuation)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole, ctx = self.encode(context + continuation), self.encode(context)
        if whole[: len(ctx)] != ctx:  # the boundary merged across: score the separate encodings
            return ctx, self.encode(continuation)
        return ctx, whole[len(ctx):]

    def _fit(self, prefix: list[int], cont: list[int]) -> tuple[list[int], list[int]]:
        """Keep the last `max_length` tokens: the context is cut from the left first."""
        room = self.max_length - len(cont)
        if room >= (1 if prefix else 0):
            return (prefix[-room:] if room else []), cont
        if not self._warned_truncation:
            warnings.warn(
                f"a continuation of {len(cont)} tokens does not fit max_length={self.max_length}; "
                "only its last tokens are scored", stacklevel=3,
            )
            self._warned_truncation = True
        keep = self.max_length - 1
        return prefix[-1:] if prefix else [], cont[-keep:] if prefix else cont[-self.max_length:]

    # ------------------------------------------------------------------ likelihood
    def loglikelihood(
        self, requests: Sequence[tuple[str, str]], *, mc_num: int | None = None, desc: str = "loglikelihood"
    ) -> list[float]:
        """log p(continuation | context) for every (context, continuation) pair."""
        pairs = [self.encode_pair(c, x) for c, x in requests]
        for (ctx, x), (_, ids) in zip(requests, pairs):
            if not ids:
                raise ValueError(f"continuation {x!r} of context ...{ctx[-40:]!r} encodes to no tokens")
        return self.loglikelihood_ids([p for p, _ in pairs], [c for _, c in pairs], mc_num=mc_num, desc=desc)

    def loglikelihood_ids(
        self,
        prefixes: Sequence[list[int]],
        continuations: Sequence[list[int]],
        *,
        mc_num: int | None = None,
        desc: str = "loglikelihood",
    ) -> list[float]:
        """Token-level `loglikelihood`, batched over all requests (one float per request)."""
        mc = self.mc_num if mc_num is None else mc_num
        fitted = [self._fit(list(p), list(c)) for p, c in zip(prefixes, continuations)]
        # One-token continuations are exact with one "mc_count" sample; the rest use `mc`.
        groups: dict[int, list[int]] = defaultdict(list)
        for i, (_, c) in enumerate(fitted):
            groups[1 if self.method == "mc_count" and len(c) == 1 else mc].append(i)
        out = [0.0] * len(fitted)
        bar = tqdm(total=len(fitted), desc=desc, disable=not self.progress, leave=False)
        for samples, idx in sorted(groups.items()):
            idx.sort(key=lambda i: -(len(fitted[i][0]) + len(fitted[i][1])))  # similar lengths share a batch
            # Calls of about ROWS_PER_CALL forward batches ("chain" runs |y| rows per request).
            chunks, chunk, rows = [], [], 0
            for i in idx:
                chunk.append(i)
                rows += len(fitted[i][1]) if self.method == "chain" else samples
                if rows >= ROWS_PER_CALL * self.batch_size:
                    chunks.append(chunk)
                    chunk, rows = [], 0
            chunks += [chunk] if chunk else []
            for chunk in chunks:
                res = elbo(
                    self.model, [fitted[i][0] for i in chunk], [fitted[i][1] for i in chunk], mc_num=samples,
                    method=self.method, batch_size=self.batch_size,
                    seed=[request_seed(self.seed, *fitted[i]) for i in chunk],
                )
                for i, v in zip(chunk, res.logprob.tolist()):
                    out[i] = float(v)
                bar.update(len(chunk))
        bar.close()
        return out

    # ------------------------------------------------------------------ generation
    def generate_ids(
        self,
        prompts: Sequence[list[int]],
        gen_length: int,
        *,
        block_length: int | None = None,
        steps: int | None = None,
        temperature: float = 0.0,
        desc: str = "generate",
        fast: bool = True,
    ) -> list[list[int]]:
        """`gen_length` new tokens per prompt (the sampler of docs/method.md §2, batched `batch_size` prompts).

        The length is rounded up to a whole number of blocks and the extra tokens dropped; prompts are
        cut from the left to leave room; `steps` defaults to `gen_steps`, else one token per step.
        `fast=True` applies the predictor's `cache`, `threshold` and `remasking` (the greedy check does not).
        A block model (docs/method.md §13) decodes `gen_length` tokens in its own blocks, `block_length` its
        sub-blocks (`sub_block_length`), with at least the steps its sub-blocks need (one each, every block).
        """
        block_size = None if self.model.config.causal else self.model.config.block_size
        padded = gen_length
        if block_size is not None:  # its own blocks: no semi-autoregressive padding, block_length its sub-blocks
            block_length = sub_block_length(block_length, block_size)
        elif block_length is not None and block_length < gen_length:
            padded = -(-gen_length // block_length) * block_length
        else:
            block_length = None
        room = self.max_length - padded
        if room < 1:
            raise ValueError(
                f"cannot generate {padded} tokens with a model of max_length={self.max_length}: "
                "no room is left for the prompt; ask for fewer tokens"
            )
        n_blocks = padded // block_length if block_length and block_size is None else 1
        cache, threshold = (self.cache, self.threshold) if fast else (None, None)
        steps = steps or self.gen_steps or padded
        steps = max(n_blocks, min(steps, padded))
        if block_length and block_size is not None:  # the sampler's steps per block: ceil(steps / its blocks)
            steps = max(steps, sub_block_steps(block_length, block_size, -(-gen_length // block_size)))
        rows = [(list(p)[-room:] if p else self.prefix_token) for p in prompts]
        if any(not r for r in rows):
            raise ValueError("an empty prompt needs a tokenizer with an EOS token to stand in for it")
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        out: list[list[int]] = [[] for _ in rows]
        bar = tqdm(total=len(rows), desc=desc, disable=not self.progress, leave=False)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start: start + self.batch_size]
            # an AR model decodes one token per step, left to right: the diffusion settings are not given to it
            # (generate refuses any that is, so that a user's is never silently ignored)
            diffusion = {} if self.model.config.causal else dict(
                steps=None if threshold is not None else steps, block_length=block_length, threshold=threshold,
                cache="prefix" if cache == "dual" and n_blocks == 1 else cache,
                kv_cache_dtype=self.kv_cache_dtype if cache else None,
                **(self.remasking if fast else dict(schedule="llada", remasking="low_confidence")))
            if block_size is not None:  # decodes in its own blocks, with its exact cache (§13), in sub-blocks;
                # the greedy check (fast=False) is exact decoding: its cache keeps the model's dtype
                diffusion.update(cache=None, kv_cache_dtype=self.kv_cache_dtype if fast else None)
            res = sample(self.model, [rows[i] for i in chunk], gen_length=padded, temperature=temperature,
                         generator=[torch.Generator(self.model.device).manual_seed(request_seed(self.seed, rows[i]))
                                    for i in chunk], return_dict=True, **diffusion)
            new = res.sequences[:, res.prompt_length: res.prompt_length + gen_length].tolist()
            for i, ids in zip(chunk, new):
                out[i] = ids
            bar.update(len(chunk))
        bar.close()
        return out

    def decode(self, ids: list[int], until: Sequence[str] = ()) -> str:
        """Tokens -> text, cut at the first EOS token, then at the first stop string."""
        if self.eos_id is not None and self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), until)

    def generate(self, requests: Sequence[GenRequest], *, desc: str = "generate") -> list[str]:
        """Text continuations, one per request (batched by length, block length and temperature)."""
        prompts, lengths = [], []
        for r in requests:
            if r.length_of is not None:
                ctx, target = self.encode_pair(r.context, r.length_of)
                if not target:
                    raise ValueError(f"length_of={r.length_of!r} encodes to no tokens")
                prompts.append(ctx)
                lengths.append(len(target))
            else:
                prompts.append(self.encode(r.context))
                lengths.append(r.max_tokens)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            groups[(lengths[i], r.block_length, r.temperature)].append(i)
        out = [""] * len(requests)
        for (n, block, temp), idx in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
            ids = self.generate_ids([prompts[i] for i in idx], n, block_length=block, temperature=temp, desc=desc)
            for i, toks in zip(idx, ids):
                out[i] = self.decode(toks, requests[i].until)
        return out

    def greedy_matches(self, prefixes: Sequence[list[int]], continuations: Sequence[list[int]]) -> list[bool]:
        """Whether greedy decoding reproduces each continuation: |y| steps, each committing the single
        most confident masked position with its argmax token (LLaDA's `suffix_greedy_prediction`)."""
        fitted = [self._fit(list(p), list(c)) for p, c in zip(prefixes, continuations)]
        groups: dict[int, list[int]] = defaultdict(list)
        for i, (_, c) in enumerate(fitted):
            if len(c) < self.max_length:  # a continuation filling the whole row leaves no prompt
                groups[len(c)].append(i)
        out = [False] * len(fitted)
        for n, idx in sorted(groups.items()):
            # generate_ids cuts prompts to max_length - n: exactly the room _fit left.
            got = self.generate_ids([fitted[i][0] for i in idx], n, steps=n, desc="greedy check", fast=False)
            for i, ids in zip(idx, got):
                out[i] = ids == fitted[i][1]
        return out
