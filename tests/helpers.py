"""Helpers shared by several test files (the one-thread setting lives in conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from sinkdlm import DiffusionLM, ModelConfig


def tiny_model(seed: int = 0, **kw) -> DiffusionLM:
    """A float64 random model large-init enough (0.3) to have attention sinks at small ϵ."""
    cfg = dict(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, max_position_embeddings=96, initializer_range=0.3)
    torch.manual_seed(seed)
    return DiffusionLM(ModelConfig(**{**cfg, **kw})).double().eval()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    """`torchrun --nproc_per_node=nproc ARGS` (ARGS: `-m sinkdlm train ...` or a script) on a free port."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}", *args]


def subprocess_env() -> dict[str, str]:
    """The environment for a child Python: one intra-op thread, and this very `sinkdlm` first on the
    path (a relative PYTHONPATH would not survive the child's other working directory)."""
    import os
    from pathlib import Path

    import sinkdlm

    src = str(Path(sinkdlm.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def torchrun(nproc: int, *args: str, cwd, timeout: int = 300):
    """Run `torchrun_cmd` to completion with `subprocess_env()`; the CompletedProcess.

    A run still going after `timeout` s is a hang, not a slow machine (a 4-step run takes seconds): its
    workers get SIGABRT, so Python's faulthandler prints every thread's stack, and the test fails with
    those stacks instead of a bare timeout (how the teardown hang of dist_utils.shutdown was found)."""
    import signal
    import subprocess

    proc = subprocess.Popen(torchrun_cmd(nproc, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**subprocess_env(), "PYTHONFAULTHANDLER": "1"}, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in workers:
            os.kill(int(pid), signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"torchrun hung for {timeout} s; the workers' stacks at SIGABRT:\n{err[-6000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _load_tool(name: str, folder: str = "tools"):
    """A developer tool from tools/ or benchmarks/ (not part of the package), loaded by path."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OpCounter = _load_tool("op_counter").OpCounter  # ATen ops, kernels and host syncs of a pass


def quick_start_block() -> list[str]:
    """The lines of the README's Quick-start bash block (benchmarks/bench_quickstart.py reads them)."""
    return _load_tool("bench_quickstart", "benchmarks").quick_start_block()


def example_gguf_or_skip() -> Path:
    """The example SmolLM2 GGUF (fetched once into the cache), or the test is skipped saying why."""
    import pytest

    from sinkdlm.checkpoint.example_model import ExampleModelError, example_model_path, fetch_example_model

    path = example_model_path()
    if not path.is_file():
        try:
            path = fetch_example_model()
        except ExampleModelError as e:
            pytest.skip(f"the example model could not be fetched: {e}")
    return path


def assert_logits_and_greedy_equal_hf(model, hf) -> None:
    """A causal model opened by sinkdlm computes transformers' logits and greedy continuation."""
    from sinkdlm import generate

    from numerics import assert_model_close

    x = torch.randint(3, 290, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_model_close(model(x).logits, hf(input_ids=x).logits, model.config)  # transformers' kernels
        # Token parity across two implementations: in float64, where no argmax gap is within rounding
        # (in float32 a near-tie may flip with the CPU's rounding; tests/numerics.py)
        model, hf = model.double(), hf.double()
        seq = torch.tensor([[5, 6, 7]])
        for _ in range(4):
            seq = torch.cat([seq, hf(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generate(model, [5, 6, 7], gen_length=4, steps=4), seq)


# --- training runs (tests/training, tests/model/test_cuda.py) ---
# A really small model so each run takes a second or two on 2 cores.
SMALL = dict(vocab_size=320, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)


def write_corpus(path: Path, n_docs: int = 40) -> Path:
    rng = torch.Generator().manual_seed(0)
    words = "the king queen sword crown night day love death fair foul sleep dream castle ghost".split()
    lines = []
    for d in range(n_docs):
        idx = torch.randint(0, len(words), (120,), generator=rng).tolist()
        lines.append(json.dumps({"text": " ".join(words[i] for i in idx) + f" {d}."}))
    path.write_text("\n".join(lines) + "\n")
    return path


def cfg_for(tmp_path: Path, corpus: Path, **kw):
    from sinkdlm.training import TrainConfig

    base = dict(
        out=str(tmp_path / "run"), data=str(corpus), cache_dir=str(tmp_path / "cache"), model_overrides=SMALL,
        max_steps=12, batch_size=4, seq_len=32, log_every=1, eval_every=4, save_every=4, eval_batches=1,
        num_sink_tokens=1, seed=3, tensorboard=False,
    )
    base.update(kw)
    return TrainConfig.resolve(**base)


def interrupted_and_resumed(tmp_path: Path, corpus: Path, **kw):
    """The exact-resume pair: (`a`, trained straight through; `b`, stopped at step 10 as by a crash, after its
    step-8 checkpoint and before step 12's, then resumed), both `cfg_for(..., **kw)` runs."""
    import pytest

    from sinkdlm.training import train
    from sinkdlm.training.checkpointing import latest_checkpoint

    class Interrupt(Exception):
        pass

    def stop(info):
        if info["step"] == 10:
            raise Interrupt

    full = cfg_for(tmp_path / "a", corpus, **kw)
    train(full)
    part = cfg_for(tmp_path / "b", corpus, **kw)
    with pytest.raises(Interrupt):
        train(part, on_step=stop)
    assert latest_checkpoint(part.out).name == "step-8"
    resumed = cfg_for(tmp_path / "b", corpus, resume=True, **kw)
    train(resumed)
    return full, resumed


def read_metrics(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line]


# --- a word-level tokenizer for CLI runs (tests/integration, tests/cli) ---
WORDS = [f"w{i}" for i in range(44)]


def word_tokenizer():
    """A whitespace word-level tokenizer: [UNK]=0, [PAD]=1, w0..w43, [MASK]=46 (= the model's mask id)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}, "[MASK]": 46}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")
