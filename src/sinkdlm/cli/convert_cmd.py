"""`sinkdlm convert`: a local Hugging Face Qwen2/LLaMA causal LM -> a sinkdlm checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from sinkdlm.cli.app import app
from sinkdlm.cli.switch_options import with_switch_options


@app.command()
@with_switch_options(unset_default=False)  # every model switch, at its registry default
def convert(
    from_hf: Path = typer.Option(..., "--from-hf", help="Local causal LM to convert: a Qwen2/LLaMA directory (safetensors) or a llama/qwen2 .gguf file."),
    out: Path = typer.Option(..., "--out", help="Output checkpoint directory."),
    seed: int = typer.Option(0, "--seed", help="Seed for the new sink embeddings and sink logits."),
    **switches,
) -> None:
    """Copy an autoregressive checkpoint's weights into a bidirectional DLM (+[MASK], + sinks)."""
    from sinkdlm.config import check_model_switches
    from sinkdlm.model.hf import convert_hf_checkpoint

    from sinkdlm.validation import check_output_dir, check_seed

    check_seed(seed, "--seed")
    check_model_switches(switches, where="--")  # before reading --from-hf, in the flags' own names
    check_output_dir(out)
    model = convert_hf_checkpoint(from_hf, out, seed=seed, **switches)
    cfg = model.config
    typer.echo(
        f"wrote {out}: {model.num_parameters() / 1e6:.1f}M parameters, vocab {cfg.vocab_size}, "
        f"mask_token_id {cfg.mask_token_id}, {cfg.num_sink_tokens} sink token(s) ({cfg.sink_position})"
    )
