"""Every check before any weight (issue 53): a bad sampler value, dtype or decoding setting given with the
example GGUF is refused in one line, naming the flag, in well under the time its weights take to read.

The reference is the clock: reading the example model's weights takes seconds, so a refusal under 2 s
(in process, torch already imported) came before them; `load_model_and_tokenizer` is also made to fail
the test if it is called at all.
"""

from __future__ import annotations

import io
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from helpers import example_gguf_or_skip

pytestmark = pytest.mark.real_model

REFUSALS = [  # (extra argv, words of the error line)
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--top-p", "2"], "--top-p must lie in (0, 1]"),
    (["--top-p", "0"], "--top-p must lie in (0, 1]"),
    (["--top-k", "0"], "--top-k must be an integer >= 1"),
    (["--alg-temp", "-1"], "--alg-temp must be a number >= 0"),
    (["--eps", "2"], "--eps must lie in (0, 1)"),
    (["--dtype", "float8"], "--dtype 'float8' is not one of float32, bfloat16, float16"),
    (["--remasking", "random"], "applies to diffusion decoding only"),
    (["--threshold", "2"], "applies to diffusion decoding only"),
    (["--steps", "0"], "--steps"),  # generate: a diffusion-only setting; analyze: must be >= 1
    (["--gen-length", "0"], "--gen-length must be an integer >= 1"),
    (["--seed", "-1"], "--seed must be an integer in [0,"),
]


CASES = [(command, extra, words) for command in ("generate", "analyze") for extra, words in REFUSALS
         if command == "generate" or extra[0] not in ("--temperature", "--threshold")]  # analyze has neither flag


@pytest.mark.parametrize("command,extra,words", CASES, ids=[f"{c} {' '.join(e)}" for c, e, _ in CASES])
def test_refused_before_any_weight_in_under_2_s(command, extra, words, tmp_path, monkeypatch):
    gguf = example_gguf_or_skip()
    import sinkdlm.checkpoint.manager as manager
    from sinkdlm.cli import main

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(manager, "load_model_and_tokenizer", no_weights)
    prompts = tmp_path / "p.txt"
    prompts.write_text("The capital of France is\n")
    argv = {"generate": ["generate", "--model", str(gguf), "--prompt", "hi", "--gen-length", "4"],
            "analyze": ["analyze", "--model", str(gguf), "--prompts", str(prompts), "--gen-length", "4",
                        "--out", str(tmp_path / "a")]}[command]
    err = io.StringIO()
    start = time.perf_counter()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main([*argv, *extra])
    seconds = time.perf_counter() - start
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and words in lines[0], lines
    assert seconds < 2.0, f"{extra}: refused after {seconds:.2f} s"
    assert not (tmp_path / "a").exists()
