"""FSDP2 on gloo: 2 processes = 1 process across a sharded resume, a rank killed mid-save, resume
with another world size (2 -> 1 and 1 -> 2), the consolidated checkpoint opens with `sinkdlm
generate`, activation checkpointing and compile are exact, and bad launches fail clearly.

The reference is a plain single-process run (`sinkdlm.training.train`, fp32) of the same global
batch; FSDP must log the same losses within a relative 1e-4 (float summation order differs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from typer.testing import CliRunner

if not hasattr(dcp, "HuggingFaceStorageWriter"):  # torch < 2.8: --fsdp refuses with one line (test_versions.py)
    pytest.skip(f"--fsdp needs torch>=2.8 (this is {torch.__version__})", allow_module_level=True)

from sinkdlm import DiffusionLM
from sinkdlm.training import TrainConfig, train
from sinkdlm.training.checkpointing import latest_checkpoint
from sinkdlm.training.sharded import SHARDED_DIR

from helpers import subprocess_env, torchrun, torchrun_cmd
from helpers import cfg_for, read_metrics, write_corpus

STEPS = dict(max_steps=8, save_every=4, eval_every=4)

# train(cfg) under torchrun, every rank leaving at the same step (after the step-4 checkpoint).
STOP_SCRIPT = r"""
import json, sys
from sinkdlm.training import TrainConfig, train
stop = int(sys.argv[2])
def on_step(info):
    if info["step"] == stop:
        raise SystemExit(3)
train(TrainConfig.resolve(**json.loads(sys.argv[1])), on_step=on_step)
"""

# Rank 1 writes its shards of step 8, reports its pid and hangs until the test SIGKILLs it.
KILL_SCRIPT = r"""
import json, os, sys, time, pathlib
import torch.distributed.checkpoint as dcp
from sinkdlm.training import TrainConfig, train
orig = dcp.HuggingFaceStorageWriter.write_data
def slow(self, plan, planner):
    fut = orig(self, plan, planner)
    if ".tmp-step-8" in str(self.path) and os.environ["RANK"] == "1":
        pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))
        time.sleep(300)
    return fut
dcp.HuggingFaceStorageWriter.write_data = slow
train(TrainConfig.resolve(**json.loads(sys.argv[1])))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus):
    """8 plain single-process steps: the losses every FSDP run must reproduce."""
    cfg = cfg_for(tmp_path_factory.mktemp("ref"), corpus, **STEPS)
    train(cfg)
    return cfg


def fsdp_cfg(tmp_path: Path, reference: TrainConfig, **kw) -> TrainConfig:
    return TrainConfig.resolve(**{**reference.to_dict(), "out": str(tmp_path / "run"), "fsdp": True, **kw})


def run_script(tmp_path: Path, nproc: int, script: str, *args: str):
    path = tmp_path / "script.py"
    path.write_text(script)
    return torchrun(nproc, str(path), *args, cwd=tmp_path)


def resume_cli(tmp_path: Path, nproc: int, cfg: TrainConfig, *flags: str):
    """`torchrun -m sinkdlm train --fsdp --resume --config FILE` with `cfg` as the file."""
    conf = tmp_path / "resume.json"
    conf.write_text(json.dumps({**cfg.to_dict(), "resume": True}))
    res = torchrun(nproc, "-m", "sinkdlm", "train", "--fsdp", "--config", str(conf), *flags, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def assert_same_losses(reference: TrainConfig, out) -> None:
    want, got = read_metrics(reference.out), read_metrics(out)
    assert [r["step"] for r in got] == list(range(1, 9))
    for a, b in zip(want, got):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), f"step {a['step']}"
        if "val_loss" in a:
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-4), f"step {a['step']}"


@pytest.mark.slow  # several processes, each importing torch: 42-49 s in a loaded full run (2 cores)
def test_two_fsdp_processes_match_one_process_across_a_sharded_resume(tmp_path, reference):
    cfg = fsdp_cfg(tmp_path, reference)
    res = run_script(tmp_path, 2, STOP_SCRIPT, json.dumps(cfg.to_dict()), "6")
    assert res.returncode != 0 and "Traceback" not in res.stdout, res.stderr[-3000:]
    ckpt = latest_checkpoint(cfg.out)
    assert ckpt.name == "step-4"
    # only safetensors and JSON: one shard file per rank, no pickled DCP .metadata
    shards = sorted(p.name for p in (ckpt / SHARDED_DIR).iterdir())
    assert len(shards) == 2 and all(n.endswith(".safetensors") for n in shards), shards
    assert all(p.suffix in {".json", ".safetensors"} for p in ckpt.rglob("*") if p.is_file())

    resume_cli(tmp_path, 2, cfg)
    assert_same_losses(reference, cfg.out)
    final = latest_checkpoint(cfg.out)
    assert final.name == "step-8" and not list((Path(cfg.out) / "checkpoints").glob(".tmp-*"))
    want = DiffusionLM.from_pretrained(latest_checkpoint(reference.out)).state_dict()
    got = DiffusionLM.from_pretrained(final).state_dict()  # the consolidated, gathered model
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-3, atol=1e-5)

    from sinkdlm.cli import app

    result = CliRunner().invoke(app, ["generate", "--model", str(final), "--prompt", "the king", "--gen-length", "8",
                                      "--steps", "8", "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output.strip().splitlines()[-1])["tokens"]) == 8


def test_sigkill_of_a_rank_during_a_sharded_save_then_resume_on_one_process(tmp_path, reference):
    cfg = fsdp_cfg(tmp_path, reference)
    marker = tmp_path / "pid"
    script = tmp_path / "script.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.Popen(torchrun_cmd(2, str(script), json.dumps(cfg.to_dict()), str(marker)), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=subprocess_env())
    deadline = time.time() + 240
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.1)
    time.sleep(0.2)  # the pid is written in full
    os.kill(int(marker.read_text()), signal.SIGKILL)
    proc.communicate(timeout=120)  # torchrun tears the other rank down
    assert proc.returncode != 0
    ckpt = latest_checkpoint(cfg.out)
    assert ckpt.name == "step-4"  # the half-written step 8 was never published
    DiffusionLM.from_pretrained(ckpt)

    # 2 -> 1: the sharded state loads into a plain single-process run (no process group)
    train(TrainConfig.resolve(**{**cfg.to_dict(), "fsdp": False, "resume": True}))
    assert_same_losses(reference, cfg.out)


@pytest.mark.slow  # three torchrun launches: ~22 s on 2 cores
def test_resume_from_one_fsdp_process_on_two_with_activation_checkpointing(tmp_path, reference):
    cfg = fsdp_cfg(tmp_path, reference)
    res = run_script(tmp_path, 1, STOP_SCRIPT, json.dumps(cfg.to_dict()), "6")
    assert res.returncode != 0 and latest_checkpoint(cfg.out).name == "step-4", res.stderr[-3000:]
    assert json.loads((latest_checkpoint(cfg.out) / "trainer_state.json").read_text())["world_size"] == 1
    resume_cli(tmp_path, 2, cfg, "--activation-checkpointing")
    assert_same_losses(reference, cfg.out)


def test_activation_checkpointing_and_compile_give_the_plain_losses(tmp_path, reference):
    short = dict(max_steps=3, save_every=3, eval_every=3)
    plain = TrainConfig.resolve(**{**reference.to_dict(), **short, "out": str(tmp_path / "plain")})
    train(plain)
    want = [r["loss"] for r in read_metrics(plain.out)]
    for name, kw in [("ac", dict(activation_checkpointing=True)), ("compiled", dict(compile=True, compile_backend="aot_eager"))]:
        cfg = TrainConfig.resolve(**{**plain.to_dict(), **kw, "out": str(tmp_path / name)})
        train(cfg)
        got = [r["loss"] for r in read_metrics(cfg.out)]
        assert got == pytest.approx(want, rel=1e-5), name
        # the block options leave parameter names alone: the checkpoint is a plain model directory
        DiffusionLM.from_pretrained(latest_checkpoint(cfg.out))


def test_fsdp_without_torchrun_is_refused_before_any_work(tmp_path, reference, monkeypatch, capsys):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    cfg = fsdp_cfg(tmp_path, reference)
    with pytest.raises(ValueError, match=r"torchrun --nproc_per_node=N -m sinkdlm train --fsdp"):
        train(cfg)
    from sinkdlm.cli import main

    with pytest.raises(SystemExit) as exc:  # the command line: one error line, exit code 2
        main(["train", "--fsdp", "--data", reference.data, "--out", cfg.out, "--max-steps", "1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: --fsdp ") and "torchrun" in err, err
    assert not Path(cfg.out).exists()


def test_compile_with_a_missing_backend_is_refused_before_any_work(tmp_path, reference, monkeypatch):
    cfg = TrainConfig.resolve(**{**reference.to_dict(), "out": str(tmp_path / "c"), "compile": True,
                                 "compile_backend": "no-such-backend"})
    with pytest.raises(ValueError, match="not a torch.compile backend; choose one of"):
        train(cfg)
    # No compiler anywhere: $CXX names none and PATH holds nothing (inductor would fail mid-run).
    monkeypatch.setenv("CXX", "no-such-c++")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    cfg = TrainConfig.resolve(**{**cfg.to_dict(), "compile_backend": "inductor"})
    with pytest.raises(ValueError, match="needs a C\\+\\+ compiler.*--compile-backend aot_eager"):
        train(cfg)
    assert not Path(cfg.out).exists()


@pytest.mark.slow  # two torchrun processes and a plain run: ~30 s on 2 cores
def test_two_fsdp_processes_train_a_block_model_as_one_process_does(tmp_path, corpus):
    """A block model (docs/method.md §13) under FSDP2 on two processes: the BD3-LM loss of every step and the
    validation are the one-process run's (the global batch and its per-block noise are the same)."""
    one = cfg_for(tmp_path / "one", corpus, block_size=4, **STEPS)
    train(one)
    cfg = TrainConfig.resolve(**{**one.to_dict(), "out": str(tmp_path / "two" / "run"), "fsdp": True})
    res = run_script(tmp_path, 2, STOP_SCRIPT, json.dumps(cfg.to_dict()), "99")
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same_losses(one, cfg.out)
    assert DiffusionLM.from_pretrained(latest_checkpoint(cfg.out)).config.block_size == 4
