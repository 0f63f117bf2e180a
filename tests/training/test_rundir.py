"""Runs never lose or mix data: refusal to overwrite, --overwrite, the run lock, Ctrl-C/SIGTERM,
explained resume with fallback past a corrupt checkpoint, and refused setting changes on resume.

The references are the run's own files (byte-for-byte snapshots) and an uninterrupted run's
losses (exact resume: the batch and noise of step s depend on (seed, s) only).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sinkdlm import DiffusionLM
from sinkdlm.training import train
from sinkdlm.training import rundir
from sinkdlm.training.checkpointing import list_checkpoints
from sinkdlm.training.rundir import LOCK_NAME, TrainingStopped
from helpers import SMALL, cfg_for, read_metrics, write_corpus

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl")


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file under `out` (but our lock file) with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def cli_args(tmp_path: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    """`sinkdlm train` flags for the micro config of test_training.cfg_for."""
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"model_overrides": SMALL, "eval_batches": 1, "tensorboard": False}))
    return ["train", "--config", str(small), "--data", str(corpus), "--out", str(out),
            "--cache-dir", str(tmp_path / "cache"), "--batch-size", "4", "--seq-len", "32", "--log-every", "1",
            "--eval-every", "4", "--seed", "3", "--num-sink-tokens", "1", "--device", "cpu", *extra]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    from sinkdlm.cli import main

    capsys.readouterr()  # what ran before (progress on stderr) is not this command's output
    with pytest.raises(SystemExit) as exc:
        main(args)
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


# ----------------------------------------------------------------------------- existing runs
def test_existing_run_is_refused_and_left_unchanged(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    train(cfg_for(tmp_path, corpus, max_steps=4, save_every=2))
    before = snapshot(out)
    code, _, err = run_cli(cli_args(tmp_path, corpus, out, "--max-steps", "2", "--batch-size", "8"), capsys)
    assert code == 2
    assert err.startswith(f"error: --out={out} already holds a training run (train_config.json, metrics.jsonl, "
                          "checkpoints/step-4); pass --resume to continue it, or --overwrite to delete it")
    assert snapshot(out) == before
    with pytest.raises(ValueError, match="already holds a training run"):  # the library refuses too
        train(cfg_for(tmp_path, corpus, max_steps=2))
    with pytest.raises(ValueError, match="give only one of them"):
        cfg_for(tmp_path, corpus, resume=True, overwrite=True)
    assert snapshot(out) == before


def test_overwrite_removes_only_what_training_wrote(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    train(cfg_for(tmp_path, corpus, max_steps=4, save_every=2))
    (out / "notes.txt").write_text("mine")
    (out / "checkpoints" / "corrupt-step-1").mkdir()
    (out / "checkpoints" / "README").write_text("mine too")
    before = snapshot(out)
    # an input error with --overwrite costs nothing: the old run is deleted only after every check
    with pytest.raises(ValueError, match="does not exist"):
        train(cfg_for(tmp_path, corpus, data=str(tmp_path / "missing.txt"), overwrite=True))
    assert snapshot(out) == before
    capsys.readouterr()

    summary = train(cfg_for(tmp_path, corpus, max_steps=3, save_every=3, overwrite=True))
    assert "--overwrite: removed the previous run" in capsys.readouterr().err
    assert summary["checkpoint"] == str(out / "checkpoints" / "step-3")
    assert [s for s, _ in list_checkpoints(out)] == [3]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["README", "step-3"]
    assert (out / "notes.txt").read_text() == "mine"
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert json.loads((out / "train_config.json").read_text())["max_steps"] == 3


def test_resume_with_other_settings_is_refused(tmp_path, corpus):
    out = tmp_path / "run"
    train(cfg_for(tmp_path, corpus, max_steps=4, save_every=4))
    before = snapshot(out)
    with pytest.raises(ValueError) as err:
        train(cfg_for(tmp_path, corpus, max_steps=8, resume=True, batch_size=8, seq_len=16, num_sink_tokens=2,
                      data=str(write_corpus(tmp_path / "other.jsonl", 41))))
    msg = str(err.value)
    assert msg.startswith("resume=True: this run was started with other settings: ")  # the library's names
    for part in ("batch_size=4 in the checkpoint, 8 now", "seq_len=32 in the checkpoint, 16 now",
                 "num_sink_tokens=1 in the checkpoint, 2 now", "data="):
        assert part in msg, part
    assert "seed=" not in msg and "pass overwrite=True" in msg
    assert snapshot(out) == before
    # unchanged settings (a longer run, another device spelling) resume
    summary = train(cfg_for(tmp_path, corpus, max_steps=5, save_every=4, resume=True, device="cpu"))
    assert summary["checkpoint"].endswith("step-5")


# ----------------------------------------------------------------------------- resume
def test_a_fresh_run_says_nothing_about_resuming(tmp_path, corpus, capsys):
    """An experiment's run: resume=True on a fresh out, trained and scored part by part (`stop_at`), says
    nothing about resuming; it trains the steps of one run (a resume by a new call names its checkpoint:
    test_signal_saves_prints_resume_command_and_resume_is_exact)."""
    cfg = cfg_for(tmp_path, corpus, max_steps=4, save_every=100, resume=True)
    capsys.readouterr()
    train(cfg, stop_at=2)
    train(cfg)
    assert "resum" not in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(cfg.out)] == [1, 2, 3, 4]


def test_corrupt_newest_checkpoint_falls_back_and_is_named(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    train(cfg_for(tmp_path, corpus, max_steps=12, save_every=4))
    want = read_metrics(out)
    weights = out / "checkpoints" / "step-12" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated, as by a full disk
    capsys.readouterr()
    summary = train(cfg_for(tmp_path, corpus, max_steps=12, save_every=4, resume=True))
    log = capsys.readouterr().err
    assert f"{out / 'checkpoints' / 'step-12'} cannot be loaded" in log
    assert "moved it aside to corrupt-step-12 and falling back to step-8" in log
    assert f"resuming from {out / 'checkpoints' / 'step-8'}" in log
    assert (out / "checkpoints" / "corrupt-step-12" / "model.safetensors").stat().st_size == 1000
    got = read_metrics(out)
    assert [r["step"] for r in got] == list(range(1, 13))
    assert [r["loss"] for r in got] == [r["loss"] for r in want]  # steps 9-12 redone exactly
    DiffusionLM.from_pretrained(summary["checkpoint"])
    assert [s for s, _ in list_checkpoints(out)] == [4, 8, 12]


def test_no_loadable_checkpoint_and_unreadable_folder_are_errors(tmp_path, corpus, monkeypatch):
    out = tmp_path / "run"
    train(cfg_for(tmp_path, corpus, max_steps=4, save_every=2, keep_last=2))
    for step in (2, 4):
        (out / "checkpoints" / f"step-{step}" / "trainer_state.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"no checkpoint under .* can be loaded \(step-4: .*; step-2: .*\); pass overwrite=True"):
        train(cfg_for(tmp_path, corpus, max_steps=4, resume=True))
    assert (out / "checkpoints" / "step-4").is_dir()  # nothing moved when there is nothing to fall back to

    real_iterdir = Path.iterdir

    def denied(self):
        if self.name == "checkpoints":
            raise PermissionError(13, "Permission denied")
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(ValueError, match=r"checkpoints cannot be read \(Permission denied\); fix its permissions"):
        train(cfg_for(tmp_path, corpus, max_steps=4, resume=True))
    monkeypatch.undo()
    other = tmp_path / "other"
    other.mkdir()
    (other / "checkpoints").write_text("")  # not a folder: not "no checkpoint yet"
    with pytest.raises(ValueError, match="checkpoints is not a directory"):
        train(cfg_for(tmp_path, corpus, out=str(other), max_steps=4, resume=True))


def test_stale_temporary_checkpoints_are_removed_on_start(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    train(cfg_for(tmp_path, corpus, max_steps=2, save_every=2))
    stale = out / "checkpoints" / ".tmp-step-3"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    capsys.readouterr()
    train(cfg_for(tmp_path, corpus, max_steps=3, save_every=3, resume=True))
    log = capsys.readouterr().err
    assert "removed 1 unfinished checkpoint(s) left by an interrupted save: .tmp-step-3" in log
    assert not stale.exists() and [s for s, _ in list_checkpoints(out)] == [2, 3]


# ----------------------------------------------------------------------------- signals
def test_sigint_in_process_saves_stops_and_restores_handlers(tmp_path, corpus, capfd):
    def mine(signum, frame):  # a library caller's own handler must survive train()
        raise AssertionError("not during training")

    previous = signal.signal(signal.SIGINT, mine)
    try:
        def interrupt(info):
            if info["step"] == 2:
                os.kill(os.getpid(), signal.SIGINT)

        with pytest.raises(TrainingStopped) as stopped:
            train(cfg_for(tmp_path, corpus, max_steps=6, save_every=100), on_step=interrupt)
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.value.exit_code == 130 and stopped.value.step == 2
    out = tmp_path / "run"
    assert [s for s, _ in list_checkpoints(out)] == [2] and [r["step"] for r in read_metrics(out)] == [1, 2]
    log = capfd.readouterr()  # the handler writes to fd 2 directly (print is unsafe in a handler)
    assert "SIGINT received: finishing this step and saving a checkpoint" in log.err
    assert f"stopped by SIGINT after step 2 of 6: checkpoint saved to {out / 'checkpoints' / 'step-2'}" in log.err
    assert "resume with: call train() again with resume=True" in log.err


# A `python -m sinkdlm ...` process whose step `BLOCK_AT` (0-based) waits for the file `go`: the
# test acts while the run is known to be mid-training (send a signal, start a second run).
BLOCKING_MAIN = r"""
import pathlib, runpy, sys, time
import sinkdlm.training.trainer as trainer
block_at, marker, go = int(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
lr_at = trainer.lr_at
def waiting(step, cfg):
    if step == block_at:
        marker.write_text("at step")
        deadline = time.time() + 120
        while not go.exists() and time.time() < deadline:
            time.sleep(0.05)
    return lr_at(step, cfg)
trainer.lr_at = waiting
sys.argv = ["sinkdlm", *sys.argv[4:]]
runpy.run_module("sinkdlm", run_name="__main__")
"""


def start_blocking(tmp_path: Path, block_at: int, args: list[str]) -> tuple[subprocess.Popen, Path, Path]:
    marker, go = tmp_path / "marker", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", BLOCKING_MAIN, str(block_at), str(marker), str(go), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1][-3000:])
        assert time.time() < deadline, "the training never reached its blocking step"
        time.sleep(0.05)
    return proc, marker, go


@pytest.mark.slow  # three `sinkdlm` processes, each importing torch: ~22 s on 2 cores
def test_second_run_on_the_same_out_is_refused_while_the_first_finishes(tmp_path, corpus):
    out = tmp_path / "run"
    args = cli_args(tmp_path, corpus, out, "--max-steps", "4", "--save-every", "2")
    first, _, go = start_blocking(tmp_path, 1, args)
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    for extra in ([], ["--resume"]):  # a resume must wait for the owner too
        second = subprocess.run([sys.executable, "-m", "sinkdlm", *args, *extra], env=env, capture_output=True,
                                text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr.strip() == (f"error: --out={out} is in use by another training (PID {first.pid}); "
                                         "wait for it to finish, stop it, or choose another output directory")
    go.write_text("")
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-3000:]
    assert json.loads(stdout.splitlines()[-1])["checkpoint"] == str(out / "checkpoints" / "step-4")
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]  # one run's rows, not interleaved
    assert [s for s, _ in list_checkpoints(out)] == [2, 4]
    assert json.loads((out / "train_config.json").read_text())["seed"] == 3


# SIGTERM (what Slurm and a local launcher send) in the default suite; SIGINT (the same handler) with the slow ones
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM])
def test_signal_saves_prints_resume_command_and_resume_is_exact(tmp_path, corpus, capsys, sig):
    out = tmp_path / "run"
    args = cli_args(tmp_path, corpus, out, "--max-steps", "8", "--save-every", "100")
    proc, _, go = start_blocking(tmp_path, 3, args)  # waiting inside step 4 (0-based 3)
    proc.send_signal(sig)
    time.sleep(0.5)  # the handler has run long before: it only sets a flag
    go.write_text("")
    stdout, stderr = proc.communicate(timeout=300)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, stderr[-3000:]
    assert f"{name} received: finishing this step and saving a checkpoint" in stderr
    assert "Traceback" not in stderr
    ckpt = out / "checkpoints" / "step-4"
    assert f"[sinkdlm] stopped by {name} after step 4 of 8: checkpoint saved to {ckpt}" in stderr
    assert stdout == ""  # a stopped run has no result; what it says is progress (stderr)
    assert [s for s, _ in list_checkpoints(out)] == [4]
    assert not list((out / "checkpoints").glob(".tmp-*"))
    command = stderr.split("[sinkdlm] resume with: ", 1)[1].splitlines()[0]
    words = shlex.split(command)
    assert words[:2] == ["sinkdlm", "train"] and words[-1] == "--resume"
    pairs = lambda w: dict(zip(w[::2], w[1::2]))  # noqa: E731
    assert pairs(words[2:-1]) == pairs(args[1:])  # exactly the typed flags, nothing resolved or lost
    if sig == signal.SIGTERM:
        return
    code, _, log = run_cli(words[1:], capsys)  # run the printed command
    assert code == 0
    assert f"resuming from {ckpt}" in log
    ref = cfg_for(tmp_path / "ref", corpus, max_steps=8, save_every=100)
    train(ref)
    got, want = read_metrics(out), read_metrics(ref.out)
    assert [r["step"] for r in got] == list(range(1, 9))
    assert [r["loss"] for r in got] == [r["loss"] for r in want]
    assert [r.get("val_loss") for r in got] == [r.get("val_loss") for r in want]


@pytest.mark.parametrize("threads", [1, 2])
def test_interrupted_and_resumed_equals_uninterrupted_bitwise_at_each_thread_count(tmp_path, corpus, threads):
    """Bitwise resume (issue 31: a signal-resume run once differed in the last bit under load): a run
    stopped by SIGINT after step 4 of 8 and resumed equals one that was never stopped, loss for loss,
    with one and with two intra-op threads (a reduction split across threads is where order could
    change; the suite otherwise runs with one)."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        def interrupt(info):
            if info["step"] == 4:
                os.kill(os.getpid(), signal.SIGINT)

        cfg = cfg_for(tmp_path / "a", corpus, max_steps=8, save_every=100)
        with pytest.raises(TrainingStopped):
            train(cfg, on_step=interrupt)
        train(cfg_for(tmp_path / "a", corpus, max_steps=8, save_every=100, resume=True))
        ref = cfg_for(tmp_path / "b", corpus, max_steps=8, save_every=100)
        train(ref)
    finally:
        torch.set_num_threads(previous_threads)
    got, want = read_metrics(cfg.out), read_metrics(ref.out)
    assert [r["step"] for r in got] == list(range(1, 9))
    assert [(r["loss"], r["grad_norm"], r.get("val_loss")) for r in got] == [
        (r["loss"], r["grad_norm"], r.get("val_loss")) for r in want]


# ----------------------------------------------------------------------------- degraded lock
def test_without_fcntl_the_run_goes_on_and_says_so(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setattr(rundir, "fcntl", None)
    summary = train(cfg_for(tmp_path, corpus, max_steps=1, save_every=1))
    assert "no fcntl file locks; nothing stops a second training" in capsys.readouterr().err
    assert summary["checkpoint"].endswith("step-1")


# ----------------------------------------------------------------------------- input errors
def test_non_utf8_data_fails_naming_the_file_through_the_cli(tmp_path, capsys):
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 au lait\n\nsecond paragraph\n".encode("latin-1") * 20)
    code, _, err = run_cli(["train", "--data", str(latin), "--out", str(tmp_path / "o"), "--cache-dir",
                            str(tmp_path / "cache"), "--max-steps", "1"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: ") and f"{latin.name} is not UTF-8 text" in err


@pytest.mark.slow  # ~16 s (a fresh interpreter); the same refusal through main(): tests/cli/test_cli_robust.py
def test_unwritable_cache_dir_is_one_line_from_the_real_entry_point(tmp_path):
    """`python -m sinkdlm` (what a user runs), not the in-process main: no traceback on stderr."""
    env = {**os.environ, "PYTHONPATH": SRC}
    res = subprocess.run([sys.executable, "-m", "sinkdlm", "train", "--out", str(tmp_path / "o"), "--max-steps", "1",
                          "--cache-dir", "/proc/sinkdlm-cache"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: --cache-dir /proc/sinkdlm-cache is not writable (No such file or directory); choose another directory"
    ]


def test_ctrl_c_in_an_experiment_saves_and_leaves_the_stage_unfinished(tmp_path, corpus, monkeypatch):
    """The runner must not mark an interrupted training as done; its hint is the experiment command."""
    from typer.testing import CliRunner

    import sinkdlm.training.trainer as trainer
    from sinkdlm.cli.app import app

    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "cache"))
    real = trainer.lr_at

    def interrupting(step, cfg):
        if step == 1:  # during the second step of the first variant's training
            os.kill(os.getpid(), signal.SIGINT)
        return real(step, cfg)

    monkeypatch.setattr(trainer, "lr_at", interrupting)
    out = tmp_path / "exp"
    args = ["experiment", "--preset", "smoke", "--out", str(out), "--data", str(corpus), "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 130, result.output
    run = out / "runs" / "vanilla-s0" / "train"
    assert [s for s, _ in list_checkpoints(run)] == [2] and not (run / "DONE.json").exists()
    assert f"resume with: sinkdlm experiment --device cpu --preset smoke --out {out} --data {corpus}" in result.output
