"""One rule for every command that writes an output directory (`--out`), in one place.

`train`, `sft`, `convert`, `merge`, `analyze`, `experiment`, `tokenizer train` (a directory) and `eval` (a
file) all go through `check_out` before any work, then write inside `writing_out`:

* a new path, or an empty directory, is written;
* the command's own resumable output is resumed: `experiment` over the same preset's directory (a
  study in docs/results/<name> resumes there), `train`/`sft` over their run (the trainer then resumes
  it with `--resume` or refuses, as it always did);
* `--overwrite` replaces only what the command itself wrote. Each output keeps its own record of what
  it wrote (`RECORD`, `.sinkdlm-out.json`: the command and every path it wrote, kept by `writing_out`
  when the command ends, however it ends); eval's scores file is its own record (its keys). A directory
  holding any entry that record does not list (a user's notes, another command's output, an output from
  before records or of a run killed outright) is refused even with `--overwrite`, naming those entries:
  move them, or choose another `--out`. No refusal offers `--overwrite` for such a folder;
* anything else (this command's finished output) is refused in one line that offers `--overwrite`;
* `--overwrite` writes a new directory beside the old one (`.NAME.new-PID`) and swaps it in when the
  run ends, so a failed run leaves the old directory whole (and no half of each), then says in one line
  what it replaced. The swap is two renames; a crash between them leaves the old one as `.NAME.old-PID`
  beside the new. `train` and `experiment` record their own paths, so they set the old directory aside
  first and write in place; a run killed outright (no cleanup) leaves it there, and the next command on
  that `--out` names it (`set_aside`) so it is never forgotten.

`exclusive_out` keeps one writer per directory (an exclusive `flock` on the directory itself: the OS
drops it when the process dies, so a crashed run never leaves a stale lock). `hold` is the same lock for
work that processes share out among themselves (an experiment's shards, each claiming one run at a time):
a held directory is skipped or waited for, not refused.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sinkdlm.io.atomic import atomic_write_json

try:
    import fcntl
except ImportError:  # Windows: commands run unlocked
    fcntl = None

RECORD = ".sinkdlm-out.json"  # an output's record of what its command wrote (`written`, `foreign`)
LAUNCH_DIR = ".sinkdlm-launch"  # a launched experiment's job records and logs (experiment/launch.py), its own
IGNORED = {".DS_Store", ".train.lock", RECORD, LAUNCH_DIR}  # what an empty directory may still hold
SHOWN = 10  # entries a refusal names before it counts the rest
_NOTED: set[Path] = set()  # set-aside directories this process has already named (`check_out`)


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def experiment_preset(path: Path) -> str | None:
    """The preset an experiment directory was started with (STARTED.json, else results.json, else the
    title of progress.md); None when it does not say."""
    path = Path(path)
    for name in ("STARTED.json", "results.json"):
        preset = _json(path / name).get("preset")
        if isinstance(preset, str):
            return preset
    try:
        first = (path / "progress.md").read_text(encoding="utf-8").split("\n", 1)[0]
    except OSError:
        return None
    return first.split("`")[1] if first.count("`") >= 2 else None


def owner(path: str | Path) -> str | None:
    """The sinkdlm command whose output `path` holds ("train", "sft", "analyze", "convert", "experiment",
    "tokenizer train", "merge", "eval"), or None (nothing, or something else): the one its record names
    (`written`), else the one whose files it holds."""
    path = Path(path)
    if path.is_file():
        data = _json(path) if path.suffix == ".json" else {}
        return "eval" if {"scores", "tasks", "model"} <= data.keys() else None
    if not path.is_dir():
        return None
    record = written(path)
    if record is not None:
        return record["command"]
    names = {name.rstrip("/") for name in _contents(path)}
    if names & {"STARTED.json", "progress.md", "interim.json"} or {"results.json", "runs"} <= names:
        return "experiment"
    if "train_config.json" in names:
        return "sft" if _json(path / "train_config.json").get("sft") else "train"
    if names & {"metrics.jsonl", "checkpoints"}:
        return "train"
    if names & {"analysis.json", "intervals.json", "compare.json"}:
        return "analyze"
    if {"config.json", "model.safetensors"} <= names:
        return "convert"
    if "tokenizer.json" in names:
        return "tokenizer train"
    return None


def _contents(path: Path) -> list[str]:
    try:
        return sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir() if p.name not in IGNORED)
    except OSError as e:  # unreadable: say so, not a traceback
        raise ValueError(f"--out {str(path)!r} cannot be read ({e.strerror or e}); fix its permissions or choose "
                         "another --out") from e


def describe(path: str | Path) -> str:
    """What `path` holds, in a few words: "the output of `sinkdlm analyze` (analysis.json, ...)"."""
    path = Path(path)
    who = owner(path)
    if path.is_file():
        return "scores of an earlier `sinkdlm eval`" if who == "eval" else "a file"
    names = _contents(path)
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    if who == "experiment":
        preset = experiment_preset(path)
        return f"the `{preset}` experiment ({shown})" if preset else f"an experiment ({shown})"
    if who is not None:
        return f"the output of `sinkdlm {who}` ({shown})"
    return f"{len(names)} other entr{'y' if len(names) == 1 else 'ies'} ({shown})"


def check_out(path: str | Path, command: str, *, overwrite: bool = False, resumable: bool = False,
              preset: str | None = None, inputs: Sequence[str | Path | None] = (), flag: str = "--out",
              is_file: bool = False) -> str:
    """Decide, before any work, how `command` may write `path`: "new" (write it), "resume" (its own
    resumable output) or "replace" (`overwrite` over what `command` alone wrote: write beside, then swap).
    Anything else raises ValueError naming what is there. `preset`: an experiment's (another preset's
    directory is refused); `inputs`: paths the command reads, which `--overwrite` must not delete;
    `is_file`: `path` is a file (eval's scores), not a directory."""
    path = Path(path).expanduser()
    for aside in set_aside(path):  # an earlier --overwrite killed before it could clean up or put it back
        if aside in _NOTED:  # the command line and the library both check --out: say it once
            continue
        _NOTED.add(aside)
        print(f"[sinkdlm] note: {aside} holds what an interrupted --overwrite set aside from {flag} {path}; "
              f"move it back or delete it", file=sys.stderr, flush=True)
    if not is_file and path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file; give a directory")
    if is_file and path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory; give a file path such as {str(path / 'scores.json')!r}")
    _check_writable_ancestor(path.parent if is_file else path, f"{flag} {str(path)!r}")
    if not path.exists() or (not is_file and not _contents(path)):
        return "new"
    who = owner(path)
    if is_file:  # eval's scores are their own record: its keys
        if who != command:
            raise ValueError(f"{flag} {path} already exists and is not the scores of an earlier `sinkdlm {command}`; "
                             f"choose another {flag}, or move it away")
        strangers = []
    else:
        strangers = foreign(path, command)
    if overwrite and not strangers:
        _check_replaceable(path, inputs, flag)
        return "replace"
    if who == command and resumable and not overwrite:
        found = experiment_preset(path) if command == "experiment" else None
        if preset is None or found is None or found == preset:
            return "resume"
        replace = "" if strangers else ", or --overwrite to replace it"
        raise ValueError(f"{flag} {path} holds the `{found}` experiment, not `{preset}`: the two would mix; "
                         f"choose another {flag} (or --preset {found} to resume it{replace})")
    if strangers:
        raise ValueError(_foreign_refusal(path, command, strangers, flag))
    there = f"already exists ({describe(path)})" if is_file else f"already holds {describe(path)}"
    raise ValueError(f"{flag} {path} {there}; choose another {flag}, "
                     f"or pass --overwrite to replace it")


def _foreign_refusal(path: Path, command: str, strangers: list[str], flag: str) -> str:
    """The refusal of a directory holding entries `command` did not write: all of them named (or the first
    `SHOWN` and a count), and the two safe ways out; never --overwrite, which would delete them."""
    record, who = written(path), owner(path)
    if record is not None and record["command"] != command:
        why = f" (the output of `sinkdlm {record['command']}`)"
    elif record is None and who == command:
        why = (f" (it looks like the output of `sinkdlm {command}`, but it holds no record of what that wrote, "
               f"{RECORD}: an older sinkdlm's output, or a run killed outright)")
    elif record is None and who is not None:
        why = f" ({describe(path).split(' (')[0]})"
    else:
        why = ""
    n = len(strangers)
    return (f"{flag} {path} holds {n} entr{'y' if n == 1 else 'ies'} that `sinkdlm {command}` did not write "
            f"({listed(strangers)}){why}; choose another {flag}, or move {'it' if n == 1 else 'them'} out of it")


def listed(entries: list[str]) -> str:
    """The first `SHOWN` entries named, the rest counted: "a, b/ and 3 more"."""
    return ", ".join(entries[:SHOWN]) + (f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else "")


def written(path: str | Path) -> dict | None:
    """The record `path`'s command kept of what it wrote: {"command": ..., "entries": set of paths relative to
    `path`, folders ending in "/"}; None where there is none (or it cannot be read)."""
    record = _json(Path(path) / RECORD)
    if not isinstance(record.get("command"), str) or not isinstance(record.get("entries"), list):
        return None
    return {"command": record["command"], "entries": {e for e in record["entries"] if isinstance(e, str)}}


def foreign(path: str | Path, command: str) -> list[str]:
    """The entries of directory `path` that `command` did not write (by its record, `written`), outermost
    first: a folder it did not write is named once, not file by file."""
    record = written(path)
    mine = record["entries"] if record is not None and record["command"] == command else set()
    found: list[str] = []

    def visit(folder: Path, prefix: str) -> None:
        for p in sorted(folder.iterdir()):
            if p.name in IGNORED:
                continue
            name = prefix + p.name
            if p.is_dir() and not p.is_symlink():
                if name + "/" in mine:
                    visit(p, name + "/")
                else:
                    found.append(name + "/")
            elif name not in mine:
                found.append(name)

    visit(Path(path), "")
    return found


def _walk(path: Path) -> set[str]:
    """Every entry under `path` (relative, folders ending in "/"; a link is an entry, never followed)."""
    found = set()
    for folder, dirs, files in os.walk(path):
        prefix = os.path.relpath(folder, path) + "/" if folder != str(path) else ""
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in IGNORED and d not in links]
        found.update(prefix + d + "/" for d in dirs)
        found.update(prefix + f for f in [*files, *links] if f not in IGNORED)
    return found


def keep_record(path: Path, command: str, before: set[str]) -> None:
    """Keep `path`'s record of what `command` wrote: what its record already lists, and every entry now there
    but those that were there, not written by it, when it started (`before`: `foreign`'s list)."""
    if not path.is_dir():
        return
    record = written(path)
    kept = record["entries"] if record is not None and record["command"] == command else set()
    entries = {e for e in _walk(path) if e in kept or not any(e == b or (b.endswith("/") and e.startswith(b))
                                                                for b in before)}
    if (entries or record is not None) and (record is None or record["command"] != command
                                            or entries != record["entries"]):  # a refused run changes nothing
        atomic_write_json(path / RECORD, {"command": command, "entries": sorted(entries)})


def _replaced(path: Path, command: str) -> str:
    """What `--overwrite` replaces at `path`, in one line: for a study its preset, runs and file count."""
    files = sum(not e.endswith("/") for e in _walk(path))
    if command == "experiment":
        runs = sorted(p.name for p in (path / "runs").iterdir() if p.is_dir()) if (path / "runs").is_dir() else []
        return (f"the `{experiment_preset(path)}` experiment: {len(runs)} run{'' if len(runs) == 1 else 's'}"
                f"{f' ({listed(runs)})' if runs else ''}, {files} files")
    names = _contents(path)
    shown = ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
    return f"the output of `sinkdlm {command}`: {files} file{'' if files == 1 else 's'} ({shown})"


def set_aside(path: str | Path) -> list[Path]:
    """The directories an `--overwrite` of `path` set aside or half-wrote (`.NAME.old-PID`, `.NAME.new-PID`)
    whose process is gone: what a run killed outright left beside `path`."""
    path = Path(path).expanduser()
    found = []
    for prefix in (f".{path.name}.old-", f".{path.name}.new-"):
        for p in sorted(path.parent.glob(prefix + "*")) if path.parent.is_dir() else ():
            pid = p.name[len(prefix):]
            if pid.isdigit() and not _alive(int(pid)):
                found.append(p)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _check_writable_ancestor(path: Path, what: str) -> None:
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"cannot write {what}: {str(parent)!r} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {what}: directory {str(parent)!r} is not writable")


def _check_replaceable(path: Path, inputs: Sequence[str | Path | None], flag: str) -> None:
    """--overwrite deletes `path`: never the working directory or one above it, nor an input of the run."""
    real = path.resolve()
    if real == Path.cwd().resolve() or real in Path.cwd().resolve().parents or real == Path.home().resolve():
        raise ValueError(f"--overwrite would delete {flag} {str(path)!r}, the working or home directory (or one "
                         f"above it); give a directory of its own")
    for item in inputs:
        if item is not None and str(item) and (real == Path(item).resolve() or real in Path(item).resolve().parents):
            raise ValueError(f"--overwrite would delete {flag} {path}, which holds {item}, an input of this run; "
                             f"choose another {flag}")


@contextmanager
def writing_out(path: str | Path, mode: str, command: str, *, lock: bool = True, in_place: bool = False,
                flag: str = "--out") -> Iterator[Path]:
    """The directory to write for a `check_out` decision `mode`: `path` itself ("new", "resume"), or, for
    "replace", a new directory beside it, swapped in when the body ends. `in_place` (a run that records
    its own paths: train, experiment): the old directory is set aside beside instead and the new run
    written at `path`. A body that raises leaves `path` as it was found, either way; a stop that leaves a
    resumable run is caught by the caller inside the body, so that run is kept. `lock`: hold the directory
    (`exclusive_out`) for the body (train and experiment keep their own locks). However the body ends, the
    directory it wrote keeps its record of what `command` wrote (`RECORD`); a replaced one is named in a line."""
    path = Path(path).expanduser()
    if mode != "replace":
        before = set(foreign(path, command)) if path.is_dir() else set()
        try:
            with exclusive_out(path, command, flag) if lock else _as_is(path) as held:
                yield held
        finally:
            keep_record(path, command, before)
        return
    new = path.with_name(f".{path.name}.new-{os.getpid()}")
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    replaced = _replaced(path, command)
    if in_place:
        os.replace(path, old)
    target = path if in_place else new
    try:
        with exclusive_out(target, command, flag) if lock else _as_is(target) as held:
            held.mkdir(parents=True, exist_ok=True)
            try:
                yield held
            finally:
                keep_record(held, command, set())
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        if in_place:
            os.replace(old, path)
        raise
    if not in_place:
        os.replace(path, old)
        os.replace(new, path)
    strangers = foreign(old, command)
    if strangers:  # written into it while the command ran: kept beside, and said
        print(f"[sinkdlm] note: {old} holds the replaced {flag} {path}, kept because it came to hold entries "
              f"`sinkdlm {command}` did not write ({listed(strangers)}); move them, then delete it",
              file=sys.stderr, flush=True)
        return
    shutil.rmtree(old, ignore_errors=True)
    print(f"[sinkdlm] --overwrite replaced {flag} {path}: {replaced}", file=sys.stderr, flush=True)


@contextmanager
def _as_is(path: Path) -> Iterator[Path]:
    yield path


@contextmanager
def exclusive_out(path: str | Path, command: str, flag: str = "--out") -> Iterator[Path]:
    """Create directory `path` if needed and hold it for the body; refuse (ValueError) when another
    process holds it. A body that refuses its input (ValueError) leaves no directory this call made."""
    path = Path(path)
    made, missing = [], path
    while not missing.exists() and missing != missing.parent:
        made.append(missing)
        missing = missing.parent
    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = _flock(path, block=False)
    except BlockingIOError:
        raise ValueError(f"{flag} {path} is in use by another `sinkdlm {command}`; wait for it to finish, "
                         f"or choose another {flag}") from None
    try:
        yield path
    except ValueError:
        for folder in made:  # deepest first; stop at the first that is not empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    finally:
        _unlock(fd)


@contextmanager
def hold(path: str | Path, *, wait: bool, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """Hold directory `path` (made if missing) for the body, as `exclusive_out` does; yields False at once when
    another process holds it and `wait` is off (the caller does other work and comes back), else waits for it,
    calling `on_wait` first (say what it waits for). A body that finds the work done by the other holder
    returns: the holder's writes are complete when its lock is released (or its process dies)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        fd = _flock(path, block=False)
    except BlockingIOError:
        if not wait:
            yield False
            return
        if on_wait is not None:
            on_wait()
        fd = _flock(path, block=True)
    try:
        yield True
    finally:
        _unlock(fd)


def _flock(path: Path, *, block: bool) -> int | None:
    """An exclusive flock on directory `path`: its descriptor, or None where locks are not available (Windows,
    a network file system without flock: the work runs unlocked); BlockingIOError when held and not `block`."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
