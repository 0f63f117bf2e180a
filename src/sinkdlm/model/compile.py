"""Can `torch.compile` work here? The one check behind `train --compile` and `generate --compile`.

A missing backend or build tool otherwise fails deep inside the first compiled call, after the work
has started; this says what is missing and what to do before any.
"""

from __future__ import annotations

import os
import shutil

import torch


def check_compile(backend: str, device: torch.device) -> None:
    """`--compile` can work here: the backend exists and what it builds with is installed."""
    import importlib.util
    import sys

    known = torch.compiler.list_backends(exclude_tags=())  # debug backends (aot_eager) too
    if backend not in known:
        raise ValueError(f"--compile-backend {backend!r} is not a torch.compile backend; choose one of {known}")
    if backend != "inductor":
        return
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            raise ValueError(
                "--compile with the inductor backend needs Triton on CUDA, which is not installed: "
                "pip install triton, or use --compile-backend aot_eager, or drop --compile"
            )
        return
    # Inductor's CPU code is built by $CXX, else the platform's default compiler (its config.cpp.cxx).
    names = [os.environ.get("CXX"), "clang++" if sys.platform == "darwin" else "g++", "c++"]
    if not any(n and shutil.which(n) for n in names):
        raise ValueError(
            "--compile with the inductor backend needs a C++ compiler on CPU, and none was found "
            f"(looked for {[n for n in names if n]}): install g++ (or set CXX), use --compile-backend "
            "aot_eager, or drop --compile"
        )
