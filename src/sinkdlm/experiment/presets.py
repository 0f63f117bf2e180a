"""Experiment presets: which variants of the paper's comparison to train, on what, for how long.

Every variant of one experiment shares the training budget, the data and the seeds; only the
model switches differ (docs/method.md §3-4). Each preset is a function (a recipe) returning an
`ExperimentPreset` built from the typed configs (`TrainConfig`, `EvalConfig`, `AnalyzeConfig`);
`PRESETS` maps the names `sinkdlm experiment --preset` takes to these functions:
  * `smoke`      — the whole path in about a minute of CPU (measured: its description), for the test suite.
  * `demo`       — vanilla DLM vs + 1 front sink, tiny preset, shakespeare, 3 seeds, paired;
                   `make demo`, as fast as the machine: docs/results/demo/results.json records the committed run's
                   time (the README's set-up section and docs/guide.md show it, generated from that file).
  * `study`      — the paper's from-scratch claims (front/end, 1/2/4 sinks, zero-value sink, gated
                   attention) on the pilot's protocol: 7 variants x 5 seeds x 12,000 steps, the "≈" claims
                   tested for equivalence; about 6 hours on a 2-core CPU.
  * `escape`     — when each run leaves the unigram plateau (docs/method.md §11): vanilla, + 1 sink, gated attention, 20 fresh
                   seeds x 6,000 steps probed every 100; ~7-8 min per run on a 2-core CPU (docs/method.md §11).
  * `late-sink`  — a sink added after pretraining (docs/method.md §12): one tiny vanilla DLM continued five ways (all
                   weights, + 1 sink sink-only, LoRA, LoRA + 1 sink, + 1 sink all weights), 10 seeds, paired;
                   ~4 h on one CPU thread (docs/method.md §12).
  * `quant`      — does a sink make a DLM quantizable? (docs/method.md §16): vanilla, + 1 sink, gated attention on the
                   escape recipe, 10 fresh seeds, every run scored quantized (torchao int8) on the fixed validation;
                   `quant-pilot` (3 seeds) sizes it.
  * `block-sinks` — sinks as the block shrinks (docs/method.md §15): blocks of 4, 16 and the whole sequence, each
                   vanilla and + 1 sink, 10 fresh seeds; `block-sinks-pilot` (3 seeds, the primary pair) sized it.
  * `study-pilot` — vanilla vs + 1 sink, 3 seeds, 4x the study's steps, the fixed validation at every fifth:
                   the plateau and the paired spread that size `study`.
  * `study-pilot-long` — its second phase at 12,000 steps (the first found no plateau at 4,000).
  * `study-gpu`  — the comparison with every sink mechanism (also the per-head sink logit and softmax-off-by-one),
                   sized for one H100 (larger model, more tokens; time not measured yet).
  * `ablation`   — Tables 3-5 on the `small` preset, 3 seeds; more than a day on a 2-core CPU (GPU).
  * `real`       — the One-Token experiment on a real initialisation: SmolLM2-135M (the example GGUF)
                   converted to a DLM (vanilla vs + 1 sink), continued pre-training on Shakespeare,
                   3 seeds, paired; about 1 h per run on a 2-core CPU (14 min training, 40 min fixed
                   validation of 36 draws x 256 sequences), 7 h for the study with its two step-0
                   controls; one model at a time, so a committed study survives its machine;
                   `interim.json` splits the variance as each pair finishes).
  * `real-bf16`  — `real` in bf16 autocast (training and fixed validation), for CPUs with AMX bf16 units
                   (Intel Sapphire Rapids and later) and GPUs: on such a 2-core CPU a run takes about half
                   the time of `real`'s fp32; on a CPU without bf16 units it is slower than `real`.
  * `real-quant` — `real` in float32, one seed, each final checkpoint scored quantized (torchao W8A8, int8 weights)
  * `real-gpu`   — the same with gated attention too, sized for one H100: 5 seeds, more tokens,
                   bf16 (its run time is not measured yet: it has not run on a GPU). Each run keeps only its
                   last resumable checkpoint (`keep_last=1`): 1.6 GB with optimizer state, not 3-4.6 GB.
  * `paper-0.5b` — Tables 1-2: Qwen2.5-0.5B init, FineWeb; needs `--init-from` (a local HF Qwen2.5
                   directory), `--data` (local FineWeb files) and `--gsm8k DIR` (train/test JSONL), the
                   lm-eval datasets in the local HF cache, and GPUs for sensible run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from sinkdlm.config import AnalyzeConfig, EvalConfig, SampleConfig, TrainConfig
from sinkdlm.config.checks import QUANTIZE_SCHEMES
from sinkdlm.evaluation.harness import TABLE1_TASKS


@dataclass(frozen=True)
class Variant:
    name: str  # directory-safe
    label: str  # for tables and figures
    switches: dict[str, Any]  # ModelConfig fields
    train: dict[str, Any] = field(default_factory=dict)  # this arm's own TrainConfig fields (what trains: `trainable`)
    # the arm whose conversion and step-0 control this one shares: the same switches, so the same converted
    # model (arms that differ only in what trains); None: its own
    step0: str | None = None


VANILLA = Variant("vanilla", "DLM", {"num_sink_tokens": 0, "gated_attention": False})
SINK = Variant("sink1-front", "DLM + 1 sink (front)", {"num_sink_tokens": 1, "sink_position": "front"})
GATED = Variant("gated", "DLM + GA", {"num_sink_tokens": 0, "gated_attention": True})
SINK_END = Variant("sink1-end", "DLM + 1 sink (end)", {"num_sink_tokens": 1, "sink_position": "end"})
SINK2 = Variant("sink2-front", "DLM + 2 sinks", {"num_sink_tokens": 2, "sink_position": "front"})
SINK4 = Variant("sink4-front", "DLM + 4 sinks", {"num_sink_tokens": 4, "sink_position": "front"})
SINK_ZERO = Variant("sink1-zero", "DLM + 1 zero-value sink", {"num_sink_tokens": 1, "sink_zero_value": True})
# Sink mechanisms beside the token: a learned per-head logit on an extra zero-value softmax column
# (gpt-oss), and the same column with its logit fixed at 0 (softmax-off-by-one).
SINK_LOGIT = Variant("sink-logit", "DLM + sink logit", {"sink_logit": True})
SOFTMAX_ONE = Variant("softmax1", "DLM + softmax₁", {"softmax_one": True})
# A sink added after pretraining (docs/method.md §12): arms continuing one trained DLM, which differ in what they add and
# what trains. The LoRA arms merge their adapters at the end (`TrainConfig.merge`), so every arm is scored alike.
_ONE_SINK = {"num_sink_tokens": 1, "sink_position": "front"}
LATE_ALL = Variant("all", "continued, all weights", {"num_sink_tokens": 0, "gated_attention": False})
LATE_SINK_ONLY = Variant("sink-only", "+ 1 sink, sink only", _ONE_SINK, {"trainable": "sink"})
LATE_LORA = Variant("lora", "LoRA", {"num_sink_tokens": 0, "gated_attention": False},
                    {"trainable": "lora", "merge": True}, step0=LATE_ALL.name)
LATE_LORA_SINK = Variant("lora-sink", "LoRA + 1 sink", _ONE_SINK, {"trainable": "lora", "merge": True},
                         step0=LATE_SINK_ONLY.name)
LATE_SINK_ALL = Variant("sink-all", "+ 1 sink, all weights", _ONE_SINK, step0=LATE_SINK_ONLY.name)


@dataclass(frozen=True)
class Validation:
    """The fixed validation of a study (docs/method.md §1, "Validation of a study"): the first
    `tokens` tokens of the packed validation split, each sequence scored with `draws` masked-count
    draws from one `noise_seed` shared by every run and variant (`diffusion.likelihood.validation_elbo`)."""

    tokens: int = 32_768  # at least this many tokens (whole sequences of the run's seq_len)
    draws: int = 8  # even: its standard error pairs neighbouring strata
    noise_seed: int = 0
    batch_size: int = 8  # model rows per forward
    # Score under bf16 autocast (matmuls in bf16, the residual stream and the loss in fp32), as a study trained
    # in bf16 runs: on a 2-core CPU with AMX bf16 units 2x faster than fp32 (2.2 vs 4.45 s per sequence of 36 draws); part of the pairing key (a study's
    # runs are all scored in one precision).
    bf16: bool = False
    # Fractions of the run's training steps at which each run is scored too (its `val_curve`; the last is
    # the run's `val_loss`, 1.0 is always included): the learning curve on the fixed set, a plateau
    # criterion's data and, from an AR initialisation, the gap's trajectory from the step-0 control.
    checkpoints: tuple[float, ...] = (1.0,)

    def curve_steps(self, max_steps: int) -> list[int]:
        """The training steps scored, ascending, the last `max_steps` (fractions rounded to a step >= 1)."""
        return sorted({max(1, min(max_steps, round(f * max_steps))) for f in (*self.checkpoints, 1.0)})


@dataclass(frozen=True)
class Escape:
    """The escape endpoint (docs/method.md §11), declared before a study's runs: every `every` training
    steps the run is probed on a fixed set, the first `sequences` rows of the packed validation split, each with
    `draws` masked-count draws from `noise_seed` (`diffusion.likelihood.validation_elbo`, the study's estimator),
    and its attention is read on the same forwards (sinks at `epsilon`, docs/method.md §6). The escape step is the
    first probe from which the probe loss stays below the plateau minus `margin` nats; the plateau is the
    probe set's cross-entropy under the training split's unigram distribution (what a model that predicts the
    unigram marginal scores there). A run that never escapes is right-censored at its last probe.
    `pair` (arm, baseline) is the primary log2 ratio of escape steps (exact sign test, censored pairs ordered
    conservatively: `experiment.escape.censored_sign_test`); `secondary` pairs are reported beside it.
    Sink onset: the first probe from which the largest attention mass on detected sinks over the layers from
    `onset_first_layer` on stays at or above `onset_mass` (every arm; a sink token counts when it is detected).
    Layer 0 is left out: in a 400-step probe run (+ 1 sink, seed 7, not a study seed) it already put 0.27-0.44 of
    its attention on detected keys from step 100, on the plateau, before any other layer had a sink."""

    pair: tuple[str, str]
    secondary: tuple[tuple[str, str], ...] = ()
    every: int = 100
    sequences: int = 16
    draws: int = 4  # even: its standard error pairs neighbouring strata
    noise_seed: int = 1
    margin: float = 0.4
    epsilon: float = 3.0
    onset_mass: float = 0.3
    onset_first_layer: int = 1
    sized_for: float | None = None
    """The log2 ratio the seeds were sized to detect (docs/method.md §11): a test that detects nothing is called
    inconclusive only where its MDE exceeds this; None: not sized."""

    def __post_init__(self):
        if self.every < 1 or self.sequences < 1 or self.draws < 2 or self.draws % 2 or self.margin <= 0:
            raise ValueError(f"Escape: every, sequences >= 1, draws even >= 2 and margin > 0; got {self}")


@dataclass(frozen=True)
class Quantization:
    """The quantization endpoint (docs/method.md §16), declared before a study's runs: after training, each run's final
    checkpoint is scored on the study's fixed validation (the same sequences, draws and noise as its val.json) once
    per scheme in `schemes` with its block linears quantized by torchao (`model.quantize`), and
    Δ_quant = quantized − unquantized val_loss, paired on the same masked inputs; the per-layer FFN ∞-norm
    (`analysis.outliers`) is measured on the same validation sequences. `pair` (arm, baseline): the primary, the
    paired difference of Δ_quant under `primary_scheme`, exact Wilcoxon signed-rank test with the paired t interval
    beside it, tested once at 5 %; `secondary` pairs' Δ_quant, every pair's Δ_quant under the other schemes and
    every pair's FFN ∞-norm difference form one Benjamini-Hochberg family. int8 schemes run on a CPU; int4-weight
    needs CUDA (torchao's tinygemm kernel) and is scored against the unquantized model in bfloat16."""

    pair: tuple[str, str]
    secondary: tuple[tuple[str, str], ...] = ()
    schemes: tuple[str, ...] = ("int8-dynamic", "int8-weight")
    primary_scheme: str = "int8-dynamic"
    sized_for: float | None = None
    """The difference of Δ_quant (nats) the seeds were sized to detect, stated from the pilot before the study's
    runs; a test that detects nothing is inconclusive only where its MDE exceeds this; None: not sized."""

    def __post_init__(self):
        unknown = [s for s in self.schemes if s not in QUANTIZE_SCHEMES]
        if unknown or not self.schemes or self.primary_scheme not in self.schemes:
            raise ValueError(f"Quantization: schemes from {QUANTIZE_SCHEMES} and primary_scheme among them; got {self}")


@dataclass(frozen=True)
class Base:
    """The DLM every arm of a study continues from (docs/method.md §12, a sink added after pretraining): trained once,
    before any arm, into OUT/base with `train` (its own recipe and seed). Its last checkpoint is every arm's
    starting point, converted per arm as any DLM is (`model.hf.convert_hf_checkpoint`: the arm's switches
    added, every other weight bitwise the base's), so the arms differ only in what they add and what trains;
    each conversion is scored as the arm's step-0 control."""

    train: TrainConfig


@dataclass(frozen=True)
class Primary:
    """A study's primary comparison, declared before its run (docs/method.md §7): the pair, the metric and the
    test that decides it: an exact `wilcoxon` signed-rank or `sign` test, shown beside the paired t interval,
    or `t` (the paired t test, the Wilcoxon beside it) for a study of fewer than 6 seeds, where no exact
    test's two-sided p can fall below 5 % (5 untied differences: 1/16)."""

    pair: tuple[str, str]
    metric: str = "val_loss"
    test: str = "wilcoxon"
    sized_for: float | None = None
    """The difference (in the metric's units) the seeds were sized to detect, declared with the study: a test that
    detects nothing is called inconclusive only where its MDE exceeds this (docs/method.md §7); None: not sized."""

    def __post_init__(self):
        if self.test not in ("wilcoxon", "sign", "t"):
            raise ValueError(f"Primary.test must be 'wilcoxon', 'sign' or 't', got {self.test!r}")


@dataclass(frozen=True)
class Equivalence:
    """Equivalence claims ("≈"), declared before the run: each pair's val_loss difference is tested with TOST
    at ±`margin` nats inside the report's multiplicity family. Without one, "≈" is never printed."""

    margin: float
    pairs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ExperimentPreset:
    """One experiment: its variants and seeds, and the typed configs every variant shares."""

    name: str
    description: str
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...]
    train: TrainConfig  # shared by every variant; the runner sets out, seed, the switches and init_from
    evaluation: EvalConfig  # tasks, limit, mc_num (the model and --out are the runner's)
    analysis: AnalyzeConfig  # the sink analysis's settings (prompts are drawn by the runner)
    sft: TrainConfig | None = None  # when set: SFT after pre-training, then evaluate the SFT model
    analyse_every_seed: bool = False  # analyse every seed's model (intervals over seeds), not only the first
    # (variant, baseline) name pairs to compare; empty: every variant against the first
    comparisons: tuple[tuple[str, str], ...] = ()
    lm_eval_tasks: tuple[str, ...] = ()  # lm-evaluation-harness tasks (need their datasets locally)
    needs: tuple[str, ...] = field(default=())  # options the user must supply (paper-0.5b)
    # The checkpoint every variant is converted from when --init-from is not given: "example" is the
    # example real model (SmolLM2-135M GGUF, `sinkdlm.checkpoint.example_model`, fetched on first use).
    default_init_from: str | None = None
    validation: Validation = Validation()
    # The declared plateau criterion (nats): a run has plateaued when the last fifth of its training lowered its
    # fixed val_loss by less than this (its `val_curve` must hold the step at 4/5 of training); None: not declared.
    plateau_nats: float | None = None
    primary: Primary | None = None
    equivalence: Equivalence | None = None
    escape: Escape | None = None  # probe every run as it trains; the escape endpoint (docs/method.md §11)
    base: Base | None = None  # the trained DLM every arm continues from (trained first, into OUT/base)
    quantization: Quantization | None = None  # each run scored quantized after training (docs/method.md §16)
    # A GPU-scale study: the model preset its --init-from has (its --dry-run prices the runs in GPU-hours,
    # experiment/gpu_cost.py) and its minimum detectable effect from the paper's own spread, or why unknown
    gpu_model: str | None = None
    paper_mde: str | None = None

    def __post_init__(self):
        by_name = {v.name: v for v in self.variants}
        for v in self.variants:  # a shared step-0 control is the same converted model, or it is not shared
            # (the arm it names may be outside a --variants shard: the control's directory is the same)
            if v.step0 in by_name and by_name[v.step0].switches != v.switches:
                raise ValueError(f"variant {v.name!r} shares the step-0 control of {v.step0!r}, whose switches "
                                 f"differ ({by_name[v.step0].switches} vs {v.switches})")

    def declared(self) -> dict[str, Any]:
        """What the preset declares before the run (results.json's `declared`)."""
        return {"primary": self.primary and {**dataclasses.asdict(self.primary), "pair": list(self.primary.pair)},
                "equivalence": self.equivalence and {"margin": self.equivalence.margin,
                                                     "pairs": [list(p) for p in self.equivalence.pairs]},
                "plateau_nats": self.plateau_nats,
                "escape": self.escape and {**dataclasses.asdict(self.escape), "pair": list(self.escape.pair),
                                           "secondary": [list(p) for p in self.escape.secondary]},
                "quantization": self.quantization and {
                    **dataclasses.asdict(self.quantization), "pair": list(self.quantization.pair),
                    "secondary": [list(p) for p in self.quantization.secondary],
                    "schemes": list(self.quantization.schemes)}}

    @property
    def eval_tasks(self) -> list[str]:
        return [t.strip() for t in self.evaluation.tasks.split(",") if t.strip()]


# The study's questions: every mechanism against the vanilla DLM, and the paper's ablations against the
# 1-front-sink model (end vs front, 2 and 4 vs 1 sink, zero-value vs learned, gated attention vs sink token). Where
# a preset declares no equivalence margin a report can say "no difference detected", never "the same" (docs/method.md §7).
STUDY_VARIANTS = (VANILLA, SINK, SINK_END, SINK2, SINK4, SINK_ZERO, GATED, SINK_LOGIT, SOFTMAX_ONE)
STUDY_PAIRS = (
    *((v.name, VANILLA.name) for v in STUDY_VARIANTS[1:]),
    (SINK_END.name, SINK.name), (SINK2.name, SINK.name), (SINK4.name, SINK.name), (SINK_ZERO.name, SINK.name),
    (GATED.name, SINK.name), (SINK_LOGIT.name, SINK.name), (SINK_LOGIT.name, SINK_ZERO.name),
    (SOFTMAX_ONE.name, SINK_LOGIT.name),
)
# The paper's own from-scratch variants (One-Token Tables 2-5 and the gated-attention baseline): `study`.
PAPER_VARIANTS = STUDY_VARIANTS[:7]
PAPER_PAIRS = tuple(p for p in STUDY_PAIRS if set(p) <= {v.name for v in PAPER_VARIANTS})

# What each compared pair asks (reports print the verdicts under these questions).
PAIR_QUESTIONS = {
    (SINK.name, VANILLA.name): "Does one extra sink token (front) change the DLM?",
    (SINK_END.name, VANILLA.name): "Does one extra sink token at the end change the DLM?",
    (SINK2.name, VANILLA.name): "Do 2 sink tokens change the DLM?",
    (SINK4.name, VANILLA.name): "Do 4 sink tokens change the DLM?",
    (SINK_ZERO.name, VANILLA.name): "Does a zero-value sink token change the DLM?",
    (GATED.name, VANILLA.name): "Does gated attention change the DLM?",
    (SINK_LOGIT.name, VANILLA.name): "Does a per-head sink logit change the DLM?",
    (SOFTMAX_ONE.name, VANILLA.name): "Does softmax-off-by-one change the DLM?",
    (SINK_END.name, SINK.name): "Does the sink position matter (end vs front)?",
    (SINK2.name, SINK.name): "Do 2 sinks differ from 1?",
    (SINK4.name, SINK.name): "Do 4 sinks differ from 1?",
    (SINK_ZERO.name, SINK.name): "Does a zero-value sink differ from a learned-value one?",
    (GATED.name, SINK.name): "Does gated attention differ from a sink token?",
    (SINK_LOGIT.name, SINK.name): "Does a per-head sink logit differ from a sink token?",
    (SINK_LOGIT.name, SINK_ZERO.name): "Does a per-head sink logit differ from a zero-value sink token (both add a zero-value key)?",
    (SOFTMAX_ONE.name, SINK_LOGIT.name): "Does a fixed logit 0 (softmax₁) differ from a learned logit?",
}

MICRO = dict(vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
SHAKESPEARE_TASKS = "shakespeare_cloze,shakespeare_next_line,shakespeare_word_order"
# Tokens per analysis prompt: windows of the held-out Shakespeare text drawn by the one prompt
# extractor, `sinkdlm.analysis.prompts_from_documents` (seed 0), as `analyze --data` draws them.
# Results committed before this extractor was shared analysed line-aligned 160-character snippets
# instead (docs/method.md §6).
ANALYSIS_PROMPT_TOKENS = 32


# ----------------------------------------------------------------------------- the presets (recipes)
def smoke() -> ExperimentPreset:
    """The whole experiment path (micro model, 3 steps), its measured time in its description: for tests."""
    return ExperimentPreset(
        name="smoke",
        description=("the whole experiment path in about a minute of CPU (measured with `time`: 51 s user+sys on "
                     "one thread of a 2-core AMD EPYC, 3.4 min wall while other jobs shared the cores; micro model, "
                     "3 steps): for tests, not for conclusions"),
        variants=(VANILLA, SINK, GATED),
        seeds=(0, 1),
        train=TrainConfig(preset="tiny", model_overrides=MICRO, data="shakespeare", max_steps=3, batch_size=4,
                          seq_len=32, max_tokens=20_000, eval_every=3, save_every=3, log_every=1, eval_batches=1, lr=1e-3),
        evaluation=EvalConfig(tasks=SHAKESPEARE_TASKS, limit=6, mc_num=2),
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=2, sample=SampleConfig(gen_length=8, steps=4), ablation_k="0,1"),
        analyse_every_seed=True,
        comparisons=(("sink1-front", "vanilla"), ("gated", "vanilla"), ("gated", "sink1-front")),
        validation=Validation(tokens=256, draws=2, batch_size=16, checkpoints=(0.5,)),  # a path test, not a measurement
        escape=Escape(pair=(SINK.name, VANILLA.name), secondary=((GATED.name, VANILLA.name),), every=1, sequences=2, draws=2),
    )


def demo() -> ExperimentPreset:
    """Vanilla DLM vs + 1 front sink on the tiny preset, 3 seeds (`make demo`; its committed run's measured time:
    docs/results/demo/results.json, shown in the README's set-up section)."""
    # Tiny masked-diffusion models sit on a unigram plateau before they learn to use context; the
    # budget buys steps, not batch (at 400 steps of batch 16 the masked-token loss did not depend
    # on t at all). 600 steps of batch 8 keep the demo short: the study's vanilla model already picks
    # the true word order 75 % of the time at step 500 (chance 50 %), cloze and next line not yet.
    return ExperimentPreset(
        name="demo",
        description="vanilla DLM vs DLM + 1 front sink; tiny preset on shakespeare, 3 seeds, paired",
        variants=(VANILLA, SINK),
        seeds=(0, 1, 2),
        train=TrainConfig(preset="tiny", data="shakespeare", max_steps=600, batch_size=8, seq_len=128, lr=5e-3,
                          min_lr=5e-4, eval_every=200, save_every=300, log_every=50, eval_batches=16),
        evaluation=EvalConfig(tasks=SHAKESPEARE_TASKS, limit=150, mc_num=8),
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=8, sample=SampleConfig(gen_length=32, steps=32), ablation_k="1,5,10"),
        analyse_every_seed=True,
    )


def study() -> ExperimentPreset:
    """The paper's from-scratch claims (One-Token Tables 2-5) on the tiny preset, decided on the pilot's protocol:
    7 variants x 5 seeds x 12,000 steps, the fixed validation at every fifth of training; about 6 h on 2 CPU cores."""
    # Sized from the pilot (docs/results/study-pilot, 3 seeds x 4,000 steps; docs/results/study-pilot-long, 2 seeds
    # x 12,000 steps, stopped after 2 of its 3 seeds to give the CPU to the real-weights study):
    #   * plateau: none. At 12,000 steps (8 epochs of the corpus) the last fifth still lowered the fixed val_loss
    #     by 0.10-0.11 nats (the declared criterion is 0.02): the loss falls ~0.3 nats per doubling of steps, so a
    #     plateau is several doublings away, beyond any 6 h budget for 7 variants. The study trains as long as the
    #     budget allows and reports the plateau measure as it is (it is declared, so it is not moved afterwards).
    #   * spread: the paired + 1 sink - vanilla difference converges late: seed 1's gap was +0.68, +0.29, +0.14,
    #     +0.06, +0.04 at 2,400 ... 12,000 steps, seed 0's +0.09, -0.01, -0.01, ..., -0.005. At 12,000 steps the
    #     per-seed differences spread by 0.034 nats (1 df: its 95 % interval is 0.015-1.1), so an MDE of 0.05 needs
    #     6 seeds per variant at that spread; at 4,000 steps the pilot measured 0.30 (hundreds of seeds).
    #   * cost: a 12,000-step run trained at 10,000-20,000 tokens/s here, 13-22 min with its validation, evaluation
    #     and analysis: about 16 min on quiet cores. (The mid-schedule drop to ~10,000 was denormal attention
    #     probabilities in the CPU attention backward; training now flushes them, bit-identically on this
    #     protocol, and ran 17,500-19,700 tokens/s where it had run 14,000-15,000: training/cpu.py.)
    #   * so: at the flushed rate (about 12 min per run with its measurements, from that 200-step segment; the first
    #     runs measure it) 6 h holds about 30 runs. The pilot-long's 4 finished runs (vanilla and + 1 sink, seeds 0
    #     and 1 at 12,000 steps; the same settings as here, so they are this study's runs and are reused) and its seed
    #     2 vanilla run (stopped at step 1,137, resumed from its checkpoint) plus 30 new ones make 7 variants x 5
    #     seeds. The budget forces dropping two of the nine mechanisms: the per-head sink logit and
    #     softmax-off-by-one, which are not in the paper's Tables 2-5 (they stay in `study-gpu`). 5 seeds: the MDE is
    #     1.68 x the spread (4 seeds: 2.13 x, 3: 3.26 x), 0.057 nats at the pilot's spread; the 0.05 target is met
    #     where a contrast's spread is <= 0.030 (the report sizes every contrast at the spread it measured).
    #   * the primary test: with 5 seeds the smallest two-sided p of an exact Wilcoxon or sign test is 1/16, so it
    #     could never reject at 5 %: the paired t test decides (`Primary.test = "t"`), the Wilcoxon shown beside.
    # Declared before the run: the primary comparison, the paper's "≈" claims with their margin (front ≈ end,
    # 1 ≈ 2 ≈ 4 sinks, zero-value ≈ learned), tested with TOST inside the report's multiplicity family, the plateau
    # criterion and the learning curve's points.
    pilot = study_pilot_long()
    return ExperimentPreset(
        name="study",
        description=("the paper's from-scratch claims (Tables 2-5): sink position (front/end), count (1/2/4), "
                     "zero-value sink and gated attention against the vanilla DLM; tiny preset on shakespeare, "
                     "12,000 steps, 5 seeds, paired"),
        variants=PAPER_VARIANTS,
        seeds=(0, 1, 2, 3, 4),
        train=pilot.train,
        evaluation=pilot.evaluation,
        analysis=pilot.analysis,
        analyse_every_seed=True,
        comparisons=PAPER_PAIRS,
        validation=pilot.validation,
        plateau_nats=pilot.plateau_nats,
        primary=Primary((SINK.name, VANILLA.name), test="t"),
        equivalence=Equivalence(0.05, ((SINK_END.name, SINK.name), (SINK2.name, SINK.name), (SINK4.name, SINK.name),
                                       (SINK_ZERO.name, SINK.name))),
    )


def escape() -> ExperimentPreset:
    """When does a run leave the unigram plateau, and does a sink token or gated attention move that moment? (docs/method.md §11)
    Vanilla vs + 1 front sink vs gated attention, tiny preset on shakespeare, 20 fresh seeds, 6,000 steps, probed
    every 100 steps; primary: + 1 sink vs vanilla, the log2 ratio of escape steps (docs/method.md §11)."""
    # Declared before any of its runs (docs/method.md §11). Sized from the 35 runs of docs/results/study (7 variants x 5
    # seeds x 12,000 steps), their escape steps recomputed from the logged training loss under this rule as nearly
    # as a 50-step single-batch log allows (tools/escape_sizing.py -> docs/results/escape-sizing/, exploratory):
    #   * threshold: the unigram plateau minus 0.4 nats. The tiny tokenizer's training-split unigram entropy is
    #     6.11 nats, so the committed runs escape below 5.71; the probe's own plateau (its set's cross-entropy under
    #     the training unigram, ~6.35 for its first 16 validation rows) is the probe's reference.
    #   * steps: 32 of the 35 committed runs escaped by 4,450 steps (24 by 2,400, 30 by 4,000), the other 3 at
    #     9,500-11,900 (trailing mean of 5 logged losses): 6,000 steps leave the typical range a margin and censor
    #     the stragglers, whose order the censored sign test still uses. The schedule is this run's own (warm-up
    #     5 %, cosine to 6,000), not the committed 12,000-step one: the first pairs show whether escapes moved.
    #   * spread and seeds: the paired log2 ratio of escape steps spread by sd 1.0-1.8 over the study's 5 seeds
    #     (pooled 1.35 over the six contrasts with vanilla). MDE of the exact two-sided sign test at 5 %, 80 % power
    #     (`escape.sign_test_mde`, normal differences at sd 1.35): 1.87 log2 at 10 seeds, 1.52 at 12, 1.42 at 16,
    #     1.13 at 20 (24: 1.13 again, the test is discrete). So 20 seeds: MDE 1.13 log2 (a 2.2x ratio of escape
    #     steps). The exploratory + 1 sink / vanilla median was +0.04 and gated / vanilla -1.22 (5 of 5 earlier):
    #     an effect of the latter's size is detectable, one of -0.9 is not (docs/results/escape-sizing/).
    #   * cost: ~7-8 min per run on 2 quiet cores (6,000 steps at the committed study's ~17 steps/s, 60 probes of
    #     0.5-0.9 s, the fixed validation ~40 s), 60 runs: ~8 h over several sessions; every run is finished, recorded and committable
    #     before the next starts (`--out docs/results/escape`: the checkpoints stay out of git, runner docstring).
    #   * fresh seeds 100-119: no earlier preset used them, so no run was seen before the rule was declared.
    pilot = study_pilot()
    return ExperimentPreset(
        name="escape",
        description=("escape from the unigram plateau: vanilla vs + 1 front sink vs gated attention, tiny preset on "
                     "shakespeare, 6,000 steps probed every 100, 20 fresh seeds, paired log2 ratio of escape steps"),
        variants=(VANILLA, SINK, GATED),
        seeds=tuple(range(100, 120)),
        train=dataclasses.replace(pilot.train, max_steps=6000, eval_every=1500, save_every=500),
        evaluation=pilot.evaluation,
        analysis=pilot.analysis,
        comparisons=((SINK.name, VANILLA.name), (GATED.name, VANILLA.name), (GATED.name, SINK.name)),
        validation=Validation(tokens=32_768, draws=8),  # the loss at the last step (secondary); the probes are the curve
        escape=Escape(pair=(SINK.name, VANILLA.name), secondary=((GATED.name, VANILLA.name),), sized_for=1.13),
    )


def late_sink() -> ExperimentPreset:
    """What a sink added after pretraining buys (docs/method.md §12): one tiny vanilla DLM trained here (6,000 steps, seed
    200), then continued 1,500 steps five ways, 10 fresh seeds: (a) all weights, nothing added; (b) + 1 sink, the
    sink alone trains; (c) LoRA; (d) LoRA + 1 sink; (e) + 1 sink, all weights. Primary: (e) - (a) fixed
    validation loss at the last step (exact Wilcoxon); the sink's attention share and the moving-sink rate per
    layer from every seed's analysis, each arm's step-0 control beside it (docs/method.md §12)."""
    # Declared before any of its runs (docs/method.md §12).
    #   * the base: the `escape` study's recipe (tiny, shakespeare, 8 x 128 tokens, lr 5e-3 cosine to 5e-4 over
    #     6,000 steps), seed 200, which no preset used before. 32 of the 35 committed from-scratch runs had left
    #     the unigram plateau by 4,450 steps (docs/results/escape-sizing), so the base is a model that learned.
    #   * the arms continue 1,500 steps (a quarter of the base's) at lr 1e-3, warm-up 5 %, cosine to 1e-4, the
    #     same for every arm: equal steps and tokens (equal compute per token is not claimed: sink-only and LoRA
    #     steps are cheaper, measured and reported by each run's timing). LoRA: rank 8, alpha 16, attn + mlp.
    #   * pairs: (e) - (a) primary (does the sink lower the loss when everything trains?); (d) - (c) and
    #     (b) - (a) in the BH family beside it. Each sink arm's own seed draws its sink (its own step-0 control).
    #   * seeds: the closest committed design (SmolLM2 converted once and continued with and without a sink,
    #     6 seeds) spread its paired end difference by sd 0.0195 nats (tools/late_sink_sizing.py ->
    #     docs/results/late-sink-sizing, a proxy); the paired t test's MDE at 10 seeds is 0.019 nats (80 %
    #     power, two-sided 5 %), about 0.02 for the exact Wilcoxon test (ARE 3/pi). The report restates the MDE
    #     from the study's own spread. Fresh seeds 300-309.
    #   * cost: the base ~12 min on one quiet thread (the escape runs' speed); a continuation ~3 min of training
    #     plus ~1 min scoring (fixed validation 32,768 tokens x 8 draws, the three Shakespeare tasks, the
    #     analysis); 50 runs and 11 step-0 controls (arms with the same switches share one: Variant.step0): ~4 h.
    pilot = study_pilot()
    return ExperimentPreset(
        name="late-sink",
        description=("a sink added after pretraining: one tiny vanilla DLM (6,000 steps) continued 1,500 steps as "
                     "all weights, + 1 sink (sink only), LoRA, LoRA + 1 sink, + 1 sink (all weights); 10 seeds, paired"),
        variants=(LATE_ALL, LATE_SINK_ONLY, LATE_LORA, LATE_LORA_SINK, LATE_SINK_ALL),
        seeds=tuple(range(300, 310)),
        train=dataclasses.replace(pilot.train, max_steps=1500, lr=1e-3, min_lr=1e-4, eval_every=500,
                                  save_every=500),
        evaluation=pilot.evaluation,
        analysis=pilot.analysis,
        analyse_every_seed=True,  # the sink's share and the moving-sink rate need every seed (intervals)
        comparisons=((LATE_SINK_ALL.name, LATE_ALL.name), (LATE_LORA_SINK.name, LATE_LORA.name),
                     (LATE_SINK_ONLY.name, LATE_ALL.name)),
        validation=Validation(tokens=32_768, draws=8),
        primary=Primary((LATE_SINK_ALL.name, LATE_ALL.name), sized_for=0.019),
        base=Base(dataclasses.replace(escape().train, seed=200)),
    )


# Block diffusion (docs/method.md §15): the same tiny DLM, block-causal at 4 and 16 tokens, with and without the sink
BLOCK4 = Variant("block4", "block 4", {"num_sink_tokens": 0, "gated_attention": False, "block_size": 4})
BLOCK4_SINK = Variant("block4-sink1", "block 4 + 1 sink", {"num_sink_tokens": 1, "sink_position": "front",
                                                           "block_size": 4})
BLOCK16 = Variant("block16", "block 16", {"num_sink_tokens": 0, "gated_attention": False, "block_size": 16})
BLOCK16_SINK = Variant("block16-sink1", "block 16 + 1 sink", {"num_sink_tokens": 1, "sink_position": "front",
                                                              "block_size": 16})


def block_sinks_pilot() -> ExperimentPreset:
    """The pilot that sizes the `block-sinks` study (docs/method.md §15): vanilla on the whole sequence against
    vanilla in blocks of 4, 3 fresh seeds, 3,000 steps of the escape recipe; every seed analysed. It measures the
    spread over seeds of the paired difference in the moving-sink rate (the study's primary) and each arm's cost."""
    # Exploratory: it sizes the study, decides nothing (its seeds 400-402 are not the study's). The recipe is the
    # escape study's (tiny, shakespeare, 8 x 128 tokens, lr 5e-3 cosine to 5e-4) at half its steps: the budget of
    # two cores; the sampler of the analysis the same for every arm (32 tokens, 32 steps; a block model decodes
    # block by block, `analysis.analyzer`); no sink-masking ablation (not yet for a block model, §15).
    pilot = study_pilot()
    return ExperimentPreset(
        name="block-sinks-pilot",
        description=("the block-sinks study's pilot: vanilla DLM on the whole sequence vs in blocks of 4, tiny preset "
                     "on shakespeare, 3,000 steps, 3 seeds, every seed analysed"),
        variants=(VANILLA, BLOCK4),
        seeds=(400, 401, 402),
        train=dataclasses.replace(escape().train, max_steps=3000, eval_every=1000, save_every=500),
        evaluation=pilot.evaluation,
        analysis=dataclasses.replace(pilot.analysis, ablation_k=None),
        analyse_every_seed=True,
        comparisons=((BLOCK4.name, VANILLA.name),),
        validation=Validation(tokens=32_768, draws=8),
        primary=Primary((BLOCK4.name, VANILLA.name), metric="content_sink_set_change_rate", test="t"),
    )


def quant() -> ExperimentPreset:
    """Does a sink make a DLM quantizable? (docs/method.md §16) Vanilla vs + 1 front sink vs gated attention on the escape
    recipe (tiny, shakespeare, 6,000 steps), 10 fresh seeds, every seed analysed; after training each run is scored on
    the fixed validation quantized (torchao int8-dynamic and int8-weight). Primary: + 1 sink's Δ_quant − vanilla's
    under int8-dynamic, paired by seed (exact Wilcoxon, the paired t interval beside it)."""
    # Declared before any of its runs (docs/method.md §16). Bondarenko et al. (2023) trace the activation outliers that
    # break W8A8 quantization to heads that learn a "no-op" by attending to a low-information token; a dedicated sink
    # token (or a gate) gives them that no-op without an outlier. The question is whether this holds for a DLM.
    #   * the recipe: the escape study's (docs/method.md §11), whose runs left the unigram plateau by ~4,500 steps, so
    #     every run is a model that uses context; gated attention is the gate Bondarenko et al. propose.
    #   * schemes: int8-dynamic (W8A8: activations quantized per token, where outliers matter) is primary; int8-weight
    #     (weights only) beside it. Both run on a CPU (torchao); int4-weight needs CUDA and is not declared here.
    #   * seeds 500-509: no earlier preset used them. 10 seeds: the exact Wilcoxon test's smallest two-sided p is
    #     1/512.
    #   * sized from the pilot (`quant-pilot`, 3 seeds, tools/quant_sizing.py -> docs/results/quant-sizing), before any
    #     of the study's runs: the primary's per-seed differences were -0.00056, +0.00106 and +0.00007 nats (sd
    #     0.00082), so the paired t test's MDE (80 % power, two-sided 5 %) at 10 seeds is 0.00082 nats: `sized_for`
    #     0.001. Vanilla's whole W8A8 cost was +0.0004 nats (mean of 3), so a sink that removed all of it would not be
    #     detected (about 40 seeds at that spread); an sd from 3 seeds is uncertain (2 df: its 95 % interval reaches
    #     6.3x), and where the study's own MDE exceeds 0.001 its report says inconclusive.
    #   * cost, measured by the pilot (one thread a run, two runs at once, 2-core AMD EPYC): 0.45-0.53 core-h a run,
    #     training ~20 min and the int8-dynamic scoring ~7 min of it (torchao's eager W8A8 is much slower than float32
    #     on this CPU, benchmarks/bench_quant.py); 30 runs about 15 core-h, over several sessions (resumable).
    esc = escape()
    return ExperimentPreset(
        name="quant",
        description=("does a sink make a DLM quantizable? vanilla vs + 1 front sink vs gated attention, tiny preset on "
                     "shakespeare, 6,000 steps, 10 fresh seeds, each run scored quantized (torchao int8-dynamic, "
                     "int8-weight) on the fixed validation, paired"),
        variants=(VANILLA, SINK, GATED),
        seeds=tuple(range(500, 510)),
        train=esc.train,
        evaluation=esc.evaluation,
        analysis=esc.analysis,
        analyse_every_seed=True,
        comparisons=((SINK.name, VANILLA.name), (GATED.name, VANILLA.name), (GATED.name, SINK.name)),
        validation=Validation(tokens=32_768, draws=8),
        quantization=Quantization(pair=(SINK.name, VANILLA.name), secondary=((GATED.name, VANILLA.name),),
                                  sized_for=0.001),
    )


def quant_pilot() -> ExperimentPreset:
    """The pilot that sizes `quant` (docs/method.md §16): the same arms and recipe, 3 fresh seeds (510-512). It measures
    the spread over seeds of the paired Δ_quant difference and each run's cost; it decides nothing."""
    # The same 6,000 steps as the study, not fewer: outliers grow with training (Bondarenko et al. 2023), so a shorter
    # pilot would measure the spread of other models than the study's. Its seeds are not the study's.
    study = quant()
    return dataclasses.replace(
        study,
        name="quant-pilot",
        description=("the quant study's pilot: vanilla vs + 1 front sink vs gated attention, tiny preset on "
                     "shakespeare, 6,000 steps, 3 fresh seeds, each run scored quantized (torchao int8): the spread "
                     "of the paired Δ_quant difference"),
        seeds=(510, 511, 512),
        quantization=dataclasses.replace(study.quantization, sized_for=None),  # the pilot sizes; it is not sized
    )


def block_sinks() -> ExperimentPreset:
    """Does the sink token matter when attention is block-causal, and how do sinks move as the block shrinks?
    (docs/method.md §15) Blocks of 4, 16 and the whole sequence, each vanilla and + 1 front sink, the pilot's recipe,
    10 fresh seeds; primary: the moving-sink rate of vanilla in blocks of 4 minus vanilla on the whole sequence."""
    # Declared before any of its runs (docs/method.md §15), sized from `block_sinks_pilot` (3 seeds,
    # tools/block_sinks_sizing.py -> docs/results/block-sinks-sizing, exploratory):
    #   * the pilot's per-seed differences (block 4 - whole sequence, content sink-set change rate, mean over
    #     layers) were -0.138, -0.083 and -0.331: mean -0.184, sd 0.130. The paired t test's MDE (80 % power,
    #     two-sided 5 %) at that spread is 0.150 at 8 seeds, 0.130 at 10, 0.116 at 12: 10 seeds detect an effect
    #     of the pilot's size, not one of half of it. The declared test is the exact Wilcoxon (10 untied
    #     differences: smallest two-sided p 1/512), the paired t interval beside it.
    #   * secondary (Benjamini-Hochberg, the report's family): + 1 sink - vanilla at each block size on the rate
    #     and on val_loss (a block size's own bound, §15), and block 16 - whole; their spread is unknown before
    #     the study (the pilot ran the primary pair only): the report states each MDE from the study's own spread.
    #   * cost: the pilot's runs took 0.28 core-h (whole sequence) and 0.52 core-h (blocks of 4) each, one
    #     thread a run, two at once beside other work: about 2.7 core-h a seed of six arms (blocks of 16 priced as
    #     4), 27 core-h in all, over several sessions (`--launcher local --jobs 2 --cpus-per-task 1`, resumable).
    #   * fresh seeds 420-429: no preset used them.
    pilot = block_sinks_pilot()
    return dataclasses.replace(
        pilot,
        name="block-sinks",
        description=("sinks as the block shrinks: blocks of 4, 16 and the whole sequence, each vanilla and + 1 front "
                     "sink, tiny preset on shakespeare, 3,000 steps, 10 seeds, paired"),
        variants=(VANILLA, SINK, BLOCK16, BLOCK16_SINK, BLOCK4, BLOCK4_SINK),
        seeds=tuple(range(420, 430)),
        comparisons=((BLOCK4.name, VANILLA.name), (SINK.name, VANILLA.name), (BLOCK16_SINK.name, BLOCK16.name),
                     (BLOCK4_SINK.name, BLOCK4.name), (BLOCK16.name, VANILLA.name)),
        primary=Primary((BLOCK4.name, VANILLA.name), metric="content_sink_set_change_rate", sized_for=0.13),
    )


def study_pilot() -> ExperimentPreset:
    """The pilot that sizes the study (docs/method.md §7): vanilla vs + 1 front sink, 3 seeds, 4x the study's steps,
    the fixed validation scored at every fifth of training: the plateau and the spread of the paired differences."""
    # What it measures, before the study is sized: (1) where the fixed val_loss plateaus (the declared
    # criterion: the last fifth of training lowers it by less than `plateau_nats`), (2) the spread over seeds
    # of the paired + 1 sink - vanilla difference, which with the per-run cost sets seeds and steps for an
    # MDE of 0.05 nats within about 6 h of CPU compute. Warm-up 5 %, then cosine annealing to lr / 10.
    return ExperimentPreset(
        name="study-pilot",
        description=("the study's pilot: vanilla vs + 1 front sink, tiny preset on shakespeare, 3 seeds, 4,000 steps, "
                     "the fixed validation at every fifth of training (plateau and spread of the paired differences)"),
        variants=(VANILLA, SINK),
        seeds=(0, 1, 2),
        train=TrainConfig(preset="tiny", data="shakespeare", max_steps=4000, batch_size=8, seq_len=128, lr=5e-3,
                          min_lr=5e-4, warmup_frac=0.05, eval_every=500, save_every=500, log_every=50, eval_batches=16,
                          keep_last=1),
        evaluation=EvalConfig(tasks=SHAKESPEARE_TASKS, limit=100, mc_num=4),
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=8, sample=SampleConfig(gen_length=32, steps=32), ablation_k="1,5,10"),
        comparisons=((SINK.name, VANILLA.name),),
        validation=Validation(tokens=32_768, draws=8, checkpoints=(0.2, 0.4, 0.6, 0.8)),
        plateau_nats=0.02,
        primary=Primary((SINK.name, VANILLA.name)),
    )


def study_pilot_long() -> ExperimentPreset:
    """The pilot's second phase: 3x its steps (12,000), to find where the tiny DLMs plateau; seed 1 first."""
    # The pilot (docs/results/study-pilot, 3 seeds x 4,000 steps) found no plateau: every run's last fifth lowered
    # the fixed val_loss by 0.07-0.13 nats (criterion 0.02), and the paired + 1 sink - vanilla difference spread
    # by 0.30 nats over seeds, growing with training (0.15 at step 800), because seed 1's sink run left the
    # unigram plateau later (5.54 against 5.04-5.16 for the others at step 4,000). An MDE of 0.05 at that spread
    # needs hundreds of seeds; a study can only decide where the runs have converged. Seed 1 (the lagging pair)
    # runs first. About 14 min per run on 2 quiet cores (15,000 tokens/s).
    return dataclasses.replace(
        study_pilot(),
        name="study-pilot-long",
        description=("the study's pilot, second phase: vanilla vs + 1 front sink, tiny preset on shakespeare, 12,000 "
                     "steps, the fixed validation at every fifth of training; seeds 1, 0, 2"),
        seeds=(1, 0, 2),
        train=dataclasses.replace(study_pilot().train, max_steps=12_000, eval_every=1500, save_every=1500),
    )


def study_gpu() -> ExperimentPreset:
    """The study sized for one H100 (time not measured yet): small preset, 4x the tokens, bf16."""
    return dataclasses.replace(
        study(),
        name="study-gpu",
        description=("the study's comparison with every sink mechanism, sized for one H100 (time not measured yet): "
                     "small preset, 4x the tokens, 5 seeds, paired"),
        variants=STUDY_VARIANTS,  # on a GPU the two mechanisms `study` drops for its CPU budget come back
        comparisons=STUDY_PAIRS,
        seeds=(0, 1, 2, 3, 4),
        train=TrainConfig(preset="small", data="shakespeare", max_steps=1500, batch_size=32, seq_len=256, lr=2e-3,
                          min_lr=2e-4, eval_every=250, save_every=500, log_every=50, eval_batches=16, bf16=True),
        evaluation=EvalConfig(tasks=SHAKESPEARE_TASKS, limit=500, mc_num=16),
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=16, sample=SampleConfig(gen_length=64, steps=64, block_length=32), ablation_k="1,5,10"),
    )


def ablation() -> ExperimentPreset:
    """Tables 3-5 on the small preset, 3 seeds, with SFT on arithmetic: more than a day on 2 CPU cores."""
    return ExperimentPreset(
        name="ablation",
        description="Tables 3-5: sink position (front/end), count (1/2/4), zero-value sink, gated attention",
        variants=(VANILLA, SINK, SINK_END, SINK2, SINK4, SINK_ZERO, GATED),
        seeds=(0, 1, 2),
        train=TrainConfig(preset="small", data="shakespeare", max_steps=3000, batch_size=32, seq_len=256, lr=1e-3,
                          min_lr=1e-4, eval_every=250, save_every=500, log_every=50, eval_batches=16),
        evaluation=EvalConfig(tasks=SHAKESPEARE_TASKS + ",arithmetic", limit=500, mc_num=16),
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=16, sample=SampleConfig(gen_length=64, steps=64, block_length=32), ablation_k="1,5,10"),
        sft=TrainConfig(data="arithmetic", max_steps=1000, batch_size=32, seq_len=256, lr=5e-4, eval_every=250,
                        save_every=500),
    )


def real() -> ExperimentPreset:
    """The One-Token comparison from real weights (SmolLM2-135M, the example GGUF), on 2 CPU cores."""
    # Cost on the 2-core CPU (measured, 2 threads): a training step of 4 x 128 tokens on the converted model
    # (forward, backward, AdamW) runs at 110-138 tokens/s (an earlier machine: 63-71), so 200 steps take
    # about 14 min per run (a profile: backward 57 %, forward 27 %, AdamW 6 %); evaluation (40 items x 3
    # tasks, mc 2) and the analysis about 3 min per run. Gated attention only in `real-gpu`.
    # Dream-style adaptation: the AR head keeps predicting the next token (shift_logits). The fixed
    # validation (docs/method.md §1) is the expensive part: 36 draws x 256 sequences = 9,216 forwards of
    # 128 tokens per run and per step-0 control, 8.7-9.3 s per sequence of 36 draws: about 40 min per
    # model, 5 h of the study's 7. The experiment finishes one model at a time (docs/method.md §7), with
    # interim comparisons (`interim.json`, `progress.md`).
    return ExperimentPreset(
        name="real",
        description=("SmolLM2-135M-Instruct (LLaMA, Q4_1 GGUF) converted to a DLM: vanilla vs + 1 front sink, continued "
                     "pre-training on shakespeare with the same seeds and data order, paired"),
        variants=(VANILLA, SINK),
        seeds=(0, 1, 2),
        train=TrainConfig(data="shakespeare", max_steps=200, batch_size=4, seq_len=128, lr=5e-5, min_lr=5e-7,
                          warmup_frac=0.05, eval_every=100, save_every=100, log_every=10, eval_batches=8,
                          shift_logits=True, keep_last=1),
        evaluation=EvalConfig(tasks=SHAKESPEARE_TASKS, limit=40, mc_num=2),
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=4, sample=SampleConfig(gen_length=32, steps=32), ablation_k="1,5,10"),
        analyse_every_seed=True,
        comparisons=((SINK.name, VANILLA.name),),
        default_init_from="example",
        # 36 draws: the converted SmolLM2 (+ 1 sink, step 0) measured σ²_draw = 0.874 nats² per (sequence,
        # draw) on these 256 x 128 tokens (16 sequences x 8 draws), so SE = sqrt(0.874 / (256 D)) <= 0.01
        # needs D >= 34.1 (docs/method.md §1); each run's val.json re-measures it (`draws_for_target_se`).
        validation=Validation(tokens=32_768, draws=36),
    )


def real_bf16() -> ExperimentPreset:
    """`real` in bf16 autocast, training and fixed validation alike (CPUs with AMX bf16 units, GPUs)."""
    # Measured on a 2-core Xeon with AMX (Sapphire Rapids), one thread beside a running study, SmolLM2 + 1 sink: a 128 x 1536 x 576
    # matmul runs at 1,215 GFLOP/s in bf16 vs 143 in fp32; a training step of 4 x 128 tokens 2.28 s vs
    # 4.35 s, a validation batch of 8 rows 0.76 s vs 1.91 s; in the study itself (2 threads, quiet) training
    # ran at 290-330 tokens/s vs 245 and validation at 2.2 s vs 4.45 per sequence (the rest is not matmul). Same
    # recipe, seeds and noise as `real`, so only the precision differs; results are not pooled with `real`'s
    # (the fixed validation's pairing key includes bf16).
    # Round 4 (docs/method.md §7): the paper's question is the gap at the end of training, so that is the declared primary
    # endpoint (exact Wilcoxon signed-rank test with the Hodges-Lehmann estimate, beside the t interval), reported
    # with the step-0 gap and the training effect, each seed converted with its own sink draw and scored at step 0,
    # T/2 and T. Sizes from the measured costs of round 3 (7 seeds, 200 steps, 36 draws; this AMX CPU):
    #   * validation draws: the SE of the *paired* difference, which the shared noise keeps small, was 0.0024 at 36
    #     draws, 0.0055 at 12 and 0.0079 at 8 (mean over the 7 pairs); the seeds' spread of that difference was
    #     0.04-0.16. 12 draws leave the validation noise under 2 % of the seed variance at a third of the cost
    #     (about 3.1 min per scoring of 256 sequences instead of 9.4);
    #   * training: 3x round 3's tokens (600 steps x 4 x 128 = 307,200 per run), about 18 min per run at 1.8 s/step;
    #   * seeds: a seed pair costs about 56 min (2 x 18 min training, 5 scorings, 2 x 2 min evaluation and
    #     analysis), so 6 seeds fit the 6 h budget. 6, not 5: with 5 untied differences the exact Wilcoxon test's
    #     smallest two-sided p is 1/16, so it could never reject at 5 %; with 6 it is 1/32.
    # Round 3 (7 seeds, 200 steps, one sink draw for every seed) is in git history (docs/results/smollm2/dlm).
    base = real()
    return dataclasses.replace(
        base,
        name="real-bf16",
        description=base.description + "; bf16 autocast (training and fixed validation)",
        seeds=tuple(range(6)),
        train=dataclasses.replace(base.train, bf16=True, max_steps=600, eval_every=300, save_every=100),
        validation=dataclasses.replace(base.validation, bf16=True, draws=12, checkpoints=(0.5,)),
        primary=Primary((SINK.name, VANILLA.name)),
    )


def real_quant() -> ExperimentPreset:
    """What W8A8 and int8 weights cost SmolLM2-135M's DLM conversions, vanilla and + 1 front sink (docs/method.md §16):
    `real`'s recipe in float32, one seed, each final checkpoint scored quantized on a small fixed validation."""
    # Issue 66 item 4's DLM rows, at the smallest size that answers on 2 CPU cores without bf16 units (no AMX here,
    # so float32 and not `real-bf16`): `real`'s 200 steps (its round 3), one seed. It measures each conversion's
    # Δ_quant, paired per (sequence, draw) on the same masks; one seed per arm gives no interval over training seeds,
    # so the arms' difference is descriptive. Size: torchao's eager W8A8 forward of 128 tokens takes ~12 s on one
    # thread of this AMD EPYC (quant-real: 1,544 s for 128 rows), so the fixed validation is 64 sequences x 2 draws
    # (128 rows, ~26 min a run quantized); the released AR model's W8A8 Δ was +0.035 nats with an sd over sequences
    # of ~0.05 (docs/results/quant-real), which 64 sequences resolve to about ±0.013.
    base = real()
    return dataclasses.replace(
        base,
        name="real-quant",
        description=("SmolLM2-135M-Instruct converted to a DLM, vanilla vs + 1 front sink, `real`'s 200 steps in "
                     "float32, one seed, each final checkpoint scored quantized (torchao int8-dynamic, int8-weight) "
                     "on 64 x 128 fixed validation tokens x 2 draws"),
        seeds=(0,),
        evaluation=dataclasses.replace(base.evaluation, limit=20, mc_num=1),
        analysis=dataclasses.replace(base.analysis, num_prompts=2, ablation_k="1"),
        validation=Validation(tokens=8_192, draws=2),
        quantization=Quantization(pair=(SINK.name, VANILLA.name)),
    )


def real_gpu() -> ExperimentPreset:
    """`real` with gated attention too, sized for one H100 (run time unmeasured): 5 seeds, 8x the tokens, bf16."""
    return dataclasses.replace(
        real(),
        name="real-gpu",
        description=("the real-initialisation comparison sized for one H100 (run time not measured yet): 5 seeds, "
                     "8x the tokens of `real`, bf16"),
        variants=(VANILLA, SINK, GATED),
        seeds=(0, 1, 2, 3, 4),
        train=TrainConfig(data="shakespeare", max_steps=800, batch_size=16, seq_len=256, lr=5e-5, min_lr=5e-7,
                          warmup_frac=0.05, eval_every=200, save_every=400, log_every=20, eval_batches=16,
                          shift_logits=True, bf16=True, keep_last=1),
        evaluation=EvalConfig(tasks=SHAKESPEARE_TASKS, limit=300, mc_num=8),
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=16, sample=SampleConfig(gen_length=64, steps=64, block_length=32), ablation_k="1,5,10"),
        comparisons=((SINK.name, VANILLA.name), (GATED.name, VANILLA.name), (GATED.name, SINK.name)),
    )


# The paper's Table 1 reports one run per arm and no spread: an MDE cannot be computed from it
PAPER_MDE = "unknown (the paper reports one run per arm and no spread; a pilot of 2 seeds per arm sizes it)"


def paper_0_5b() -> ExperimentPreset:
    """Tables 1-2: Qwen2.5-0.5B init, FineWeb, lm-eval zero-shot tasks, GSM8K after SFT (GPUs)."""
    return ExperimentPreset(
        name="paper-0.5b",
        description=("Table 1-2: Qwen2.5-0.5B init, FineWeb, vanilla vs 1 sink vs gated attention; lm-eval zero-shot "
                     "tasks, GSM8K after SFT (GPUs)"),
        variants=(VANILLA, SINK, GATED),
        seeds=(0,),
        train=TrainConfig(max_steps=60_000, batch_size=512, seq_len=1024, lr=1e-4, min_lr=1e-5, eval_every=1000,
                          save_every=1000, log_every=10, eval_batches=32, bf16=True),
        evaluation=EvalConfig(tasks="gsm8k", limit=None, mc_num=128),
        lm_eval_tasks=TABLE1_TASKS,
        analysis=AnalyzeConfig(prompt_length=ANALYSIS_PROMPT_TOKENS,
                               num_prompts=64, sample=SampleConfig(gen_length=256, steps=256, block_length=32), ablation_k="1,5,10"),
        sft=TrainConfig(data="gsm8k", max_steps=5000, batch_size=64, seq_len=512, lr=1e-5, eval_every=500,
                        save_every=1000),
        needs=("init_from", "data", "gsm8k"),
        gpu_model="qwen2.5-0.5b",
        paper_mde=PAPER_MDE,
    )


def paper_1_5b() -> ExperimentPreset:
    """Table 1's 1.5 B block: Qwen2.5-1.5B init, 100 B FineWeb tokens at a batch of 4,096 (GPUs)."""
    p = paper_0_5b()
    return dataclasses.replace(
        p, name="paper-1.5b",
        description=("Table 1 (1.5 B): Qwen2.5-1.5B init, FineWeb, vanilla vs 1 sink vs gated attention; lm-eval "
                     "zero-shot tasks, GSM8K after SFT (GPUs)"),
        # 100 B tokens / (4,096 x 1,024) = 23,842 steps; the paper's peak and minimum learning rates
        train=dataclasses.replace(p.train, max_steps=23_842, batch_size=4096),
        gpu_model="qwen2.5-1.5b",
    )


PRESETS: dict[str, Callable[[], ExperimentPreset]] = {
    "smoke": smoke, "demo": demo, "study": study, "escape": escape, "late-sink": late_sink, "quant": quant,
    "quant-pilot": quant_pilot, "study-pilot": study_pilot, "block-sinks-pilot": block_sinks_pilot, "block-sinks": block_sinks, "study-pilot-long": study_pilot_long, "study-gpu": study_gpu, "ablation": ablation,
    "real": real, "real-bf16": real_bf16, "real-quant": real_quant, "real-gpu": real_gpu, "paper-0.5b": paper_0_5b, "paper-1.5b": paper_1_5b,
}


def get_preset(name: str) -> ExperimentPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown experiment preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
