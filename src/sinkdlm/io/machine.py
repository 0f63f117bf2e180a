"""Which machine a number was measured on: results files and benchmarks record it, since times and the last
bits of float results differ by CPU vendor and generation (AVX-512, AMX; docs/method.md's tolerance rule).

`platform.processor()` is empty on Linux, so the CPU's name is read from /proc/cpuinfo (Linux) or
`platform.processor()` elsewhere, and the kernels torch dispatches to from `torch.backends.cpu`.
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

# the instruction-set extensions that change which CPU kernels run (and so the last bits of a float result)
NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo; empty where there is none (macOS, Windows)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block only
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC 9R14", "Intel(R) Xeon(R) Platinum 8488C"), else the architecture."""
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> list[str]:
    """Which of `NOTABLE_FLAGS` the CPU has (Linux; empty where /proc/cpuinfo is not there)."""
    have = set(_cpuinfo().get("flags", "").split())
    return [f for f in NOTABLE_FLAGS if f in have]


def int8_flags() -> list[str] | None:
    """The int8 dot-product instructions the CPU has (AVX-512 VNNI, AVX-VNNI, AMX int8), which decide whether x86 int8
    kernels sum u8 x s8 pairs exactly or into saturating 16-bit sums; None where /proc/cpuinfo is not there."""
    info = _cpuinfo()
    if "flags" not in info:
        return None
    return sorted({"avx512_vnni", "avx_vnni", "amx_int8"} & set(info["flags"].split()))


def machine_info() -> dict[str, Any]:
    """What a results file records about where it ran (and how busy the machine was as it started)."""
    import torch

    return {
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpu": cpu_name(), "cpu_flags": cpu_flags(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "cuda": torch.cuda.is_available(), "python": platform.python_version(),
        # other work on the machine as this invocation starts (a busy CPU slows every stage; the report says so)
        "load_average_at_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def machine_words(m: dict[str, Any]) -> str:
    """A results file's `machine` in a few words: "AMD EPYC (AVX512 kernels)"; older files name the architecture."""
    name = m.get("cpu") or m.get("processor") or "unknown CPU"
    return name + (f" ({m['cpu_capability']} kernels)" if m.get("cpu_capability") else "")
