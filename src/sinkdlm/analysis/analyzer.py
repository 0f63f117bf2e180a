"""`analyze`: run the sink analysis of a model and write analysis.json, its arrays, figures and a report.

`analyze(model, tokenizer, prompts, config: AnalyzeConfig)` generates from the prompts (batched) with a
`SinkRecorder` on the sampler callback, optionally runs the sink-masking ablation (`ablation.py`), and
writes to `config.out`:
  analysis.json          the numbers (schema: `ANALYSIS_KEYS`, README "analysis.json"; and `outliers`, the
                         per-layer activation outliers of `outliers.py`, measured on the prompts);
  analysis_arrays.npz    per-run arrays for `compare` (largest-sink positions, norm samples, maps);
  the PNG figures        stable names in `report.FIGURES`, listed under the `figures` key;
  report.md, report.html what was measured, on what, and the numbers (both link the PNGs).
This module computes; `sinkdlm.analysis.report` draws the figures and writes the document.
`prompts_from_documents` is the one prompt extractor: `analyze --data` and the experiment runner
both draw their prompts with it (seeded token windows, docs/method.md §6).
`analyze` is a plan, then the work: `plan_analysis` checks everything and encodes the prompts before any
forward; `_generate_recorded` and `_ablation` run the model; `_analysis_json` assembles what is written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sinkdlm.analysis.ablation import check_ks, run_ablation, split_continuation
from sinkdlm.analysis.outliers import measure_outliers, prompt_batches
from sinkdlm.analysis.recorder import SinkRecorder
from sinkdlm.analysis.report import write_analysis_report, write_figures
from sinkdlm.io.atomic import atomic_write, atomic_write_json
from sinkdlm.config.checks import check_epsilon, check_int, check_scale
from sinkdlm.config.commands import AnalyzeConfig, SampleConfig  # the one home of the defaults (field docstrings)

SCHEMA_VERSION = 1
ANALYSIS_KEYS = (
    "schema_version", "model", "setup", "epsilon", "scale", "non_sink_fraction", "non_sink_fraction_by_epsilon",
    "non_sink_fraction_per_layer", "sinks_per_head", "sink_attention_mass", "sink_token_types", "value_norm",
    "moving", "extra_sink", "virtual_sink", "ablation", "figures", "arrays", "samples", "timing",
)
ARRAYS_NAME = "analysis_arrays.npz"


# ----------------------------------------------------------------------------- input checks
def check_options(config: AnalyzeConfig) -> dict:
    """Every user error of `analyze`'s settings as a ValueError, before any work (the command runs it before
    loading the model). Returns the resolved settings (`AnalyzeConfig.settings`, the K list checked)."""
    settings = config.settings()
    gen_length, steps, block_length = settings["gen_length"], settings["steps"], settings["block_length"]
    check_epsilon(settings["epsilon"])
    check_scale(settings["scale"])
    check_int("gen_length", gen_length, 1)
    check_int("steps", steps, 1)
    check_int("mc_num", settings["mc_num"], 1)
    check_int("batch_size", settings["batch_size"], 1)
    if block_length is not None:
        check_int("block_length", block_length, 1)
        if gen_length % block_length:
            raise ValueError(f"block_length={block_length} must divide gen_length={gen_length}")
    figure_steps = settings["figure_steps"]
    if figure_steps is not None:
        a, b = figure_steps
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < steps and (b == -1 or a < b < steps)):
            raise ValueError(f"figure_steps must be (a, b) with 0 <= a < b < steps={steps} (b = -1: last step), "
                             f"got {figure_steps!r}")
    out_dir = config.out
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not a directory")
    if settings["ablation_k"] is not None:
        settings["ablation_k"] = check_ks(settings["ablation_k"])
    return settings


def prompts_from_documents(documents: Sequence[str], tokenizer, num_prompts: int, prompt_length: int,
                           seed: int = 0) -> list[str]:
    """`num_prompts` windows of `prompt_length` tokens from the documents (seeded offsets), as text."""
    check_int("num_prompts", num_prompts, 1)
    check_int("prompt_length", prompt_length, 2)
    from sinkdlm.data import encode_texts

    docs = [ids for ids in encode_texts(tokenizer, list(documents)) if len(ids) >= prompt_length]
    if not docs:
        raise ValueError(f"no document has {prompt_length} tokens; lower --prompt-length")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num_prompts):
        ids = docs[i % len(docs)]
        start = int(torch.randint(0, len(ids) - prompt_length + 1, (), generator=gen))
        out.append(tokenizer.decode(ids[start:start + prompt_length]))
    return out


# ----------------------------------------------------------------------------- analyze
def analyze(model, tokenizer, prompts: list[str], config: AnalyzeConfig, *, ablation_task=None) -> dict:
    """Sink analysis of `model` generating from `prompts`; writes `config.out` and returns analysis.json's dict.

    The settings are an `AnalyzeConfig` (`sinkdlm.config`, the one home of their defaults):
    sample          how to decode (`SampleConfig`: gen_length, steps, block_length, temperature, ...);
                    `steps` None is one token per step; the sampler is seeded with `seed`.
    epsilon/scale   sink threshold (Rulli et al. eq. 3) and received-attention scale (docs/method.md §6).
    ablation_k      run the sink-masking ablation for these K ("1,5,10" or [1, 5, 10]; 0 is always added
                    as the baseline): with `ablation_task` (protocol: `sinkdlm.analysis.ablation`) its
                    score, else the per-token ELBO of held-out continuations (each prompt's last
                    `min(gen_length, len // 2)` tokens) with `mc_num` samples.
    ablation_protocol  with `ablation_task`: "clean" (sinks of step t-1 found on its un-ablated
                    attention, default) or "ablated" (on the masked model's own maps).
    figure_steps    the two steps of the attention-map figure (default: first and last).
    batch_size      prompts per `generate` call (attention maps of a step scale with it).
    out, label, quiet  the output directory (required), the model's name in the report, no progress bar.

    An autoregressive model (`config.causal`: a Qwen2/LLaMA checkpoint opened as is) is analysed the
    same way on its greedy left-to-right generation (one step per token, causal maps), and its ablation
    scores the exact continuation log-likelihood per token (docs/method.md §10). A block model
    (`config.block_size`) is analysed on its block decoding, and its ablation scores the block NELBO of the
    continuations with the sinks of the x_t ⊕ x_0 pass masked (docs/method.md §15; no `ablation_task`).
    """
    if not isinstance(config, AnalyzeConfig):
        raise TypeError(f"analyze() takes an AnalyzeConfig as config, got {type(config).__name__}")
    plan = plan_analysis(model, tokenizer, prompts, config, ablation_task)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    # ϵ, scale, the figure's layer and steps, the seed
    recorder = SinkRecorder(model.config, config, decode=_cached_decode(tokenizer))
    was_training = model.training
    model.eval()
    samples, steps_taken, gen_seconds = _generate_recorded(model, tokenizer, plan, recorder)
    ablation, abl_seconds = _ablation(model, plan, config, ablation_task)
    start = time.perf_counter()
    outliers = measure_outliers(model, prompt_batches(plan.ids, plan.settings["batch_size"],
                                                      model.config.mask_token_id or 0, model.device))  # as generate pads
    outlier_seconds = time.perf_counter() - start
    model.train(was_training)
    summary = recorder.summary()
    arrays = recorder.arrays()
    analysis = _analysis_json(model, plan, config, recorder, summary, (samples, steps_taken), ablation,
                              {"generation_seconds": gen_seconds, "ablation_seconds": abl_seconds,
                               "outlier_seconds": outlier_seconds})
    analysis["outliers"] = outliers  # not in ANALYSIS_KEYS: files written before it have none
    if plan.progress:  # drawing the figures takes seconds on a CPU
        print(f"[sinkdlm] sink analysis: writing figures and the report to {plan.out_dir}", file=sys.stderr, flush=True)
    _save_arrays(plan.out_dir / ARRAYS_NAME, arrays)
    analysis["figures"] = write_figures(plan.out_dir, analysis, arrays)
    atomic_write_json(plan.out_dir / "analysis.json", analysis)
    write_analysis_report(analysis, plan.out_dir, sinks_per_head=mean_over_layers(analysis["sinks_per_head"]))
    if plan.progress:
        print(f"[sinkdlm] sink analysis: wrote {plan.out_dir / 'analysis.json'}, {plan.out_dir / 'report.md'} (and "
              f".html) and {len(analysis['figures'])} figures in {plan.out_dir}", file=sys.stderr, flush=True)
    return analysis


@dataclass(frozen=True)
class AnalysisPlan:
    """What `analyze` fixes before any forward: the checked settings, the encoded prompts, the sampler's
    settings and (for the ELBO ablation) the held-out continuations."""

    settings: dict  # `check_options`'s resolved settings (ablation_k, gen_length, steps, block_length, ...)
    sample: SampleConfig  # the sampler's settings, `steps` resolved
    generate_kwargs: dict  # its settings beyond length, steps, blocks and seed (temperature, remasking, ...)
    ids: list  # the prompts' token ids
    pairs: list | None  # (prefix, held-out continuation) per prompt for the ELBO ablation; else None
    out_dir: Path
    num_prompts: int
    seed: int  # the sampler's seed
    progress: bool


def plan_analysis(model, tokenizer, prompts: list[str], config: AnalyzeConfig, ablation_task=None) -> AnalysisPlan:
    """Every user error of an `analyze` call as a ValueError, before any work, and its `AnalysisPlan`."""
    import dataclasses

    from sinkdlm.config.fields import non_default_fields
    from sinkdlm.data import encode_texts

    if config.out is None:
        raise ValueError("AnalyzeConfig.out (the output directory) is required")
    settings = check_options(config)
    gen_length = settings["gen_length"]
    sample = dataclasses.replace(config.sample, steps=settings["steps"])
    generate_kwargs = {k: v for k, v in non_default_fields(sample).items()
                       if k not in ("gen_length", "steps", "block_length", "seed")}
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError("every prompt must be a non-empty string")
    if ablation_task is not None and not callable(ablation_task):
        raise ValueError("ablation_task must be a callable task(model, generate_kwargs) -> float")
    cfg = model.config
    if cfg.block_size == 1 and cfg.shift_logits:  # each block's one token is read before the block: no step
        raise ValueError("a block model with shifted logits and block_size=1 reads every token in the pass before "
                         "its block, so its decoding has no denoising step for analyze to record")
    if cfg.block_size is not None and settings["ablation_k"] is not None:  # docs/method.md §15
        if ablation_task is not None:
            raise ValueError(f"a block model's (block_size={cfg.block_size}) decoding takes no key masks yet, so its "
                             "sink-masking ablation scores the block NELBO of held-out continuations: leave out "
                             "ablation_task")
    ids = encode_texts(tokenizer, list(prompts))
    if any(not row for row in ids):
        raise ValueError("a prompt encodes to no tokens; give non-empty prompts")
    longest = max(len(r) for r in ids)
    if longest + gen_length > cfg.max_content_length:
        raise ValueError(f"prompt ({longest} tokens) + gen_length ({gen_length}) is longer than the model's "
                         f"{cfg.content_length_note()} positions; shorten the prompts or gen_length")
    pairs = None
    if settings["ablation_k"] is not None and ablation_task is None:
        pairs = [p for p in (split_continuation(r, gen_length) for r in ids) if p is not None]
        if not pairs:
            raise ValueError("the ELBO ablation needs prompts of at least 2 tokens (prefix + held-out continuation)")
    return AnalysisPlan(settings, sample, generate_kwargs, ids, pairs, Path(config.out), len(prompts),
                        config.seed, progress=not config.quiet)


def _cached_decode(tokenizer):
    """`decode(token id) -> text`, each id decoded once (the recorder names the sinks' tokens)."""
    decoded: dict[int, str] = {}

    def decode(i: int) -> str:
        if i not in decoded:
            decoded[i] = tokenizer.decode([i])
        return decoded[i]
    return decode


def _generate_recorded(model, tokenizer, plan: AnalysisPlan, recorder: SinkRecorder):
    """Generate from the prompts, `batch_size` at a time, with the recorder on every step's forward:
    (decoded samples, the most steps a batch took, seconds)."""
    from tqdm.auto import tqdm

    from sinkdlm.diffusion.sampling import StepProbe, generate

    cfg, batch_size, gen_length = model.config, plan.settings["batch_size"], plan.settings["gen_length"]
    chunks = [plan.ids[i:i + batch_size] for i in range(0, len(plan.ids), batch_size)]
    samples, steps_taken = [], 0
    start = time.perf_counter()
    steps_per_chunk = gen_length if cfg.causal else plan.settings["steps"]  # an AR model takes one step per token
    last_layer = cfg.num_hidden_layers - 1
    with tqdm(total=len(chunks) * steps_per_chunk, desc="sink analysis: generation", unit="step",
              disable=not plan.progress, leave=False) as bar:
        def step_hook(step, input_ids, attention_mask):
            # The recorder sees one layer's maps at a time inside the forward (docs/method.md §10):
            # an 8B model's analysis never holds every layer's [B, H, S, S] at once.
            record = recorder.step_hook(step, input_ids, attention_mask)

            def hook(layer, attn, values, column=None):
                record(layer, attn, values, column)
                if layer == last_layer:
                    bar.update(1)
            return hook

        for chunk in chunks:
            out = generate(model, chunk, plan.sample, seed=plan.seed, probe=StepProbe(hook=step_hook),
                           return_dict=True)
            steps_taken = max(steps_taken, out.steps_taken)
            for row in out.sequences[:, out.prompt_length:].tolist():
                samples.append(tokenizer.decode(row, skip_special_tokens=True))
    return samples, steps_taken, time.perf_counter() - start


def _ablation(model, plan: AnalysisPlan, config: AnalyzeConfig, ablation_task):
    """The sink-masking ablation (`ablation.run_ablation`) when `ablation_k` asks for it: (its dict, seconds);
    (None, 0.0) otherwise."""
    from tqdm.auto import tqdm

    ks, pairs, cfg = plan.settings["ablation_k"], plan.pairs, model.config
    if ks is None:
        return None, 0.0
    start = time.perf_counter()
    total = len(ks) if ablation_task is not None else len(pairs) * (1 if cfg.causal else plan.settings["mc_num"])
    total *= 2 if cfg.num_sink_tokens else 1  # scored with and without masking the extra sink
    with tqdm(total=total, desc="sink analysis: ablation", disable=not plan.progress, leave=False) as bar:
        ablation = run_ablation(
            model, ks, config, ablation_task=ablation_task, prefixes=[p for p, _ in pairs] if pairs else None,
            continuations=[c for _, c in pairs] if pairs else None, batch_size=plan.settings["batch_size"] * 2,
            progress=bar.update,
        )
    return ablation, time.perf_counter() - start


def _analysis_json(model, plan: AnalysisPlan, config: AnalyzeConfig, recorder: SinkRecorder, summary: dict,
                   generated: tuple[list[str], int], ablation, timing: dict) -> dict:
    """analysis.json's dict (`ANALYSIS_KEYS`), its `figures` still empty (drawn from it afterwards). `generated`:
    the generation's (decoded samples, steps taken)."""
    cfg, settings = model.config, plan.settings
    samples, steps_taken = generated
    lengths = [len(r) for r in plan.ids]
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "label": config.label or "model",
            **{k: getattr(cfg, k) for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                            "hidden_size", "vocab_size", "mask_token_id", "num_sink_tokens",
                                            "sink_position", "sink_zero_value", "gated_attention",
                                            "sink_logit", "softmax_one", "causal", "shift_logits")},
            "block_size": cfg.block_size,  # a block model (docs/method.md §13); None: the whole sequence
            "kind": ("autoregressive (causal)" if cfg.causal else "diffusion (bidirectional)" if cfg.block_size is None
                     else f"block diffusion (block-causal, blocks of {cfg.block_size})"),
            "source_format": cfg.extra.get("source_format", "sinkdlm"),
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(model.dtype).removeprefix("torch."),
            "quantization": getattr(model, "quantization", None),  # --quantize (model/quantize.py)
            "device": str(model.device),
        },
        "setup": {
            "num_prompts": plan.num_prompts, "prompt_tokens": {"min": min(lengths), "mean": sum(lengths) / len(lengths),
                                                                "max": max(lengths)},
            "gen_length": settings["gen_length"], "steps": settings["steps"], "steps_taken": steps_taken,
            "block_length": cfg.block_size or settings["block_length"] or settings["gen_length"],
            "batch_size": settings["batch_size"],
            "seed": plan.seed, "max_sequence_positions": recorder.max_positions,
            "figure_layer": recorder.figure_layer, "generate_kwargs": plan.generate_kwargs,
            "figure_prompt_tokens": lengths[recorder.figure_row] if recorder.figure_row < len(lengths) else None,
        },
        **{k: v for k, v in summary.items() if k != "counts"},
        "ablation": ablation,
        "figures": {},
        "arrays": ARRAYS_NAME,
        "samples": samples[:5],
        "timing": timing,
    }


def mean_over_layers(values) -> float | None:
    """The unweighted mean of a per-layer list over the layers that have a value (None: none has)."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    atomic_write(path, lambda tmp: np.savez_compressed(tmp, **arrays), suffix=".npz")

