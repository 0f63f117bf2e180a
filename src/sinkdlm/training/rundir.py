"""The run directory's lifecycle: one writer at a time, no silent overwrite, explained resume, clean stops.

`train()` opens `OUT` with `RunDir.open(cfg, env)` before any work and keeps it open to the end:

* **Lock.** `OUT/.train.lock` is held with `fcntl.flock` (exclusive, non-blocking) for the whole
  run, so a second training on the same `--out` is refused with the first one's PID instead of
  interleaving its metrics and checkpoints. The OS drops the lock when the process dies (even by
  SIGKILL), so a crashed run never leaves a stale lock. Without `fcntl` (Windows) or on a file
  system that refuses locks, the run goes on unlocked and says so.
* **No silent overwrite.** A directory that already holds a run (`train_config.json`,
  `metrics.jsonl`, `checkpoints/`, `tensorboard/`) is refused unless `resume` (continue it) or
  `overwrite` (delete it) is set. `overwrite` deletes only what the trainer writes
  (`RUN_FILES`, `step-N` / `.tmp-step-N` / `corrupt-step-N` checkpoint directories, TensorBoard
  event files), after every input check has passed, so a typo never costs the old run. However the run
  ends, `OUT` keeps its record of what training wrote (`io.out_dir.keep_record`): what the command line's
  `--overwrite` may replace.
* **Stale temporaries.** `.tmp-step-N` directories left by a save that was killed are removed at
  the next start (under the lock, so no live save is touched).
* **Explained resume.** `resume_point` names the checkpoint it resumes from; a corrupt newest
  checkpoint is moved aside to `corrupt-step-N` (named in the log; the previous good one is used);
  an unreadable `checkpoints/` is an error, not "no checkpoint yet"; `check_resume_matches` refuses
  a resume whose batch size, sequence length, data or model switches differ from the checkpoint's.
* **Clean stops.** `StopRequest` turns SIGINT/SIGTERM into a flag: the step finishes, a checkpoint
  is saved and `TrainingStopped` says where it is and how to resume. Under DDP each rank only sets
  its flag; `requested` all-reduces it so that every rank stops (and saves) after the same step.

Every decision is taken on rank 0 and broadcast (`_agree`), so a refusal reaches every rank
instead of leaving the others waiting at a barrier.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from sinkdlm.config import MODEL_SWITCHES
from sinkdlm.io.files import ensure_writable_dir
from sinkdlm.io.out_dir import foreign, keep_record
from sinkdlm.training.checkpointing import STATE_NAME, STEP_DIR

try:  # POSIX; Windows has no flock, and a run there goes on unlocked (said once)
    import fcntl
except ImportError:  # pragma: no cover - exercised by monkeypatching in the tests
    fcntl = None

LOCK_NAME = ".train.lock"
METRICS_NAME = "metrics.jsonl"
CONFIG_NAME = "train_config.json"
RUN_FILES = (CONFIG_NAME, METRICS_NAME)  # plain files the trainer writes in OUT
# the checkpoints where a `train(stop_at=)` of this process returned (`paused_at`): training on from one (an
# experiment's run, scored part by part) continues the run; it is no resume to announce
_PAUSED: set[str] = set()


def paused_at(checkpoint: str | Path) -> None:
    """Note that `train(stop_at=)` returned at `checkpoint`, so that going on from it says nothing."""
    _PAUSED.add(str(Path(checkpoint).resolve()))
MERGED_DIR = "merged"  # --merge: the last step with its LoRA adapters folded in (trainer.merged_checkpoint)
MERGED_MARK = Path(MERGED_DIR) / "merged_from.json"  # written last: the directory is whole


def read_metrics(out: str | Path, name: str = METRICS_NAME) -> list[dict[str, Any]]:
    """The rows of a run's `metrics.jsonl` (or another log `name` in `out`) in the order logged ([] before
    the first row)."""
    path = Path(out) / name
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def local_checkpoint(run_dir: Path, summary: dict[str, Any]) -> Path:
    """A finished run's checkpoint in `run_dir`, wherever the run directory was when it trained (DONE.json
    keeps absolute paths; a study's directory may have moved, e.g. into a repository)."""
    ckpt = Path(summary["checkpoint"])
    try:
        return run_dir / ckpt.relative_to(summary["out"])
    except (KeyError, ValueError):
        return ckpt


def grad_norm_peaks(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, largest pre-clip gradient norm since the previous logged step) of `read_metrics` rows: the
    trainer logs that maximum as `grad_norm_max` (older runs logged only the logged step's `grad_norm`)."""
    peaks = [(r["step"], r.get("grad_norm_max", r.get("grad_norm"))) for r in rows if "loss" in r]
    return [(step, float(g)) for step, g in peaks if g is not None]


def grad_norm_peak_steps(run_dir: Path) -> tuple[float, list[int]] | None:
    """(the largest pre-clip gradient norm of a run, [first, last] step of the logged interval it fell in) from
    `run_dir/metrics.jsonl`; None when the log is not there. The trainer logs each interval's maximum at the
    interval's last step, so the peak's step is known to that interval."""
    peaks = grad_norm_peaks(read_metrics(run_dir))
    if not peaks:
        return None
    i = max(range(len(peaks)), key=lambda j: peaks[j][1])
    return peaks[i][1], [peaks[i - 1][0] + 1 if i else 1, peaks[i][0]]
TMP_DIR = re.compile(r"^\.tmp-step-(\d+)$")
CORRUPT_DIR = re.compile(r"^corrupt-step-(\d+)(\.\d+)?$")
# Settings that define the batches and the model of a run: changing one on resume would silently
# splice two different runs together (the batch of step s is a function of these, see trainer).
RESUME_MUST_MATCH = ("data", "text_field", "max_tokens", "seq_len", "batch_size", "seed", "sft", "tokenizer", "init_from",
                     "trainable", "lora_rank", "lora_alpha", "lora_targets", "block_noise",
                     "complementary_masks")

T = TypeVar("T")


class TrainingStopped(KeyboardInterrupt):
    """Raised by `train()` after a SIGINT/SIGTERM once the checkpoint is saved.

    A `KeyboardInterrupt`, so code that catches `Exception` (e.g. a driver that would go on to
    mark the run finished) does not swallow it. `exit_code` is the shell's 128 + signal number.
    """

    def __init__(self, message: str, checkpoint: Path, step: int, signum: int):
        super().__init__(message)
        self.message, self.checkpoint, self.step, self.signum = message, checkpoint, step, signum
        self.exit_code = 128 + signum


# ----------------------------------------------------------------------------- rank agreement
def _agree(env, value: Any) -> Any:
    """Rank 0's `value` on every rank (identity in one process)."""
    if env.world_size == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _agree_or_raise(env, error: str | None) -> None:
    """Raise rank 0's error (if any) on every rank."""
    error = _agree(env, error)
    if error:
        raise ValueError(error)


# ----------------------------------------------------------------------------- lock
class RunLock:
    """Exclusive `flock` on `OUT/.train.lock`; the file holds the owner's PID for the error message."""

    def __init__(self, out: Path):
        self.path = out / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> str | None:
        """None when held (or locking is unavailable); else the error naming the holder."""
        if fcntl is None:
            print(f"[sinkdlm] note: this platform has no fcntl file locks; nothing stops a second training "
                  f"from writing into {self.path.parent} at the same time", file=sys.stderr, flush=True)
            return None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            return (f"out={self.path.parent} is in use by another training (PID {holder}); wait for it to "
                    f"finish, stop it, or choose another output directory")
        except OSError as e:  # e.g. a network file system without flock support
            os.close(fd)
            print(f"[sinkdlm] note: cannot lock {self.path} ({e.strerror}); nothing stops a second training "
                  f"from writing into {self.path.parent} at the same time", file=sys.stderr, flush=True)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


# ----------------------------------------------------------------------------- the directory
def _step_of(path: Path) -> int:
    return int(STEP_DIR.match(path.name).group(1))


class RunDir:
    """`OUT` for the duration of one `train()` call; use as a context manager (`RunDir.open`)."""

    def __init__(self, out: Path, env, resume: bool, overwrite: bool, command: str = "train"):
        self.out, self.env, self.resume, self.overwrite, self.command = out, env, resume, overwrite, command
        self.ckpt_root = out / "checkpoints"
        self.lock = RunLock(out)
        self._created: list[Path] = []  # what a refused run removes again: the lock file, new folders
        self._before: set[str] | None = None  # what OUT held that this command did not write (io.out_dir.foreign)

    @classmethod
    def open(cls, cfg, env) -> "RunDir":
        """Lock `cfg.out` and refuse to start over an existing run without resume/overwrite."""
        run = cls(Path(cfg.out), env, cfg.resume, cfg.overwrite, "sft" if cfg.sft else "train")
        error = None
        if env.is_main:
            missing = run.out
            while not missing.exists() and missing != missing.parent:
                run._created.append(missing)
                missing = missing.parent
            if not run.lock.path.exists():
                run._created.insert(0, run.lock.path)
            try:
                ensure_writable_dir(run.out)
                error = run.lock.acquire() or run._refusal()
            except ValueError as e:
                error = str(e)
            if error:
                run._undo()
            else:
                run._remove_stale_temporaries()
                run._before = set(foreign(run.out, run.command))
        _agree_or_raise(env, error)
        return run

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and issubclass(exc_type, ValueError):
            self._undo()  # an input refused inside train(): leave --out as it was found
        if self._before is not None:  # OUT's record of what training wrote: what --overwrite may replace
            keep_record(self.out, self.command, self._before)
        self.lock.release()

    def _undo(self) -> None:
        """Release the lock and remove the lock file and the folders this run created, as far as
        they are still empty: a refused run leaves no half-made `--out` (a run that wrote
        something keeps it)."""
        held = self.lock.fd is not None  # never the lock file of a training that refused us
        for path in self._created:
            if path == self.lock.path:
                if held:  # unlinked while still held: no other process can take this inode meanwhile
                    path.unlink(missing_ok=True)
                continue
            self.lock.release()
            try:
                path.rmdir()
            except OSError:  # not empty (another writer, or this run's output), or gone: stop here
                break
        self.lock.release()

    # -------------------------------------------------------------- what is there
    def _checkpoint_entries(self) -> list[Path]:
        """Everything under `checkpoints/`; an unreadable folder is an error, not an empty one."""
        if not os.path.lexists(self.ckpt_root):
            return []
        if not self.ckpt_root.is_dir():
            raise ValueError(f"{self.ckpt_root} is not a directory; move it away (or pass overwrite=True to start a new run)")
        try:
            return sorted(self.ckpt_root.iterdir())
        except OSError as e:
            raise ValueError(
                f"{self.ckpt_root} cannot be read ({e.strerror}); fix its permissions to resume, or choose another output directory"
            ) from e

    def step_dirs(self) -> list[Path]:
        """`checkpoints/step-N` directories (complete or not), oldest first."""
        found = [p for p in self._checkpoint_entries() if STEP_DIR.match(p.name) and p.is_dir()]
        return sorted(found, key=_step_of)

    def existing_run(self) -> list[str]:
        """Names of what a previous run left in `OUT` (empty: a fresh directory)."""
        found = [name for name in RUN_FILES if (self.out / name).exists()]
        steps = self.step_dirs()
        if steps:
            found.append(f"checkpoints/{steps[-1].name}")
        elif self._checkpoint_entries():
            found.append("checkpoints/")
        if (self.out / "tensorboard").is_dir():
            found.append("tensorboard/")
        if (self.out / MERGED_MARK).is_file():
            found.append("merged/")
        return found

    def _refusal(self) -> str | None:
        if self.resume or self.overwrite:
            self._checkpoint_entries()  # an unreadable checkpoints/ is an error before any work
            return None
        found = self.existing_run()
        if not found:
            return None
        # the library's parameter names; the command line reads its flags (`config.checks.cli_message`)
        return (f"out={self.out} already holds a training run ({', '.join(found)}); pass resume=True to continue it, "
                f"or overwrite=True to delete it and start a new one (or choose another output directory)")

    # -------------------------------------------------------------- cleaning
    def _remove_stale_temporaries(self) -> None:
        """`.tmp-step-N` left by a save that was killed (we hold the lock: no save is running)."""
        stale = [p for p in self._checkpoint_entries() if TMP_DIR.match(p.name)]
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        for name in RUN_FILES:  # atomic_write's temporaries of the run files
            for p in self.out.glob(f".{name}.*.tmp"):
                p.unlink(missing_ok=True)
        if stale:
            print(f"[sinkdlm] removed {len(stale)} unfinished checkpoint(s) left by an interrupted save: "
                  f"{', '.join(p.name for p in stale)}", file=sys.stderr, flush=True)

    def remove_previous_run(self) -> None:
        """`overwrite`: delete what the trainer wrote before, nothing else (call after the input checks)."""
        if not (self.overwrite and self.env.is_main):
            return
        removed = [name for name in RUN_FILES if (self.out / name).exists()]
        for name in removed:
            (self.out / name).unlink()
        ckpts = [p for p in self._checkpoint_entries()
                 if p.is_dir() and (STEP_DIR.match(p.name) or TMP_DIR.match(p.name) or CORRUPT_DIR.match(p.name))]
        for p in ckpts:
            shutil.rmtree(p)
        if ckpts:
            removed.append(f"{len(ckpts)} checkpoint(s)")
        _rmdir_if_empty(self.ckpt_root)
        if (self.out / MERGED_MARK).is_file():  # --merge's checkpoint (trainer.merged_checkpoint), nothing else
            shutil.rmtree(self.out / MERGED_DIR)
            removed.append("merged/")
        tb = self.out / "tensorboard"
        if tb.is_dir():
            events = list(tb.glob("events.out.tfevents.*"))
            for p in events:
                p.unlink()
            _rmdir_if_empty(tb)
            if events:
                removed.append(f"{len(events)} TensorBoard event file(s)")
        if removed:
            print(f"[sinkdlm] --overwrite: removed the previous run in {self.out} ({', '.join(removed)})",
                  file=sys.stderr, flush=True)

    # -------------------------------------------------------------- resume
    def resume_point(self, load: Callable[[Path], T]) -> tuple[Path, T] | None:
        """(checkpoint, load(checkpoint)) of the newest loadable checkpoint, or None for a fresh start.

        Rank 0 tries the newest first; one that fails to load is moved aside to `corrupt-step-N`
        and named, and the previous one is tried. The other ranks load rank 0's choice.
        """
        if not self.resume:
            return None
        chosen, loaded, error = None, None, None
        if self.env.is_main:
            try:
                chosen, loaded = self._newest_loadable(load)
            except ValueError as e:
                error = str(e)
        _agree_or_raise(self.env, error)
        chosen = _agree(self.env, None if chosen is None else str(chosen))
        if chosen is None:
            if self.env.is_main and self.existing_run():  # a fresh run says nothing about resuming
                print(f"[sinkdlm] --resume: no checkpoint under {self.ckpt_root} yet; starting from step 0",
                      file=sys.stderr, flush=True)
            return None
        chosen = Path(chosen)
        if not self.env.is_main:
            loaded = load(chosen)
        elif str(chosen.resolve()) not in _PAUSED:  # where this process paused the run: it goes on, not resumed
            print(f"[sinkdlm] resuming from {chosen}", file=sys.stderr, flush=True)
        return chosen, loaded

    def _newest_loadable(self, load: Callable[[Path], T]) -> tuple[Path | None, T | None]:
        bad: list[tuple[Path, str]] = []
        for path in reversed(self.step_dirs()):
            try:
                if not (path / STATE_NAME).is_file():
                    raise ValueError(f"{STATE_NAME} is missing")
                result = load(path)
            except Exception as e:  # noqa: BLE001 - any failure to read means "not a usable checkpoint"
                bad.append((path, f"{type(e).__name__}: {e}"))
                continue
            for p, why in bad:
                aside = _free_name(self.ckpt_root / f"corrupt-{p.name}")
                os.replace(p, aside)
                print(f"[sinkdlm] {p} cannot be loaded ({why}); moved it aside to {aside.name} and "
                      f"falling back to {path.name}", file=sys.stderr, flush=True)
            return path, result
        if bad:
            listed = "; ".join(f"{p.name}: {why}" for p, why in bad)
            raise ValueError(f"resume=True: no checkpoint under {self.ckpt_root} can be loaded ({listed}); "
                             f"pass overwrite=True to start the run again")
        return None, None

    # -------------------------------------------------------------- stop
    def stopped(self, step: int, max_steps: int, signum: int, command: str | None) -> TrainingStopped:
        """The exception `train()` raises after saving `checkpoints/step-{step}` on a signal."""
        ckpt = self.ckpt_root / f"step-{step}"
        if command is None:
            how = f"call train() again with resume=True and the same settings (out={str(self.out)!r})"
        else:
            how = command if self.env.world_size == 1 else f"torchrun --nproc_per_node={self.env.world_size} -m {command}"
        message = (f"stopped by {signal.Signals(signum).name} after step {step} of {max_steps}: checkpoint saved to "
                   f"{ckpt}\n[sinkdlm] resume with: {how}")
        if self.env.is_main:
            print(f"[sinkdlm] {message}", file=sys.stderr, flush=True)
        return TrainingStopped(message, ckpt, step, signum)


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:  # not there, or something the trainer did not write is left in it
        pass


def _free_name(path: Path) -> Path:
    if not path.exists():
        return path
    k = 1
    while path.with_name(f"{path.name}.{k}").exists():
        k += 1
    return path.with_name(f"{path.name}.{k}")


def check_resume_matches(cfg, saved_config: dict[str, Any] | None, model_config) -> None:
    """Refuse a resume whose data/batch settings differ from the checkpoint's, or whose model
    switches (and other model overrides) differ from the checkpoint's model."""
    differ = []
    if saved_config:
        for name in RESUME_MUST_MATCH:
            if name in saved_config and saved_config[name] != getattr(cfg, name):
                differ.append(f"{name}={saved_config[name]!r} in the checkpoint, {getattr(cfg, name)!r} now")
        if cfg.init_from is None and saved_config.get("preset", cfg.preset) != cfg.preset:
            differ.append(f"preset={saved_config['preset']!r} in the checkpoint, {cfg.preset!r} now")
    switch_names = {s.name for s in MODEL_SWITCHES}
    for name, value in cfg.model_switches().items():
        if getattr(model_config, name, value) != value:
            label = f"{name}=" if name in switch_names else f"model_overrides[{name!r}] "
            differ.append(f"{label}{getattr(model_config, name)!r} in the checkpoint, {value!r} now")
    if differ:
        raise ValueError("resume=True: this run was started with other settings: " + "; ".join(differ)
                         + ". Resume with the original settings, or pass overwrite=True to start a new run "
                         "(or choose another output directory)")


# ----------------------------------------------------------------------------- signals
class StopRequest:
    """SIGINT/SIGTERM/SIGUSR2 -> a flag checked after each step; in one process a second signal stops at once.

    Handlers are installed only in the main thread (Python allows no other) and the previous
    ones are restored on exit, so a library caller's own handlers survive `train()`. Until `arm()`
    (set-up: tokenizer training, packing, loading) there is no step to finish, and a signal acts
    as it would without us.
    """

    # SIGUSR2: Slurm's warning before a time limit or a preemption (submitit's default `--signal`): the run saves
    # at the end of its step and its job is requeued (experiment/launch.py)
    SIGNALS = (signal.SIGINT, signal.SIGTERM, *((signal.SIGUSR2,) if hasattr(signal, "SIGUSR2") else ()))

    def __init__(self, env):
        self.env = env
        self.signum = 0
        self.armed = False
        self._previous: dict[int, Any] = {}

    def arm(self) -> None:
        self.armed = True

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if not self.armed:
            return self._default(signum, frame)
        if self.signum:
            # One process: asked twice, the user means now. Under torchrun a worker gets Ctrl-C
            # from the terminal *and* the agent's forwarded signal: only the flag counts there.
            if self.env.world_size == 1:
                raise KeyboardInterrupt
            return
        self.signum = signum
        if self.env.is_main:  # os.write: print() is not safe inside a signal handler
            again = " (send it again to stop at once, without saving)" if self.env.world_size == 1 else ""
            os.write(2, (f"\n[sinkdlm] {signal.Signals(signum).name} received: finishing this step and saving a "
                         f"checkpoint{again}\n").encode())

    def _default(self, signum, frame) -> None:
        previous = self._previous.get(signum)
        if callable(previous):
            return previous(signum, frame)
        if signum == signal.SIGINT and previous is not signal.SIG_IGN:
            raise KeyboardInterrupt
        if previous in (signal.SIG_DFL, None):  # SIGTERM's default: die by the signal, as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def requested(self) -> int:
        """The signal number every rank agrees to stop on after this step (0: go on)."""
        if self.env.world_size == 1:
            return self.signum
        import torch
        import torch.distributed as dist

        t = torch.tensor([self.signum], device=self.env.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())
