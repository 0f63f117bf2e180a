"""Training a block model (BD3-LM, docs/method.md §13): the run trains with block_diffusion_loss, pads to whole
blocks with EOS, draws its noise per block or per sequence, and resumes bit for bit."""

from __future__ import annotations

import pytest
import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.diffusion.block import block_diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.training import TrainConfig
from sinkdlm.training.checkpointing import latest_checkpoint
from sinkdlm.training.trainer import global_noise

from helpers import interrupted_and_resumed, read_metrics, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.jsonl")


def test_block_model_trains_and_resumes_bitwise(tmp_path, corpus):
    """30-token rows, block 4: padded to 32 with EOS; the interrupted run ends where the straight one does."""
    full, resumed = interrupted_and_resumed(tmp_path, corpus, block_size=4, seq_len=30)
    want, got = read_metrics(full.out), read_metrics(resumed.out)
    assert [r["step"] for r in got] == list(range(1, 13))
    for a, b in zip(want, got):
        assert a["loss"] == b["loss"] and a.get("val_loss") == b.get("val_loss")  # the same kernels and inputs
    wa = DiffusionLM.from_pretrained(latest_checkpoint(full.out))
    wb = DiffusionLM.from_pretrained(latest_checkpoint(resumed.out))
    assert wa.config.block_size == 4 and wa.config.num_sink_tokens == 1
    assert all(torch.equal(wa.state_dict()[k], v) for k, v in wb.state_dict().items())  # bitwise resume


def test_resume_with_the_other_block_noise_is_refused(tmp_path, corpus):
    from sinkdlm.training import train

    from helpers import cfg_for

    train(cfg_for(tmp_path, corpus, block_size=4, max_steps=1, save_every=1, eval_every=1))
    with pytest.raises(ValueError, match="block_noise='block' in the checkpoint, 'sequence' now"):
        train(cfg_for(tmp_path, corpus, block_size=4, max_steps=2, resume=True, block_noise="sequence"))


@pytest.mark.parametrize("block_noise", ["block", "sequence"])
def test_step_noise_is_per_block_or_per_sequence(block_noise):
    cfg = TrainConfig.resolve(block_size=4, seq_len=30, block_noise=block_noise, seed=1)
    t, u = global_noise(cfg, 5, 3, 30, block_size=4)
    assert u.shape == (3, 32)  # the EOS padding draws its uniforms too
    assert t.shape == ((3, 8) if block_noise == "block" else (3,))
    assert ((t > cfg.eps) & (t <= 1)).all()
    # per sequence: every block of a row masked at the same rate, as the [B, K] repeat of it
    model = DiffusionLM(ModelConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, intermediate_size=16, block_size=4))
    x0 = torch.randint(0, 30, (3, 30))
    out = block_diffusion_loss(model, x0, MaskNoise(t=t, u=u), pad_id=2)
    repeated = t if t.dim() == 2 else t[:, None].expand(3, 8)
    again = block_diffusion_loss(model, x0, MaskNoise(t=repeated.contiguous(), u=u), pad_id=2)
    assert torch.equal(out.t, repeated) and torch.equal(out.loss, again.loss)  # one computation, same inputs


def test_convert_gives_a_dlm_a_block_size_and_keeps_every_weight(tmp_path):
    """`convert --block-size 4` on a whole-sequence DLM: every tensor bit for bit, and the block model's logits are
    the input model's under a block-causal mask written here."""
    from sinkdlm.data import train_bpe_tokenizer
    from sinkdlm.model.hf import convert_hf_checkpoint

    from numerics import assert_model_close

    tok = train_bpe_tokenizer(["the cat sat on the mat", "a dog ran in the park"] * 20, 300)
    torch.manual_seed(0)
    source = DiffusionLM(ModelConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                     mask_token_id=tok.mask_token_id, num_sink_tokens=1))
    source.save_pretrained(tmp_path / "dlm", tokenizer=tok)
    convert_hf_checkpoint(tmp_path / "dlm", tmp_path / "block", block_size=4)
    block = DiffusionLM.from_pretrained(tmp_path / "block").eval()
    assert block.config.block_size == 4
    assert all(torch.equal(source.state_dict()[k], v) for k, v in block.state_dict().items())  # a round trip
    ids = torch.randint(0, 290, (2, 10), generator=torch.Generator().manual_seed(0))
    blocks = torch.arange(10) // 4
    want = source.eval()(ids, attention_mask=(blocks[:, None] >= blocks[None, :])[None, None]).logits
    assert_model_close(block(ids).logits, want, block.config, keys=11)
    with pytest.raises(ValueError, match="already has block_size=4"):
        convert_hf_checkpoint(tmp_path / "block", tmp_path / "other", block_size=8)


@pytest.fixture(scope="module")
def block_start(tmp_path_factory, corpus):
    """A 2-step block model (blocks of 4, one sink): what the sink-only, LoRA and SFT runs start from."""
    from sinkdlm.training import train

    from helpers import cfg_for

    tmp = tmp_path_factory.mktemp("block-start")
    return train(cfg_for(tmp, corpus, block_size=4, max_steps=2, save_every=2, eval_every=2))["checkpoint"]


@pytest.mark.parametrize("trainable", ["sink", "lora"])
def test_a_block_model_trains_its_sink_alone_or_adapters(tmp_path, corpus, block_start, trainable):
    """--trainable sink|lora from a block model: the run keeps the block size and trains with the block loss
    (finite, changing); sink-only moves the sinks and nothing else."""
    if trainable == "lora":
        pytest.importorskip("peft")
    from sinkdlm.training import train

    from helpers import cfg_for

    summary = train(cfg_for(tmp_path, corpus, init_from=str(block_start), trainable=trainable, max_steps=3,
                            save_every=3, eval_every=3, lr=1e-2))
    losses = [r["loss"] for r in read_metrics(summary["out"])]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    if trainable == "sink":
        before = DiffusionLM.from_pretrained(block_start).state_dict()
        after = DiffusionLM.from_pretrained(summary["checkpoint"])
        assert after.config.block_size == 4
        after = after.state_dict()
        assert not torch.equal(before["sink_embeddings"], after["sink_embeddings"])
        assert all(torch.equal(before[k], after[k]) for k in before if k != "sink_embeddings")


def test_sft_of_a_block_model(tmp_path, block_start):
    """SFT on arithmetic from a block model: the run trains with the block loss on the responses and keeps the
    block size."""
    import math

    from sinkdlm.training import train

    summary = train(TrainConfig.resolve(
        out=str(tmp_path / "sft"), data="arithmetic", init_from=str(block_start), sft=True, max_steps=2, batch_size=4,
        seq_len=128, save_every=2, eval_every=2, eval_batches=1, tensorboard=False))
    assert math.isfinite(summary["last"]["val_loss"])
    assert DiffusionLM.from_pretrained(summary["checkpoint"]).config.block_size == 4


def test_complementary_masks_train_and_a_resume_without_them_is_refused(tmp_path, corpus):
    """--complementary-masks on a block model: the step trains on both copies (a finite loss); resuming with the
    option flipped would splice two objectives, and is refused."""
    from sinkdlm.training import train

    from helpers import cfg_for

    summary = train(cfg_for(tmp_path, corpus, block_size=4, max_steps=1, save_every=1, eval_every=1,
                            complementary_masks=True))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in read_metrics(summary["out"]))
    with pytest.raises(ValueError, match="complementary_masks=True in the checkpoint, False now"):
        train(cfg_for(tmp_path, corpus, block_size=4, max_steps=2, resume=True))


@pytest.mark.parametrize("source", ["preset", "init-from"])
def test_complementary_masks_on_a_whole_sequence_model_are_one_line_before_any_weight(tmp_path, corpus, source,
                                                                                      monkeypatch):
    """Fast-dLLM v2's rule is a block model's (its code trains no other): `train --complementary-masks` on a
    whole-sequence model is refused in one line, from the flags (a preset) or from the --init-from model's header
    (its weights file is not even a safetensors file), before any weight, tokenizer or data is read."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    import sinkdlm.training.trainer as trainer
    from sinkdlm.cli import main

    from helpers import tiny_model

    def never(*args, **kwargs):
        raise AssertionError("read before the refusal")

    for name in ("build_model", "prepare_tokenizer", "load_batches"):
        monkeypatch.setattr(trainer, name, never)
    argv = ["train", "--complementary-masks", "--out", str(tmp_path / "run"), "--data", str(corpus),
            "--cache-dir", str(tmp_path / "cache"), "--device", "cpu"]
    if source == "init-from":
        model = tmp_path / "whole"
        tiny_model().save_pretrained(model)
        (model / "model.safetensors").write_bytes(b"never read")
        argv += ["--init-from", str(model)]
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(argv)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert exit_.value.code and len(lines) == 1, lines
    assert "Fast-dLLM v2's recipe for a block model" in lines[0] and "whole-sequence" in lines[0], lines
    assert not (tmp_path / "run" / "checkpoints").exists()
