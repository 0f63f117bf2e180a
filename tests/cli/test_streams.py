"""Progress on stderr, results on stdout, for the commands that print a result: `train` prints its summary as
JSON and `generate --json` one object, so their stdout parses as JSON whole (one progress line there and it
would not); `analyze` and `convert` print only their "wrote" line, naming the final paths. The reference is
the rule itself: stdout is the result and nothing else."""

from __future__ import annotations

import json

import pytest

import fuzz_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return fuzz_world.build(tmp_path_factory.mktemp("streams_world") / "w")


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    from sinkdlm.cli import main

    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = 0 if e.code is None else e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_train_prints_its_summary_on_stdout_and_its_progress_on_stderr(world, tmp_path, capsys):
    code, out, err = run(["train", "--preset", "tiny", "--data", world["corpus.txt"], "--tokenizer", world["ok"],
                          "--max-steps", "2", "--batch-size", "2", "--seq-len", "16", "--device", "cpu",
                          "--out", str(tmp_path / "run")], capsys)
    assert code == 0, err
    summary = json.loads(out)  # the whole of stdout: one JSON object
    assert summary["checkpoint"] == str(tmp_path / "run" / "checkpoints" / "step-2")
    assert "[sinkdlm] training steps 1-2" in err and "[sinkdlm] step 2/2" in err  # the progress


def test_generate_json_is_all_of_stdout(world, capsys):
    code, out, err = run(["generate", "--model", world["ok"], "--prompt", "To be", "--steps", "4", "--gen-length", "4",
                          "--show-steps", "--json", "--device", "cpu"], capsys)
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) <= 4 and "[step" in err  # --show-steps: progress, so stderr


@pytest.mark.slow  # ~7 s (two analyses); --overwrite's message: tests/cli/test_out_dir.py, by default
def test_analyze_overwrite_says_the_final_paths(world, tmp_path, capsys):
    """analyze --overwrite: every path it says is --out's own (no temporary beside it), the replaced output is
    named on stderr, and stdout holds the one "wrote" line."""
    out = tmp_path / "an"
    argv = ["analyze", "--model", world["ok"], "--prompts", world["prompts.txt"], "--num-prompts", "2",
            "--gen-length", "4", "--steps", "2", "--device", "cpu", "--out", str(out)]
    assert run(argv, capsys)[0] == 0
    code, stdout, err = run([*argv, "--overwrite"], capsys)
    assert code == 0, err
    assert stdout.splitlines() == [line for line in stdout.splitlines() if line.startswith(f"wrote {out}/")]
    assert len(stdout.splitlines()) == 1
    assert f"--overwrite replaced --out {out}: the output of `sinkdlm analyze`" in err
    assert ".an." not in stdout + err  # no temporary directory named
    assert f"sink analysis: wrote {out / 'analysis.json'}" in err
