"""`--help` of every command, as a user runs it (`python -m sinkdlm ... --help` in a fresh process, the
console script's own entry point): exit 0, usage text on stdout, never a traceback.

Unmarked, so the default suite runs it; `make test-floors` runs it too, in the environment of the declared
floors (typer 0.14 with the click pip resolved beside it crashed every command's --help there).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
# Runs sinkdlm's entry point with lm_eval made unimportable: the optional extra missing.
WITHOUT_LM_EVAL = """
import sys
class _NoLmEval:
    def find_spec(self, name, path=None, target=None):
        if name == "lm_eval" or name.startswith("lm_eval."):
            raise ModuleNotFoundError("No module named 'lm_eval'")
sys.meta_path.insert(0, _NoLmEval())
from sinkdlm.cli import main
main()
"""


def _command_paths() -> list[tuple[str, ...]]:
    """Every command and subcommand of the application, as the words a user types (the root too)."""
    import typer.main

    from sinkdlm.cli import app

    paths: list[tuple[str, ...]] = []

    def walk(cmd, words: tuple[str, ...]) -> None:
        paths.append(words)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, (*words, name))

    walk(typer.main.get_command(app), ())
    return paths


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=ENV, capture_output=True, text=True, timeout=120)


# lm-eval's --help (lm_eval's own argparse help; ~7 s single-process, the slowest here): make test-slow
@pytest.mark.parametrize("words", [pytest.param(w, marks=pytest.mark.slow) if w == ("lm-eval",) else w
                                   for w in _command_paths()], ids=lambda w: " ".join(w) or "sinkdlm")
def test_help_of_every_command(words):
    out = _run(["-m", "sinkdlm", *words, "--help"])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower()  # lm-eval's own help (argparse) says "usage:", click's "Usage:"


@pytest.mark.slow  # ~16 s: a process without lm-eval; make test-slow
def test_lm_eval_help_without_the_extra_is_help_and_the_install_line():
    out = _run(["-c", WITHOUT_LM_EVAL, "lm-eval", "--help"])
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "Usage:" in out.stdout and "lm-evaluation-harness" in out.stdout
    assert "pip install 'sinkdlm[eval]'" in out.stdout
    # and running it without the extra is still the one-line error
    run = _run(["-c", WITHOUT_LM_EVAL, "lm-eval", "--tasks", "arc_easy"])
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "error: `sinkdlm lm-eval` needs lm-eval: pip install 'sinkdlm[eval]' (No module named 'lm_eval')"
    ]
