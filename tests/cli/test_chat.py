"""The small expected things (issue 53): `sinkdlm --version`, `generate --chat --system`, progress for a slow
generate, and `sinkdlm chat MODEL` (its transcript through stdin, the history in every prompt)."""

from __future__ import annotations

import io
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

import fuzz_world

CHATML = fuzz_world.CHATML  # ChatML: what the prompt of a conversation must look like


def chatml(messages: list[dict]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny diffusion LM whose tokenizer has ChatML's turn tokens and template."""
    import torch

    from sinkdlm import DiffusionLM
    from sinkdlm.data import train_bpe_tokenizer

    tok = train_bpe_tokenizer(fuzz_world.TEXTS * 4, 300)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    model = tmp_path_factory.mktemp("chat_world") / "chat"
    torch.manual_seed(0)
    DiffusionLM(fuzz_world._tiny_config(tok)).save_pretrained(model, tokenizer=tok)
    return model


def run(argv: list[str], stdin: str = "", monkeypatch=None) -> tuple[int, str, str]:
    from sinkdlm.cli import main

    out, err = io.StringIO(), io.StringIO()
    if monkeypatch is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            code = 0 if e.code is None else e.code
    return code, out.getvalue(), err.getvalue()


def test_version():
    from sinkdlm import __version__

    assert run(["--version"]) == (0, f"sinkdlm {__version__}\n", "")


def test_chat_transcript_through_stdin_keeps_the_history(chat_model, monkeypatch):
    import sinkdlm.diffusion.text as text

    prompts = []
    real = text.encode_prompt

    def spy(tokenizer, prompt, chat, system=None):
        ids = real(tokenizer, prompt, chat, system)
        prompts.append(tokenizer.decode(ids))
        return ids

    monkeypatch.setattr(text, "encode_prompt", spy)
    code, out, err = run(["chat", str(chat_model), "--gen-length", "4", "--device", "cpu", "--system", "Be brief."],
                         "to be or not\n\nthe slings and arrows\n", monkeypatch)
    assert code == 0, err
    replies = out.split("\n")[:-1]
    assert len(replies) == 2 and len(prompts) == 2  # the empty line is no message
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "to be or not"}]
    assert prompts[0] == chatml(first)
    second = first + [{"role": "assistant", "content": replies[0]}, {"role": "user", "content": "the slings and arrows"}]
    assert prompts[1] == chatml(second)


def test_chat_refuses_a_model_without_a_template_before_its_weights(tmp_path, monkeypatch):
    world = fuzz_world.build(tmp_path / "w")
    code, _, err = run(["chat", world["ok"]], "", monkeypatch)
    assert code == 2 and err.startswith("error: ") and "has no chat template" in err and len(err.splitlines()) == 1


def test_generate_chat_system(chat_model):
    code, _, err = run(["generate", "--model", str(chat_model), "--prompt", "hi", "--gen-length", "4", "--steps", "4",
                        "--system", "Be brief.", "--device", "cpu"])
    assert code == 2 and err == "error: --system is a message of the model's chat template: add --chat\n"
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.diffusion.text import encode_prompt

    _, tok = load_model_and_tokenizer(chat_model, device="cpu")
    ids = encode_prompt(tok, "hi", chat=True, system="Be brief.")
    assert tok.decode(ids) == chatml([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    code, out, err = run(["generate", "--model", str(chat_model), "--prompt", "hi", "--gen-length", "4", "--steps", "4",
                          "--chat", "--system", "Be brief.", "--device", "cpu"])
    assert code == 0, err


def test_progress_is_printed_only_for_a_slow_block():
    from sinkdlm.cli.app import progress_when_slow

    err = io.StringIO()
    with redirect_stderr(err):
        with progress_when_slow(lambda s: f"working: {s:.1f} s", after_s=0.2, every_s=0.2):
            pass  # quick: nothing
        assert err.getvalue() == ""
        with progress_when_slow(lambda s: f"working: {s:.1f} s", after_s=0.2, every_s=0.2):
            time.sleep(0.7)
    lines = err.getvalue().splitlines()
    assert 2 <= len(lines) <= 4 and all(line.startswith("working: ") for line in lines)
    assert [float(line.split()[1]) for line in lines] == sorted(float(line.split()[1]) for line in lines)


def test_chat_on_a_terminal_prompts_replies_and_ends_on_ctrl_d(chat_model):
    """The interactive path: stdin a pseudo-terminal, so the loop says how to end and prompts `you> `; two
    messages get two replies, and Ctrl-D (the terminal's end of file) ends it with exit 0."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "sinkdlm", "chat", str(chat_model), "--gen-length", "4",
                              "--device", "cpu"], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    os.close(slave)
    try:
        # canonical mode: each line reaches the model when its newline is typed; ^D at a line's start is EOF
        os.write(master, b"to be or not\nthe slings and arrows\n\x04")
        out, err = child.communicate(timeout=300)
    finally:
        os.close(master)
    assert child.returncode == 0, err[-2000:]
    assert "(one line per message; Ctrl-D ends the conversation)" in err
    assert err.count("you> ") == 3  # before each message and before the Ctrl-D
    assert len(out.split("\n")[:-1]) == 2
