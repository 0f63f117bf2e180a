"""Is compiled W8A8 the same quantized model as eager W8A8? (issue 66: the fast CPU path of `bench_quant.py`.)

For a run's last checkpoint, the study's fixed validation rows (`experiment.fixed_set`: the preset's sequences,
draws and noise seed; the first `--rows` rows) are scored in float32 eager, then under torchao's `int8-dynamic`
(W8A8, `model.quantize.quantize_model`) along three paths: eager, `torch.compile` (inductor, defaults) and
`torch.compile` with inductor's `freezing` (the quantized weights folded into the graph as constants, torchao's
CPU recipe and the W8A8 speed that docs/benchmarks.md reports). Per path: Δ_quant = mean of quantized − fp32 eager
values with its validation SE (`diffusion.likelihood.stratified_se`, as `endpoints/quant/measure.py`), the max
|value| difference from eager W8A8, and wall seconds (a compiled path's first scoring, which compiles, apart as
its warm-up). Also float32 compiled against float32 eager, with and without `freezing`, so that a difference of
the quantized paths is not the compiler's float32 rounding. Dynamo is reset between paths and `freezing` restored.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv-quant/bin/python tools/quant_compile_check.py \
        --run docs/results/quant-pilot/runs/vanilla-s510 [--run ...] [--rows 32] [--preset quant-pilot] \
        [--out docs/results/quant-compile]

    PYTHONPATH=src python tools/quant_compile_check.py --readme-only [--out ...]   # OUT/README.md from result.json

    PYTHONPATH=src python tools/quant_compile_check.py --gemm-only [--out ...]   # this machine's int8 products

Writes OUT/result.json (one entry per run, and `int8_gemm_check`'s comparison) and OUT/README.md; `--gemm-only`
adds `int8_gemm_check` on this machine (and oneDNN ISA cap, `ONEDNN_MAX_CPU_ISA`) to `int8_gemm_machines`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from sinkdlm.io.atomic import atomic_write_bytes, atomic_write_json

SCHEME = "int8-dynamic"
PATHS = ("eager", "compiled", "compiled, freezing")


def _compiled(model):
    """A copy of `model` whose forward is `torch.compile`d (inductor)."""
    m = copy.deepcopy(model)
    m.forward = torch.compile(m.forward)
    return m


def _score_compiled(model, x0, validation, freezing: bool) -> tuple[torch.Tensor, float, float, int]:
    """(values, warm-up seconds, seconds, oneDNN qlinears): `model` compiled under inductor's `freezing` setting,
    scored twice (the first scoring compiles), dynamo reset before and after; `freezing` is restored on return. The
    last: how many int8 matmuls inductor's freezing pass rewrote to oneDNN's `qlinear_pointwise` (its counter
    `qlinear_weight_prepack_matcher_count`, summed over the graphs compiled)."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    from sinkdlm.experiment.fixed_set import score_set

    torch._dynamo.reset()
    counters["inductor"].clear()
    try:
        with inductor_config.patch(freezing=freezing):
            m = _compiled(model)
            t0 = time.perf_counter()
            score_set(m, x0, validation)
            t1 = time.perf_counter()
            values = score_set(m, x0, validation)
            t2 = time.perf_counter()
        onednn = int(counters["inductor"]["qlinear_weight_prepack_matcher_count"])
    finally:
        torch._dynamo.reset()
    return values, t1 - t0, t2 - t1, onednn


def int8_gemm_check(seed: int = 0) -> list[dict[str, Any]]:
    """Why the frozen path differs, on this CPU: oneDNN's int8 linear (`onednn.qlinear_pointwise`, what the freezing
    pass lowers torchao's `_int_mm` to) against the exact int32 product (`torch._int_mm`) of the same int8 operands,
    scales 1, a [16, 256] × [256, 64] product. Per case: the largest |difference| (absolute, and relative to the
    largest |exact| entry) and the fraction of entries that differ. Without VNNI, x86 int8 kernels multiply u8 × s8
    pairs into int16 sums (vpmaddubsw), which saturate where both products are large."""
    g = torch.Generator().manual_seed(seed)
    m, k, n = 16, 256, 64
    one, rows = torch.tensor(1.0), []
    for wmax, xmax in ((127, 127), (127, 8), (8, 127)):
        w = torch.randint(-wmax, wmax + 1, (n, k), dtype=torch.int8, generator=g)
        x = torch.randint(-xmax, xmax + 1, (m, k), dtype=torch.int8, generator=g)
        exact = torch._int_mm(x, w.t().contiguous()).double()
        got = torch.ops.onednn.qlinear_pointwise.tensor(
            x, one, None, torch.ops.onednn.qlinear_prepack(w, None), torch.ones(n), None, None, 1.0, 0,
            torch.float32, "none", [], "").double()
        d = (got - exact).abs()
        # is `_int_mm` itself exact here? (eager W8A8's product, `torchao.kernel.intmm`): against int64 arithmetic
        int_mm = (exact - (x.long() @ w.t().long()).double()).abs()
        rows.append({"weights_max": wmax, "activations_max": xmax, "max_abs_diff": float(d.max()),
                     "max_rel_diff": float(d.max() / exact.abs().max()),
                     "fraction_differing": float((d > 0.5).double().mean()),
                     "int_mm_max_abs_diff": float(int_mm.max()),
                     "int_mm_fraction_differing": float((int_mm > 0.5).double().mean())})
    return rows


def gemm_machine_entry() -> dict[str, Any]:
    """`int8_gemm_check` on this machine, with its CPU and oneDNN's ISA cap (`ONEDNN_MAX_CPU_ISA`, which makes a
    VNNI CPU run oneDNN's AVX2 kernels: how a CPU without VNNI computes, as far as oneDNN decides)."""
    return {"machine": machine(), "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "int8_gemm": int8_gemm_check()}


def _delta(values: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    from sinkdlm.diffusion.likelihood import stratified_se

    diff = values - reference
    return {"val_loss": float(values.mean()), "delta": float(diff.mean()), "delta_se": stratified_se(diff)}


def check_model(model, x0: torch.Tensor, validation, compile: bool = True) -> dict[str, Any]:
    """The measurement (see the module docstring) on an in-memory float32 `model` and rows `x0` `[N, L]`;
    `compile=False`: the eager path only (no compiled paths, no fp32 compiled check)."""
    from sinkdlm.experiment.fixed_set import score_set
    from sinkdlm.model.quantize import quantize_model

    model.eval()
    t0 = time.perf_counter()
    reference = score_set(model, x0, validation)  # [N, D] fp32 eager
    fp32_seconds = time.perf_counter() - t0
    quantized = quantize_model(copy.deepcopy(model), SCHEME)
    t0 = time.perf_counter()
    eager = score_set(quantized, x0, validation)
    paths = {"eager": {**_delta(eager, reference), "max_abs_diff_vs_eager": 0.0,
                       "seconds": time.perf_counter() - t0, "warmup_seconds": None,
                       "onednn_qlinears": 0}}
    fp32_compiled = {}
    if compile:
        for freezing in (False, True):
            values, warm, secs, _ = _score_compiled(model, x0, validation, freezing)
            fp32_compiled["freezing" if freezing else "no freezing"] = {
                "max_abs_diff_vs_eager": float((values - reference).abs().max()),
                "mean_diff_vs_eager": float((values - reference).mean()), "seconds": secs, "warmup_seconds": warm}
            values, warm, secs, onednn = _score_compiled(quantized, x0, validation, freezing)
            paths["compiled, freezing" if freezing else "compiled"] = {
                **_delta(values, reference), "max_abs_diff_vs_eager": float((values - eager).abs().max()),
                "seconds": secs, "warmup_seconds": warm, "onednn_qlinears": onednn}
    return {"scheme": SCHEME, "rows": int(len(x0)), "seq_len": int(x0.shape[1]), "draws": int(reference.shape[1]),
            "val_loss_fp32": float(reference.mean()), "fp32_seconds": fp32_seconds, "paths": paths,
            "fp32_compiled": fp32_compiled}


def check_run(run: Path, rows: int, preset_name: str) -> dict[str, Any]:
    """`check_model` on the last checkpoint of the experiment run `run` (its train/train_config.json's
    TrainConfig fields) and the first `rows` rows of `preset_name`'s fixed validation."""
    from sinkdlm.config import TrainConfig
    from sinkdlm.experiment.fixed_set import validation_inputs
    from sinkdlm.experiment.presets import get_preset

    preset = get_preset(preset_name)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = {k: v for k, v in json.loads((run / "train" / "train_config.json").read_text()).items() if k in fields}
    ckpts = sorted((run / "train" / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    if not ckpts:
        raise SystemExit(f"{run}: no train/checkpoints/step-*")
    model, x0 = validation_inputs(str(ckpts[-1]), cfg, preset.validation, "cpu")
    return {"run": str(run), "checkpoint": ckpts[-1].name, "preset": preset_name,
            **check_model(model, x0[:rows], preset.validation)}


def machine() -> dict[str, Any]:
    from sinkdlm.io.machine import cpu_flags, cpu_name, int8_flags
    from sinkdlm.model.quantize import torchao_version

    return {"cpu": cpu_name(), "cpu_flags": cpu_flags(), "vnni_flags": int8_flags(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "torchao": torchao_version(), "python": platform.python_version()}


def _fmt(x, spec=".5f"):
    return "–" if x is None else format(x, spec)


def readme(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = ["# Compiled W8A8 against eager W8A8 (issue 66)", "",
             f"{m['cpu']}, {m['threads']} thread(s); torch {m['torch']}, torchao {m['torchao']}, Python "
             f"{m['python']}. `{result['command']}` (`tools/quant_compile_check.py`).", "",
             "Δ_quant = mean over the fixed validation's (sequence, draw) values of W8A8 (`int8-dynamic`) − float32 "
             "eager, nats, with its validation SE; max |diff|: the largest per-value difference from eager W8A8; "
             "seconds: one scoring of the rows after the warm-up (a compiled path's first scoring, which compiles); "
             "oneDNN qlinears: int8 matmuls inductor's freezing pass rewrote to `onednn.qlinear_pointwise`.",
             "", "| run | rows | path | Δ_quant | SE | max \\|diff\\| vs eager W8A8 | seconds | warm-up s "
             "| oneDNN qlinears |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for e in result["runs"]:
        name = Path(e["run"]).name
        for path, p in e["paths"].items():
            lines.append(f"| {name} | {e['rows']} | W8A8 {path} | {p['delta']:+.5f} | {p['delta_se']:.5f} | "
                         f"{p['max_abs_diff_vs_eager']:.4f} | {p['seconds']:.1f} | "
                         f"{_fmt(p['warmup_seconds'], '.1f')} | {p['onednn_qlinears']} |")
    lines += ["", "Float32 compiled against float32 eager (the compiler's own rounding):", "",
              "| run | inductor | max \\|diff\\| | mean diff | seconds | warm-up s |", "|---|---|---:|---:|---:|---:|"]
    for e in result["runs"]:
        for k, f in e["fp32_compiled"].items():
            lines.append(f"| {Path(e['run']).name} | {k} | {f['max_abs_diff_vs_eager']:.2e} | "
                         f"{f['mean_diff_vs_eager']:+.2e} | {f['seconds']:.1f} | {f['warmup_seconds']:.1f} |")
    if result.get("int8_gemm"):
        flags = ", ".join(m.get("cpu_flags", [])) or "none of them"
        if m.get("vnni_flags") is not None:
            flags += f"; int8 dot-product flags: {', '.join(m['vnni_flags']) or 'none'}"
        lines += ["", "oneDNN's int8 linear (what the freezing pass lowers the int8 matmuls to) against the exact "
                  "int32 product of the same int8 operands (`int8_gemm_check`: [16, 256] × [256, 64], scales 1, "
                  f"uniform random integers; this CPU's notable flags: {flags}):", "",
                  "| weights in ± | activations in ± | max \\|diff\\| | relative to max \\|exact\\| "
                  "| entries differing |", "|---:|---:|---:|---:|---:|"]
        lines += [f"| {g['weights_max']} | {g['activations_max']} | {g['max_abs_diff']:.0f} | "
                  f"{g['max_rel_diff']:.3f} | {g['fraction_differing']:.1%} |" for g in result["int8_gemm"]]
        lines += ["", "Without VNNI (AVX-512 VNNI, AVX-VNNI), x86 int8 kernels multiply u8 × s8 pairs into 16-bit "
                  "sums (vpmaddubsw) that saturate where both products are large; exact products with small weights "
                  "and wrong ones with large weights and activations fit that, though this table does not show which "
                  "instruction ran."]
    if result.get("int8_gemm_machines"):
        lines += ["", "The same operands on other machines (`--gemm-only`): `torch._int_mm` (eager W8A8's int8 product) "
                  "against int64 arithmetic, and oneDNN's int8 linear against `_int_mm` (the first table's comparison), "
                  "max |diff| (fraction of entries differing) per case, weights ± / activations ±:", "",
                  "| CPU | int8 dot-product flags | ONEDNN_MAX_CPU_ISA | case | `_int_mm` − int64 | oneDNN linear − "
                  "`_int_mm` |", "|---|---|---|---|---:|---:|"]
        for e in result["int8_gemm_machines"]:
            m = e["machine"]
            for g in e["int8_gemm"]:
                lines.append(f"| {m['cpu']} | {', '.join(m['vnni_flags'] or []) or 'none'} | "
                             f"{e['onednn_max_cpu_isa'] or '–'} | {g['weights_max']} / {g['activations_max']} | "
                             f"{g['int_mm_max_abs_diff']:.0f} ({g['int_mm_fraction_differing']:.1%}) | "
                             f"{g['max_abs_diff']:.0f} ({g['fraction_differing']:.1%}) |")
    return "\n".join(lines) + "\n"


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "result.json", result)
    atomic_write_bytes(out / "README.md", readme(result).encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, action="append", help="an experiment run's folder (repeatable)")
    ap.add_argument("--rows", type=int, default=32, help="the first ROWS rows of the fixed validation")
    ap.add_argument("--preset", default="quant-pilot")
    ap.add_argument("--out", type=Path, default=Path("docs/results/quant-compile"))
    ap.add_argument("--readme-only", action="store_true", help="OUT/README.md again from OUT/result.json")
    ap.add_argument("--gemm-only", action="store_true",
                    help="add this machine's int8 product check to OUT/result.json (replacing its own earlier one)")
    args = ap.parse_args()
    if args.readme_only:
        atomic_write_bytes(args.out / "README.md", readme(json.loads((args.out / "result.json").read_text())).encode())
        return
    if args.gemm_only:
        torch.set_num_threads(1)
        result, entry = json.loads((args.out / "result.json").read_text()), gemm_machine_entry()
        key = lambda e: (e["machine"]["cpu"], tuple(e["machine"]["vnni_flags"] or ()), e["onednn_max_cpu_isa"])  # noqa: E731
        result["int8_gemm_machines"] = [e for e in result.get("int8_gemm_machines", []) if key(e) != key(entry)] + [entry]
        write(args.out, result)
        return
    if not args.run:
        ap.error("--run is required (or --readme-only)")
    torch.set_num_threads(1)
    command = ("PYTHONPATH=src OMP_NUM_THREADS=1 python tools/quant_compile_check.py "
               + " ".join(f"--run {r}" for r in args.run)
               + f" --rows {args.rows} --preset {args.preset} --out {args.out}")
    gemm = int8_gemm_check()
    runs: list[dict[str, Any]] = []
    for r in args.run:  # written after each run (a partial result survives an interrupted invocation)
        runs.append(check_run(r, args.rows, args.preset))
        write(args.out, {"machine": machine(), "command": command, "runs": runs, "int8_gemm": gemm})


if __name__ == "__main__":
    main()
