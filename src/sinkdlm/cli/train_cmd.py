"""`sinkdlm train`, `sinkdlm sft` and `sinkdlm tokenizer train`: flags -> TrainConfig -> train()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from sinkdlm.cli.app import app, typed_command
from sinkdlm.cli.switch_options import with_switch_options

tokenizer_app = typer.Typer(help="Tokenizer utilities.", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")

# Every option defaults to None so that `--config FILE` values are only overridden by flags the
# user actually typed (TrainConfig.resolve: defaults < config file < flags).
Preset = typer.Option(None, "--preset", help="Model preset (tiny, small, smdm-85m, qwen2.5-0.5b, ...).")
Data = typer.Option(None, "--data", help="shakespeare | a .txt/.jsonl/.json/.parquet file or folder | hf:OWNER/NAME[:CONFIG]")
Out = typer.Option(None, "--out", help="Run directory (config, metrics.jsonl, checkpoints/).")


@app.command()
@with_switch_options(unset_default=True)  # --num-sink-tokens, --sink-logit/--no-sink-logit, ...
def train(
    ctx: typer.Context,
    preset: Optional[str] = Preset,
    data: Optional[str] = Data,
    out: Optional[str] = Out,
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON file of training options."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Global batch in sequences."),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="Micro-batches per optimizer step."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len"),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak lr (default: 2e-4 scratch, 1e-4 AR init)."),
    min_lr: Optional[float] = typer.Option(None, "--min-lr", help="Final lr of the cosine (default: 2e-5 scratch, 1e-5 AR init)."),
    save_every: Optional[int] = typer.Option(None, "--save-every"),
    eval_every: Optional[int] = typer.Option(None, "--eval-every"),
    log_every: Optional[int] = typer.Option(None, "--log-every"),
    keep_last: Optional[int] = typer.Option(None, "--keep-last", help="Checkpoints to keep."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    resume: Optional[bool] = typer.Option(None, "--resume/--no-resume", help="Continue from the newest checkpoint in --out."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite/--no-overwrite", help="Delete the run already in --out (only the files training writes) and start anew."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="HF tokenizer dir or tokenizer.json (default: train a BPE)."),
    text_field: Optional[str] = typer.Option(None, "--text-field"),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Cap on corpus tokens packed (quick runs; default: the whole corpus)."),
    init_from: Optional[str] = typer.Option(None, "--init-from", help="Start from a sinkdlm, LLaDA or Dream checkpoint, or a Qwen2/LLaMA directory or .gguf (converted on load)."),
    shift_logits: Optional[bool] = typer.Option(None, "--shift-logits/--no-shift-logits", help="Position i predicts token i+1 (AR head); default: the model's own setting."),
    attention_anneal_steps: Optional[int] = typer.Option(None, "--attention-anneal-steps", help="Causal -> full attention over N steps."),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast."),
    device: Optional[str] = typer.Option(None, "--device", help="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N."),
    fsdp: Optional[bool] = typer.Option(None, "--fsdp/--no-fsdp", help="FSDP2 sharding instead of DDP (needs torchrun, any --nproc_per_node; sharded checkpoints)."),
    activation_checkpointing: Optional[bool] = typer.Option(
        None, "--activation-checkpointing/--no-activation-checkpointing", help="Recompute each block in backward: less memory, ~1/3 more compute."),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile every block."),
    compile_backend: Optional[str] = typer.Option(None, "--compile-backend", help="torch.compile backend for --compile (default: inductor)."),
    cache_dir: Optional[str] = typer.Option(None, "--cache-dir", help="Cache of trained tokenizers and packed corpora (default: $SINKDLM_CACHE or ~/.cache/sinkdlm)."),
    **switches,
) -> None:
    """Train a masked diffusion LM (from scratch or --init-from a converted AR checkpoint)."""
    flags = dict(locals())  # first: exactly the options
    flags.update(flags.pop("switches"))
    flags.pop("ctx")
    from sinkdlm.training import TrainConfig

    config_file = flags.pop("config")
    if flags["init_from"] and flags["preset"]:
        typer.echo(f"note: --preset {flags['preset']} is ignored: --init-from {flags['init_from']} brings its own "
                   "architecture (its config.json)", err=True)
    cfg = TrainConfig.resolve(config_file, **flags)
    _run(ctx, cfg)


def _run(ctx: typer.Context, cfg) -> None:
    """train(cfg) and print its summary; after Ctrl-C/SIGTERM (checkpoint saved, resume command
    printed by the trainer) exit with the shell's 128 + signal code."""
    from sinkdlm.training import train
    from sinkdlm.training.rundir import TrainingStopped

    from sinkdlm.validation import check_output_dir

    if isinstance(cfg.out, (str, Path)):  # a file there: say so before any work (else train() says)
        check_output_dir(cfg.out)
    try:
        summary = train(cfg, resume_command=typed_command(ctx, drop=("resume", "overwrite"), extra=("--resume",)))
    except TrainingStopped as stopped:
        raise typer.Exit(stopped.exit_code) from None
    typer.echo(json.dumps(summary))


@app.command()
def sft(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="Model to fine-tune: sinkdlm, LLaDA, Dream, or Qwen2/LLaMA (converted on load)."),
    data: str = typer.Option(..., "--data", help="arithmetic | FILE.jsonl with prompt/response fields"),
    out: str = typer.Option("runs/sft", "--out"),
    config: Optional[Path] = typer.Option(None, "--config"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len"),
    lr: Optional[float] = typer.Option(None, "--lr"),
    save_every: Optional[int] = typer.Option(None, "--save-every"),
    eval_every: Optional[int] = typer.Option(None, "--eval-every"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    resume: Optional[bool] = typer.Option(None, "--resume/--no-resume"),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite/--no-overwrite", help="Delete the run already in --out and start anew."),
) -> None:
    """Supervised fine-tuning: the prompt is never masked; the loss is normalised by the response length."""
    flags = dict(locals())  # first: exactly the options
    flags.pop("ctx")
    from sinkdlm.training import TrainConfig

    config_file = flags.pop("config")
    flags["init_from"] = flags.pop("model")
    if data.startswith("gsm8k:") and not data[len("gsm8k:"):].strip():  # else: SFT file '.' does not exist
        raise ValueError("--data gsm8k: needs the file after the colon: gsm8k:PATH (a local GSM8K JSONL)")
    _run(ctx, TrainConfig.resolve(config_file, sft=True, **flags))


@tokenizer_app.command("train")
def tokenizer_train(
    data: str = typer.Option(..., "--data", help="Corpus spec, as for `sinkdlm train --data`."),
    vocab_size: int = typer.Option(..., "--vocab-size"),
    out: Path = typer.Option(..., "--out"),
    text_field: str = typer.Option("text", "--text-field"),
) -> None:
    """Train a byte-level BPE (with [MASK]) on a corpus's training split."""
    from sinkdlm.data import iter_documents, train_bpe_tokenizer
    from sinkdlm.validation import check_int, check_output_dir

    check_int("--vocab-size", vocab_size, 1, 2**31 - 1)  # the tokenizers library overflows past its int
    check_output_dir(out)
    tok = train_bpe_tokenizer(iter_documents(data, "train", text_field), vocab_size, out_dir=out)
    typer.echo(f"wrote {out}: {len(tok)} tokens, mask_token_id {tok.mask_token_id}")
