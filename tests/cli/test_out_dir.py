"""One rule for every command's `--out` (issue 53, `sinkdlm.io.out_dir`): each command against an empty
directory, its own output, another command's and unrelated files; `--overwrite` replaces atomically.

The reference is the rule as the issue states it, written out as a table here: empty -> written; own
and resumable (train/sft, the same experiment preset) -> resumed (train refuses without --resume, as
before); anything else -> refused in one line that names what is there and offers --overwrite.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import fuzz_world
from sinkdlm.io.out_dir import check_out, owner, writing_out

# What each command leaves in its --out (the names `owner` recognises), as small stand-ins.
OUTPUTS = {
    "train": {"train_config.json": '{"sft": false}', "metrics.jsonl": "{}\n"},
    "sft": {"train_config.json": '{"sft": true}', "metrics.jsonl": "{}\n"},
    "convert": {"config.json": "{}", "model.safetensors": "", "tokenizer.json": "{}"},
    "analyze": {"analysis.json": "{}", "report.html": "<html>"},
    "experiment": {"STARTED.json": '{"time": 0, "preset": "demo"}', "progress.md": "# sinkdlm experiment `demo`\n"},
    "tokenizer train": {"tokenizer.json": "{}", "tokenizer_config.json": "{}"},
}
UNRELATED = {"notes.txt": "mine\n", "photos/cat.jpg": "jpeg"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return fuzz_world.build(tmp_path_factory.mktemp("outdir_world") / "w")


def argv_for(command: str, world: dict, out: Path) -> list[str]:
    """A valid command line of `command` writing `out` (refused, in these tests, before any work)."""
    return {
        "train": ["train", "--preset", "tiny", "--data", world["corpus.txt"], "--tokenizer", world["ok"],
                  "--max-steps", "1", "--batch-size", "2", "--seq-len", "16", "--device", "cpu"],
        "sft": ["sft", "--model", world["ok"], "--data", world["sft.jsonl"], "--max-steps", "1", "--batch-size", "2",
                "--seq-len", "32"],
        "convert": ["convert", "--from-hf", world["hf_qwen2"]],
        "analyze": ["analyze", "--model", world["ok"], "--prompts", world["prompts.txt"], "--num-prompts", "2",
                    "--gen-length", "4", "--steps", "2", "--device", "cpu", "--quiet"],
        "experiment": ["experiment", "--preset", "smoke", "--max-steps", "1", "--seeds", "0", "--device", "cpu"],
        "tokenizer train": ["tokenizer", "train", "--data", world["corpus.txt"], "--vocab-size", "280"],
        "eval": ["eval", "--model", world["ok"], "--tasks", "arithmetic", "--limit", "2", "--mc-num", "1",
                 "--device", "cpu", "--no-progress"],
    }[command] + ["--out", str(out)]


def run(argv: list[str]) -> tuple[int, str]:
    from sinkdlm.cli import main

    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as e:
            return (0 if e.code is None else e.code), err.getvalue()
    return 0, err.getvalue()


def make(path: Path, files: dict[str, str]) -> Path:
    for name, body in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(body)
    return path


def snapshot(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else "dir" for p in sorted(path.rglob("*"))}


COMMANDS = list(OUTPUTS)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("state", ["empty", "own", "other", "unrelated"])
def test_the_rule_decides_for_every_command(command, state, tmp_path):
    """The decision table, for every directory command, from the library (no work is started)."""
    out = tmp_path / "out"
    out.mkdir()
    other = next(c for c in COMMANDS if c != command and not {c, command} <= {"convert", "tokenizer train"})
    make(out, {"empty": {}, "own": OUTPUTS[command], "other": OUTPUTS[other], "unrelated": UNRELATED}[state])
    if state != "empty":
        assert owner(out) == {"own": command, "other": other, "unrelated": None}[state]
    resumable = command in ("train", "sft", "experiment")
    preset = "demo" if command == "experiment" else None
    if state == "empty" or (state == "own" and resumable):
        assert check_out(out, command, resumable=resumable, preset=preset) == ("new" if state == "empty" else "resume")
    else:
        with pytest.raises(ValueError, match=r"already holds .*choose another --out, or pass --overwrite"):
            check_out(out, command, resumable=resumable, preset=preset)
    assert check_out(out, command, overwrite=True, resumable=resumable) == ("new" if state == "empty" else "replace")


@pytest.mark.parametrize("command", [*COMMANDS, "eval"])
@pytest.mark.parametrize("state", ["own", "other", "unrelated"])
def test_every_command_refuses_in_one_line_before_any_work(command, state, world, tmp_path):
    """The command line: one `error:` line that names what --out holds (and offers --overwrite, or, for a
    training run of its own, --resume as before), and --out left byte-identical."""
    if command == "experiment" and state == "own":  # the same preset's directory resumes: a different one
        files, expected = OUTPUTS["experiment"], "holds the `demo` experiment, not `smoke`"
    elif command in ("train", "sft") and state == "own":
        files, expected = OUTPUTS[command], "pass --resume to continue it"
    else:
        other = "analyze" if command != "analyze" else "convert"
        files = {"own": OUTPUTS.get(command), "other": OUTPUTS[other], "unrelated": UNRELATED}[state]
        what = {"own": f"`sinkdlm {command}`", "other": f"`sinkdlm {other}`", "unrelated": "notes.txt"}[state]
        expected = what
    if command == "eval":  # eval writes one file: its own scores, another command's JSON, or some file
        out = tmp_path / "scores.json"
        body = {"own": {"model": "m", "tasks": [], "scores": {}}, "other": {"preset": "demo"}}.get(state)
        out.write_text(json.dumps(body) if body is not None else "mine\n")
        expected = {"own": "scores of an earlier `sinkdlm eval`", "other": "a file", "unrelated": "a file"}[state]
        before = out.read_bytes()
    else:
        out = make(tmp_path / "out", files)
        before = snapshot(out)
    code, err = run(argv_for(command, world, out))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --out"), err
    assert expected in lines[0], lines[0]
    assert "--overwrite" in lines[0], lines[0]
    assert (out.read_bytes() if command == "eval" else snapshot(out)) == before


@pytest.mark.parametrize("command", ["tokenizer train", "convert"])
def test_empty_directory_is_written_and_overwrite_replaces_whole(command, world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert run(argv_for(command, world, out))[0] == 0
    assert owner(out) == command
    make(out, UNRELATED)  # now: the command's output among unrelated files
    code, err = run(argv_for(command, world, out) + ["--overwrite"])
    assert code == 0, err
    assert owner(out) == command and not (out / "notes.txt").exists() and not (out / "photos").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing left beside it


@pytest.mark.parametrize("in_place", [False, True])
def test_overwrite_that_fails_leaves_the_old_directory_whole(in_place, tmp_path):
    out = make(tmp_path / "out", OUTPUTS["analyze"])
    before = snapshot(out)
    mode = check_out(out, "analyze", overwrite=True)
    with pytest.raises(RuntimeError):
        with writing_out(out, mode, "analyze", in_place=in_place) as where:
            (where / "analysis.json").write_text('{"half": true}')
            raise RuntimeError("the run failed half way")
    assert snapshot(out) == before and [p.name for p in tmp_path.iterdir()] == ["out"]
    with writing_out(out, mode, "analyze", in_place=in_place) as where:
        (where / "analysis.json").write_text('{"new": true}')
    assert snapshot(out) == {"analysis.json": b'{"new": true}'} and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_overwrite_never_deletes_the_working_directory_or_an_input(tmp_path, monkeypatch):
    model = make(tmp_path / "runs" / "m", OUTPUTS["convert"])
    with pytest.raises(ValueError, match="an input of this run"):
        check_out(tmp_path / "runs", "analyze", overwrite=True, inputs=(model,))
    monkeypatch.chdir(tmp_path / "runs")
    with pytest.raises(ValueError, match="working or home directory"):
        check_out(".", "analyze", overwrite=True)


def test_experiment_resumes_its_own_preset_and_refuses_another(tmp_path):
    """A study committed in docs/results/<name> (results.json and progress.md name the preset, no
    STARTED.json preset from before it was recorded) resumes under its own preset."""
    study = make(tmp_path / "study", {"results.json": '{"preset": "study"}', "runs/base-s0/metrics.jsonl": "{}\n",
                                      "progress.md": "# sinkdlm experiment `study`\n", "STARTED.json": '{"time": 1}'})
    assert check_out(study, "experiment", resumable=True, preset="study") == "resume"
    with pytest.raises(ValueError, match=r"holds the `study` experiment, not `escape`.*--overwrite"):
        check_out(study, "experiment", resumable=True, preset="escape")


def test_train_overwrite_replaces_and_a_failed_start_puts_the_old_back(world, tmp_path):
    """train --overwrite over unrelated files: the new run takes --out whole (its train_config.json names
    --out, not a temporary); a start that fails (missing --data) leaves the old directory as it was."""
    out = make(tmp_path / "out", UNRELATED)
    before = snapshot(out)
    bad = argv_for("train", world, out) + ["--overwrite"]
    bad[bad.index("--data") + 1] = str(tmp_path / "missing.txt")
    code, err = run(bad)
    assert code == 2 and "missing.txt" in err and snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    code, err = run(argv_for("train", world, out) + ["--overwrite"])
    assert code == 0, err
    assert owner(out) == "train" and not (out / "notes.txt").exists()
    assert json.loads((out / "train_config.json").read_text())["out"] == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("command", [*COMMANDS, "eval"])
def test_refusal_comes_before_the_heavy_imports(command, world, tmp_path):
    """A fresh `sinkdlm` process refuses another's --out in well under the 2 s that importing torch alone takes
    here: the check runs before the command's imports, let alone its model (measured ~0.3 s on 2 busy cores)."""
    import subprocess
    import sys
    import time

    from helpers import subprocess_env

    out = make(tmp_path / "out", UNRELATED)
    target = out / "notes.txt" if command == "eval" else out
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sinkdlm", *argv_for(command, world, target)], capture_output=True,
                          text=True, env=subprocess_env(), timeout=60)
    seconds = time.perf_counter() - start
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--overwrite" in done.stderr
    assert seconds < 2.0, f"{command}: refused after {seconds:.2f} s"


def test_overwrite_killed_outright_keeps_the_old_directory_and_names_it(tmp_path, capsys):
    """A run killed with SIGKILL cannot put the old directory back: it stays whole beside --out, and the next
    command on that --out says where it is (nothing a user made disappears silently)."""
    import signal
    import subprocess
    import sys

    out = make(tmp_path / "out", OUTPUTS["analyze"])
    before = snapshot(out)
    code = ("import sys, time\nfrom sinkdlm.io.out_dir import check_out, writing_out\n"
            f"out = {str(out)!r}\nmode = check_out(out, 'train', overwrite=True)\n"
            "with writing_out(out, mode, 'train', in_place=True) as where:\n"
            "    (where / 'half.txt').write_text('half'); print('inside', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "inside"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    aside = tmp_path / f".out.old-{child.pid}"
    assert snapshot(aside) == before  # the user's directory, whole
    capsys.readouterr()
    check_out(out, "train", overwrite=True)
    err = capsys.readouterr().err
    assert f"note: {aside} holds what an interrupted --overwrite set aside from --out {out}" in err
    check_out(out, "train", overwrite=True)  # the command line and the library both check: named once
    assert "note:" not in capsys.readouterr().err


def _held_elsewhere(path: Path) -> int:
    """An exclusive flock on `path` through a descriptor of its own (what another process's `hold` takes: flock
    locks belong to the open file description, so this conflicts with `hold` in this process as well)."""
    import fcntl
    import os

    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_hold_skips_a_held_directory_or_waits_for_it(tmp_path):
    """`hold` (an experiment's shards claiming units): a free directory is made and held; a held one yields False
    at once without `wait`, and with `wait` says once what it waits for, then holds it when the other lets go."""
    import os
    import threading
    import time

    pytest.importorskip("fcntl")
    from sinkdlm.io.out_dir import hold

    d = tmp_path / "runs" / "a"
    with hold(d, wait=False) as held:
        assert held and d.is_dir()
        with hold(d, wait=False) as again:  # a second holder (its own descriptor) is turned away
            assert again is False
    fd = _held_elsewhere(d)
    said = []
    threading.Timer(0.3, os.close, (fd,)).start()  # the other holder lets go (closing drops the lock)
    t0 = time.perf_counter()
    with hold(d, wait=True, on_wait=lambda: said.append("waiting")) as held:
        assert held and said == ["waiting"] and time.perf_counter() - t0 >= 0.25
    with hold(d, wait=False) as held:  # released again at the end of the body
        assert held
