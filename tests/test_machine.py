"""Where a number was measured (`sinkdlm.io.machine`): the CPU's model name, its notable instruction sets and
torch's kernel level, which results files and benchmarks record (platform.processor() is empty on Linux)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from sinkdlm.io import machine
from sinkdlm.io.machine import NOTABLE_FLAGS, cpu_flags, cpu_name, int8_flags, machine_info, machine_words


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc/cpuinfo (not Linux)")
def test_cpu_name_and_flags_are_those_of_proc_cpuinfo():
    text = Path("/proc/cpuinfo").read_text()
    names = re.findall(r"^model name\s*:\s*(.+?)\s*$", text, flags=re.M)
    if names:
        assert cpu_name() == names[0]
    flags = set(re.search(r"^flags\s*:(.*)$", text, flags=re.M).group(1).split()) if "flags" in text else set()
    assert cpu_flags() == [f for f in NOTABLE_FLAGS if f in flags]
    assert int8_flags() == sorted(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def test_int8_flags_are_the_int8_dot_product_instructions_or_none_without_cpuinfo(monkeypatch):
    """VNNI (AVX-512 or AVX) and AMX int8 decide whether x86 int8 kernels sum exactly (bench_quant and the int8
    product check record them); a machine without /proc/cpuinfo records None, not "none"."""
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {"flags": "fpu avx2 avx_vnni avx512f avx512_vnni"})
    assert int8_flags() == ["avx512_vnni", "avx_vnni"]
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {"flags": "fpu avx2"})
    assert int8_flags() == []
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {})
    assert int8_flags() is None


def test_machine_info_says_which_cpu_and_kernels():
    m = machine_info()
    assert m["cpu"] == cpu_name() and m["cpu"] not in ("", None)
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(m["cpu_flags"]) <= set(NOTABLE_FLAGS) and m["cpu_count"] >= 1
    if sys.platform == "linux":
        assert m["cpu"] != "x86_64" or "model name" not in Path("/proc/cpuinfo").read_text()


def test_machine_words_reads_new_and_old_results_files():
    assert machine_words({"cpu": "AMD EPYC", "cpu_capability": "AVX512", "processor": "x86_64"}) == "AMD EPYC (AVX512 kernels)"
    assert machine_words({"processor": "x86_64"}) == "x86_64"  # a results.json written before `cpu` was recorded
