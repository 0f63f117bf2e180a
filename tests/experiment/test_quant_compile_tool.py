"""tools/quant_compile_check.py: eager, compiled and frozen-compiled W8A8 on a tiny model. The eager path's Δ_quant
equals the quantization endpoint's own (`endpoints.quant.measure.scheme_scores`) computed here, and the result file
and its README carry every field; the compiled paths (slow: inductor compiles four times) each give a Δ, a max
difference from eager W8A8 and a warm-up, and leave inductor's `freezing` as it was."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("torchao")

from helpers import _load_tool, tiny_model  # noqa: E402
from sinkdlm.experiment.presets import Validation  # noqa: E402

tool = _load_tool("quant_compile_check")
VALIDATION = Validation(tokens=4 * 16, draws=4, noise_seed=3, batch_size=4)
PATH_KEYS = {"val_loss", "delta", "delta_se", "max_abs_diff_vs_eager", "seconds", "warmup_seconds", "onednn_qlinears"}


def _model_and_rows():
    model = tiny_model(num_sink_tokens=1, initializer_range=0.05, hidden_size=64, intermediate_size=128).float()
    x0 = torch.randint(0, model.config.vocab_size - 1, (4, 16), generator=torch.Generator().manual_seed(0))
    return model, x0


def _write_and_check(tmp_path, record, paths):
    result = {"machine": tool.machine(), "command": "test", "runs": [{"run": "runs/tiny", **record}],
              "int8_gemm": tool.int8_gemm_check()}
    tool.write(tmp_path, result)
    got = json.loads((tmp_path / "result.json").read_text())
    assert set(got) == {"machine", "command", "runs", "int8_gemm"}
    assert set(got["machine"]) == {"cpu", "cpu_flags", "vnni_flags", "threads", "torch", "torchao", "python"}
    assert all(set(g) == {"weights_max", "activations_max", "max_abs_diff", "max_rel_diff", "fraction_differing",
                          "int_mm_max_abs_diff", "int_mm_fraction_differing"} for g in got["int8_gemm"])
    run = got["runs"][0]
    assert set(run) == {"run", "scheme", "rows", "seq_len", "draws", "val_loss_fp32", "fp32_seconds", "paths",
                        "fp32_compiled"}
    assert list(run["paths"]) == list(paths)
    assert all(set(p) == PATH_KEYS for p in run["paths"].values())
    text = (tmp_path / "README.md").read_text()
    assert all(f"W8A8 {p} |" in text for p in paths) and got["machine"]["torchao"] in text and "oneDNN" in text
    return run


def test_the_eager_paths_delta_is_the_quant_endpoints(tmp_path):
    from sinkdlm.experiment.endpoints.quant.measure import scheme_scores
    from sinkdlm.experiment.fixed_set import score_set

    model, x0 = _model_and_rows()
    r = tool.check_model(model, x0, VALIDATION, compile=False)
    reference = score_set(model, x0, VALIDATION)
    want = scheme_scores(model, x0, VALIDATION, "int8-dynamic", reference)
    eager = r["paths"]["eager"]
    assert eager["delta"] == want["delta"] and eager["delta_se"] == want["delta_se"]
    assert eager["val_loss"] == want["val_loss"] and r["val_loss_fp32"] == float(reference.mean())
    assert eager["delta"] != 0.0 and eager["max_abs_diff_vs_eager"] == 0.0 and eager["onednn_qlinears"] == 0
    assert (r["rows"], r["seq_len"], r["draws"]) == (4, 16, 4) and r["fp32_compiled"] == {}
    _write_and_check(tmp_path, r, ("eager",))


@pytest.mark.slow
def test_the_compiled_paths(tmp_path):
    import torch._inductor.config as inductor_config

    model, x0 = _model_and_rows()
    before = inductor_config.freezing
    r = tool.check_model(model, x0, VALIDATION)
    assert inductor_config.freezing == before
    run = _write_and_check(tmp_path, r, tool.PATHS)
    assert set(run["fp32_compiled"]) == {"no freezing", "freezing"}
    for f in run["fp32_compiled"].values():
        assert f["max_abs_diff_vs_eager"] < 1e-3 and f["warmup_seconds"] > 0
    for name in ("compiled", "compiled, freezing"):
        p = run["paths"][name]
        assert abs(p["delta"]) < 1.0 and p["warmup_seconds"] > 0 and p["max_abs_diff_vs_eager"] >= 0.0
    # only freezing lowers the int8 matmuls to oneDNN (the block linears: 7 a layer, 2 layers, per graph compiled)
    assert run["paths"]["compiled"]["onednn_qlinears"] == 0
    assert run["paths"]["compiled, freezing"]["onednn_qlinears"] >= 14


def test_the_int8_product_check_compares_int_mm_with_int64_arithmetic(tmp_path, monkeypatch):
    """`int8_gemm_check`'s `_int_mm` column is `_int_mm` against int64 arithmetic: 0 where they agree, and where
    `_int_mm` saturates (replaced here by a product whose int16 pair sums saturate, as x86 int8 kernels without
    VNNI compute) it is what that saturation costs. `--gemm-only` keeps one entry per machine and ISA cap."""
    exact = tool.int8_gemm_check()
    real = torch._int_mm

    def saturating(x, w):  # u8 x s8 pairs summed into int16 with saturation (vpmaddubsw), then int32 sums
        xu = x.long() + 128
        prod = xu.unsqueeze(-1) * w.long().unsqueeze(0)  # [m, k, n]
        pairs = (prod[:, 0::2] + prod[:, 1::2]).clamp(-32768, 32767).sum(1)
        return (pairs - 128 * w.long().sum(0)).to(torch.int32)

    monkeypatch.setattr(torch, "_int_mm", saturating)
    x, w = torch.randint(-127, 128, (3, 8), dtype=torch.int8), torch.randint(-8, 9, (8, 5), dtype=torch.int8)
    assert torch.equal(saturating(x, w).long(), x.long() @ w.long())  # no saturation with small weights
    rows = tool.int8_gemm_check()
    monkeypatch.setattr(torch, "_int_mm", real)
    by_case = {(g["weights_max"], g["activations_max"]): g for g in rows}
    assert by_case[(127, 127)]["int_mm_max_abs_diff"] > 1000 and by_case[(8, 127)]["int_mm_max_abs_diff"] == 0
    out = tmp_path / "qc"
    tool.write(out, {"machine": tool.machine(), "command": "test", "runs": [], "int8_gemm": exact})
    for isa in (None, "AVX2", None):
        if isa:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        else:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        monkeypatch.setattr("sys.argv", ["quant_compile_check.py", "--gemm-only", "--out", str(out)])
        tool.main()
    got = json.loads((out / "result.json").read_text())["int8_gemm_machines"]
    assert [e["onednn_max_cpu_isa"] for e in got] == ["AVX2", None]
    assert "ONEDNN_MAX_CPU_ISA" in (out / "README.md").read_text()
