"""Argument checks shared by every module: one home for "must be an integer >= 1" and friends.

Each check raises `ValueError` with a message that names the argument, says what it must be and
what it got, before any work starts. Library functions pass their own parameter names; the
command line re-spells them as its flags (`seq_len` -> `--seq-len`) with `cli_message`, so an
error printed by `sinkdlm ...` speaks the names the user typed.

No torch import here: the CLI imports this module on its fast `--help` path.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable
from pathlib import Path

SCALES = ("sum", "mean")  # received-attention scale, Rulli et al. eq. 3 (column sum or mean)


def check_int(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    """`value` is an int (not a bool) >= minimum (and <= maximum, when given)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be an integer <= {maximum}, got {value!r}")
    return value


def check_optional_int(name: str, value, minimum: int = 1, *, none_means: str) -> int | None:
    """`value` is None (which means `none_means`) or an int >= minimum."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum} (or left unset: {none_means}), got {value!r}")
    return value


SEED_MAX = 2**32 - 1  # seeds are mixed into int64 arithmetic (trainer's per-step generators)


def check_seed(value, name: str = "seed") -> int:
    """An int in [0, SEED_MAX]: a larger one overflows torch's int64 seeds deep inside the run."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= SEED_MAX:
        raise ValueError(f"{name} must be an integer in [0, {SEED_MAX}], got {value!r}")
    return value


def check_scale(scale) -> str:
    """Scale of received attention (Rulli et al. eq. 3): column 'sum' (default) or 'mean'."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use 'sum' (column sum, default) or 'mean' (column mean)")
    return scale


def check_epsilon(epsilon) -> float:
    """Sink threshold ϵ (Rulli et al. eq. 3): a finite number >= 0."""
    try:
        eps = float(epsilon)
    except (TypeError, ValueError) as err:
        raise ValueError(f"epsilon must be a number, got {epsilon!r}") from err
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return eps


def check_epsilons(epsilons) -> list[float]:
    """One threshold or a non-empty collection of thresholds, each as in `check_epsilon`."""
    if isinstance(epsilons, (int, float)):
        epsilons = (epsilons,)
    eps = [check_epsilon(e) for e in epsilons]
    if not eps:
        raise ValueError("epsilons is empty; pass at least one threshold, e.g. (3.0,)")
    return eps


def parse_int_list(text: str | None, name: str) -> list[int] | None:
    """"1,5,10" -> [1, 5, 10] (None stays None); `name` is the flag, for the error."""
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ValueError(f"{name} must be comma-separated integers like 1,5,10, got {text!r}") from err
    if not values:
        raise ValueError(f"{name} is empty; give comma-separated integers like 1,5,10")
    return values


# ----------------------------------------------------------------------------- input files
def read_text_file(path, flag: str) -> str:
    """The UTF-8 text of the file given to `flag` (e.g. "--prompts"), or a ValueError naming the
    flag and the file: missing, a directory, unreadable, or not UTF-8 (worded as `train --data`'s)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{flag} file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory; give a file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{flag} file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); it must be UTF-8 — "
            f"convert it, e.g. `iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}`"
        ) from exc
    except OSError as exc:  # unreadable (permissions), a FIFO, ...
        raise ValueError(f"{flag} file {str(path)!r} cannot be read ({exc.strerror or exc})") from exc


def check_prompt_size(text: str, tokenizer, config, flag: str) -> None:
    """Refuse a prompt far too long for the model before encoding it (10 MB take a BPE ~20 s): no
    token covers more characters than the vocabulary's longest, so `text` needs at least
    len(text) / longest tokens. `config`: the model's (for `max_content_length`)."""
    longest = max(map(len, tokenizer.get_vocab()), default=1)
    positions = config.max_content_length
    if len(text) > longest * positions:
        raise ValueError(f"{flag} holds {len(text)} characters, at least {len(text) // longest} tokens: more than "
                         f"the model's {positions} positions; shorten it")


# ----------------------------------------------------------------------------- CLI spelling
def cli_message(message: str, flags: Iterable[str]) -> str:
    """Rewrite library parameter names in an error message as the running command's flags.

    `flags` are the command's long options (e.g. `--seq-len`). A name with an underscore
    (`seq_len`, `text_field`) becomes its flag wherever it stands as a word; a one-word name
    (`steps`, `limit`) only where it is clearly the argument (`steps=64`, `steps must ...`, or
    opening the message before its value: `dtype 'x' is ...`), so prose such as "denoising steps"
    is left alone; `unknown [kind] name 'value'` gets the flag after the value. `got None` becomes
    `got nothing` (an unset option): the user never reads the Python spelling.
    """
    known = {f[2:].replace("-", "_"): f for f in flags if f.startswith("--")}
    out = message
    for name, flag in sorted(known.items(), key=lambda kv: -len(kv[0])):
        # not part of a longer name (`max_seq_len` vs `seq_len`), of a flag or of an attribute
        lead = r"(?<![\w.\-])"
        out = re.sub(lead + re.escape(name) + "=", flag + "=", out)
        if "_" in name:
            out = re.sub(lead + re.escape(name) + r"(?![\w(])", flag, out)
        else:
            out = re.sub(lead + re.escape(name) + r"(?= must\b| is required\b)", flag, out)
            # the value's name opening the message (`dtype 'x' is not ...`)
            out = re.sub("^" + re.escape(name) + r"(?= ['\"\d-])", flag, out)
        # `unknown model preset 'x'; ...` -> `unknown model preset 'x' (--preset); ...` (and `unknown task` for --tasks)
        named = re.escape(name) + ("?" if name.endswith("s") else "")
        out = re.sub(r"^(unknown (?:[\w-]+ )?" + named + r" ('(?:[^'\\]|\\.)*'|\"[^\"]*\"))",
                     lambda m: f"{m.group(1)} ({flag})", out)
    # a switch given as `name=True` (a library keyword) is the flag itself on the command line
    out = re.sub(r"(?<![\w-])--([\w-]+)=True\b", r"--\1", out)
    out = re.sub(r"(?<![\w-])--([\w-]+)=False\b", r"--no-\1", out)
    return out.replace("got None", "got nothing")


# ----------------------------------------------------------------------------- model dtype
DTYPES = ("float32", "bfloat16", "float16", "float64")  # what --dtype takes (nothing or "auto": as stored)


def check_dtype(dtype) -> str | None:
    """The name of the dtype to load a model in: None for None or "auto" (as stored), else one of DTYPES,
    given by name or as a torch dtype (`torch.bfloat16`). Torch-free, so a command refuses a bad --dtype
    before it reads any weight."""
    if dtype is None or dtype == "auto":
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype {str(dtype)!r} is not one of {', '.join(DTYPES)}; give one of them, or leave it out "
                         "(auto: as stored)")
    return name


# ----------------------------------------------------------------------------- decoding settings
# The `SampleConfig` fields only diffusion decoding reads: an autoregressive model decodes one token per
# step, left to right, and uses only gen_length, temperature, top_p, top_k and seed.
DIFFUSION_ONLY = ("steps", "block_length", "threshold", "cache", "compile", "compile_backend", "remasking",
                  "schedule", "eps", "alg_temp", "kv_cache_dtype", "max_new_tokens")
# What a block model (`ModelConfig.block_size`) does not take: it decodes in its own blocks with an exact cache
# (its `block_length` is its sub-blocks', `check_sub_blocks`).
NOT_FOR_BLOCK_MODELS = ("cache",)
CACHE_CHOICES = ("prefix", "dual")
KV_CACHE_DTYPES = ("int8",)  # --kv-cache-dtype: what the prefix/dual cache may store its keys and values in
QUANTIZE_SCHEMES = ("int8-weight", "int8-dynamic", "int4-weight")  # --quantize (sinkdlm.model.quantize)


def _number(value, integer: bool = False) -> bool:
    kinds = (int,) if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


def check_sampler_values(settings) -> None:
    """Each sampler value on its own, for any model (the ones `diffusion.remasking.check_rule` checks
    again beside the rule's names): temperature, top_p, top_k, alg_temp, eps. `settings`: a `SampleConfig`,
    or `RemaskingOptions` (an `EvalConfig`: no temperature, which is then greedy's 0)."""
    temperature, top_p, top_k = getattr(settings, "temperature", 0.0), settings.top_p, settings.top_k
    if not _number(temperature) or not temperature >= 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_p is not None and (not _number(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1] (1 keeps every token), got {top_p!r}")
    if top_k is not None and (not _number(top_k, integer=True) or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    alg_temp, eps = settings.alg_temp, settings.eps
    if not _number(alg_temp) or not alg_temp >= 0 or not math.isfinite(alg_temp):
        raise ValueError(f"alg_temp must be a number >= 0 (0 = commit the top-k confidences), got {alg_temp!r}")
    if not _number(eps) or not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1) (Dream's last timestep), got {eps!r}")


def check_sample_settings(settings, *, autoregressive: bool | None, block_model: bool | None = None,
                          block_size: int | None = None) -> None:
    """Every check of a `SampleConfig` that needs no model, only its kind (`autoregressive`, `block_model`: a
    block diffusion model, docs/method.md §13, `block_size` its block size when known; read from the model's
    header; None: not known), so a command refuses bad settings before it reads any weight.

    An autoregressive model refuses every diffusion-only setting that differs from its default, all of
    them named in one line; a diffusion model needs `steps` unless `threshold`, a `block_length` that
    divides `gen_length` into no more blocks than steps (a block model's: its `block_size` into sub-blocks,
    `check_sub_blocks`), a threshold in [0, 1] and a known cache."""
    from sinkdlm.config.fields import field_default

    check_int("gen_length", settings.gen_length, 1)
    if settings.max_new_tokens is not None:
        check_int("max_new_tokens", settings.max_new_tokens, 1)
    check_sampler_values(settings)
    if autoregressive:
        defaults = {f.name: field_default(f) for f in dataclasses.fields(settings) if f.name in DIFFUSION_ONLY}
        # one step per token in one block is what left-to-right decoding does: steps=gen_length is no conflict
        defaults.update(steps=(None, settings.gen_length), block_length=(None, settings.gen_length))
        given = [f"{name}={getattr(settings, name)}" for name in DIFFUSION_ONLY
                 if getattr(settings, name) not in (defaults[name] if isinstance(defaults[name], tuple)
                                                    else (defaults[name],))]
        if given:
            one = len(given) == 1
            raise ValueError(f"this model is autoregressive (it decodes one token per step, left to right): "
                             f"{', '.join(given[:-1]) + ' and ' if not one else ''}{given[-1]} {'applies' if one else 'apply'} to diffusion decoding only; "
                             f"leave {'it' if one else 'them'} out")
        return
    if block_model is False and settings.max_new_tokens is not None:
        raise ValueError(f"max_new_tokens={settings.max_new_tokens} bounds a block model's generation; this "
                         "whole-sequence model generates exactly gen_length tokens: give gen_length instead")
    if block_model:
        check_block_model_options(settings)
    block_model = block_model or block_size is not None
    steps, threshold, block_length = settings.steps, settings.threshold, settings.block_length
    if block_length is not None:
        check_int("block_length", block_length, 1)
        if not block_model and settings.gen_length % block_length:
            raise ValueError(f"gen_length={settings.gen_length} is not divisible by block_length={block_length}; "
                             "choose a block_length that divides gen_length")
    blocks = 1 if block_model else settings.gen_length // (block_length or settings.gen_length)
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be a probability in [0, 1], got {threshold!r}")
    elif steps is None:
        raise ValueError("steps is required: give the number of denoising steps (as many as gen_length: one token "
                         "per step), or decode with a confidence threshold (e.g. threshold=0.9)")
    if steps is not None:
        check_int("steps", steps, 1)
        if threshold is None and steps < blocks:
            raise ValueError(f"steps={steps} is fewer than the number of blocks ({settings.gen_length}/{block_length} "
                             f"= {blocks}); every block needs at least one step")
    check_sub_blocks(settings, block_size)
    if settings.cache is not None and settings.cache not in CACHE_CHOICES:
        raise ValueError(f"cache must be prefix or dual, got {settings.cache!r}")
    if settings.cache == "dual" and blocks == 1:
        raise ValueError("cache=dual reuses the keys/values after the current block, and with a single block "
                         "there are none: pass a block_length that splits gen_length into several blocks (e.g. 32), "
                         "or use cache=prefix")
    if settings.compile and settings.cache is None and not block_model:  # a block model's cache is always on
        raise ValueError("compile=True compiles the cached decoding step, so it needs a cache: give cache=prefix "
                         "or cache=dual")
    check_kv_cache_dtype(settings.kv_cache_dtype, "blocks" if block_model else settings.cache)


def check_block_model_options(settings) -> None:
    """A block model's settings (`SampleConfig` or `ScoringOptions`) give none of NOT_FOR_BLOCK_MODELS (one line)."""
    given = [f"{name}={getattr(settings, name)}" for name in NOT_FOR_BLOCK_MODELS if getattr(settings, name)]
    if given:
        raise ValueError(f"a block model decodes block by block with an exact cache of its finished blocks: "
                         f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to it; leave them out")


def check_sub_blocks(settings, block_size: int | None) -> None:
    """A block model's `block_length` is its sub-block length (Fast-dLLM v2's `small_block_size`, docs/method.md
    §13): it divides `block_size` (`check_sub_block_length`), and each block's steps (`steps` over the bound's
    blocks) give every sub-block at least one (`sub_block_steps`)."""
    length = settings.block_length
    if length is None or block_size is None:
        return
    check_sub_block_length(length, block_size)
    subs = block_size // length
    if settings.steps is None or settings.threshold is not None or subs == 1:
        return
    bound = settings.gen_length if settings.max_new_tokens is None else settings.max_new_tokens
    blocks = math.ceil(bound / block_size)
    if math.ceil(settings.steps / blocks) < subs:
        raise ValueError(f"steps={settings.steps} split over {blocks} blocks gives a block "
                         f"{math.ceil(settings.steps / blocks)} steps, fewer than its {subs} sub-blocks (block_size="
                         f"{block_size} / block_length={length}); every sub-block needs a step: give at least steps="
                         f"{sub_block_steps(length, block_size, blocks)}, or a longer block_length")


def check_sub_block_length(length: int, block_size: int) -> None:
    """A sub-block `length` divides the model's `block_size` (one line saying what to give, if not)."""
    if block_size % length:
        raise ValueError(f"block_length={length} does not divide the model's block_size={block_size} (a block "
                         f"model's block_length is the length of the sub-blocks of its blocks): give a divisor of "
                         f"{block_size}, or {block_size} (one sub-block, the whole block)")


def sub_block_steps(length: int, block_size: int, blocks: int) -> int:
    """The fewest steps that give every sub-block of `length` a step in each of `blocks` blocks of `block_size`
    (the sampler gives a block ceil(steps / blocks) steps)."""
    return (block_size // length - 1) * blocks + 1


def check_kv_cache_dtype(kv_cache_dtype, cache) -> None:
    """`kv_cache_dtype` is None or one of KV_CACHE_DTYPES, and a cache (`cache`: prefix | dual) is in use."""
    if kv_cache_dtype is None:
        return
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be {' | '.join(KV_CACHE_DTYPES)} (or left unset: the model's dtype), "
                         f"got {kv_cache_dtype!r}")
    if cache is None:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype} stores the KV cache's keys and values, and no cache is in "
                         "use: add cache=prefix or cache=dual")
