"""The trainer: exact resume (bitwise, fp32), kill-during-save, DDP on gloo, SFT, bad input."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sinkdlm import DiffusionLM
from sinkdlm.training import TrainConfig, train
from sinkdlm.training.checkpointing import latest_checkpoint, list_checkpoints
from sinkdlm.training.trainer import lr_at

from helpers import SMALL, cfg_for, interrupted_and_resumed, read_metrics, torchrun, write_corpus
from numerics import fp_tolerance

REPO = Path(__file__).resolve().parents[2]
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl")


def test_run_writes_config_metrics_and_loadable_checkpoints(tmp_path, corpus):
    cfg = cfg_for(tmp_path, corpus, keep_last=2)
    summary = train(cfg)
    out = Path(cfg.out)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, 13))
    for r in rows:
        assert {"step", "loss", "lr", "tokens_per_s"} <= set(r) and math.isfinite(r["loss"])
    assert [r["step"] for r in rows if "val_loss" in r] == [4, 8, 12]
    assert json.loads((out / "train_config.json").read_text())["model"]["num_sink_tokens"] == 1
    assert [s for s, _ in list_checkpoints(out)] == [8, 12]  # keep_last=2
    model = DiffusionLM.from_pretrained(summary["checkpoint"])
    assert model.config.num_sink_tokens == 1 and (Path(summary["checkpoint"]) / "tokenizer.json").is_file()
    assert not list((out / "checkpoints").glob(".tmp-*"))


def test_lr_schedule_warmup_cosine_min():
    cfg = TrainConfig.resolve(max_steps=1000, lr=1e-3, min_lr=1e-4)
    assert lr_at(0, cfg) == pytest.approx(1e-4)  # linear warm-up over the first 1 % = 10 steps
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    mid = 10 + (1000 - 10) // 2
    assert lr_at(mid, cfg) == pytest.approx(0.5 * (1e-3 + 1e-4), rel=1e-2)
    assert lr_at(1000, cfg) == pytest.approx(1e-4)
    assert TrainConfig.resolve().peak_lr == 2e-4 and TrainConfig.resolve(init_from="x").peak_lr == 1e-4


def test_exact_resume_is_bitwise(tmp_path, corpus):
    full, resumed = interrupted_and_resumed(tmp_path, corpus)
    want, got = read_metrics(full.out), read_metrics(resumed.out)
    assert [r["step"] for r in got] == list(range(1, 13))
    for a, b in zip(want, got):
        assert a["loss"] == b["loss"], f"step {a['step']}: {a['loss']!r} != {b['loss']!r}"
        assert a.get("val_loss") == b.get("val_loss")
    wa = DiffusionLM.from_pretrained(latest_checkpoint(full.out)).state_dict()
    wb = DiffusionLM.from_pretrained(latest_checkpoint(resumed.out)).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bitwise resume: the same kernels on the same inputs


KILL_SCRIPT = r"""
import sys, time, pathlib
import sinkdlm.training.checkpointing as ck
from sinkdlm.training import TrainConfig, train
orig = ck.save_state_dict
def slow(tensors, path, metadata=None):
    if ".tmp-step-8" in str(path):
        orig(tensors, path, metadata)  # half-written directory exists now
        pathlib.Path(sys.argv[2]).write_text("saving")
        time.sleep(120)
    return orig(tensors, path, metadata)
ck.save_state_dict = slow
import json
train(TrainConfig.resolve(**json.loads(sys.argv[1])))
"""


def test_sigkill_during_save_leaves_previous_checkpoint_and_resume_works(tmp_path, corpus):
    cfg = cfg_for(tmp_path / "k", corpus)
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, json.dumps(cfg.to_dict()), str(marker)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ckpt = latest_checkpoint(cfg.out)
    assert ckpt.name == "step-4"
    DiffusionLM.from_pretrained(ckpt)  # loadable
    train(cfg_for(tmp_path / "k", corpus, resume=True))
    ref = cfg_for(tmp_path / "ref", corpus)
    train(ref)
    assert [r["loss"] for r in read_metrics(cfg.out)] == [r["loss"] for r in read_metrics(ref.out)]


def test_grad_accumulation_matches_one_big_batch(tmp_path, corpus):
    a = cfg_for(tmp_path / "a", corpus, max_steps=3, grad_accum=1)
    b = cfg_for(tmp_path / "b", corpus, max_steps=3, grad_accum=2)
    train(a)
    train(b)
    for ra, rb in zip(read_metrics(a.out), read_metrics(b.out)):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-5, abs=1e-6)


def test_two_process_gloo_matches_one_process(tmp_path, corpus):
    single = cfg_for(tmp_path / "one", corpus, max_steps=4, eval_every=4, save_every=4)
    train(single)
    args = [
        "--data", str(corpus), "--out", str(tmp_path / "two"), "--cache-dir", single.cache_dir,
        "--max-steps", "4", "--batch-size", "4", "--seq-len", "32", "--log-every", "1", "--eval-every", "4",
        "--save-every", "4", "--seed", "3", "--num-sink-tokens", "1",
        "--config", str(tmp_path / "small.json"), "--device", "cpu",
    ]
    (tmp_path / "small.json").write_text(json.dumps({"model_overrides": SMALL, "eval_batches": 1, "tensorboard": False}))
    # `python -m sinkdlm train` under the DDP-wrapper probe (one launch for both: the probe is
    # test_ddp_wrapper_is_freed_before_the_process_group's, which runs with the slow ones)
    (tmp_path / "probe_cli.py").write_text(DESTROY_PROBE_CLI)
    res = torchrun(2, str(tmp_path / "probe_cli.py"), "train", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("DDP wrappers alive at destroy_process_group: 0") == 2, res.stdout[-2000:]
    one, two = read_metrics(single.out), read_metrics(tmp_path / "two")
    assert len(one) == len(two) == 4
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-5)
    assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
    # only rank 0 wrote: one metrics file, one set of checkpoints, no stray rank files
    assert [s for s, _ in list_checkpoints(tmp_path / "two")] == [4]
    wa = DiffusionLM.from_pretrained(latest_checkpoint(single.out)).state_dict()
    wb = DiffusionLM.from_pretrained(latest_checkpoint(tmp_path / "two")).state_dict()
    # the all-reduce sums the two halves' gradients in another order: rule 2 over 4 x 32 tokens, chained
    # through forward and backward (2 (L + 1)) at each of the 4 steps
    tol = fp_tolerance(torch.float32, n=4 * 32, depth=4 * 2 * (SMALL["num_hidden_layers"] + 1))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=tol["rtol"], atol=tol["rtol"] * float(wa[k].abs().max()))


# Counts the DDP wrappers still alive when the process group is destroyed (the hang's cause: see below).
_PROBE = """
import gc
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

real = dist.destroy_process_group
def probed(*args, **kwargs):
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    print(f"DDP wrappers alive at destroy_process_group: {alive}", flush=True)
    return real(*args, **kwargs)
dist.destroy_process_group = probed
"""
# The probe around `train` on a config file, and around `python -m sinkdlm ARGS` (the CLI's own entry point, as
# `torchrun -m sinkdlm` runs it).
DESTROY_PROBE = _PROBE + """
import json, sys
from sinkdlm.training import TrainConfig, train
train(TrainConfig.resolve(**json.loads(open(sys.argv[1]).read())))
"""
DESTROY_PROBE_CLI = _PROBE + """
import runpy
runpy.run_module("sinkdlm", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow  # ~10 s (a torchrun launch); the same probe runs in test_two_process_gloo_matches_one_process
def test_ddp_wrapper_is_freed_before_the_process_group(tmp_path, corpus):
    """The CPU proxy for a hang at the end of a finished two-process run (CI, 1 run in 10 here): a DDP
    Reducer freed after destroy_process_group is the gloo group's last holder, and its destructor joins
    the worker thread with the GIL held. The trainer must drop the wrapper first, on every rank."""
    cfg = cfg_for(tmp_path, corpus, max_steps=2, eval_every=2, save_every=2)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg.to_dict()))
    (tmp_path / "probe.py").write_text(DESTROY_PROBE)
    res = torchrun(2, str(tmp_path / "probe.py"), str(tmp_path / "cfg.json"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("DDP wrappers alive at destroy_process_group: 0") == 2, res.stdout[-2000:]


@pytest.mark.parametrize("data", ["arithmetic", "gsm8k"])
def test_sft_run_on_arithmetic_masks_only_responses(tmp_path, corpus, data):
    base = cfg_for(tmp_path / "pre", corpus, max_steps=2, save_every=2, eval_every=2)
    ckpt = train(base)["checkpoint"]
    if data == "gsm8k":  # the published GSM8K layout: question / answer ending in "#### N"
        from sinkdlm.data import arithmetic_dataset

        rows = [{"question": e["question"], "answer": e["response"]} for e in arithmetic_dataset("train", n=40)]
        path = tmp_path / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        data = f"gsm8k:{path}"
    sft = TrainConfig.resolve(
        out=str(tmp_path / "sft"), data=data, init_from=ckpt, sft=True, max_steps=2, batch_size=4,
        seq_len=256, save_every=2, eval_every=2, eval_batches=1, tensorboard=False,
    )
    summary = train(sft)
    assert math.isfinite(summary["last"]["val_loss"])
    assert DiffusionLM.from_pretrained(summary["checkpoint"]).config.num_sink_tokens == 1


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(data="/does/not/exist.txt"), "does not exist"),
        (dict(seq_len=4096), "seq_len|max"),
        (dict(text_field="body"), "body"),
        (dict(preset="huge"), "unknown model preset"),
        (dict(sink_position="middle"), "sink_position"),
        (dict(batch_size=6, grad_accum=4), "divisible"),
    ],
)
def test_bad_input_fails_before_training(tmp_path, corpus, change, match):
    started = []
    with pytest.raises(ValueError, match=match):
        train(cfg_for(tmp_path, corpus, **change), on_step=started.append)
    assert not started and not (tmp_path / "run" / "checkpoints").exists()


def test_empty_corpus_and_unwritable_out(tmp_path, corpus):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty|no text|no documents"):
        train(cfg_for(tmp_path, empty))
    if os.geteuid() != 0:  # root can write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(ValueError, match="not writable"):
            train(cfg_for(tmp_path, corpus, out=str(ro / "x")))
    with pytest.raises(ValueError, match="not writable"):
        train(cfg_for(tmp_path, corpus, out="/proc/sinkdlm-run"))


def test_config_file_and_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("max-steps: 7\nnum_sink_tokens: 2\nlr: 0.001\n")
    cfg = TrainConfig.resolve(f, max_steps=9)
    assert (cfg.max_steps, cfg.num_sink_tokens, cfg.lr) == (9, 2, 0.001)
    f.write_text("bogus: 1\n")
    with pytest.raises(ValueError, match="bogus"):
        TrainConfig.resolve(f)


@pytest.mark.slow
def test_200_steps_on_shakespeare_lower_validation_loss(tmp_path):
    cfg = TrainConfig.resolve(
        out=str(tmp_path / "s"), data="shakespeare", cache_dir=str(tmp_path / "cache"), max_steps=200,
        batch_size=16, seq_len=128, eval_every=100, save_every=200, log_every=1, max_tokens=400_000,
        tensorboard=False, lr=1e-3,
    )
    train(cfg)
    vals = [r["val_loss"] for r in read_metrics(cfg.out) if "val_loss" in r]
    first = read_metrics(cfg.out)[0]["loss"]  # step 1: about ln(vocab) = 7.6
    assert first > 7.0 and vals[-1] < first - 1.0 and vals[-1] <= vals[0], (first, vals)


def test_annealed_mask_goes_from_causal_to_full():
    from sinkdlm.model.attention import annealed_mask, causal_mask

    assert torch.equal(annealed_mask(6, 0.0), causal_mask(6))
    assert annealed_mask(6, 1.0).all()
    half = annealed_mask(6, 0.5)[0, 0]
    for i in range(6):  # query i sees keys j <= i + round(0.5 * 5) = i + 2 (DiffuLLaMA-style window)
        assert half[i].tolist() == [j <= i + 2 for j in range(6)]
    with pytest.raises(ValueError, match="progress"):
        annealed_mask(6, 1.5)


def test_shift_logits_scores_position_i_with_the_logits_of_i_minus_1():
    from sinkdlm.diffusion.loss import diffusion_loss
    from sinkdlm.diffusion.noise import MaskNoise

    class Fixed(torch.nn.Module):
        config = type("C", (), {"mask_token_id": 9})()

        def forward(self, xt, attention_mask=None, logits_index=None, **_):
            # logits at position i put all mass on x0[i + 1]: right only under the AR shift
            logits = torch.full((*xt.shape, 10), -30.0)
            logits[0, torch.arange(xt.shape[1] - 1), self.x0[0, 1:]] = 30.0
            if logits_index is not None:
                logits = logits[logits_index]
            return type("O", (), {"logits": logits})()

    m = Fixed()
    m.x0 = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    t = torch.ones(1)
    shifted = diffusion_loss(m, m.x0, MaskNoise(t=t), shift_logits=True).loss
    plain = diffusion_loss(m, m.x0, MaskNoise(t=t)).loss
    assert shifted.item() < 1e-6 < plain.item()


def test_anneal_and_shift_run_from_an_init_checkpoint(tmp_path, corpus):
    ckpt = train(cfg_for(tmp_path / "base", corpus, max_steps=2, save_every=2, eval_every=2))["checkpoint"]
    cfg = cfg_for(tmp_path / "ar", corpus, init_from=ckpt, shift_logits=True, attention_anneal_steps=4, max_steps=6,
                  num_sink_tokens=None)
    summary = train(cfg)
    rows = read_metrics(cfg.out)
    assert len(rows) == 6 and all(math.isfinite(r["loss"]) for r in rows)
    assert cfg.peak_lr == 1e-4  # Appendix A.1 default for AR init
    with pytest.raises(ValueError, match="add them with `sinkdlm convert --from-hf"):
        train(cfg_for(tmp_path / "bad", corpus, init_from=ckpt, num_sink_tokens=2))
    assert summary["checkpoint"]


def test_keep_last_one_leaves_only_the_last_resumable_checkpoint(tmp_path, corpus):
    """The experiments' run directories (`real`, `real-gpu`: keep_last=1) hold one checkpoint, with its
    optimizer state, and a run resumes from it."""
    from sinkdlm.experiment import get_preset
    from sinkdlm.training.checkpointing import OPTIMIZER_NAME, load_training_state

    assert get_preset("real-gpu").train.keep_last == get_preset("real").train.keep_last == 1
    cfg = cfg_for(tmp_path, corpus, max_steps=8, save_every=2, keep_last=1)
    train(cfg)
    ckpts = list_checkpoints(cfg.out)
    assert [step for step, _ in ckpts] == [8]
    assert not [p for p in (Path(cfg.out) / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert (ckpts[0][1] / OPTIMIZER_NAME).is_file()
    state, opt = load_training_state(ckpts[0][1])
    assert state["step"] == 8 and opt["state"]  # AdamW moments kept
    longer = cfg_for(tmp_path, corpus, max_steps=10, save_every=2, keep_last=1, resume=True)
    train(longer)
    rows = read_metrics(longer.out)
    assert [r["step"] for r in rows] == list(range(1, 11))  # steps 9-10 continued from step 8, not from 0
    assert [step for step, _ in list_checkpoints(longer.out)] == [10]


def test_grad_norm_max_is_the_largest_norm_since_the_last_logged_row(tmp_path, corpus):
    every = read_metrics(train(cfg_for(tmp_path / "a", corpus, max_steps=8, log_every=1, eval_every=8,
                                       save_every=8))["out"])
    sparse = read_metrics(train(cfg_for(tmp_path / "b", corpus, max_steps=8, log_every=4, eval_every=8,
                                        save_every=8))["out"])
    norms = {r["step"]: r["grad_norm"] for r in every}
    assert [r["step"] for r in sparse] == [4, 8]
    for r in sparse:  # the same run logged every step: the max over the 4 steps of each window
        assert r["grad_norm_max"] == pytest.approx(max(norms[s] for s in range(r["step"] - 3, r["step"] + 1)), rel=1e-5)


def test_a_hung_torchrun_fails_with_the_workers_stacks(tmp_path):
    """The helper turns a hang into a failure that shows where each worker waits (faulthandler at SIGABRT)."""
    (tmp_path / "hang.py").write_text("import time\n\ndef wait_forever():\n    time.sleep(3600)\n\nwait_forever()\n")
    with pytest.raises(AssertionError, match="torchrun hung") as caught:
        torchrun(1, str(tmp_path / "hang.py"), cwd=tmp_path, timeout=8)
    # one worker: two workers' stacks share one stderr pipe and interleave mid-line (seen under load and at torch
    # 2.6: "Fatal Python error: Fatal Python error: AbortedAborted"), which made the text of either unreadable
    message = caught.value.args[0]
    assert "Aborted" in message and "in wait_forever" in message
