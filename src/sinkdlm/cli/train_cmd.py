"""`sinkdlm train`, `sinkdlm sft` and `sinkdlm tokenizer train`: flags (generated from TrainConfig) -> train()."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from sinkdlm.cli.app import HelpGroup, app, said_when_slow, typed_command
from sinkdlm.cli.options import config_options
from sinkdlm.config.model import MODEL_SWITCHES
from sinkdlm.config.train import TrainConfig

tokenizer_app = typer.Typer(help="Tokenizer utilities.", no_args_is_help=True, cls=HelpGroup)
app.add_typer(tokenizer_app, name="tokenizer")

ConfigFile = typer.Option(None, "--config", help="YAML/JSON file of TrainConfig fields (flags typed here override it).")
# SFT continues a model on prompt/response pairs: its architecture and corpus packing are the model's.
SFT_EXCLUDES = ("preset", "attention_anneal_steps", "tokenizer", "text_field", "max_tokens", "cache_dir",
                *(s.name for s in MODEL_SWITCHES))
SFT_REQUIRED = ("init_from", "data")  # the model to fine-tune (--model) and its prompt/response data
SFT_OPTIONS = dict(exclude=SFT_EXCLUDES, flags={"init_from": "--model"}, required=SFT_REQUIRED,
                   defaults={"out": "runs/sft"})


@app.command()
@config_options(TrainConfig, layered=True)  # one option per TrainConfig field, model switches included
def train(ctx: typer.Context, config: Optional[Path] = ConfigFile, options: dict = None) -> None:
    """Train a masked diffusion LM (from scratch or --init-from a converted AR checkpoint)."""
    if options["init_from"] and options["preset"]:
        typer.echo(f"note: --preset {options['preset']} is ignored: --init-from {options['init_from']} brings its "
                   "own architecture (its config.json)", err=True)
    _run(ctx, TrainConfig.resolve(config, **options))


def _run(ctx: typer.Context, cfg) -> None:
    """train(cfg) and print its summary; after Ctrl-C/SIGTERM (checkpoint saved, resume command
    printed by the trainer) exit with the shell's 128 + signal code. `--out` follows the rule of every
    command's output (`sinkdlm.io.out_dir`): a run of this command is resumed (--resume) or refused by the
    trainer, anything else refused here; --overwrite sets it aside for the new run (put back if that fails)."""
    import dataclasses

    from sinkdlm.io.out_dir import check_out, writing_out

    cfg.validate()  # the options first, then what --out holds, then the imports of training
    command = "sft" if cfg.sft else "train"
    mode = check_out(cfg.out, command, overwrite=cfg.overwrite, resumable=True,
                     inputs=(cfg.init_from, cfg.tokenizer, cfg.data))
    if mode == "resume" and not cfg.resume:  # the trainer refuses a run it is not told to resume
        from sinkdlm.io.out_dir import foreign, listed

        strangers = foreign(cfg.out, command)
        if strangers:  # ... offering --overwrite, which would not replace these: say what they are instead
            n = len(strangers)
            raise ValueError(f"--out {cfg.out} holds a `sinkdlm {command}` run and {n} entr{'y' if n == 1 else 'ies'} it "
                             f"did not write ({listed(strangers)}); pass --resume to continue it, or choose another --out")
    from sinkdlm.training import train
    from sinkdlm.training.rundir import TrainingStopped
    stopped = None
    # the trainer holds its own lock; the new run is written at --out (the old one set aside, put back on failure)
    with writing_out(cfg.out, mode, command, lock=False, in_place=True):
        try:
            # the tokenizer, the --init-from weights and the packed data come before step 1 (half a minute for
            # the example GGUF on a CPU); the trainer prints progress from step 1
            with said_when_slow("preparing the run: tokenizer, model and data ...") as note:
                summary = train(dataclasses.replace(cfg, overwrite=False), on_step=lambda row: note.cancel(),
                                resume_command=typed_command(ctx, drop=("resume", "overwrite"), extra=("--resume",)))
        except TrainingStopped as e:  # a resumable run: kept like a finished one
            stopped = e
    if stopped is not None:
        raise typer.Exit(stopped.exit_code) from None
    typer.echo(json.dumps(summary))


@app.command()
@config_options(TrainConfig, layered=True, **SFT_OPTIONS)
def sft(ctx: typer.Context, config: Optional[Path] = ConfigFile, options: dict = None) -> None:
    """Supervised fine-tuning: the prompt is never masked; the loss is normalised by the response length."""
    data = options["data"]
    if data.startswith("gsm8k:") and not data[len("gsm8k:"):].strip():  # else: SFT file '.' does not exist
        raise ValueError("--data gsm8k: needs the file after the colon: gsm8k:PATH (a local GSM8K JSONL)")
    _run(ctx, TrainConfig.resolve(config, base=SFT_OPTIONS["defaults"], sft=True, **options))


@tokenizer_app.command("train")
def tokenizer_train(
    data: str = typer.Option(..., "--data", help="Corpus spec, as for `sinkdlm train --data`."),
    vocab_size: int = typer.Option(..., "--vocab-size"),
    out: Path = typer.Option(..., "--out"),
    text_field: str = typer.Option(TrainConfig.text_field, "--text-field"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace what --out holds (written beside it, then "
                                   "swapped in: a failed run leaves it as it was)."),
) -> None:
    """Train a byte-level BPE (with [MASK]) on a corpus's training split."""
    from sinkdlm.config.checks import check_int
    from sinkdlm.io.out_dir import check_out, writing_out

    check_int("--vocab-size", vocab_size, 1, 2**31 - 1)  # the tokenizers library overflows past its int
    mode = check_out(out, "tokenizer train", overwrite=overwrite, inputs=(data,))
    from sinkdlm.data import iter_documents, train_bpe_tokenizer

    with writing_out(out, mode, "tokenizer train") as where:
        tok = train_bpe_tokenizer(iter_documents(data, "train", text_field), vocab_size, out_dir=where)
    typer.echo(f"wrote {out}: {len(tok)} tokens, mask_token_id {tok.mask_token_id}")
