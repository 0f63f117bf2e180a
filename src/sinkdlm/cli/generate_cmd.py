"""`sinkdlm generate`: sample text from a checkpoint directory with `sinkdlm.generate` (docs/method.md §2)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer

from sinkdlm.cli.app import app


def render_partial(tokenizer, ids: list[int], masked: list[bool], mask_text: str = "_") -> str:
    """Decode the generated tokens, each still-masked position shown as `mask_text`."""
    pieces, run = [], []
    for tok, m in zip(ids, masked):
        if m:
            if run:
                pieces.append(tokenizer.decode(run, skip_special_tokens=False))
                run = []
            pieces.append(mask_text)
        else:
            run.append(tok)
    if run:
        pieces.append(tokenizer.decode(run, skip_special_tokens=False))
    return "".join(pieces)


@app.command()
def generate(
    model: Path = typer.Option(..., "--model", help="Model: a directory (sinkdlm checkpoint, LLaDA, Dream, autoregressive Qwen2/LLaMA) or a llama/qwen2 .gguf file."),
    prompt: str = typer.Option(None, "--prompt", help="Prompt text."),
    prompt_file: Path = typer.Option(None, "--prompt-file", help="Read the prompt from this file instead."),
    gen_length: int = typer.Option(..., "--gen-length", help="Tokens to generate."),
    steps: int = typer.Option(None, "--steps", help="Denoising steps (required unless --threshold)."),
    block_length: int = typer.Option(None, "--block-length", help="Semi-autoregressive block length (default: one block)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy; > 0 samples (Gumbel, float64)."),
    remasking: str = typer.Option("low_confidence", "--remasking", help="low_confidence | random"),
    threshold: float = typer.Option(None, "--threshold", help="Confidence-threshold parallel decoding (e.g. 0.9)."),
    cache: str = typer.Option(None, "--cache", help="Fast-dLLM KV cache: prefix | dual (dual needs --block-length)."),
    seed: int = typer.Option(0, "--seed", help="Random seed (used when temperature > 0 or remasking=random)."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available, else CPU) | cpu | cuda | cuda:N."),
    dtype: str = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 (default: as stored)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: text, tokens, steps_taken, seconds."),
    show_steps: bool = typer.Option(False, "--show-steps", help="Print the partially unmasked text after every step."),
) -> None:
    """Generate a continuation of a prompt with a masked diffusion LM (or, left to right, an autoregressive one)."""
    from sinkdlm.diffusion.sampling import generate as sample
    from sinkdlm.loading import load_model_and_tokenizer

    from sinkdlm.validation import check_prompt_size, check_seed

    if (prompt is None) == (prompt_file is None):
        raise ValueError("give exactly one of --prompt TEXT or --prompt-file FILE")
    check_seed(seed, "--seed")
    if prompt_file is not None:
        from sinkdlm.validation import read_text_file

        prompt = read_text_file(prompt_file, "--prompt-file")
    net, tokenizer = load_model_and_tokenizer(model, device=device, dtype=dtype)
    check_prompt_size(prompt, tokenizer, net.config, "--prompt-file" if prompt_file is not None else "--prompt")
    ids = tokenizer(prompt)["input_ids"]
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give a non-empty prompt")

    if threshold is None and steps is not None and steps > gen_length:
        # The schedule commits at least one token per step; the surplus steps would commit nothing.
        typer.echo(f"note: --steps {steps} > --gen-length {gen_length}: at most one token is committed per "
                   f"step, so {gen_length} steps run", err=True)
    callback = None
    if show_steps:
        out_stream = sys.stderr if as_json else sys.stdout
        p = len(ids)

        def callback(state) -> None:
            gen = state.x[0, p:].tolist()
            still = (state.masked[0, p:] & ~state.committed[0, p:]).tolist()
            text = render_partial(tokenizer, gen, still)
            print(f"[step {state.step:>4} block {state.block}] {text!r}", file=out_stream, flush=True)

    start = time.perf_counter()
    out = sample(
        net, ids, gen_length, steps, block_length=block_length, temperature=temperature,
        remasking=remasking, threshold=threshold, seed=seed, callback=callback, return_dict=True,
        cache=cache,
    )
    seconds = time.perf_counter() - start
    tokens = out.sequences[0, out.prompt_length:].tolist()
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if as_json:
        typer.echo(json.dumps({"text": text, "tokens": tokens, "steps_taken": out.steps_taken, "seconds": seconds}))
    else:
        typer.echo(text)
