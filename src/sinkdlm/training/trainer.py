"""The training loop: pre-training on a packed corpus, or SFT on prompt/response pairs.

One function, `train(cfg)`, used by `sinkdlm train`, `sinkdlm sft`, torchrun and the experiment.
Exact resume is by construction: the batch of step s comes from `(seed, s)` only
(`data.batch_for_step`), the diffusion noise of step s from a generator seeded with `(seed, s)`
and drawn for the *global* batch (so 1 process and N data-parallel ranks see the same noise per
sequence), and the optimiser moments are restored bit for bit from safetensors. The learning rate
is a pure function of the step.

Its shape: `open_run` opens everything once (resume point, tokenizer, model, data, optimizer) into a
`TrainRun`, and `_train` is the loop alone over `_optimizer_step`, `_Progress` (bar, rows, metrics.jsonl)
and `_save`.
"""

from __future__ import annotations

import json
import math
import os
import functools
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from sinkdlm.config import ModelConfig
from sinkdlm.data import (
    PackedTokens,
    arithmetic_dataset,
    load_gsm8k_jsonl,
    batch_for_step,
    corpus_fingerprint,
    iter_documents,
    load_sft_jsonl,
    load_tokenizer,
    pack_corpus,
    tokenize_sft,
    train_bpe_tokenizer,
)
from sinkdlm.data.packing import default_cache_dir
from sinkdlm.diffusion.block import block_diffusion_loss, padded_length
from sinkdlm.diffusion.loss import diffusion_loss, to_device
from sinkdlm.diffusion.noise import MaskNoise, sample_t
from sinkdlm.model import DiffusionLM
from sinkdlm.model.attention import annealed_mask
from sinkdlm.io.atomic import atomic_write_bytes, atomic_write_json
from sinkdlm.io.files import ensure_writable_dir
from sinkdlm.checkpoint.manager import ModelSource, load_checkpoint, load_tokenizer_for, open_source
from sinkdlm.training.cpu import flush_denormals
from sinkdlm.training import distributed as dist_utils
from sinkdlm.training.checkpointing import STATE_NAME, latest_checkpoint, load_training_state, save_training_checkpoint
from sinkdlm.config.train import TrainConfig
from sinkdlm.training.rundir import (CONFIG_NAME, MERGED_DIR, MERGED_MARK, METRICS_NAME, RunDir, StopRequest,
                                     check_resume_matches, paused_at)
from sinkdlm.training.sharded import is_sharded, load_sharded_checkpoint, save_sharded_checkpoint
from sinkdlm.training.trainable import (apply_trainable, check_adapter_fits, check_trainable, is_adapter_checkpoint,
                                        save_adapter, save_sinks, sink_base)
from sinkdlm.model.loader import resolve_device
from sinkdlm.training.model_init import build_model, open_init_source, with_run_settings


# ----------------------------------------------------------------------------- pieces
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over the first `warmup_frac` of steps, then cosine to `final_lr` (A.1)."""
    warmup = max(1, math.ceil(cfg.warmup_frac * cfg.max_steps)) if cfg.warmup_frac > 0 else 0
    if step < warmup:
        return cfg.peak_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, cfg.max_steps - warmup))
    return cfg.final_lr + 0.5 * (cfg.peak_lr - cfg.final_lr) * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (A.1): weight decay on matrices (incl. embeddings and sinks), none on norms/biases."""
    decay, no_decay = [], []
    seen = set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2), foreach=True)


def step_generator(seed: int, step: int, device: torch.device) -> torch.Generator:
    # A distinct, reproducible stream per (seed, step); large odd multiplier avoids collisions.
    return torch.Generator(device="cpu").manual_seed(seed * 1_000_003 + step * 7919 + 17)


def prepare_tokenizer(cfg: TrainConfig, vocab_size: int | None, init: ModelSource | None = None):
    """The run's tokenizer: --tokenizer, the init checkpoint's, or a BPE trained (and cached) on the corpus.

    `init`: the `--init-from` model already opened (`open_source`), so it is not parsed again."""
    if cfg.tokenizer is not None:
        return load_tokenizer(cfg.tokenizer)
    if cfg.init_from is not None:
        init = open_init_source(cfg, init)
        if init.is_autoregressive:  # converted on load: its tokenizer gains [MASK] (docs/method.md §5)
            from sinkdlm.model.hf import tokenizer_with_mask

            tok, _ = tokenizer_with_mask(init)
            if tok is None:
                raise ValueError(f"--init-from {cfg.init_from} has no tokenizer files; pass --tokenizer DIR")
            return tok
        return load_tokenizer_for(init)
    assert vocab_size is not None
    import hashlib

    key = hashlib.sha256(f"{corpus_fingerprint(cfg.data, cfg.text_field)}|{vocab_size}|{cfg.max_tokens}".encode()).hexdigest()[:20]
    cache = Path(cfg.cache_dir or default_cache_dir()).expanduser() / "tokenizers" / key
    if (cache / "tokenizer.json").is_file():
        return load_tokenizer(cache)
    texts = iter_documents(cfg.data, "train", cfg.text_field)
    if cfg.max_tokens is not None:  # a quick run trains its tokenizer on about as much text as it packs
        texts = _take_chars(texts, cfg.max_tokens * 6)
    print(f"[sinkdlm] training a {vocab_size}-token BPE tokenizer on {cfg.data} (first run only; "
          f"cached in {cache})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    tok = train_bpe_tokenizer(texts, vocab_size)
    print(f"[sinkdlm] tokenizer trained in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(tmp))
    if not cache.exists():  # another process may have won the race; both trained the same BPE
        os.replace(tmp, cache)
    return load_tokenizer(cache)


def _take_chars(texts, limit: int):
    total = 0
    for t in texts:
        if total >= limit:
            return
        yield t[: limit - total]
        total += len(t)


@dataclass
class Batches:
    """Training rows (and prompt masks for SFT) with the step -> global batch rule."""

    rows: Any  # PackedTokens or a [N, L] tensor
    prompt_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, indices) -> tuple[torch.Tensor, torch.Tensor | None]:
        if isinstance(self.rows, PackedTokens):
            x0 = self.rows.get_batch(indices)
        else:
            x0 = self.rows[torch.as_tensor(indices, dtype=torch.long)]
        pm = None if self.prompt_mask is None else self.prompt_mask[torch.as_tensor(indices, dtype=torch.long)]
        return x0, pm


def load_batches(cfg: TrainConfig, tokenizer, max_len: int, split: str) -> Batches:
    if cfg.sft:
        # Validation is a held-out slice of the *training* split: the test split stays for evaluation.
        if cfg.data == "arithmetic":
            examples = arithmetic_dataset("train", n=2200, seed=cfg.seed)
        elif cfg.data.startswith("gsm8k:"):  # the published GSM8K JSONL (question / answer)
            examples = load_gsm8k_jsonl(cfg.data[len("gsm8k:"):])
        else:
            examples = load_sft_jsonl(cfg.data)
        cut = max(1, len(examples) // 11)
        examples = examples[cut:] if split == "train" else examples[:cut]
        if cfg.seq_len > max_len:
            raise ValueError(f"--seq-len {cfg.seq_len} exceeds the model's maximum of {max_len} content tokens")
        enc = tokenize_sft(examples, tokenizer, cfg.seq_len)
        return Batches(enc["input_ids"], enc["prompt_mask"])
    path = pack_corpus(
        cfg.data, tokenizer, cfg.seq_len, split, text_field=cfg.text_field, cache_dir=cfg.cache_dir,
        max_seq_len=max_len, max_tokens=_split_tokens(cfg, split),
    )
    return Batches(PackedTokens(path))


def _split_tokens(cfg: TrainConfig, split: str) -> int | None:
    """Token cap of a split: `max_tokens` for training, a tenth of it (>= 4 rows) for validation."""
    if cfg.max_tokens is None or split == "train":
        return cfg.max_tokens
    return max(cfg.max_tokens // 10, 4 * cfg.seq_len)


def global_noise(cfg: TrainConfig, step: int, batch: int, seq_len: int, low_discrepancy: bool = False,
                 block_size: int | None = None):
    """`t [B]` and uniforms `u [B, L]` for the whole global batch of `step`. A block model (`block_size`):
    `t [B, K]` per block (`--block-noise block`) and `u` over the sequence padded to whole blocks."""
    gen = step_generator(cfg.seed, step, torch.device("cpu"))
    if block_size is None:
        t = sample_t(batch, cfg.eps, low_discrepancy=low_discrepancy, generator=gen)
        return t, torch.rand(batch, seq_len, generator=gen)
    length = padded_length(seq_len, block_size)
    per = length // block_size if cfg.block_noise == "block" else 1
    t = sample_t(batch * per, cfg.eps, low_discrepancy=low_discrepancy, generator=gen).view(batch, per)
    return (t if per > 1 else t[:, 0]), torch.rand(batch, length, generator=gen)


def training_loss(config: ModelConfig, pad_id: int | None) -> Callable:
    """The loss a run trains and validates with: eq. 3-4 (`diffusion_loss`), or BD3-LM's for a block model
    (`block_diffusion_loss`, its sequences padded to whole blocks with `pad_id`, the tokenizer's EOS). The training
    step's `MaskNoise.complementary` (`--complementary-masks`; validation keeps the plain draw) asks the block loss
    for each sequence also with the complement of its masks (a block model's only, checked before any weight)."""
    if config.block_size is None:
        return diffusion_loss
    return functools.partial(block_diffusion_loss, pad_id=pad_id)


@torch.no_grad()
def evaluate(model: DiffusionLM, val: Batches, cfg: TrainConfig, device: torch.device, env=None,
             pad_id: int | None = None) -> float:
    """Validation ELBO bound per token (eq. 4 averaged over fixed batches, low-discrepancy t).

    Collective under data parallelism: every rank scores its share of the rows of every batch (an
    FSDP model cannot run on one rank alone), weighted by its row count and summed over ranks, so
    the result is the single-process value up to float summation order. One host sync at the end.
    """
    env = env or dist_utils.DistEnv()
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device)
    bs = min(cfg.batch_size, len(val))
    assert bs >= env.world_size, "checked before training: every rank needs a validation row"
    batches = min(cfg.eval_batches, max(1, len(val) // bs))
    loss_fn = training_loss(model.config, pad_id)  # pad_id: a block model's EOS padding
    for i in range(batches):
        t, u = global_noise(cfg, -1 - i, bs, cfg.seq_len, low_discrepancy=True, block_size=model.config.block_size)
        rows = torch.arange(bs).tensor_split(env.world_size)[env.rank]  # this rank's rows of batch i
        x0, pm = val.get((i * bs + rows).tolist())
        with bf16_autocast(cfg.bf16, device):
            out = loss_fn(
                model, to_device(x0, device), MaskNoise(t=to_device(t[rows], device), u=to_device(u[rows], device)),
                shift_logits=model.config.shift_logits, prompt_mask=None if pm is None else to_device(pm, device),
            )
        # the loss is a mean over rows: a rank's share weighs len(rows) / bs (exactly 1 alone)
        total += out.loss.float() if env.world_size == 1 else out.loss.float() * (len(rows) / bs)
    model.train(was_training)
    return float(dist_utils.sum_across_ranks(total, env)) / batches


def bf16_autocast(enabled: bool, device: torch.device):
    """bf16 autocast on `device` when enabled (`TrainConfig.bf16`, `Validation.bf16`), else a no-op context."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else nullcontext()


class MetricsLog:
    """`metrics.jsonl` (+ TensorBoard if installed). On resume, rows past the resumed step are dropped."""

    def __init__(self, out: Path, resume_step: int, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.path = out / METRICS_NAME
        self.writer = None
        if not enabled:
            return
        if resume_step > 0 and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= resume_step]
            atomic_write_bytes(self.path, ("\n".join(kept) + "\n" if kept else "").encode())
        elif resume_step == 0:
            self.path.write_text("")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(out / "tensorboard"))
            except ImportError:  # tensorboard is optional: say so instead of pretending it logs
                self.writer = None
                print("[sinkdlm] TensorBoard is not installed: metrics go to metrics.jsonl only "
                      "(pip install tensorboard to get out/tensorboard/)", file=sys.stderr, flush=True)

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.writer.add_scalar(k, v, row["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


# ----------------------------------------------------------------------------- train
def train(cfg: TrainConfig, on_step: Callable[[dict], None] | None = None, *,
          resume_command: str | None = None, stop_at: int | None = None,
          probe: tuple[int, Callable[[DiffusionLM, int], None]] | None = None) -> dict[str, Any]:
    """Run (or resume) training as described by `cfg`; returns a summary of the run.

    `cfg.out` is locked for the run and never overwritten silently (`rundir`). On SIGINT/SIGTERM
    the step finishes, a checkpoint is saved and `rundir.TrainingStopped` is raised; its message
    says how to resume (`resume_command`, the CLI's own command line, when given).

    `stop_at`: return after that step, its checkpoint saved, the schedule still `cfg.max_steps`'s; a later
    call resumes there (the experiment scores a run's fixed validation at declared steps this way).

    `probe` (every, fn): `fn(model, step)` after every `every`-th optimizer step (the experiment's escape probe,
    experiment/endpoints/escape/probe.py); its time is left out of the logged tokens/s. It must not touch the training RNG.
    """
    cfg.validate()
    if stop_at is not None and not 0 < stop_at <= cfg.max_steps:
        raise ValueError(f"stop_at must lie in [1, max_steps={cfg.max_steps}], got {stop_at}")
    flush_denormals()  # before the first parallel op: the CPU's attention backward slows 2x on denormals (training/cpu.py)
    env = dist_utils.init(cfg.fsdp)  # --fsdp without torchrun: a ValueError saying how to launch
    device = resolve_device(cfg.device) if not env.distributed else env.device
    if cfg.compile:
        dist_utils.check_compile(cfg.compile_backend, device)
    with RunDir.open(cfg, env) as run, StopRequest(env) as stop:
        summary = _train(cfg, env, device, run, stop, _Asks(stop_at or cfg.max_steps, on_step, probe, resume_command))
    if stop_at is not None and stop_at < cfg.max_steps and summary["checkpoint"]:
        paused_at(summary["checkpoint"])  # the next train() goes on from here: a continuation, not a resume
    if cfg.merge and summary["checkpoint"] and Path(summary["checkpoint"]).name == f"step-{cfg.max_steps}":
        summary["merged"] = str(merged_checkpoint(cfg, summary["checkpoint"]))
    return summary


def merged_checkpoint(cfg: TrainConfig, checkpoint: str | Path) -> Path:
    """OUT/merged for `cfg.merge`: the last checkpoint's LoRA adapters folded in (`training.merge`), written once;
    a resumed run that already merged its last step finds it there."""
    from sinkdlm.training.merge import merge_adapter

    target, done = Path(cfg.out) / MERGED_DIR, Path(cfg.out) / MERGED_MARK
    if done.is_file() and json.loads(done.read_text()).get("checkpoint") == Path(checkpoint).name:
        return target
    shutil.rmtree(target, ignore_errors=True)  # a merge cut short, or one of an earlier last step
    print(f"[sinkdlm] merging the adapters of {checkpoint} into {target} (--merge)", file=sys.stderr, flush=True)
    merge_adapter(checkpoint, target)  # its merged_from.json (`done`, with the checkpoint's name) written last
    return target


# ----------------------------------------------------------------------------- opening a run
@dataclass
class TrainRun:
    """What a run opens once, before its first step (`open_run`); the loop (`_train`) only reads it.

    `model` is the bare DiffusionLM (the optimizer's parameters, the checkpoints, the probe); `wrapped` is
    what the step runs: the DDP/FSDP wrapper, or the model itself in one process."""

    tokenizer: Any
    model: DiffusionLM
    wrapped: torch.nn.Module | None  # set to None before the process group goes (dist_utils.shutdown)
    optimizer: torch.optim.AdamW
    train_set: Batches
    val_set: Batches
    start: int  # the resumed step (0: a new run): the first step the loop runs
    per_rank: int  # this rank's rows of a global batch
    micro: int  # rows of one of its `grad_accum` micro-batches
    peft_model: Any | None = None  # --trainable lora: its checkpoints hold the adapters alone


def open_run(cfg: TrainConfig, env, device: torch.device, run: RunDir) -> TrainRun:
    """Open what the loop needs, once: the resume point, the tokenizer and model, both data splits, what
    trains, its placement and wrapping, and the optimizer (restored on resume). Everything that can fail on
    bad input fails here, before the first step and before `--overwrite` removes anything."""
    if env.is_main:
        ensure_writable_dir(Path(cfg.cache_dir or default_cache_dir()).expanduser(), flag="--cache-dir")
    if cfg.trainable == "lora" and env.world_size > 1:
        raise ValueError("--trainable lora runs in one process (its checkpoints hold peft adapters, written and "
                         "resumed by one rank); launch it without torchrun")
    resumed = run.resume_point(lambda path: _load_resume_point(path, cfg))
    ckpt = None if resumed is None else resumed[0]
    if ckpt is not None and cfg.fsdp and not is_sharded(ckpt):
        raise ValueError(
            f"--fsdp --resume: {ckpt} was written without --fsdp (its optimizer state is not sharded); "
            "resume it without --fsdp, or start a new --out"
        )
    state = opt_state = None
    if ckpt is not None:  # a resumed run keeps the tokenizer it started with
        tokenizer, model, (state, opt_state) = resumed[1]
        check_resume_matches(cfg, state.get("config"), model.config)
    else:
        tokenizer, model = _new_model(cfg, env)
    cfg.check_block_size(model.config.block_size)  # a block size the checkpoint brings
    cfg.check_complementary_masks(model.config.block_size)
    max_len = model.config.max_content_length
    train_set, val_set = _main_first(env, lambda: (load_batches(cfg, tokenizer, max_len, "train"),
                                                   load_batches(cfg, tokenizer, max_len, "validation")))
    _check_batches(cfg, env, train_set, val_set)
    per_rank = cfg.batch_size // env.world_size
    peft_model, wrapped, optimizer, start = _ready_to_train(cfg, env, device, model, ckpt, state, opt_state)
    return TrainRun(tokenizer, model, wrapped, optimizer, train_set, val_set, start, per_rank,
                    per_rank // cfg.grad_accum, peft_model)


def _main_first(env, load: Callable[[], Any]) -> Any:
    """`load()` on rank 0 first, then on the others: rank 0 trains and caches (the BPE, the packed corpus),
    the others then read its cache instead of building it again side by side."""
    if env.is_main:
        loaded = load()
    dist_utils.barrier(env)
    if not env.is_main:
        loaded = load()
    return loaded


def _new_model(cfg: TrainConfig, env) -> tuple[Any, DiffusionLM]:
    """(tokenizer, model) of a run that starts at step 0 (`prepare_tokenizer`, `build_model`)."""
    preset_vocab = None if cfg.init_from else ModelConfig.from_preset(cfg.preset).vocab_size
    preset_vocab = cfg.model_overrides.get("vocab_size", preset_vocab)
    # --init-from is opened once here and handed to both: a GGUF's header takes seconds to parse.
    init = open_source(cfg.init_from, flag="init_from") if cfg.init_from is not None else None
    base = init.config if init is not None else ModelConfig.from_preset(cfg.preset)
    check_trainable(cfg, base)  # no weight read yet
    cfg.check_complementary_masks(cfg.model_switches().get("block_size", base.block_size))
    tokenizer = _main_first(env, lambda: prepare_tokenizer(cfg, preset_vocab, init))
    return tokenizer, build_model(cfg, tokenizer, init)


def _check_batches(cfg: TrainConfig, env, train_set: Batches, val_set: Batches) -> None:
    """Every rank gets whole micro-batches of training rows and at least one validation row."""
    if cfg.batch_size % (env.world_size * cfg.grad_accum):
        raise ValueError(
            f"--batch-size {cfg.batch_size} must divide by world size {env.world_size} x --grad-accum {cfg.grad_accum}"
        )
    if len(train_set) < cfg.batch_size:
        raise ValueError(
            f"the training data has {len(train_set)} sequences of {cfg.seq_len} tokens, fewer than one batch of "
            f"{cfg.batch_size}; lower --batch-size/--seq-len or use more data"
        )
    if min(cfg.batch_size, len(val_set)) < env.world_size:
        raise ValueError(
            f"the validation split has {len(val_set)} sequences, fewer than the {env.world_size} processes that "
            "each score a share of it; use more data (--max-tokens) or fewer processes"
        )


def _ready_to_train(cfg: TrainConfig, env, device: torch.device, model: DiffusionLM, ckpt: Path | None,
                    state: dict | None, opt_state: dict | None):
    """What trains, on `device`, wrapped for data parallelism, and its optimizer restored on resume:
    (peft model or None, wrapped model, optimizer, start step)."""
    # what trains (training/trainable.py); a resumed lora run loads its adapters onto the rebuilt base
    peft_model = apply_trainable(model, cfg, adapter=ckpt if ckpt is not None and cfg.trainable == "lora" else None)
    model.to(device).train()
    dist_utils.prepare_blocks(model, cfg.activation_checkpointing, cfg.compile_backend if cfg.compile else None)
    if cfg.fsdp:  # before the optimizer, which must hold the sharded parameters
        wrapped = dist_utils.wrap(model, env, fsdp=True, bf16=cfg.bf16)
    optimizer = build_optimizer(model, cfg)
    start = 0
    if ckpt is not None and is_sharded(ckpt):  # any world size, with or without --fsdp
        start = int(load_sharded_checkpoint(ckpt, model, optimizer)["step"])
    elif ckpt is not None:
        optimizer.load_state_dict(opt_state)
        start = int(state["step"])
    if not cfg.fsdp:  # DDP broadcasts rank 0's (resumed) weights when it wraps
        wrapped = dist_utils.wrap(model, env)
    return peft_model, wrapped, optimizer, start


# ----------------------------------------------------------------------------- the loop
@dataclass(frozen=True)
class _Asks:
    """What `train`'s caller asks of the loop (`train`'s docstring): where it stops, `on_step(row)` after each step,
    the probe `(every, fn)`, and the command that resumes the run (said when a signal stops it)."""

    stop_at: int
    on_step: Callable[[dict], None] | None
    probe: tuple[int, Callable[[DiffusionLM, int], None]] | None
    resume_command: str | None


def _train(cfg: TrainConfig, env, device: torch.device, run: RunDir, stop: StopRequest, asks: _Asks) -> dict[str, Any]:
    """`open_run`, then steps `start .. asks.stop_at`: each an optimizer step, its metrics row, and a checkpoint
    every `save_every` steps, at `stop_at` and on a signal (then `TrainingStopped`)."""
    stop_at, on_step, probe = asks.stop_at, asks.on_step, asks.probe
    out = Path(cfg.out)
    tr = open_run(cfg, env, device, run)
    run.remove_previous_run()  # --overwrite: only now that every input check has passed
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / CONFIG_NAME,
                          {**cfg.to_dict(), "model": tr.model.config.to_dict(), "world_size": env.world_size})
    meter = _Progress(cfg, env, device, tr.start)
    stop.arm()  # from here on, SIGINT/SIGTERM finish the step and save (before: they stop at once)
    for step in range(tr.start, stop_at):
        loss, lr, grad_norm = _optimizer_step(cfg, env, device, tr, step)
        done = step + 1
        meter.stepped(grad_norm)
        if probe is not None and done % probe[0] == 0:
            with meter.paused():  # the probe is not training time
                probe[1](tr.model, done)
        row = meter.row(done, loss, lr, grad_norm)
        if done % cfg.eval_every == 0 or done == cfg.max_steps:
            row["val_loss"] = evaluate(tr.model, tr.val_set, cfg, device, env,  # every rank: its share
                                       pad_id=tr.tokenizer.eos_token_id)
        meter.report(done, row, loss, lr)
        if on_step is not None:
            on_step({"step": done, "loss": float(loss), "lr": lr})
        signum = stop.requested()  # every rank agrees on it (DDP/FSDP), so all save and stop together
        if done % cfg.save_every == 0 or done in (stop_at, cfg.max_steps) or signum:
            _save(cfg, env, out, done, tr, row)
        if signum and done < cfg.max_steps:
            _close(env, tr, meter)
            raise run.stopped(done, cfg.max_steps, signum, asks.resume_command)
    final = latest_checkpoint(out)
    _close(env, tr, meter)
    return {"out": str(out), "checkpoint": str(final) if final else None, "last": meter.last, "steps": cfg.max_steps}


def _optimizer_step(cfg: TrainConfig, env, device: torch.device, tr: TrainRun, step: int):
    """One optimizer step on the global batch of `step` (eq. 4's loss over `grad_accum` micro-batches of this
    rank's rows): (mean loss, lr, pre-clip gradient norm), the two tensors left on the device (no host sync)."""
    lr = lr_at(step, cfg)
    for group in tr.optimizer.param_groups:
        group["lr"] = lr
    indices = batch_for_step(step, len(tr.train_set), cfg.batch_size, cfg.seed)  # global batch, [B]
    t_all, u_all = global_noise(cfg, step, cfg.batch_size, cfg.seq_len, block_size=tr.model.config.block_size)
    content_mask = None
    if cfg.attention_anneal_steps and step < cfg.attention_anneal_steps:
        content_mask = annealed_mask(cfg.seq_len, step / cfg.attention_anneal_steps, device)
    mask_id, shift_logits = tr.model.config.mask_token_id, tr.model.config.shift_logits
    loss_fn = training_loss(tr.model.config, tr.tokenizer.eos_token_id)
    loss_sum = 0.0
    for m in range(cfg.grad_accum):
        lo = env.rank * tr.per_rank + m * tr.micro
        sl = slice(lo, lo + tr.micro)
        x0, pm = tr.train_set.get(indices[sl])
        sync = m == cfg.grad_accum - 1
        with (nullcontext() if sync else dist_utils.no_sync(tr.wrapped)), bf16_autocast(cfg.bf16, device):
            # host tensors: the loss plans the masked positions on the host and moves only what
            # the device needs (diffusion/loss.py MaskPlan), so the step has no host sync
            out_loss = loss_fn(
                tr.wrapped, x0, MaskNoise(t=t_all[sl], u=u_all[sl], eps=cfg.eps, complementary=cfg.complementary_masks),
                mask_id=mask_id, prompt_mask=pm, shift_logits=shift_logits, attention_mask=content_mask,
            )
            (out_loss.loss / cfg.grad_accum).backward()
        loss_sum += out_loss.loss.detach()
    # Tensors until a row is logged: no host sync per step on CUDA (FSDP's norm is a DTensor).
    grad_norm = dist_utils.full_value(torch.nn.utils.clip_grad_norm_(tr.model.parameters(), cfg.grad_clip))
    tr.optimizer.step()
    tr.optimizer.zero_grad(set_to_none=True)
    return dist_utils.mean_across_ranks(loss_sum / cfg.grad_accum, env), lr, grad_norm


def _save(cfg: TrainConfig, env, out: Path, done: int, tr: TrainRun, row: dict | None) -> None:
    """Checkpoint `done`: under FSDP every rank writes its shards (collective), else rank 0 the whole run
    (or, for lora, the adapters alone)."""
    if cfg.fsdp:
        save_sharded_checkpoint(
            out, done, tr.model, tr.optimizer, {"config": cfg.to_dict(), "metrics": row}, env, tokenizer=tr.tokenizer,
            keep_last=cfg.keep_last,
        )
    elif env.is_main:
        peft_model, base = tr.peft_model, sink_base(cfg)
        write_model = None if peft_model is None else (lambda d: save_adapter(peft_model, d))
        tokenizer = tr.tokenizer
        if base is not None:  # --trainable sink over a DLM on disk: the sinks and a reference to it (trainable.py)
            write_model = lambda d: save_sinks(tr.model, d, base)  # noqa: E731
            tokenizer = tokenizer if cfg.tokenizer is not None else None  # the base's own, read from the base
        save_training_checkpoint(
            out, done, tr.model, tr.optimizer, {"config": cfg.to_dict(), "metrics": row}, tokenizer=tokenizer,
            keep_last=cfg.keep_last, write_model=write_model,
        )
    dist_utils.barrier(env)


def _close(env, tr: TrainRun, meter: "_Progress") -> None:
    """The bar and the metrics log closed, then the wrapper dropped before the process group (see
    dist_utils.shutdown)."""
    meter.close()
    tr.wrapped = None
    dist_utils.shutdown(env)


class _Progress:
    """The loop's progress: the bar (plain lines without a terminal), metrics.jsonl, tokens/s and the ETA."""

    def __init__(self, cfg: TrainConfig, env, device: torch.device, start: int):
        self.cfg, self.start, self.is_main = cfg, start, env.is_main
        self.log = MetricsLog(Path(cfg.out), start, env.is_main, cfg.tensorboard)
        self.tokens_per_step = cfg.batch_size * cfg.seq_len
        self.bar = tqdm(total=cfg.max_steps, initial=start, disable=not (env.is_main and sys.stderr.isatty()),
                        unit="step", dynamic_ncols=True)
        self.last_time, self.last_step, self.last = time.perf_counter(), start, {}
        self.began = self.last_time  # for the ETA
        self.grad_norm_max = None
        if env.is_main:  # the first step of a 135M model takes seconds on a CPU: say what is coming
            print(f"[sinkdlm] training steps {start + 1}-{cfg.max_steps}: {cfg.batch_size} sequences x {cfg.seq_len} "
                  f"tokens a step on {device}; progress (loss, tokens/s, ETA) from step {start + 1} on",
                  file=sys.stderr, flush=True)

    def stepped(self, grad_norm: torch.Tensor) -> None:
        # The largest pre-clip norm since the last logged row: a spike between log steps is not lost
        # (docs/method.md §5); a tensor until logged, so no host sync per step.
        self.grad_norm_max = (grad_norm.detach().clone() if self.grad_norm_max is None
                              else torch.maximum(self.grad_norm_max, grad_norm))
        self.bar.update(1)

    @contextmanager
    def paused(self):
        """Time spent inside is left out of the next row's tokens/s."""
        t0 = time.perf_counter()
        yield
        self.last_time += time.perf_counter() - t0

    def row(self, done: int, loss, lr: float, grad_norm) -> dict | None:
        """The metrics row of a log or eval step (or the last); None on the other steps."""
        cfg = self.cfg
        if not (done % cfg.log_every == 0 or done % cfg.eval_every == 0 or done == cfg.max_steps):
            return None
        now = time.perf_counter()
        rate = self.tokens_per_step * (done - self.last_step) / max(now - self.last_time, 1e-9)
        self.last_time, self.last_step = now, done
        row = {"step": done, "loss": float(loss), "lr": lr, "tokens_per_s": rate, "grad_norm": float(grad_norm),
               "grad_norm_max": float(self.grad_norm_max)}
        self.grad_norm_max = None
        return row

    def report(self, done: int, row: dict | None, loss, lr: float) -> None:
        """Show the row (and the first step at once, not after --log-every steps of silence); log the row."""
        if row is not None or done == self.start + 1:
            now = time.perf_counter()
            shown = row or {"step": done, "loss": float(loss), "lr": lr,
                            "tokens_per_s": self.tokens_per_step / max(now - self.began, 1e-9)}
            eta = (now - self.began) / (done - self.start) * (self.cfg.max_steps - done)
            self.bar.set_postfix(loss=f"{shown['loss']:.3f}", tok_s=f"{shown['tokens_per_s']:.0f}")
            if self.is_main and self.bar.disable:  # no terminal (CI, logs): plain lines instead of a bar
                print(_format_row(shown, self.cfg.max_steps, eta), file=sys.stderr, flush=True)
        if row is not None:
            self.last = row
            self.log.log(row)

    def close(self) -> None:
        self.bar.close()
        self.log.close()


def _format_row(row: dict, max_steps: int, eta_s: float) -> str:
    """One plain progress line (when stderr is no terminal): step, loss, lr, tokens/s, [val_loss], ETA."""
    parts = [f"step {row['step']}/{max_steps}", f"loss {row['loss']:.4f}", f"lr {row['lr']:.2e}", f"{row['tokens_per_s']:.0f} tok/s"]
    if "val_loss" in row:
        parts.append(f"val_loss {row['val_loss']:.4f}")
    minutes, seconds = divmod(round(eta_s), 60)
    parts.append(f"ETA {minutes}:{seconds:02d}")
    return "[sinkdlm] " + " | ".join(parts)


def _load_resume_point(ckpt: Path, cfg: TrainConfig):
    """(tokenizer, model, (trainer state, optimizer state)) of a checkpoint; raises if any part is
    unreadable (then `RunDir.resume_point` falls back to the previous checkpoint). A sharded (FSDP)
    checkpoint holds the consolidated weights too; its optimizer shards are loaded after wrapping
    (`load_sharded_checkpoint`), so its optimizer state here is None."""
    # a sink-only checkpoint without tokenizer files has its base's (load_tokenizer_for)
    tokenizer = load_tokenizer(ckpt) if is_adapter_checkpoint(ckpt) else load_tokenizer_for(ckpt)
    if is_adapter_checkpoint(ckpt):  # --trainable lora: the base as the run built it; adapters loaded by apply_trainable
        model = build_model(cfg, tokenizer)
        check_adapter_fits(model, ckpt)
        return tokenizer, model, load_training_state(ckpt)
    model = with_run_settings(load_checkpoint(ckpt), cfg, tokenizer)
    if is_sharded(ckpt):
        return tokenizer, model, (json.loads((Path(ckpt) / STATE_NAME).read_text()), None)
    return tokenizer, model, load_training_state(ckpt)
