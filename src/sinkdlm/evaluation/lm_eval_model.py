"""lm-evaluation-harness model `sinkdlm`: a checkpoint directory scored by the Monte-Carlo ELBO.

Use from Python (the documented import registers the model with lm-eval's registry):

    import lm_eval, sinkdlm.evaluation.lm_eval_model  # noqa: F401  (registers "sinkdlm")
    lm_eval.simple_evaluate(model="sinkdlm", model_args="pretrained=DIR,mc_num=128", tasks=["arc_easy"])

From the shell, with exactly the arguments of `lm_eval`:

    sinkdlm lm-eval --model sinkdlm --model_args pretrained=DIR,mc_num=128 --tasks arc_easy
    python -m sinkdlm.evaluation.lm_eval_model --model sinkdlm --model_args pretrained=DIR,mc_num=128 --tasks arc_easy

(lm-eval 0.4.x does not read the `lm_eval.models` entry point that pyproject.toml declares, so the
bare `lm_eval --model sinkdlm` answers "no model for this name found": only a process that imported
this module knows the name. Both forms above import it and then run lm-eval's own command line.)

The three request types (docs/method.md §1-2, §7):
  * `loglikelihood` — the Monte-Carlo ELBO of the continuation given the context
    (`sinkdlm.diffusion.likelihood.loglikelihood`, `mc_num` samples, `method` "mc_count" by default;
    a one-token continuation is exact with one sample). `is_greedy`: whether greedy decoding — |y|
    steps, each committing the single most confident masked position with its argmax token
    (LLaDA's `suffix_greedy_prediction`) — reproduces the continuation; `check_greedy=False` skips
    those extra |y| forwards and reports False.
  * `generate_until` — the sampler at temperature 0 (unless the task asks for sampling),
    `max_gen_toks` new tokens (default 256) in semi-autoregressive blocks of `block_length`
    (default 32; a block model's sub-blocks when shorter than its block, else the whole block: docs/method.md
    §13), one token per step unless `gen_steps`; cut at EOS, then at the first stop string.
    `cache=prefix|dual` and `threshold=0.9` turn on Fast-dLLM's KV cache (a whole-sequence model's; a block
    model refuses it: it decodes with its own exact cache) and parallel decoding.
  * `loglikelihood_rolling` — the document split into windows of the model's length: lm-eval's
    disjoint rolling windows (`get_rolling_token_windows` with one token of context), each
    window's tokens scored by the ELBO given the token before it (EOS before the first), summed.

The model's settings are an `LMEvalConfig` (`sinkdlm.config.commands`, the one home of their help):
`SinkDLMEvalModel(LMEvalConfig(model=DIR, mc_num=128))` from Python; lm-eval builds it from model_args
(`create_from_arg_string`, `create_from_arg_obj`), parsed and checked by `lm_eval_config`.
model_args: pretrained (checkpoint directory or .gguf file, required), mc_num (128), method (mc_count | mc | chain),
batch_size (model rows per forward, default 32; lm-eval's default 1 and "auto" mean 32; cap it with
max_batch_size), device (cuda if available; a cuda request without CUDA falls back to the CPU), dtype (float32 |
bfloat16 | float16; default as stored), gen_steps, block_length (32), max_length (the model's
positions minus its sinks), check_greedy (True), seed (0), shift_logits (default: the model's own config.shift_logits), tokenizer (directory;
default the checkpoint's), cache (none | prefix | dual), kv_cache_dtype (none | int8: the cache's keys and values
in int8; a whole-sequence model's needs cache, a block model's cache is always on), quantize (none | int8-weight | int8-dynamic | int4-weight: torchao, as `--quantize`),
threshold (none, e.g. 0.9), and every field of the
sampler's `RemaskingOptions` (remasking, schedule, eps, alg_temp, top_p, top_k; docs/method.md §2; default: the
model family's).
The likelihood runs the LM head only on the masked continuation tokens (`loglikelihood`).
"""

from __future__ import annotations

import logging
import typing
from pathlib import Path

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry, register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
from tqdm.auto import tqdm

from sinkdlm.config.commands import LMEvalConfig, RemaskingOptions
from sinkdlm.config.fields import field_types
from sinkdlm.diffusion.likelihood import MC_NUM, METHODS
from sinkdlm.evaluation.predictor import DLMPredictor, check_scoring_options, sub_block_length
from sinkdlm.model.loader import open_source, resolve_device

logger = logging.getLogger(__name__)

NAME = "sinkdlm"
DEFAULT_MAX_GEN_TOKS = 256
DEFAULT_ROWS = 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _int_arg(name: str, value, minimum: int = 1) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"model_args {name}={value!r} must be an integer") from None
    if out < minimum or isinstance(value, bool) or (isinstance(value, float) and value != out):
        raise ValueError(f"model_args {name}={value!r} must be an integer >= {minimum}")
    return out


def _remasking_args(given: dict) -> dict:
    """The sampler's remasking settings from model_args strings, popped from `given`: every field of
    `RemaskingOptions` is a model_arg of its own name and type (declared there once, with its help), and
    unset ones are left out (the model family's defaults apply). Ranges are checked by `DLMPredictor`,
    before any request."""
    out = {}
    for name, kind in field_types(RemaskingOptions).items():
        value = given.pop(name, None)
        if value in (None, "", "none", "None"):
            continue
        kinds = typing.get_args(kind) or (kind,)
        out[name] = _int_arg(name, value) if int in kinds else _float_arg(name, value) if float in kinds else str(value)
    return out


def _float_arg(name: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"model_args {name}={value!r} must be a number") from None


def _bool_arg(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"model_args {name}={value!r} must be true or false")


def lm_eval_config(model_args: dict) -> LMEvalConfig:
    """lm-eval's model_args (values parsed from its `key=value` string, or given from Python) as an
    `LMEvalConfig`, every one checked before any checkpoint is read. `pretrained` names the model; lm-eval's
    own defaults apply where an argument is absent: mc_num 128, batch_size 32 (lm-eval's command line always
    passes its own default of 1, which would run every Monte-Carlo sample alone: 1 and "auto" mean 32 too;
    `max_batch_size` caps the rows), and progress bars on."""
    given = dict(model_args)
    remasking = _remasking_args(given)
    fields = [n for n in field_types(LMEvalConfig) if n not in field_types(RemaskingOptions) and n != "model"]
    known = ["pretrained", "max_batch_size", *fields]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown model_args for --model {NAME}: {', '.join(unknown)}; known: "
                         f"{', '.join(known + list(field_types(RemaskingOptions)))}")
    pretrained, dtype, tokenizer = given.get("pretrained"), given.get("dtype"), given.get("tokenizer")
    if pretrained is None:
        raise ValueError(f"--model {NAME} needs model_args pretrained=PATH (a model directory or a .gguf file)")
    if dtype is not None and str(dtype) not in DTYPES:
        raise ValueError(f"model_args dtype={dtype!r} must be one of {sorted(DTYPES)}")
    batch_size = given.get("batch_size")
    if batch_size is None or str(batch_size).startswith("auto") or str(batch_size) == "1":
        batch_size = DEFAULT_ROWS
    batch_size = _int_arg("batch_size", batch_size)
    if given.get("max_batch_size") is not None:
        batch_size = min(batch_size, _int_arg("max_batch_size", given["max_batch_size"]))
    block_length = given.get("block_length", LMEvalConfig.block_length)
    method = str(given.get("method", LMEvalConfig.method))
    if method not in METHODS:
        raise ValueError(f"model_args method={given['method']!r} must be one of {', '.join(METHODS)}")
    shift_logits, cache, threshold = given.get("shift_logits"), given.get("cache"), given.get("threshold")
    gen_steps, max_length = given.get("gen_steps"), given.get("max_length")
    config = LMEvalConfig(
        model=Path(str(pretrained)), dtype=None if dtype is None else str(dtype),
        device="auto" if given.get("device") is None else str(given["device"]),
        tokenizer=Path(str(tokenizer)) if tokenizer else None,
        mc_num=_int_arg("mc_num", given.get("mc_num", MC_NUM)), method=method, batch_size=batch_size,
        gen_steps=None if gen_steps is None else _int_arg("gen_steps", gen_steps),
        seed=_int_arg("seed", given.get("seed", LMEvalConfig.seed), minimum=0),
        max_length=None if max_length is None else _int_arg("max_length", max_length, minimum=2),
        cache=None if cache in (None, "", "none", "None") else str(cache),
        **{name: None if given.get(name) in (None, "", "none", "None") else str(given[name])
           for name in ("quantize", "kv_cache_dtype")},
        threshold=None if threshold in (None, "", "none", "None") else _float_arg("threshold", threshold),
        block_length=None if block_length is None else _int_arg("block_length", block_length),
        check_greedy=_bool_arg("check_greedy", given.get("check_greedy", LMEvalConfig.check_greedy)),
        shift_logits=None if shift_logits is None else _bool_arg("shift_logits", shift_logits),
        progress=True, **remasking,
    )
    check_scoring_options(config)
    return config


class SinkDLMEvalModel(LM):
    """A sinkdlm checkpoint as an lm-eval `LM` (see the module docstring for the semantics), built from its
    `LMEvalConfig`; lm-eval builds it from model_args through `create_from_arg_string` / `create_from_arg_obj`."""

    def __init__(self, config: LMEvalConfig):
        super().__init__()
        from sinkdlm.data import load_tokenizer
        from sinkdlm.checkpoint.manager import load_checkpoint, load_tokenizer_for
        from sinkdlm.model.quantize import check_quantize, quantize_model

        if not isinstance(config, LMEvalConfig):
            raise TypeError(f"SinkDLMEvalModel takes an LMEvalConfig (or model_args through create_from_arg_string), "
                            f"got {type(config).__name__}")
        if config.model is None:
            raise ValueError(f"--model {NAME} needs model_args pretrained=PATH (a model directory or a .gguf file)")
        device = config.device
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            logger.warning("device %s requested but CUDA is not available; using the CPU", device)
            device = "cpu"  # lm-eval's command line asks for cuda:0 by default
        self._device = resolve_device(device)
        dtype = DTYPES[config.dtype] if config.dtype else None
        check_quantize(config.quantize, self._device, dtype)  # before any weight is read
        source = open_source(Path(config.model))  # its config alone, no weight read yet
        # a block model's cache, kv_cache_dtype and block_length (its sub-blocks): refused now, not mid-run
        check_scoring_options(config, block_model=source.config.block_size is not None)
        if not source.config.causal:
            sub_block_length(config.block_length, source.config.block_size)
        self.model = quantize_model(load_checkpoint(source, device=self._device, dtype=dtype).eval(), config.quantize)
        if config.shift_logits is not None:  # this loaded model's head is read the other way (every estimator reads the config)
            self.model.config.shift_logits = config.shift_logits
        self.tokenizer = load_tokenizer(config.tokenizer) if config.tokenizer else load_tokenizer_for(source)
        self.predictor = DLMPredictor(self.model, self.tokenizer, config)
        self.settings = config

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> SinkDLMEvalModel:
        """From lm-eval's `model_args` string (`pretrained=DIR,mc_num=128`) and its command line's settings
        (`additional_config`: batch_size, max_batch_size, device; None values left out, as lm-eval does)."""
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> SinkDLMEvalModel:
        """From model_args given as a dict (`simple_evaluate(model_args={...})`); see `lm_eval_config`. lm-eval's own
        flags (`--device`, `--batch_size`, always passed) give way to the same setting in model_args."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(lm_eval_config({**extra, **arg_dict}))

    # ------------------------------------------------------------------ lm-eval properties
    @property
    def max_length(self) -> int:
        return self.predictor.max_length

    @property
    def eot_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "")).replace("/", "__")

    def get_model_info(self) -> dict:
        cfg = self.model.config
        return {
            "model_num_parameters": self.model.num_parameters(), "model_dtype": str(self.model.dtype),
            "num_sink_tokens": cfg.num_sink_tokens, "mc_num": self.predictor.mc_num, "method": self.predictor.method,
        }

    # ------------------------------------------------------------------ request types
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.predictor.encode_pair(ctx, cont) for ctx, cont in (r.args for r in requests)]
        empty = [r.args for r, (_, c) in zip(requests, pairs) if not c]
        if empty:
            raise ValueError(f"continuation {empty[0][1]!r} encodes to no tokens; nothing to score")
        self.predictor.progress = not disable_tqdm
        lls = self.predictor.loglikelihood_ids([p for p, _ in pairs], [c for _, c in pairs], desc="ELBO")
        if self.settings.check_greedy:
            greedy = self.predictor.greedy_matches([p for p, _ in pairs], [c for _, c in pairs])
        else:
            greedy = [False] * len(pairs)  # not computed (check_greedy=False): never claimed
        out = list(zip(lls, greedy))
        for r, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", r.args, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        prefix = self.eot_token_id
        if prefix is None:
            raise ValueError("loglikelihood_rolling needs a tokenizer with an EOS token to start the first window")
        windows, owner = [], []
        for k, r in enumerate(requests):
            ids = self.predictor.encode(r.args[0])
            # max_seq_len = max_length - 1: the one context token plus the window fit the model.
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(ids, prefix, self.max_length - 1, 1)):
                windows.append((ctx, cont))
                owner.append(k)
        self.predictor.progress = not disable_tqdm
        lls = self.predictor.loglikelihood_ids([w[0] for w in windows], [w[1] for w in windows], desc="rolling ELBO")
        totals = [0.0] * len(requests)
        for k, ll in zip(owner, lls):
            totals[k] += ll
        for r, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = [""] * len(requests)
        groups: dict[tuple, list[int]] = {}
        settings = []
        for i, r in enumerate(requests):
            context, kwargs = r.args
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_toks = _int_arg("max_gen_toks", kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
            if not kwargs.pop("do_sample", False):
                temperature = 0.0
            if kwargs:
                logger.warning("sinkdlm ignores generation kwargs %s", sorted(kwargs))
            settings.append((context, until))
            groups.setdefault((max_toks, temperature), []).append(i)
        bar = tqdm(total=len(requests), desc="generate_until", disable=disable_tqdm)
        self.predictor.progress = False
        for (max_toks, temperature), idx in groups.items():
            prompts = [self.predictor.encode(settings[i][0]) for i in idx]
            ids = self.predictor.generate_ids(
                prompts, max_toks, block_length=self.settings.block_length, temperature=temperature
            )
            for i, toks in zip(idx, ids):
                out[i] = self.predictor.decode(toks, settings[i][1])
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
            bar.update(len(idx))
        bar.close()
        return out


def _register() -> None:
    """Register under "sinkdlm"; a second import (or `python -m`) finds it registered already.

    lm-eval fills its registry with the built-in models only when it finds the registry empty, so
    they are loaded first: registering into an empty registry would hide `hf`, `dummy`, ...
    """
    import lm_eval.models  # noqa: F401  (lazy placeholders for the built-in models)

    if NAME not in model_registry:
        register_model(NAME)(SinkDLMEvalModel)


if __name__ != "__main__":  # under `python -m` the real module registers itself in main()
    _register()


def main(argv: list[str] | None = None) -> None:
    """`python -m sinkdlm.evaluation.lm_eval_model ARGS`: lm-eval's command line with `sinkdlm` registered."""
    import sys

    import sinkdlm.evaluation.lm_eval_model  # noqa: F401  (registers the model under its importable name)
    from lm_eval.__main__ import cli_evaluate

    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    given = {w.split("=", 1)[0] for w in argv}
    if not given & {"-h", "--help"} and argv and argv[0] not in ("ls", "validate"):
        if "--model" not in given:  # the model this command registers (after lm-eval's `run`, when given)
            at = 1 if argv[0] == "run" else 0
            argv = [*argv[:at], "--model", "sinkdlm", *argv[at:]]
        model = _value(argv, "--model")
        if model == "sinkdlm" and "--tasks" in given and "pretrained=" not in (_value(argv, "--model_args") or ""):
            raise ValueError("--tasks needs a model to score: give --model_args pretrained=PATH (a sinkdlm model "
                             "directory or a .gguf file)")
    # sinkdlm runs offline unless told otherwise: a dataset not in the local cache is one clear error, before the
    # model loads, not a network wait after it; what it sets, it says (a value the user set is left as it is)
    unset = [name for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if name not in os.environ]
    for name, module, constant in (("HF_DATASETS_OFFLINE", "datasets.config", "HF_DATASETS_OFFLINE"),
                                   ("HF_HUB_OFFLINE", "huggingface_hub.constants", "HF_HUB_OFFLINE")):
        os.environ.setdefault(name, "1")
        if os.environ[name] == "1" and module in sys.modules:  # read at import: already imported in this process
            setattr(sys.modules[module], constant, True)
    offline = os.environ["HF_DATASETS_OFFLINE"] == "1"
    tasks = _value(argv, "--tasks") if not given & {"-h", "--help"} else None  # None: nothing is run
    if unset and tasks:
        print(f"[sinkdlm] lm-eval runs offline here: set {' and '.join(f'{n}=1' for n in unset)} (export =0 to let "
              "it download)", file=sys.stderr, flush=True)
    if offline and tasks:
        _check_cached(tasks.split(","), _value(argv, "--include_path"))
    if "--device" not in given and "device=" not in (_value(argv, "--model_args") or "") and tasks:
        argv += ["--device", "auto"]  # lm-eval's own default is cuda:0: the model picks, and says nothing
    sys.argv = ["lm_eval", *argv]
    try:
        cli_evaluate()
    except Exception as e:
        dataset = _unreachable_dataset(e)
        if dataset is None:
            raise
        raise ValueError(_not_cached(tasks or "the task", dataset, offline)) from None


def _not_cached(task: str, dataset: str, offline: bool) -> str:
    """The refusal of a task whose dataset is not in the local cache: what it needs, where the cache is, the ways out
    (never the command just run)."""
    import datasets.config
    import huggingface_hub.constants

    where = f"{datasets.config.HF_DATASETS_CACHE} or {huggingface_hub.constants.HF_HUB_CACHE}"
    why = ("lm-eval runs offline here (HF_DATASETS_OFFLINE=1)" if offline else
           "the Hub could not be reached (HF_DATASETS_OFFLINE=0 here: no network?)")
    online = "; or, where the network is reachable, run it with HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0" if offline else ""
    return (f"lm-eval task {task} needs the dataset {dataset!r}, which is not in the local cache ({where}) and {why}; "
            f"copy a cache that holds it there (one where `datasets.load_dataset({dataset!r})` ran), or give "
            f"--include_path a task YAML that reads local files{online}")


def _check_cached(tasks: list[str], include_path: str | None) -> None:
    """Refuse, before any model is loaded, a task whose dataset (its YAML's dataset_path) is in neither local cache
    (the datasets cache, the Hub cache); a group, tag or task without a dataset_path is left to lm-eval."""
    import datasets.config
    import huggingface_hub.constants

    for task in tasks:
        path = _dataset_of(task.strip(), include_path)
        if path is None or Path(path).exists():  # a local dataset reads no cache
            continue
        found = (Path(datasets.config.HF_DATASETS_CACHE) / path.replace("/", "___"),
                 Path(huggingface_hub.constants.HF_HUB_CACHE) / f"datasets--{path.replace('/', '--')}")
        if not any(p.is_dir() for p in found):
            raise ValueError(_not_cached(task.strip(), path, offline=True))


def _dataset_of(task: str, include_path: str | None) -> str | None:
    """The dataset_path of lm-eval task `task`, read from its YAML as text (lm-eval's own task index parses every
    YAML it ships: seconds): the file named after the task first, else the one whose `task:` is it; its `include:`
    followed where it holds the dataset_path. None: no such task file (a group, a tag, a Python task)."""
    import re

    import lm_eval.tasks

    roots = [Path(lm_eval.tasks.__file__).parent, *([Path(include_path)] if include_path else [])]
    named = re.compile(rf"^task:\s*{re.escape(task)}\s*$", re.M)
    for candidates in ([p for r in roots for p in r.rglob(f"{task}.yaml")], [p for r in roots for p in r.rglob("*.yaml")]):
        for file in candidates:
            text = file.read_text(errors="ignore")
            if not named.search(text):
                continue
            for _ in range(3):  # a task YAML, then what it includes
                found = re.search(r"^dataset_path:\s*['\"]?([^'\"\s#]+)", text, re.M)
                include = re.search(r"^include:\s*['\"]?([^'\"\s#]+)", text, re.M)
                if found or not include or not (file.parent / include.group(1)).is_file():
                    return found.group(1) if found else None
                file = file.parent / include.group(1)
                text = file.read_text(errors="ignore")
            return None
    return None


def _value(argv: list[str], flag: str) -> str | None:
    """The value given to `flag` in `argv` (`--flag V` or `--flag=V`), the last one; None when absent."""
    found = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1:]
    return found


def _unreachable_dataset(error: BaseException) -> str | None:
    """The dataset named by a "could not reach the Hub" error (offline, or no network) anywhere in the
    chain of `error`; None when it is another error."""
    import re

    seen = error
    while seen is not None:
        kind, text = type(seen).__name__, str(seen)
        if "ConnectionError" in kind or "Offline" in kind or "LocalEntryNotFound" in kind or "Couldn't reach" in text:
            named = re.search(r"'([\w.-]+/[\w.-]+|[\w.-]+)'", text)
            return named.group(1) if named else "of the task"
        seen = seen.__cause__ or seen.__context__
    return None


if __name__ == "__main__":
    main()
