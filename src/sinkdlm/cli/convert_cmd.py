"""`sinkdlm convert`: a local Qwen2/LLaMA causal LM -> a sinkdlm DLM, or a DLM -> the same DLM plus sinks."""

from __future__ import annotations

import typer

from sinkdlm.cli.app import app, said_when_slow
from sinkdlm.cli.options import config_options
from sinkdlm.config.commands import ConvertConfig


@app.command()
@config_options(ConvertConfig)  # every model switch too, at its ModelConfig default
def convert(cfg: ConvertConfig) -> None:
    """Copy an autoregressive checkpoint's weights into a bidirectional DLM (+[MASK], + sinks), or add sinks to a DLM."""
    from sinkdlm.config import check_model_switches
    from sinkdlm.config.checks import check_seed
    from sinkdlm.io.out_dir import check_out, writing_out

    check_seed(cfg.seed, "--seed")
    check_model_switches(cfg.switches(), where="--")  # before reading --from-hf, in the flags' own names
    mode = check_out(cfg.out, "convert", overwrite=cfg.overwrite, inputs=(cfg.from_hf,))  # before the imports
    from sinkdlm.io.files import check_model_path
    from sinkdlm.model.hf import convert_hf_checkpoint

    check_model_path(cfg.from_hf, "--from-hf")  # nothing there (a Hub id given as a path): one line, in the flag's name
    with said_when_slow(f"converting {cfg.from_hf}: reading its weights, then writing {cfg.out} ..."), \
            writing_out(cfg.out, mode, "convert") as where:
        model = convert_hf_checkpoint(cfg.from_hf, where, seed=cfg.seed, shift_logits=cfg.shift_logits,
                                      **cfg.switches())
    c = model.config
    typer.echo(
        f"wrote {cfg.out}: {model.num_parameters() / 1e6:.1f}M parameters, vocab {c.vocab_size}, "
        f"mask_token_id {c.mask_token_id}, {c.num_sink_tokens} sink token(s) ({c.sink_position})"
    )
