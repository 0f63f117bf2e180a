"""One rule for every command's `--out` (`sinkdlm.io.out_dir`): each command against an empty directory, its
own output, another command's and unrelated files; `--overwrite` replaces atomically, and only what the command
itself wrote.

The reference is the rule as stated, written out as a table here: empty -> written; own and resumable
(train/sft, the same experiment preset) -> resumed (train refuses without --resume, as before); the command's
own recorded output -> refused in one line that offers --overwrite, which replaces it; anything its record does
not list (a user's file, another command's output, an unrecorded output) -> refused even with --overwrite, in
one line that names those entries and never offers --overwrite. The record is the documented
`{"command": ..., "entries": [...]}` in `.sinkdlm-out.json`, written out by hand here.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import fuzz_world
from sinkdlm.io.out_dir import RECORD, check_out, owner, writing_out

# What each command leaves in its --out (the names `owner` recognises), as small stand-ins.
OUTPUTS = {
    "train": {"train_config.json": '{"sft": false}', "metrics.jsonl": "{}\n"},
    "sft": {"train_config.json": '{"sft": true}', "metrics.jsonl": "{}\n"},
    "convert": {"config.json": "{}", "model.safetensors": "", "tokenizer.json": "{}"},
    "analyze": {"analysis.json": "{}", "report.html": "<html>"},
    "experiment": {"STARTED.json": '{"time": 0, "preset": "demo"}', "progress.md": "# sinkdlm experiment `demo`\n"},
    "tokenizer train": {"tokenizer.json": "{}", "tokenizer_config.json": "{}"},
    "merge": {"config.json": "{}", "model.safetensors": ""},
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
        "merge": ["merge", "--adapter", world["ok"]],
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


def own(path: Path, command: str, extra: dict[str, str] | None = None) -> Path:
    """`command`'s stand-in output with the record it keeps of what it wrote (plus `extra`, files it did not)."""
    make(path, OUTPUTS[command])
    entries = {f"{'/'.join(name.split('/')[:i])}/" for name in OUTPUTS[command] for i in range(1, name.count("/") + 1)}
    (path / RECORD).write_text(json.dumps({"command": command, "entries": sorted({*OUTPUTS[command], *entries})}))
    return make(path, extra or {})


def snapshot(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else "dir" for p in sorted(path.rglob("*"))}


COMMANDS = list(OUTPUTS)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("state", ["empty", "own", "own+notes", "unrecorded", "other", "unrelated"])
def test_the_rule_decides_for_every_command(command, state, tmp_path):
    """The decision table, for every directory command, from the library (no work is started)."""
    out = tmp_path / "out"
    out.mkdir()
    other = next(c for c in COMMANDS if c != command and not {c, command} <= {"convert", "tokenizer train", "merge"})
    if state in ("own", "own+notes"):
        own(out, command, UNRELATED if state == "own+notes" else None)
    else:
        make(out, {"empty": {}, "unrecorded": OUTPUTS[command], "other": OUTPUTS[other], "unrelated": UNRELATED}[state])
    if state not in ("empty", "own+notes"):
        want = {"other": other, "unrelated": None}.get(state, command)
        # a merged checkpoint without its record looks converted
        assert owner(out) == (want if state == "own" or want != "merge" else "convert")
    resumable = command in ("train", "sft", "experiment")
    preset = "demo" if command == "experiment" else None
    if state == "empty" or (state not in ("other", "unrelated") and resumable):
        assert check_out(out, command, resumable=resumable, preset=preset) == ("new" if state == "empty" else "resume")
    elif state == "own":
        with pytest.raises(ValueError, match=r"already holds .*choose another --out, or pass --overwrite"):
            check_out(out, command, resumable=resumable, preset=preset)
    if state in ("empty", "own"):
        assert check_out(out, command, overwrite=True, resumable=resumable) == ("new" if state == "empty" else "replace")
        return
    strangers = (["notes.txt", "photos/"] if state in ("own+notes", "unrelated")
                 else sorted(OUTPUTS[other if state == "other" else command]))
    for overwrite in (True, False) if not resumable or state in ("other", "unrelated") else (True,):
        with pytest.raises(ValueError) as refused:
            check_out(out, command, overwrite=overwrite, resumable=resumable)
        message = str(refused.value)
        assert f"holds {len(strangers)} entries that `sinkdlm {command}` did not write ({', '.join(strangers)})" in message
        assert "choose another --out, or move them out of it" in message and "--overwrite" not in message


def test_a_refusal_names_ten_foreign_entries_and_counts_the_rest(tmp_path):
    out = own(tmp_path / "out", "analyze", {f"note{i:02d}.txt": "mine" for i in range(13)})
    with pytest.raises(ValueError, match=r"holds 13 entries .* \(note00.txt, .*, note09.txt and 3 more\)"):
        check_out(out, "analyze", overwrite=True)


@pytest.mark.parametrize("command", [*COMMANDS, "eval"])
@pytest.mark.parametrize("state", ["own", "other", "unrelated"])
def test_every_command_refuses_in_one_line_before_any_work(command, state, world, tmp_path):
    """The command line: one `error:` line that names what --out holds (and offers --overwrite only for the
    command's own output, or, for a training run of its own, --resume as before), and --out left byte-identical."""
    if command == "experiment" and state == "own":  # the same preset's directory resumes: a different one
        files, expected = OUTPUTS["experiment"], "holds the `demo` experiment, not `smoke`"
    elif command in ("train", "sft") and state == "own":
        files, expected = OUTPUTS[command], "pass --resume to continue it"
    else:
        other = "analyze" if command != "analyze" else "convert"
        files = {"own": OUTPUTS.get(command), "other": OUTPUTS[other], "unrelated": UNRELATED}[state]
        expected = {"own": f"`sinkdlm {command}`", "other": f"`sinkdlm {other}`", "unrelated": "notes.txt"}[state]
    if command == "eval":  # eval writes one file: its own scores, another command's JSON, or some file
        out = tmp_path / "scores.json"
        body = {"own": {"model": "m", "tasks": [], "scores": {}}, "other": {"preset": "demo"}}.get(state)
        out.write_text(json.dumps(body) if body is not None else "mine\n")
        expected = {"own": "scores of an earlier `sinkdlm eval`"}.get(state, "is not the scores of an earlier")
        before = out.read_bytes()
    else:
        out = own(tmp_path / "out", command) if state == "own" else make(tmp_path / "out", files)
        before = snapshot(out)
    code, err = run(argv_for(command, world, out))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --out"), err
    assert expected in lines[0], lines[0]
    assert ("--overwrite" in lines[0]) == (state == "own"), lines[0]
    assert (out.read_bytes() if command == "eval" else snapshot(out)) == before


@pytest.mark.parametrize("command", [*COMMANDS, "eval"])
def test_overwrite_keeps_a_file_the_command_did_not_write(command, world, tmp_path):
    """Every command that writes --out, given --overwrite over its own output beside which a user put a file:
    refused in one line that names the file, never offers --overwrite, and the file is byte-equal afterwards."""
    if command == "eval":  # eval's --out is one file: a user's file there is never replaced
        planted = target = tmp_path / "thesis.txt"
        planted.write_bytes(b"my thesis\n\x00\xff")
    else:
        target = own(tmp_path / "out", command, {"data/thesis.txt": "my thesis\n"})
        planted = target / "data" / "thesis.txt"
    before = planted.read_bytes()
    code, err = run(argv_for(command, world, target) + ["--overwrite"])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --out"), err
    assert ("thesis.txt" if command == "eval" else "(data/)") in lines[0] and "--overwrite" not in lines[0], lines[0]
    assert planted.read_bytes() == before


@pytest.mark.parametrize("command", ["tokenizer train", "convert"])
def test_a_command_records_what_it_wrote_and_overwrite_replaces_only_that(command, world, tmp_path):
    """A real run keeps its record (every entry it wrote, nothing else); --overwrite over it replaces it whole
    and says so in one line; a user's file put beside it afterwards makes the next --overwrite a refusal."""
    out = tmp_path / "out"
    out.mkdir()
    assert run(argv_for(command, world, out))[0] == 0
    record = json.loads((out / RECORD).read_text())
    assert record["command"] == command and record["entries"] == sorted(snapshot(out).keys() - {RECORD})
    code, err = run(argv_for(command, world, out) + ["--overwrite"])
    assert code == 0, err
    files = sum((out / e).is_file() for e in record["entries"])
    assert f"--overwrite replaced --out {out}: the output of `sinkdlm {command}`: {files} files" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nothing left beside it
    make(out, {"notes.txt": "mine\n"})
    code, err = run(argv_for(command, world, out) + ["--overwrite"])
    assert code == 2 and "did not write (notes.txt)" in err and (out / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("in_place", [False, True])
def test_overwrite_that_fails_leaves_the_old_directory_whole(in_place, tmp_path):
    out = own(tmp_path / "out", "analyze")
    before = snapshot(out)
    mode = check_out(out, "analyze", overwrite=True)
    with pytest.raises(RuntimeError):
        with writing_out(out, mode, "analyze", in_place=in_place) as where:
            (where / "analysis.json").write_text('{"half": true}')
            raise RuntimeError("the run failed half way")
    assert snapshot(out) == before and [p.name for p in tmp_path.iterdir()] == ["out"]
    with writing_out(out, mode, "analyze", in_place=in_place) as where:
        (where / "analysis.json").write_text('{"new": true}')
    assert snapshot(out) == {"analysis.json": b'{"new": true}', RECORD: b'{\n  "command": "analyze",\n  "entries": '
                             b'["analysis.json"]\n}\n'} and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_overwrite_never_deletes_the_working_directory_or_an_input(tmp_path, monkeypatch):
    model = make(tmp_path / "runs" / "m", OUTPUTS["convert"])
    (tmp_path / "runs" / RECORD).write_text(json.dumps({"command": "analyze", "entries": [
        "m/", *(f"m/{name}" for name in OUTPUTS["convert"])]}))  # as if analyze had written it all
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
    with pytest.raises(ValueError, match=r"holds the `study` experiment, not `escape`.*--preset study to resume it\)$"):
        check_out(study, "experiment", resumable=True, preset="escape")  # no record: --overwrite would not replace it
    entries = [name + "/" if body == "dir" else name for name, body in snapshot(study).items()]
    (study / RECORD).write_text(json.dumps({"command": "experiment", "entries": entries}))
    with pytest.raises(ValueError, match=r"holds the `study` experiment, not `escape`.*or --overwrite to replace it\)$"):
        check_out(study, "experiment", resumable=True, preset="escape")


def test_train_overwrite_replaces_and_a_failed_start_puts_the_old_back(world, tmp_path):
    """train --overwrite over an earlier run: the new run takes --out whole (its train_config.json names
    --out, not a temporary); a start that fails (missing --data) leaves the old directory as it was."""
    out = own(tmp_path / "out", "train")
    before = snapshot(out)
    bad = argv_for("train", world, out) + ["--overwrite"]
    bad[bad.index("--data") + 1] = str(tmp_path / "missing.txt")
    code, err = run(bad)
    assert code == 2 and "missing.txt" in err and snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    code, err = run(argv_for("train", world, out) + ["--overwrite"])
    assert code == 0, err
    assert owner(out) == "train" and (out / "metrics.jsonl").read_text() != OUTPUTS["train"]["metrics.jsonl"]
    assert json.loads((out / "train_config.json").read_text())["out"] == str(out)
    assert f"--overwrite replaced --out {out}: the output of `sinkdlm train`: 2 files" in err
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
    assert "notes.txt" in done.stderr and "choose another --out" in done.stderr
    assert seconds < 2.0, f"{command}: refused after {seconds:.2f} s"


def test_overwrite_killed_outright_keeps_the_old_directory_and_names_it(tmp_path, capsys):
    """A run killed with SIGKILL cannot put the old directory back: it stays whole beside --out, and the next
    command on that --out says where it is (nothing a user made disappears silently)."""
    import signal
    import subprocess
    import sys

    out = own(tmp_path / "out", "train")
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
    with pytest.raises(ValueError, match=r"did not write \(half.txt\)"):  # the killed run kept no record
        check_out(out, "train", overwrite=True)
    err = capsys.readouterr().err
    assert f"note: {aside} holds what an interrupted --overwrite set aside from --out {out}" in err
    with pytest.raises(ValueError):  # the command line and the library both check: named once
        check_out(out, "train", overwrite=True)
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


def test_overwrite_of_a_study_names_its_preset_runs_and_file_count(tmp_path, capsys):
    """The one line --overwrite prints for a study it replaced: its preset, its runs and how many files went."""
    out = own(tmp_path / "study", "experiment")
    make(out, {f"runs/{run}/{name}": "{}" for run in ("a-s0", "b-s0") for name in ("val.json", "eval.json")})
    (out / RECORD).write_text(json.dumps({"command": "experiment", "entries": [
        name + "/" if body == "dir" else name for name, body in snapshot(out).items() if name != RECORD]}))
    mode = check_out(out, "experiment", overwrite=True, resumable=True, preset="demo")
    capsys.readouterr()
    with writing_out(out, mode, "experiment", lock=False, in_place=True) as where:
        (where / "STARTED.json").write_text('{"preset": "demo"}')
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"[sinkdlm] --overwrite replaced --out {out}: the `demo` experiment: 2 runs (a-s0, b-s0), 6 files"]
    assert sorted(p.name for p in out.iterdir()) == [RECORD, "STARTED.json"]


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_run_beside_foreign_entries_is_refused_without_offering_overwrite(command, world, tmp_path):
    """A training run of its own, with a user's file beside it, and no --resume: the trainer's refusal would offer
    --overwrite, which would not replace that file; the line names it and offers --resume or another --out."""
    out = own(tmp_path / "out", command, {"thesis.txt": "mine\n"})
    before = snapshot(out)
    code, err = run(argv_for(command, world, out))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == (f"error: --out {out} holds a `sinkdlm {command}` run and 1 entry it did not write (thesis.txt); "
                        "pass --resume to continue it, or choose another --out")
    assert snapshot(out) == before
