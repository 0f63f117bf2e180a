"""The configs of the commands that use a model: sample, analyse, evaluate (and the lm-eval model), convert, experiment.

Each field is declared once with its default and a docstring; the command line generates one
option per field from them (`sinkdlm.cli.options`), and the experiment presets build the same
classes (`sinkdlm.experiment.presets`), so ϵ = 3, the ELBO's 16 samples or a batch of 8 have a
single home. Values are checked by the library before any work starts; these classes only say
what can be set. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from sinkdlm.config.fields import DeviceOption, option
from sinkdlm.config.launch import LaunchConfig
from sinkdlm.config.model import switch_fields, switch_values

ELBO_SAMPLES = 16  # Monte-Carlo samples of an ELBO, the default of `analyze` and `eval` (`--mc-num`)
GEN_BLOCK_LENGTH = 32  # semi-autoregressive blocks for generated answers (LLaDA's GSM8K setting)


@dataclass(kw_only=True)
class ModelOptions(DeviceOption):
    """Which model to open, and where."""

    model: Path | None = None
    """Model: a directory (sinkdlm checkpoint, LLaDA, Dream, autoregressive Qwen2/LLaMA) or a .gguf file (llama, qwen2; dream, llada diffusion LMs)."""
    dtype: str | None = None
    """float32 | bfloat16 | float16 (default: as stored)."""
    quantize: str | None = None
    """Quantize the model's linear layers after loading, for inference (torchao, `pip install 'sinkdlm[quant]'`): int8-weight (the block linears in a quarter of float32's bytes, half of bfloat16's) | int8-dynamic (W8A8: activations too) | int4-weight (CUDA of compute capability >= 8.0, --dtype bfloat16). The sink embeddings, sink logits, token embeddings, norms and LM head keep their dtype."""


@dataclass(kw_only=True)
class KVCacheDtypeOption:
    """The one declaration of `--kv-cache-dtype`, inherited by the settings that hold a `cache`."""

    kv_cache_dtype: str | None = None
    """int8: store the KV cache's keys and values in int8, a symmetric scale per token and head (the sink tokens' kept in full precision, as IntactKV): a whole-sequence model's --cache, which it needs; a block model's block cache (always on). Default: the model's dtype."""


@dataclass(kw_only=True)
class RemaskingOptions:
    """Which masked positions a reverse step commits and how it predicts them (docs/method.md §2,
    `sinkdlm.diffusion.remasking`): part of `SampleConfig`, and of `EvalConfig` for its generation tasks."""

    remasking: str | None = None
    """low_confidence | random (LLaDA) | maskgit_plus | topk_margin | entropy | origin (Dream's alg). Default: the model family's (ModelConfig.family: entropy for Dream, low_confidence otherwise; maskgit_plus for Dream with --threshold)."""
    schedule: str | None = None
    """Commits per step: llada (a block's masks split evenly over its steps) | dream (Dream's timesteps linspace(1, eps, steps+1), int(n*(1-s/t)) per step). Default: the model family's."""
    eps: float = 1e-3
    """Dream's last timestep (--schedule dream), in (0, 1)."""
    alg_temp: float = 0.0
    """Draw the committed positions from softmax(confidence / alg_temp) (Dream's alg_temp); 0 commits the most confident."""
    top_p: float | None = None
    """Sample only from the most likely tokens whose probability sums to top_p, in (0, 1] (Dream's top_p)."""
    top_k: int | None = None
    """Sample only from the top_k most likely tokens (Dream's top_k)."""

    def remasking_options(self) -> dict:
        """{field: value} of these settings, as `generate(**...)` takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(RemaskingOptions)}


@dataclass(kw_only=True)
class SampleConfig(RemaskingOptions, KVCacheDtypeOption):
    """How to decode (docs/method.md §2): the settings of `sinkdlm.generate`."""

    gen_length: int
    """Tokens to generate."""
    steps: int | None = None
    """Denoising steps (required unless --threshold)."""
    block_length: int | None = None
    """Semi-autoregressive block length (default: one block). On a block model (block_size): its sub-blocks, Fast-dLLM v2's small_block_size: within each of its blocks the tokens are committed sub-block by sub-block, left to right, the block's steps split over them as these blocks split --steps (default: the whole block; it must divide block_size). One home for one idea: LLaDA's blocks are the semi-autoregressive units of a whole-sequence model's answer, sub-blocks those of a block model's block."""
    max_new_tokens: int | None = None
    """A block model (block_size): tokens to generate at most, each row ending at its end-of-text (default: --gen-length); a whole-sequence model generates exactly --gen-length and refuses this."""
    temperature: float = 0.0
    """0 = greedy; > 0 samples (Gumbel, float64)."""
    threshold: float | None = None
    """Confidence-threshold parallel decoding (e.g. 0.9)."""
    cache: str | None = None
    """Fast-dLLM KV cache of a whole-sequence model: prefix | dual (dual needs --block-length). A block model refuses it: its exact cache of finished blocks is always on."""
    compile: bool = False
    """Run the cached decoding steps' forward through torch.compile, with CUDA graphs on a GPU, where a batch-1 step is bound by kernel launches (a whole-sequence model needs --cache, a block model's is always on; the first blocks compile)."""
    compile_backend: str = "inductor"
    """torch.compile backend for --compile (aot_eager: no code generation, for checking)."""
    seed: int = 0
    """Random seed (used when temperature > 0 or remasking=random)."""
    stop_token_ids: tuple[int, ...] | None = option(None, cli=False)
    """Ids that end the text (`generate_text` sets them): an autoregressive model stops decoding once every row has
    produced one, and fills its remaining positions with the first; a block model stops a row after the block in
    which it produces one, its later positions the first."""


@dataclass(kw_only=True)
class TextOptions:
    """How a prompt becomes ids and the ids become text (`sinkdlm.diffusion.text.generate_text`)."""

    chat: bool = False
    """Wrap the prompt in the model's chat template (GGUF: tokenizer.chat_template; a directory: its tokenizer config) and end the text at the end of the assistant's turn."""
    stop_at_eos: bool = True
    """End the text at the end-of-text token (an autoregressive model stops there; a diffusion LM pads after it with that token, as LLaDA does)."""
    system: str | None = None
    """A system message before the prompt, in the chat template's system turn (needs --chat)."""


@dataclass(kw_only=True)
class TextSampleConfig(SampleConfig):
    """The decoding settings of the commands that print text (`generate`, `chat`): their one default length."""

    gen_length: int = 128
    """Tokens to generate at most (the text ends where the model ends it: at the end-of-text token, or at the end of the assistant's turn in a chat)."""


@dataclass(kw_only=True)
class GenerateConfig(ModelOptions, TextSampleConfig, TextOptions):
    """`sinkdlm generate`: a prompt, a model and the decoding settings."""

    prompt: str | None = None
    """Prompt text."""
    prompt_file: Path | None = None
    """Read prompts from this file instead: one per line, or .jsonl with "prompt"/"text" per line; decoded --batch-size at a time, each getting the tokens it gets alone. Several prompts print one answer a line (newlines as \\n)."""
    batch_size: int = 8
    """Prompts of --prompt-file decoded together in one batch."""
    as_json: bool = option(False, flag="--json")
    """Print one JSON object: text, tokens, steps_taken, seconds (one a line for several prompts)."""
    show_steps: bool = False
    """Print the partially unmasked text after every step."""


@dataclass(kw_only=True)
class ChatConfig(ModelOptions, TextSampleConfig):
    """`sinkdlm chat MODEL`: a conversation through the model's chat template, one line from you, one reply."""

    system: str | None = None
    """A system message that opens the conversation."""


@dataclass(kw_only=True)
class AnalyzeConfig(ModelOptions):
    """`sinkdlm analyze`: the attention-sink analysis (docs/method.md §6), also run by the experiments."""

    prompts: Path | None = None
    """Prompts file: one per line, or .jsonl with "prompt"/"text"."""
    data: str | None = None
    """Corpus for prompts (validation split), e.g. shakespeare."""
    num_prompts: int = 8
    """Prompts to use (first N of --prompts; windows of --data)."""
    prompt_length: int = 64
    """Tokens per prompt taken from --data."""
    sample: SampleConfig | None = option(None, flatten={
        "gen_length": "Tokens to generate per prompt.",
        "steps": "Denoising steps (default: --gen-length, one token per step; an autoregressive model always "
                 "takes one step per token).",
        "block_length": None,
        **{f.name: None for f in dataclasses.fields(RemaskingOptions)},
    })
    """How to decode (`SampleConfig`; required unless --compare): its --gen-length, --steps, --block-length and
    remasking settings (--remasking, --schedule, --eps, --alg-temp, --top-p, --top-k) are this command's flags;
    `steps` None means one token per step, and `seed` is not used (the analysis's `seed` seeds the sampler)."""
    epsilon: float = 3.0
    """Sink threshold ϵ (Rulli et al. eq. 3)."""
    scale: str = "sum"
    """Received-attention scale: sum | mean."""
    ablation_k: str | None = None
    """Sink-masking ablation for these K, e.g. 1,5,10."""
    include_extra_sink: bool = False
    """Let the ablation mask the extra sink token (a model with one is scored both ways; this picks the headline)."""
    mc_num: int = ELBO_SAMPLES
    """Monte-Carlo samples of the ablation's continuation ELBO."""
    batch_size: int = 8
    """Prompts per generation batch."""
    figure_steps: str | None = None
    """Two steps for the attention-map figure, e.g. 0,31."""
    seed: int = 0
    """Random seed (prompt windows, ELBO noise, sampling)."""
    label: str | None = None
    """Model name in the report (default: the run name and step, e.g. 'base (step 30)')."""
    compare_dirs: list[Path] | None = option(None, flag="--compare")
    """Two or more analysis directories (of `analyze --out`) to put side by side: an AR model, a block model and a whole-sequence DLM, say."""
    out: Path | None = option(None, required=True)
    """Output directory."""
    overwrite: bool = False
    """Replace what --out holds (the new output is written beside it and swapped in at the end: a failed run leaves it as it was)."""
    per_prompt: bool = False
    """Analyse each prompt on its own and give every number a 95 % interval over prompts (intervals.json)."""
    quiet: bool = False
    """No progress bar."""
    ablation_protocol: str = option("clean", cli=False)
    """With an `ablation_task`: "clean" (sinks of step t-1 found on its un-ablated attention) or "ablated"."""
    figure_layer: int | None = option(None, cli=False)
    """The layer of the attention-map figure (default: the recorder's choice)."""

    def settings(self) -> dict:
        """The resolved settings (K lists parsed, --steps defaulting to --gen-length), as `analyze` runs
        them and an experiment records them; --gen-length is required."""
        from sinkdlm.config.checks import parse_int_list

        if self.sample is None:
            raise ValueError("--gen-length is required (AnalyzeConfig.sample)")
        figure_steps = self.figure_step_pair()
        gen_length, steps = self.sample.gen_length, self.sample.steps
        return dict(
            gen_length=gen_length, steps=gen_length if steps is None else steps,
            block_length=self.sample.block_length, epsilon=self.epsilon, scale=self.scale,
            ablation_k=parse_int_list(_as_text(self.ablation_k), "--ablation-k"), include_extra_sink=self.include_extra_sink,
            figure_steps=figure_steps, batch_size=self.batch_size, mc_num=self.mc_num,
        )

    def figure_step_pair(self) -> tuple[int, int] | None:
        """--figure-steps as two steps (a, b); None: the recorder's default, the first and the last step."""
        from sinkdlm.config.checks import parse_int_list

        figure_steps = parse_int_list(_as_text(self.figure_steps), "--figure-steps")
        if figure_steps is not None and len(figure_steps) != 2:
            raise ValueError(f"--figure-steps takes two steps like 0,31, got {self.figure_steps!r}")
        return tuple(figure_steps) if figure_steps else None


def _as_text(values) -> str | None:
    """A K list given from Python as ints ([1, 5]) in the command line's spelling ("1,5")."""
    if values is None or isinstance(values, str):
        return values
    return ",".join(str(v) for v in values)


@dataclass(kw_only=True)
class ScoringOptions(RemaskingOptions, KVCacheDtypeOption):
    """How a model answers scored requests (`sinkdlm.evaluation.DLMPredictor`, docs/method.md §1-2, §7): part of
    `EvalConfig`, and of `LMEvalConfig`, the lm-eval model's settings."""

    seed: int = 0
    """Seeds the Monte-Carlo ELBO (and chooses the items of `sinkdlm eval`)."""
    mc_num: int = ELBO_SAMPLES
    """ELBO samples per candidate (cloze words: at most 4)."""
    gen_steps: int | None = None
    """Denoising steps per generation (default: one per token)."""
    batch_size: int = 64
    """Model rows per forward: speed only (every item's result is the same at any batch size; each request draws its own numbers)."""
    cache: str | None = None
    """Fast-dLLM KV cache for generation tasks: prefix | dual (a whole-sequence model's; a block model refuses it: its exact cache of finished blocks is always on)."""
    threshold: float | None = None
    """Confidence-threshold decoding for generation tasks (e.g. 0.9)."""
    progress: bool = True
    """Show progress bars."""
    method: str = option("mc_count", cli=False)
    """The ELBO estimator: mc_count (LLaDA's lower-variance form) | mc (docs/method.md §1 as written) | chain."""
    max_length: int | None = option(None, cli=False)
    """Content tokens per row, at least 2 (default: the model's positions minus its sink tokens)."""


@dataclass(kw_only=True)
class EvalConfig(ModelOptions, ScoringOptions):
    """`sinkdlm eval`: offline tasks scored with the ELBO or by generation (docs/method.md §7)."""

    tasks: str
    """Comma-separated: shakespeare_cloze, shakespeare_next_line, shakespeare_word_order, arithmetic, gsm8k:PATH."""
    out: Path | None = option(None, required=True)
    """Write the scores here as JSON."""
    overwrite: bool = False
    """Replace the file --out names, when it exists (written atomically: a failed run leaves it as it was)."""
    limit: int | None = None
    """Items per task (default: all)."""


@dataclass(kw_only=True)
class LMEvalConfig(ModelOptions, ScoringOptions):
    """The lm-eval model `sinkdlm` (`sinkdlm.evaluation.lm_eval_model`): lm-eval's `model_args` string
    (`pretrained=DIR,mc_num=128`) is parsed into these fields, `pretrained` naming `model`."""

    tokenizer: Path | None = None
    """Tokenizer directory (default: the checkpoint's)."""
    block_length: int | None = GEN_BLOCK_LENGTH
    """Semi-autoregressive block of `generate_until`; None = one block. On a block model (block_size): its sub-blocks (Fast-dLLM v2's small_block_size, as generate's --block-length) when shorter than the model's block, which it must divide; the block's length or more (the default 32 on a block of 32 or fewer) or None: the whole block, no sub-blocks."""
    check_greedy: bool = True
    """Compute `is_greedy` of each continuation (|y| extra forwards); False reports False."""
    shift_logits: bool | None = None
    """Read the head as next-token (Dream) or same-position logits (default: the model's config)."""


# Every model switch at its `ModelConfig` default (generated: a new switch needs no edit here).
_ConvertSwitchFields = dataclasses.make_dataclass("_ConvertSwitchFields", switch_fields(optional=False), kw_only=True)


@dataclass(kw_only=True)
class ConvertConfig(_ConvertSwitchFields):
    """`sinkdlm convert`: an autoregressive checkpoint -> a bidirectional DLM (+[MASK], + sinks), or a DLM -> the
    same DLM with the switches asked for added (e.g. --num-sink-tokens 1)."""

    from_hf: Path
    """Model to convert: a Qwen2/LLaMA causal LM (directory or llama/qwen2 .gguf) becomes a DLM; a DLM (sinkdlm, LLaDA or Dream directory, dream/llada .gguf) gains the switches given, every other weight kept."""
    out: Path
    """Output checkpoint directory."""
    overwrite: bool = False
    """Replace what --out holds (the new output is written beside it and swapped in at the end: a failed run leaves it as it was)."""
    seed: int = 0
    """Seed for the new sink embeddings and sink logits."""
    shift_logits: bool = False
    """Keep the AR head's shift: position i-1 predicts token i (Dream's recipe, docs/method.md §5); off, each masked position predicts itself (LLaDA's). Stored in the checkpoint; train and generate follow it. A DLM keeps its own."""

    def switches(self) -> dict:
        return switch_values(self)


@dataclass(kw_only=True)
class MergeConfig:
    """`sinkdlm merge`: a `--trainable lora` checkpoint's adapters and sink parameters (or a `--trainable sink`
    checkpoint's sinks over its base) folded into a plain checkpoint."""

    adapter: Path
    """A checkpoint of a --trainable lora run (OUT/checkpoints/step-N: adapter_config.json, adapter_model.safetensors) or of a --trainable sink run (sink_parameters.safetensors over the base its sink_base.json names)."""
    base: Path | None = None
    """The model the adapters were trained on (default: rebuilt from the checkpoint's training config, as the run built it)."""
    out: Path
    """Output checkpoint directory."""
    overwrite: bool = False
    """Replace what --out holds (written beside and swapped in at the end: a failed run leaves it as it was)."""


@dataclass(kw_only=True)
class ExperimentConfig(DeviceOption, RemaskingOptions, LaunchConfig):
    """`sinkdlm experiment`: a preset of the paper's comparison, with the few things a run may change (the
    remasking settings, when given, replace the preset's in its analysis and generation tasks)."""

    preset: str = "demo"
    """smoke | demo | study | escape | late-sink | quant | quant-pilot | study-pilot | block-sinks-pilot | block-sinks | study-pilot-long | study-gpu | real | real-bf16 | real-quant | real-gpu | ablation | paper-0.5b | paper-1.5b"""
    out: str = "runs/demo"
    """Experiment directory (re-run the same command to resume)."""
    overwrite: bool = False
    """Replace what --out holds (the new output is written beside it and swapped in at the end: a failed run leaves it as it was)."""
    init_from: str | None = None
    """Local AR checkpoint, a directory or a .gguf (paper-0.5b; real: default the example model)."""
    data: str | None = None
    """Override the preset's corpus."""
    seeds: str | None = None
    """Comma-separated seeds to run (a shard; default: the preset's). Shards may run at once on one --out."""
    max_steps: int | None = None
    """Override the training budget."""
    gsm8k: str | None = None
    """Folder with GSM8K train.jsonl/test.jsonl (paper-0.5b)."""
    variants: str | None = None
    """Comma-separated variant names to run (a shard; default: all the preset's). Shards may run at once on one
    --out."""
    analysed_seed: int | None = option(None, cli=False)
    """The seed whose runs and step-0 controls are analysed where the preset analyses one seed (None: the first of
    --seeds). A launched job runs one seed and carries its study's first here, so it analyses what an in-process run does."""
    dry_run: bool = False
    """Print the plan (runs, shard, validation, declared endpoints, runs measured already, the time left) and exit:
    nothing is trained or written."""


@dataclass(kw_only=True)
class ServeConfig(ModelOptions):
    """`sinkdlm serve MODEL`: an OpenAI-compatible HTTP server (`sinkdlm.serving`); the decoding settings are each
    request's own (body fields, checked by the code that checks `generate`'s flags)."""

    host: str = "127.0.0.1"
    """Address to listen on; any other than 127.0.0.1, localhost or ::1 needs --api-key."""
    port: int = 8000
    """TCP port (0: a free one, printed at start)."""
    api_key: str | None = None
    """Key every request must send (Authorization: Bearer KEY); default the SINKDLM_API_KEY environment variable."""
    model_name: str | None = None
    """The model id that /v1/models lists and requests name (default: the model's file or directory name)."""
    max_batch_size: int = 8
    """Rows (prompts x n) decoded together at most; requests with other settings go in other batches."""
    batch_window_ms: float = 10.0
    """How long a batch waits for more requests with its settings before it starts, in milliseconds."""
    max_queue: int = 64
    """Requests waiting at most; one more is answered 503 with Retry-After."""
    max_tokens: int = 1024
    """The largest max_tokens a request may ask for."""
    default_max_tokens: int = 16
    """max_tokens of a request that gives none (OpenAI's completions default)."""
    max_body_kb: int = 1024
    """The largest request body, in KiB (413 beyond)."""
    timeout: float = 600.0
    """Seconds a request may wait and run; then 504 and its work is dropped (also how long SIGTERM waits for the requests in flight)."""
