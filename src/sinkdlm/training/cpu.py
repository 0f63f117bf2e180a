"""Flush denormal floats to zero on the CPU: the training speed of a model whose attention has sinks.

Once attention sinks form, many attention probabilities fall below float32's smallest normal number
(1.2e-38), and x86 CPUs compute on such denormals through slow microcode. PyTorch's CPU flash-attention
backward then slows down: on the `tiny` preset at step 2,400 of a study run it took 2.3x as long as on
a fresh model (65-69 ms against 29 ms per backward, 2 threads), so a 12,000-step run trained at
10,000 tokens/s in the middle of its schedule and 18,000 at its start and end (the scores later pass
through the denormal range and underflow to exact zeros). Flush-to-zero (FTZ/DAZ) removes the slowdown
and changes nothing measurable: that checkpoint's loss and every gradient were bit-identical with and
without it (docs/method.md §1, "CPU speed: denormals"; `benchmarks/bench_denormal.py`).

When it is set matters, measured (2 threads, the step-2,400 checkpoint): set before the process's first
parallel op the backward took 29 ms; set after one, 64-68 ms, no gain, although an elementwise product then
flushes on every thread (why the attention backward keeps the old mode was not found). So the experiment
runner and `train` set it before they compute anything; a script that runs torch ops first can call
`flush_denormals()` at its top. CUDA is unaffected; only the CPU's floating-point mode changes.
"""

from __future__ import annotations


def flush_denormals() -> bool:
    """Flush denormal floats to zero on the CPU (call it before the process's first parallel op, see above);
    returns whether the CPU supports it (x86 with SSE3; False elsewhere, where nothing changes)."""
    import torch

    return bool(torch.set_flush_denormal(True))
