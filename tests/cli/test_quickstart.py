"""The README's Quick start on the example model, as written but at reduced sizes (a few steps, a few
prompts): every line runs, chat answers without role names, and the DLM lines do what the README says.
Minutes on 2 cores (the GGUF is read three times), so marked slow: `make test-slow`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def sinkdlm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    from helpers import subprocess_env

    result = subprocess.run([sys.executable, "-m", "sinkdlm", *args], cwd=cwd, capture_output=True, text=True,
                            env=subprocess_env(), timeout=900)
    assert result.returncode == 0, result.stderr
    return result


def quick_start_lines() -> list[list[str]]:
    """The `sinkdlm ...` lines of the README's Quick start block, as argument lists (comments dropped)."""
    import shlex

    from helpers import quick_start_block

    return [shlex.split(line.split("  #")[0])[1:] for line in quick_start_block() if line.startswith("sinkdlm ")]


def reduced(args: list[str], gguf: Path) -> list[str]:
    """A Quick-start line at test size: fewer steps, prompts and tokens (the chat's answer as written);
    $M is the example GGUF."""
    smaller = {"--max-steps": "2", "--batch-size": "2", "--seq-len": "32", "--num-prompts": "2", "--steps": "8",
               **({} if "--chat" in args else {"--gen-length": "8"})}
    out = []
    for i, word in enumerate(args):
        prev = args[i - 1] if i else None
        out.append(smaller.get(prev, word).replace("$M", str(gguf)).replace("step-20", "step-2"))
    return out


def test_quick_start_runs_as_written_at_reduced_size(tmp_path):
    from helpers import example_gguf_or_skip

    gguf = example_gguf_or_skip()
    lines = quick_start_lines()
    commands = [args[0] for args in lines]
    assert commands[:4] == ["generate", "analyze", "convert", "train"], commands
    assert "--shift-logits" in lines[2]  # the head measured better on the example model
    outputs = [sinkdlm(*reduced(args, gguf), cwd=tmp_path) for args in lines]
    chat = outputs[0].stdout.strip()
    assert "Paris" in chat and not re.search(r"\b(assistant|user|system)\b", chat), chat
    config = json.loads((tmp_path / "runs/smol-dlm/config.json").read_text())
    assert config["shift_logits"] is True and config["num_sink_tokens"] == 1
    assert "[sinkdlm] step 1/2 | loss" in outputs[3].stdout  # progress from the first step
    for out in outputs:
        assert "Traceback" not in out.stderr
