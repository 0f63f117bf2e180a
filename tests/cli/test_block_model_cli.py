"""A block model on the command line (docs/method.md §13): the settings that do not apply to it (and sub-blocks,
--block-length, that do not divide its block or get no step), and --max-new-tokens on a whole-sequence model, are
refused in one line from the model's header, before any weight."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from helpers import tiny_model

CASES = [  # (block_size of the model, extra argv, words of the error line)
    (4, ["--block-length", "3"], "--block-length=3 does not divide the model's block_size=4"),
    (4, ["--block-length", "1", "--steps", "3"],
     "every sub-block needs a step: give at least --steps=7, or a longer --block-length"),
    (4, ["--cache", "prefix"], "--cache=prefix does not apply to it"),
    (None, ["--max-new-tokens", "8"], "this whole-sequence model generates exactly --gen-length tokens"),
    (4, ["--max-new-tokens", "0"], "--max-new-tokens must be an integer >= 1"),
]


@pytest.mark.parametrize("block_size,extra,words", CASES, ids=[" ".join(e) for _, e, _ in CASES])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_refused_from_the_header(command, block_size, extra, words, tmp_path, monkeypatch):
    import sinkdlm.checkpoint.manager as manager
    from sinkdlm.cli import main

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(manager, "load_model_and_tokenizer", no_weights)
    model = tmp_path / "m"
    tiny_model(block_size=block_size).save_pretrained(model)
    (model / "chat_template.jinja").write_text("{{ messages }}")  # chat asks for a template first
    argv = ["generate", "--model", str(model), "--prompt", "hi"] if command == "generate" else ["chat", str(model)]
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main([*argv, "--gen-length", "8", "--steps", "8", *extra])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and words in lines[0], lines


def test_chat_and_generate_chat_run_a_block_model(tmp_path, monkeypatch):
    """`sinkdlm chat` (a transcript of two messages through stdin: two replies) and `generate --chat
    --max-new-tokens` on a block model with a ChatML template, each reply decoded block by block; generate's
    notes name --max-new-tokens."""
    import torch

    import fuzz_world
    from sinkdlm import DiffusionLM
    from sinkdlm.cli import main
    from sinkdlm.data import train_bpe_tokenizer

    tok = train_bpe_tokenizer(fuzz_world.TEXTS * 4, 300)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = fuzz_world.CHATML
    torch.manual_seed(0)
    model = tmp_path / "chat"
    DiffusionLM(fuzz_world._tiny_config(tok, block_size=4, num_sink_tokens=1)).save_pretrained(model, tokenizer=tok)
    monkeypatch.setattr("sys.stdin", io.StringIO("to be or not\nthe slings and arrows\n"))

    def run(argv):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main([*argv, "--device", "cpu"])
            except SystemExit as e:
                assert not e.code, err.getvalue()
        return out.getvalue(), err.getvalue()

    assert len(run(["chat", str(model), "--max-new-tokens", "6", "--steps", "6"])[0].split("\n")[:-1]) == 2
    _, err = run(["generate", "--model", str(model), "--prompt", "hi", "--chat", "--max-new-tokens", "6", "--steps", "9"])
    assert "--steps 9 > --max-new-tokens 6" in err  # the notes name the bound a block model was given
