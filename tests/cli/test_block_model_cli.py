"""A block model on the command line (docs/method.md §13): the settings that do not apply to it, and
--max-new-tokens on a whole-sequence model, are refused in one line from the model's header, before any weight."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from helpers import tiny_model

CASES = [  # (block_size of the model, extra argv, words of the error line)
    (4, ["--block-length", "4"], "--block-length=4 does not apply to it"),
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
