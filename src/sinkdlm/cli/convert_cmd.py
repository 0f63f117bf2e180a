"""`sinkdlm convert`: a local Hugging Face Qwen2/LLaMA causal LM -> a sinkdlm checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from sinkdlm.cli.app import app


@app.command()
def convert(
    from_hf: Path = typer.Option(..., "--from-hf", help="Local HF model directory (Qwen2 or LLaMA, safetensors)."),
    out: Path = typer.Option(..., "--out", help="Output checkpoint directory."),
    num_sink_tokens: int = typer.Option(0, "--num-sink-tokens", help="Extra sink tokens to add (0 = vanilla DLM)."),
    sink_position: str = typer.Option("front", "--sink-position", help="front | end"),
    sink_zero_value: bool = typer.Option(False, "--sink-zero-value", help="Force the sinks' values to zero."),
    gated_attention: bool = typer.Option(False, "--gated-attention", help="Add the eq. 8-10 attention gate."),
    seed: int = typer.Option(0, "--seed", help="Seed for the new sink embeddings."),
) -> None:
    """Copy an autoregressive checkpoint's weights into a bidirectional DLM (+[MASK], + sinks)."""
    from sinkdlm.model.hf import convert_hf_checkpoint

    model = convert_hf_checkpoint(
        from_hf, out, num_sink_tokens=num_sink_tokens, sink_position=sink_position,
        sink_zero_value=sink_zero_value, gated_attention=gated_attention, seed=seed,
    )
    cfg = model.config
    typer.echo(
        f"wrote {out}: {model.num_parameters() / 1e6:.1f}M parameters, vocab {cfg.vocab_size}, "
        f"mask_token_id {cfg.mask_token_id}, {cfg.num_sink_tokens} sink token(s) ({cfg.sink_position})"
    )
