"""The quantization endpoint (experiment/endpoints/quant, docs/method.md §16) against references written here:

* the per-run measurement: Δ_quant of each scheme equals a direct computation (the tiny model quantized here with
  torchao's own `quantize_` and config, the fixed validation scored both ways with `validation_elbo`), exactly; the
  FFN ∞-norm per layer equals the max |FFN output| read by a hook written here;
* the summary on hand-made per-run records: each arm's interval and the primary's paired t interval against a
  direct Student t computation, the primary's Wilcoxon against scipy's exact test, the secondary family's
  Benjamini-Hochberg p-values and its "no difference detected" where nothing survives;
* without torchao the endpoint refuses in one line at plan time, before any training.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from scipy import stats as sps

from helpers import tiny_model
from numerics import assert_model_close
from sinkdlm.experiment.endpoints.quant.summary import quant_summary
from sinkdlm.experiment.presets import Quantization, Validation, get_preset

SCHEMES = ("int8-dynamic", "int8-weight")


def _torchao_config(scheme):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig

    return Int8DynamicActivationInt8WeightConfig() if scheme == "int8-dynamic" else Int8WeightOnlyConfig()


class _Preset:
    """What the measurement reads of a preset: the fixed validation and the declaration."""

    validation = Validation(tokens=6 * 16, draws=4, noise_seed=3, batch_size=8)
    quantization = Quantization(pair=("sink1-front", "vanilla"), schemes=SCHEMES)


def test_the_per_run_measurement_equals_a_direct_computation(tmp_path, monkeypatch):
    pytest.importorskip("torchao")
    from torchao.quantization import quantize_

    from sinkdlm.diffusion.likelihood import validation_elbo
    from sinkdlm.experiment import fixed_set
    from sinkdlm.experiment.endpoints.quant.measure import QUANT, measure_quant, quant_record

    model = tiny_model(num_sink_tokens=1, initializer_range=0.05, hidden_size=64, intermediate_size=128).float()
    x0 = torch.randint(0, model.config.vocab_size - 1, (6, 16), generator=torch.Generator().manual_seed(0))
    # the loader is `units.fixed_validation`'s own (tested there): here it hands over this model and set
    monkeypatch.setattr(fixed_set, "validation_inputs", lambda *a, **k: (copy.deepcopy(model), x0))
    v = _Preset.validation
    got = measure_quant(tmp_path, "unused", {}, _Preset, None)
    assert json.loads((tmp_path / QUANT).read_text()) == json.loads(json.dumps(got))  # kept on disk

    with torch.inference_mode():
        ref = validation_elbo(model, x0, v.draws, v.noise_seed, batch_size=v.batch_size).values  # [N, D]
    assert got["val_loss"] == float(ref.mean())  # the same call on the same model and inputs
    for scheme in SCHEMES:
        q = copy.deepcopy(model)
        quantize_(q, _torchao_config(scheme), filter_fn=lambda m, fqn: isinstance(m, torch.nn.Linear)
                  and fqn.startswith("layers."))
        with torch.inference_mode():
            values = validation_elbo(q, x0, v.draws, v.noise_seed, batch_size=v.batch_size).values
        s = got["schemes"][scheme]
        # exact: the same torchao kernels on the same quantized weights, shapes and masked inputs
        assert s["delta"] == float((values - ref).mean())
        assert s["val_loss"] == float(values.mean()) and s["reference_val_loss"] == float(ref.mean())
        assert s["delta"] != 0.0  # int8 changed the loss

    # the FFN ∞-norm per layer: max |mlp output| over the clean validation rows (content) and the sink stream
    seen = [0.0] * model.config.num_hidden_layers
    hooks = [layer.mlp.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, max(seen[i], float(out.abs().max()))))
             for i, layer in enumerate(model.layers)]
    with torch.no_grad():
        model(x0)  # every row real: the content rows, and the sink's own rows
    for h in hooks:
        h.remove()
    rec = quant_record(tmp_path / QUANT)
    # rule 2: the sink rows come from the sink stream there, from the whole forward here (other matmul shapes)
    assert_model_close(torch.tensor(rec["ffn_inf_norm"]), torch.tensor(seen), model.config)
    assert rec["ffn_inf_norm_max"] == max(rec["ffn_inf_norm"]) and rec["ffn_inf_norm_sink"] is not None
    assert set(rec["schemes"]) == set(SCHEMES)


def _records(label, deltas, inf, seeds):
    return {"label": label, "switches": {},
            "seeds": {str(s): {"val_loss": 5.0, "quant": {
                "schemes": {sc: {"val_loss": 5.0 + d[sc], "delta": d[sc], "delta_se": 0.001} for sc in SCHEMES},
                "val_loss": 5.0, "ffn_inf_norm": [n / 2, n], "ffn_inf_norm_max": n, "ffn_outlier_channels": 0}}
                for s, d, n in zip(seeds, deltas, inf)}}


def _results(seeds):
    rng = np.random.default_rng(4)
    n = len(seeds)
    van = [{sc: 0.05 + rng.normal(0, 0.01) for sc in SCHEMES} for _ in range(n)]
    sink = [{sc: van[i][sc] - 0.02 + rng.normal(0, 0.005) for sc in SCHEMES} for i in range(n)]
    gated = [{sc: van[i][sc] + rng.normal(0, 0.01) for sc in SCHEMES} for i in range(n)]
    inf = {k: list(10 + rng.normal(0, 1, n)) for k in ("vanilla", "sink1-front", "gated")}
    variants = {"vanilla": _records("DLM", van, inf["vanilla"], seeds),
                "sink1-front": _records("DLM + 1 sink", sink, inf["sink1-front"], seeds),
                "gated": _records("DLM + GA", gated, inf["gated"], seeds)}
    declared = get_preset("quant").declared()
    return {"preset": "quant", "seeds": seeds, "variants": variants, "declared": declared}, van, sink


def test_the_summary_against_a_direct_paired_t_computation():
    seeds = list(range(500, 510))
    res, van, sink = _results(seeds)
    q = quant_summary(res, seeds_declared=seeds)
    assert q["complete"] and q["seeds_in"] == seeds

    def t_interval(x):
        x = np.asarray(x)
        half = sps.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
        return x.mean(), x.mean() - half, x.mean() + half

    for arm, recs in (("vanilla", van), ("sink1-front", sink)):  # each arm's Δ_quant over seeds
        for sc in SCHEMES:
            mean, low, high = t_interval([r[sc] for r in recs])
            got = q["arms"][arm]["schemes"][sc]
            assert (got["mean"], got["low"], got["high"]) == (pytest.approx(mean), pytest.approx(low), pytest.approx(high))
    d = np.array([s["int8-dynamic"] - v["int8-dynamic"] for s, v in zip(sink, van)])  # the primary, paired by seed
    p = q["primary"]
    mean, low, high = t_interval(d)
    assert (p["t"]["mean"], p["t"]["low"], p["t"]["high"]) == (pytest.approx(mean), pytest.approx(low), pytest.approx(high))
    assert p["t"]["p"] == pytest.approx(sps.ttest_1samp(d, 0).pvalue)
    assert p["rank"]["p"] == pytest.approx(sps.wilcoxon(d, method="exact").pvalue)
    assert p["rejects"] and p["decided"] and p["rank"]["estimate"] < 0  # a sink that lowers Δ_quant by 0.02, sd 0.005
    # the secondary family: gated - vanilla under int8-dynamic, every pair under int8-weight, every pair's ∞-norm
    fam = q["secondary"]
    assert [(t["pair"], t["metric"]) for t in fam] == [
        (["gated", "vanilla"], "delta:int8-dynamic"), (["sink1-front", "vanilla"], "delta:int8-weight"),
        (["gated", "vanilla"], "delta:int8-weight"), (["sink1-front", "vanilla"], "ffn_inf_norm_max"),
        (["gated", "vanilla"], "ffn_inf_norm_max")]
    want = sps.false_discovery_control([t["p"] for t in fam], method="bh")
    assert [t["p_adjusted"] for t in fam] == pytest.approx(list(want))
    for t in fam:
        assert t["survives"] == (t["p_adjusted"] < 0.05 and t["adjusted"]["excludes_zero"])
        assert t["survives"] or t["verdict"] == "no difference detected"
    gv = fam[0]  # gated = vanilla + noise: nothing to find
    assert not gv["survives"] and gv["verdict"] == "no difference detected"
    from sinkdlm.experiment.endpoints.quant.report import quant_answer_line

    line = quant_answer_line({**res, "quant": q})
    assert "**smaller**" in line and line.count(".") >= 1


def test_interim_and_one_seed_say_no_difference():
    from sinkdlm.experiment.endpoints.quant.report import quant_answer_line

    res, _, _ = _results([510])
    q = quant_summary(res, seeds_declared=[510, 511, 512])
    assert not q["complete"] and not q["primary"]["decided"]
    assert "no difference detected, interim: 1 of 3 seeds" in quant_answer_line({**res, "quant": q})
    assert "no run shows an FFN outlier channel" in quant_answer_line({**res, "quant": q})  # the fallback, with the ∞-norms


def test_without_torchao_the_plan_refuses_in_one_line(tmp_path, monkeypatch):
    """Simulated: `import torchao` fails. The refusal comes before --out is touched (no training)."""
    import sys

    from sinkdlm.config.commands import ExperimentConfig
    from sinkdlm.experiment.runner import run_experiment

    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao` raises ImportError
    out = tmp_path / "q"
    with pytest.raises(ValueError) as err:
        run_experiment(ExperimentConfig(preset="quant-pilot", out=str(out), max_steps=2))
    msg = str(err.value)
    assert "\n" not in msg and "sinkdlm[quant]" in msg and ".venv-quant" in msg
    assert not out.exists()
