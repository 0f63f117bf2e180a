"""`--trainable sink|lora` (issue 52): what trains, what stays bitwise, peft's own format, merge, exact resume.

References: the frozen weights against the checkpoint the run started from (bitwise); the adapters
against `peft.PeftModel.from_pretrained` on that base (peft itself); the merged checkpoint against the
peft model's logits; the resumed runs against an uninterrupted one (bitwise, fp32).
"""

from __future__ import annotations

import dataclasses

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

import sinkdlm.cli  # noqa: F401  (registers the commands on the app)
from sinkdlm import CheckpointError, DiffusionLM
from sinkdlm.cli import app
from sinkdlm.training import TrainConfig, train
from sinkdlm.training.checkpointing import latest_checkpoint
from sinkdlm.training.merge import merge_adapter

from helpers import SMALL, cfg_for, interrupted_and_resumed, read_metrics, torchrun, write_corpus

peft = pytest.importorskip("peft")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl")


@pytest.fixture(scope="module")
def start(tmp_path_factory, corpus):
    """A 2-step full run: the checkpoint the sink/lora runs start from (a DLM with one sink)."""
    tmp = tmp_path_factory.mktemp("start")
    cfg = cfg_for(tmp, corpus, max_steps=2, save_every=2, eval_every=2)
    return Path(train(cfg)["checkpoint"])


def from_start(tmp_path, corpus, start, **kw):
    return cfg_for(tmp_path, corpus, **{"init_from": str(start), "max_steps": 4, "save_every": 2, "eval_every": 2,
                                        "lr": 1e-2, **kw})


def test_sink_only_changes_the_sinks_and_keeps_no_state_for_the_rest(tmp_path, corpus, start):
    summary = train(from_start(tmp_path, corpus, start, trainable="sink"))
    before = DiffusionLM.from_pretrained(start).state_dict()
    after = DiffusionLM.from_pretrained(summary["checkpoint"]).state_dict()
    assert not torch.equal(before["sink_embeddings"], after["sink_embeddings"])
    frozen = [k for k in before if k != "sink_embeddings"]
    assert all(torch.equal(before[k], after[k]) for k in frozen), "a frozen weight moved"
    # AdamW holds moments for the sink embeddings only: step, exp_avg, exp_avg_sq of one parameter
    opt = load_file(str(Path(summary["checkpoint"]) / "optimizer.safetensors"))
    assert sorted(opt) == ["0.exp_avg", "0.exp_avg_sq", "0.step"]
    assert opt["0.exp_avg"].shape == before["sink_embeddings"].shape


def test_lora_checkpoint_is_peft_format_and_merges_into_a_plain_checkpoint(tmp_path, corpus, start):
    summary = train(from_start(tmp_path, corpus, start, trainable="lora", lora_rank=4, lora_alpha=8.0))
    ckpt = Path(summary["checkpoint"])
    files = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "sink_parameters.safetensors", "tokenizer.json",
            "optimizer.safetensors", "trainer_state.json"} <= files and "model.safetensors" not in files
    with pytest.raises(CheckpointError, match="holds LoRA adapters, not a whole model; .*sinkdlm merge --adapter"):
        DiffusionLM.from_pretrained(ckpt)  # what generate/analyze/eval say when given the adapters
    adapter_config = json.loads((ckpt / "adapter_config.json").read_text())
    assert adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 8.0
    assert set(adapter_config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"}
    # peft opens it on the base; the trained sinks sit beside it in safetensors
    base = DiffusionLM.from_pretrained(start)
    reference = peft.PeftModel.from_pretrained(base, str(ckpt))
    trained_b = [p for n, p in reference.named_parameters() if "lora_B" in n]
    assert len(trained_b) == 2 * 7 and all(p.abs().sum() > 0 for p in trained_b)  # lora_B starts at 0
    sinks = load_file(str(ckpt / "sink_parameters.safetensors"))
    with torch.no_grad():
        reference.get_base_model().sink_embeddings.copy_(sinks["sink_embeddings"])
    ids = torch.randint(3, 40, (2, 16), generator=torch.Generator().manual_seed(0))
    reference.eval()
    with torch.no_grad():
        want = reference(ids).logits
    merged = merge_adapter(ckpt, tmp_path / "merged")
    plain = DiffusionLM.from_pretrained(tmp_path / "merged")  # opens like any checkpoint
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, want, rtol=1e-5, atol=1e-5)
    start_sd, plain_sd = DiffusionLM.from_pretrained(start).state_dict(), plain.state_dict()
    assert torch.equal(plain_sd["sink_embeddings"], sinks["sink_embeddings"])
    untouched = [k for k in start_sd if "proj" not in k and k != "sink_embeddings"]
    assert untouched and all(torch.equal(start_sd[k], plain_sd[k]) for k in untouched)
    assert set(plain_sd) == set(start_sd) and merged.config == plain.config
    # the CLI, with the base named: the same checkpoint
    res = CliRunner().invoke(app, ["merge", "--adapter", str(ckpt), "--base", str(start), "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    again = DiffusionLM.from_pretrained(tmp_path / "cli").state_dict()
    assert all(torch.equal(again[k], plain_sd[k]) for k in plain_sd)


@pytest.mark.parametrize("trainable", ["sink", "lora"])
def test_exact_resume_is_bitwise_with_frozen_weights_and_adapters(tmp_path, corpus, trainable):
    """As `test_training.test_exact_resume_is_bitwise`, with only the sinks or LoRA adapters + sinks training."""
    full, part = interrupted_and_resumed(tmp_path, corpus, trainable=trainable, lora_rank=2)
    want, got = read_metrics(full.out), read_metrics(part.out)
    assert [r["step"] for r in got] == list(range(1, 13))
    for a, b in zip(want, got):
        assert a["loss"] == b["loss"] and a.get("val_loss") == b.get("val_loss"), f"step {a['step']}"
    names = ["model.safetensors"] if trainable == "sink" else ["adapter_model.safetensors", "sink_parameters.safetensors"]
    for name in names + ["optimizer.safetensors"]:
        wa, wb = (load_file(str(latest_checkpoint(out) / name)) for out in (full.out, part.out))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name


def test_a_sink_only_checkpoint_stores_the_sinks_and_a_reference_to_its_base(tmp_path, corpus, start):
    """--trainable sink from a DLM on disk: the checkpoint holds the sink parameters, their optimizer state and the
    base's path and sha256 (hashlib over its model.safetensors, here); it opens as the base with the trained sinks
    over it (the reference: the base's tensors and the sink file, assembled by hand), `merge` writes it whole with
    merged_from.json, and a base that is gone or changed is refused in one line."""
    import hashlib
    import shutil

    from sinkdlm.training.trainable import sink_parameters

    ckpt = Path(train(from_start(tmp_path, corpus, start, trainable="sink"))["checkpoint"])
    names = sorted(p.name for p in ckpt.iterdir() if not p.name.startswith("tokenizer") and p.suffix != ".txt")
    assert "model.safetensors" not in names and {"sink_parameters.safetensors", "sink_base.json", "config.json",
                                                  "optimizer.safetensors"} <= set(names), names
    ref = json.loads((ckpt / "sink_base.json").read_text())
    assert ref == {"base": str(start.resolve()),
                   "sha256": hashlib.sha256((start / "model.safetensors").read_bytes()).hexdigest()}
    sinks = load_file(str(ckpt / "sink_parameters.safetensors"))
    want = DiffusionLM.from_pretrained(start).state_dict()
    want.update(sinks)
    got = DiffusionLM.from_pretrained(ckpt)
    assert sorted(sinks) == sorted(sink_parameters(got)) and want.keys() == got.state_dict().keys()
    assert all(torch.equal(want[k], v) for k, v in got.state_dict().items())  # the same bytes, read back
    whole = sum(f.stat().st_size for f in start.iterdir() if f.suffix == ".safetensors")
    assert (ckpt / "sink_parameters.safetensors").stat().st_size < whole / 20

    assert not (ckpt / "tokenizer.json").exists()  # the base's tokenizer, which every command then reads
    said = CliRunner().invoke(app, ["generate", "--model", str(ckpt), "--prompt", "To be", "--gen-length", "4",
                                    "--steps", "4", "--device", "cpu", "--json"])
    assert said.exit_code == 0 and len(json.loads(said.stdout)["tokens"]) <= 4, said.output
    merged = tmp_path / "merged"
    result = CliRunner().invoke(app, ["merge", "--adapter", str(ckpt), "--out", str(merged)])
    assert result.exit_code == 0, result.output
    assert "sinks over their base" in result.output
    again = DiffusionLM.from_pretrained(merged).state_dict()
    assert all(torch.equal(again[k], v) for k, v in got.state_dict().items())
    provenance = json.loads((merged / "merged_from.json").read_text())
    assert provenance["base"] == ref["base"] and provenance["base_sha256"] == ref["sha256"]
    assert provenance["adapter"] == str(ckpt.resolve()) and provenance["checkpoint"] == ckpt.name
    assert provenance["adapter_sha256"] == hashlib.sha256((ckpt / "sink_parameters.safetensors").read_bytes()).hexdigest()
    assert "sinkdlm" in provenance

    moved = tmp_path / "moved"
    shutil.copytree(ckpt, moved)
    (moved / "sink_base.json").write_text(json.dumps({**ref, "sha256": "0" * 64}))
    with pytest.raises(CheckpointError, match=r"now holds other weights"):
        DiffusionLM.from_pretrained(moved)
    (moved / "sink_base.json").write_text(json.dumps({**ref, "base": str(tmp_path / "gone")}))
    with pytest.raises(CheckpointError, match=r"over the base .*gone, which is gone; put the base back"):
        DiffusionLM.from_pretrained(moved)


def test_exact_resume_of_a_sink_only_checkpoint_is_bitwise(tmp_path, corpus, start):
    """A sink-only run stopped after its step-8 checkpoint and resumed from it (its base read again, its sinks and
    AdamW moments from the checkpoint) equals the run that never stopped, loss for loss and bit for bit."""
    full, part = interrupted_and_resumed(tmp_path, corpus, trainable="sink", init_from=str(start), lr=1e-2)
    want, got = read_metrics(full.out), read_metrics(part.out)
    assert [r["step"] for r in got] == list(range(1, 13))
    assert all(a["loss"] == b["loss"] and a.get("val_loss") == b.get("val_loss") for a, b in zip(want, got))
    for name in ("sink_parameters.safetensors", "optimizer.safetensors"):
        wa, wb = (load_file(str(latest_checkpoint(out) / name)) for out in (full.out, part.out))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name
    assert not (latest_checkpoint(part.out) / "model.safetensors").exists()


def test_merge_at_the_end_writes_what_sinkdlm_merge_writes(tmp_path, corpus, start):
    """`--merge`: the last step's adapters folded in, at OUT/merged, once; --overwrite removes it with the run."""
    cfg = from_start(tmp_path, corpus, start, trainable="lora", lora_rank=4, merge=True)
    summary = train(cfg)
    merged = Path(summary["merged"])
    assert merged == Path(cfg.out) / "merged"
    want = merge_adapter(summary["checkpoint"], tmp_path / "by-hand").state_dict()
    got = DiffusionLM.from_pretrained(merged).state_dict()  # a plain checkpoint
    # exact: the same merge (the same kernels on the same shapes) of the same step's adapters
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    stamp = (merged / "model.safetensors").stat().st_mtime_ns
    again = train(dataclasses.replace(cfg, resume=True))  # finished: nothing trains, nothing merges again
    assert again["merged"] == str(merged) and (merged / "model.safetensors").stat().st_mtime_ns == stamp
    train(dataclasses.replace(cfg, overwrite=True, max_steps=2, merge=False))
    assert not merged.exists()  # the trainer's own output, replaced with the run


@pytest.mark.parametrize("change,match", [
    (dict(trainable="sink", num_sink_tokens=0), "this model has none and the run adds none"),
    (dict(trainable="lora", lora_rank=0), "lora_rank must be a positive integer"),
    (dict(trainable="lora", lora_alpha=-1.0), "lora_alpha must be a finite number > 0"),
    (dict(trainable="lora", lora_targets="q_proj,attention"), "lora_targets must name some of"),
    (dict(trainable="lora", fsdp=True), "not supported with --fsdp"),
    (dict(trainable="some"), "trainable must be one of all, sink, lora"),
    (dict(merge=True), "merge=True folds LoRA adapters in: it needs trainable='lora'"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, corpus, change, match):
    with pytest.raises(ValueError, match=match) as e:
        train(cfg_for(tmp_path, corpus, **change))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_lora_without_peft_names_the_install_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs peft, which is not installed: pip install 'sinkdlm\[lora\]'"):
        TrainConfig.resolve(trainable="lora")


def test_adapters_over_a_base_of_other_shapes_are_refused_before_its_weights(tmp_path, corpus, start):
    summary = train(from_start(tmp_path, corpus, start, trainable="lora", max_steps=2))
    other = tmp_path / "other"
    config = json.loads((start / "config.json").read_text())
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "intermediate_size": 2 * config["intermediate_size"]}))
    (other / "model.safetensors").write_bytes(b"never read")
    with pytest.raises(ValueError, match=r"do not fit the base model.*mlp\.(gate|up|down)_proj"):
        merge_adapter(summary["checkpoint"], tmp_path / "merged", base=other)
    assert not (tmp_path / "merged").exists()
    with pytest.raises(ValueError, match="holds no adapter_config.json"):
        merge_adapter(start, tmp_path / "merged")


def ddp_args(tmp_path, corpus, out, *extra):
    (tmp_path / "small.json").write_text(json.dumps({"model_overrides": SMALL, "eval_batches": 1, "tensorboard": False}))
    return ["-m", "sinkdlm", "train", "--data", str(corpus), "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
            "--max-steps", "4", "--batch-size", "4", "--seq-len", "32", "--log-every", "1", "--eval-every", "4",
            "--save-every", "4", "--seed", "3", "--num-sink-tokens", "1", "--config", str(tmp_path / "small.json"),
            "--device", "cpu", *extra]


@pytest.mark.slow  # two torchrun launches, about 40 s
def test_ddp_trains_the_sink_alone_as_one_process_and_refuses_lora_in_one_line(tmp_path, corpus):
    """`sink` under DDP (gloo, 2 processes) matches one process; `lora` under torchrun is refused in one line."""
    single = cfg_for(tmp_path / "one", corpus, max_steps=4, eval_every=4, save_every=4, trainable="sink",
                     cache_dir=str(tmp_path / "cache"))
    train(single)
    res = torchrun(2, *ddp_args(tmp_path, corpus, tmp_path / "two", "--trainable", "sink"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for a, b in zip(read_metrics(single.out), read_metrics(tmp_path / "two")):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-5)
    wa = DiffusionLM.from_pretrained(latest_checkpoint(single.out)).state_dict()
    wb = DiffusionLM.from_pretrained(latest_checkpoint(tmp_path / "two")).state_dict()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-6)
    res = torchrun(2, *ddp_args(tmp_path, corpus, tmp_path / "lora", "--trainable", "lora"), cwd=tmp_path)
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors and all(e == "error: --trainable lora runs in one process (its checkpoints hold peft adapters, "
                                "written and resumed by one rank); launch it without torchrun" for e in errors)
    assert not (tmp_path / "lora" / "checkpoints").exists()
