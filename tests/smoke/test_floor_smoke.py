"""Smoke suite of the declared version floors (`make test-floors`): one test per thing a user does
first, each against an independent reference, self-contained (no helper of the main suite), so it
runs in an environment that has only sinkdlm's dependencies at exactly their `>=` floors plus pytest.

  * the example GGUF (SmolLM2-135M, `make example-model`): loads, its tokenizer gives transformers'
    GGUF tokenizer's ids, and greedy generation runs;
  * a saved tiny Qwen2 and LLaMA directory: logits equal transformers' own forward pass, and greedy
    decoding equals transformers' argmax loop;
  * two training steps: finite losses, a checkpoint that loads and resumes;

Marked `floors`, so the default suite (which covers all of this more thoroughly) leaves it out;
`python -m pytest -m floors tests/smoke` runs it in any environment. `make test-floors` runs every
test of tests/smoke, so also test_help_every_command.py (`--help` of every command), which the default suite runs too.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import assert_logits_and_greedy_equal_hf, example_gguf_or_skip

pytestmark = pytest.mark.floors

TEXTS = [f"the quick brown fox {i} jumps over the lazy dog; to be or not to be, line {i * 7}." for i in range(80)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from sinkdlm.data.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer(TEXTS, 300)


def _tiny_hf(arch: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False)
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    with torch.no_grad():  # weights far from the near-zero default init, Qwen2's q/k/v biases included
        for p in model.parameters():
            p.copy_(0.15 * torch.randn(p.shape))
    return model.eval()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_saved_hf_directory_gives_transformers_logits_and_greedy_tokens(tmp_path, tokenizer, arch):
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer

    hf = _tiny_hf(arch)
    hf.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    model, tok = load_model_and_tokenizer(tmp_path, device="cpu")
    assert_logits_and_greedy_equal_hf(model, hf)
    assert tok("the lazy fox").input_ids == tokenizer("the lazy fox").input_ids


@pytest.mark.real_model
def test_example_gguf_loads_tokenizes_like_transformers_and_generates():
    from transformers import AutoTokenizer

    from sinkdlm.diffusion.sampling import generate
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer

    path = example_gguf_or_skip()
    model, tok = load_model_and_tokenizer(path, device="cpu")
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # The text's ids only: whether a BOS is prepended changed between transformers releases (4.46 adds one
    # for this file, 5.x does not); sinkdlm's tokenizer is built from the metadata and is the same on each.
    for line in ["To be, or not to be, that is the question:", "Ünïcödé ✓ 12345\n\tx", "it's  2024\r\n end"]:
        plain = dict(add_special_tokens=False)
        assert tok(line, **plain).input_ids == ref(line, **plain).input_ids, line
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()
    out = generate(model, ids[0].tolist(), gen_length=4, steps=4)
    # causal model, one token per step: greedy decoding is the argmax of the last position each time
    assert out[0, ids.shape[1]].item() == logits[0, -1].argmax().item()


def test_two_training_steps_save_a_checkpoint_that_loads_and_resumes(tmp_path):
    from sinkdlm.config import TrainConfig
    from sinkdlm.checkpoint.manager import load_checkpoint
    from sinkdlm.training import train

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": " ".join(TEXTS[i:i + 8])}) for i in range(0, 80, 2)))
    small = dict(vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=64)
    common = dict(out=str(tmp_path / "run"), data=str(corpus), cache_dir=str(tmp_path / "cache"), model_overrides=small,
                  batch_size=4, seq_len=32, log_every=1, eval_every=2, save_every=1, eval_batches=1, num_sink_tokens=1,
                  seed=3, tensorboard=False)
    train(TrainConfig.resolve(**common, max_steps=1))
    train(TrainConfig.resolve(**common, max_steps=2, resume=True))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if line]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    model = load_checkpoint(tmp_path / "run" / "checkpoints" / "step-2")
    assert model.config.num_sink_tokens == 1


def test_submitit_local_jobs_get_their_ranks_and_a_job_record(tmp_path):
    """`experiment --launcher local` rests on submitit's LocalExecutor, its JobEnvironment and
    TorchDistributedEnvironment: a job of 2 tasks sees ranks 0 and 1 of world size 2 (what the launcher exports
    for FSDP2), and the launcher's job callable (a Checkpointable) round-trips through submitit's pickling."""
    import submitit

    from sinkdlm.config import ExperimentConfig
    from sinkdlm.experiment import run_experiment
    from sinkdlm.experiment.launch import ExperimentJob, Job

    def ranks() -> tuple[int, int]:
        env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        return env.rank, env.world_size

    executor = submitit.LocalExecutor(folder=tmp_path / "%j")
    executor.update_parameters(timeout_min=2, tasks_per_node=2)
    job = executor.submit(ranks)
    assert sorted(job.results()) == [(0, 2), (1, 2)]
    assert isinstance(ExperimentJob(ExperimentConfig(preset="smoke"), Job("report", "report"), 1, run_experiment),
                      submitit.helpers.Checkpointable)
