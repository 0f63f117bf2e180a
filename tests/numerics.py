"""The suite's one rule for comparing floats (CONTRIBUTING.md, "Comparing floats").

1. Exact (`torch.equal`, or atol = rtol = 0) only where the same kernels run on the same shapes and the same
   inputs: a determinism check, a save/load round trip, a mode that calls the very same function, integer
   results (tokens, masks, positions). A short comment at the assert says which.
2. Everything else gets a tolerance derived from the dtype and the computation (`fp_tolerance`):
       rtol = c · eps(dtype) · √n · depth,   atol = rtol · max|expected|,   c = 4,
   n the longest reduction on the path (hidden size, MLP width, keys attended, tokens summed), depth the
   number of such reductions chained one after another (a model: its layers plus the head). √n is the
   random-walk growth of the rounding error of an n-term fp sum (each term contributes ±eps/2 with random
   sign); c = 4 covers its tail and the constant of the summation order (pairwise, blocked, fused
   multiply-add) that differs between BLAS paths and vendors; atol scales with the output's own magnitude
   because logits and gradients pass through zero, where a relative bound alone means nothing.
3. Where exactness of a formula is the claim, compute both sides in float64 (its eps is 2.2e-16): then
   the same rule gives a bound near 1e-13, and a real error cannot hide in it.

Token parity between two computations of different shapes (a cached pass and the full one, a row alone and
in a batch) is checked exactly, but on float64 models: an argmax gap below float64 rounding does not occur
in these tests' models, whereas a float32 tie can flip with the vendor's rounding.

The rerun guard (Makefile `test-numerics`, its files in `NUMERICS_TESTS`) runs them again with two threads and
`ATEN_CPU_CAPABILITY=default`, the settings `tools/kernel_sensitivity.py` measured to change float32 results
on the CPUs here, so a tolerance that holds only for one machine's rounding fails where it is written.
"""

from __future__ import annotations

import math

import torch

C = 4.0  # the safety factor of rule 2 (see above)


def fp_tolerance(dtype: torch.dtype, *, n: int, depth: int = 1, scale: float = 1.0, c: float = C) -> dict[str, float]:
    """`assert_close`'s rtol/atol for `depth` chained reductions of length up to `n` in `dtype` (rule 2)."""
    rel = c * torch.finfo(dtype).eps * math.sqrt(n) * depth
    return {"rtol": rel, "atol": rel * scale}


def assert_fp_close(actual: torch.Tensor, expected: torch.Tensor, *, n: int, depth: int = 1, c: float = C,
                    dtype: torch.dtype | None = None, msg: str | None = None) -> None:
    """`torch.testing.assert_close` at the rule-2 tolerance of `expected`'s magnitude and of `dtype`: the
    lowest precision on the path (default `expected.dtype`; float32 where a float64 model takes float32
    rotary angles, as HF computes them)."""
    dtype = expected.dtype if dtype is None else dtype
    scale = float(expected.detach().abs().max()) if expected.numel() else 1.0
    tol = fp_tolerance(dtype, n=n, depth=depth, scale=max(scale, torch.finfo(dtype).tiny), c=c)
    torch.testing.assert_close(actual, expected, **tol, msg=msg)


def model_reduction(config, keys: int = 0) -> dict[str, int]:
    """`n` and `depth` of a transformer's forward (rule 2): its widest reduction and its layers plus the head."""
    n = max(config.hidden_size, config.intermediate_size, keys)
    return {"n": n, "depth": config.num_hidden_layers + 1}


def assert_model_close(actual: torch.Tensor, expected: torch.Tensor, config, *, keys: int = 0,
                       dtype: torch.dtype | None = None, msg: str | None = None) -> None:
    """Two computations of one model's forward (logits, hidden states or probabilities) agree to rule 2."""
    assert_fp_close(actual, expected, **model_reduction(config, keys), dtype=dtype, msg=msg)
