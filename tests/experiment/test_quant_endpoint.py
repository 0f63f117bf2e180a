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
from sinkdlm.stats import minimum_detectable_effect
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
    declared["quantization"]["sized_for"] = None  # a study that sized nothing (`_planted` sets one)
    return {"preset": "quant", "seeds": seeds, "variants": variants, "declared": declared}, van, sink


def test_the_study_is_sized_before_its_runs_and_its_pilot_is_not():
    """`quant` declares the effect its seeds were sized for (the pilot's spread, docs/method.md §16); the pilot
    that sized it declares none, so its report stays "not sized"."""
    assert get_preset("quant").quantization.sized_for == 0.001
    assert get_preset("quant-pilot").quantization.sized_for is None
    assert get_preset("quant-pilot").quantization.pair == get_preset("quant").quantization.pair


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
    # its MDE: the paired t test's at 80 % power, two-sided 5 %, from the planted differences' own spread
    assert p["mde"] == pytest.approx(minimum_detectable_effect(d.std(ddof=1) / np.sqrt(len(d)), len(d) - 1))
    assert not p["inconclusive"] and p["sized_for"] is None
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
        # each row's MDE at the level its interval is given at (the false-coverage-adjusted one)
        x = np.array(list(t["per_seed"].values()))
        assert t["mde"] == pytest.approx(minimum_detectable_effect(x.std(ddof=1) / np.sqrt(len(x)), len(x) - 1,
                                                                   alpha=1 - t["adjusted"]["confidence"]))
        # the preset sized nothing: a row that does not survive is inconclusive, with its MDE
        assert t["survives"] or t["verdict"].startswith(f"inconclusive (MDE {t['mde']:.3g} ")
    gv = fam[0]  # gated = vanilla + noise: nothing to find
    assert not gv["survives"] and gv["inconclusive"] and "the study was not sized for an effect" in gv["verdict"]
    from sinkdlm.experiment.endpoints.quant.report import quant_answer_line

    line = quant_answer_line({**res, "quant": q})
    assert "**smaller**" in line and f"(MDE {p['mde']:.3g} nats)" in line


def test_interim_and_one_seed_say_no_difference():
    from sinkdlm.experiment.endpoints.quant.report import quant_answer_line

    res, _, _ = _results([510])
    q = quant_summary(res, seeds_declared=[510, 511, 512])
    assert not q["complete"] and not q["primary"]["decided"]
    assert q["primary"]["inconclusive"] and q["primary"]["mde"] is None
    assert "inconclusive, interim: 1 of 3 seeds (no MDE)" in quant_answer_line({**res, "quant": q})
    assert all(t["verdict"] == "inconclusive (interim)" for t in q["secondary"])
    assert "no run shows an FFN outlier channel" in quant_answer_line({**res, "quant": q})  # the fallback, with the ∞-norms


def _planted(sink_minus_vanilla, gated_minus_vanilla, sized_for):
    """A complete study of len(...) seeds whose + 1 sink and gated Δ_quant differ from vanilla's by the planted
    per-seed differences (both schemes), the declared effect the seeds were sized for set to `sized_for`."""
    seeds = list(range(500, 500 + len(sink_minus_vanilla)))
    rng = np.random.default_rng(7)
    van = [{sc: 0.05 + rng.normal(0, 0.01) for sc in SCHEMES} for _ in seeds]
    sink = [{sc: v[sc] + d for sc in SCHEMES} for v, d in zip(van, sink_minus_vanilla)]
    gated = [{sc: v[sc] + d for sc in SCHEMES} for v, d in zip(van, gated_minus_vanilla)]
    inf = {k: list(10 + rng.normal(0, 1, len(seeds))) for k in ("vanilla", "sink1-front", "gated")}
    declared = get_preset("quant").declared()
    declared["quantization"]["sized_for"] = sized_for
    res = {"preset": "quant", "seeds": seeds, "declared": declared,
           "variants": {"vanilla": _records("DLM", van, inf["vanilla"], seeds),
                        "sink1-front": _records("DLM + 1 sink", sink, inf["sink1-front"], seeds),
                        "gated": _records("DLM + GA", gated, inf["gated"], seeds)}}
    q = quant_summary(res, seeds_declared=seeds)
    assert q["complete"]
    return res, q


def test_a_test_that_detects_nothing_is_worded_by_its_mde_against_sized_for(tmp_path):
    """Planted differences around 0 (sd 0.005): "no difference detected (MDE .., sized for ..)" where the MDE is at
    or below the declared `sized_for`, "inconclusive" where it is above or nothing was declared."""
    from sinkdlm.experiment.endpoints.quant.report import quant_answer_line

    d = np.random.default_rng(11).normal(0, 0.005, 10)
    d -= d.mean() - 0.0004  # centred near 0: the Wilcoxon test cannot reject
    mde = minimum_detectable_effect(d.std(ddof=1) / np.sqrt(len(d)), len(d) - 1)
    for sized_for, detected in ((2 * mde, True), (1.001 * mde, True), (mde / 2, False), (None, False)):
        res, q = _planted(list(d), list(d[::-1]), sized_for)
        p = q["primary"]
        assert not p["rejects"] and not p["decided"] and p["sized_for"] == sized_for
        assert p["mde"] == pytest.approx(mde, rel=1e-9)
        assert p["inconclusive"] == (not detected)
        line = quant_answer_line({**res, "quant": q})
        assert "**" not in line.split("**", 2)[2]  # no direction said (the bold is the question's)
        if detected:
            assert f": no difference detected (MDE {p['mde']:.3g} nats, sized for {sized_for:g})" in line
        elif sized_for is None:
            assert f": inconclusive (MDE {p['mde']:.3g} nats; the study was not sized for an effect)" in line
        else:
            assert f": inconclusive (MDE {p['mde']:.3g} nats, above the {sized_for:g} the study was sized for)" in line
        # the secondaries of Δ_quant use the same rule at their adjusted level; an ∞-norm row was sized for nothing
        for t in q["secondary"]:
            assert not t["survives"] or t["metric"] == "ffn_inf_norm_max"
            sized = sized_for if t["metric"].startswith("delta:") else None
            if not t["survives"]:
                assert t["inconclusive"] == (sized is None or t["mde"] > sized)
                assert t["verdict"].startswith("inconclusive" if t["inconclusive"] else "no difference detected")
        # the section states the MDE and what the seeds were sized for
        from sinkdlm.experiment.endpoints.quant.report import quant_section
        from sinkdlm.reporting import Document

        doc = Document("t")
        quant_section(doc, {**res, "quant": q}, tmp_path)
        text = " ".join(b for kind, b in doc.blocks if kind == "paragraph")
        assert f"Minimum detectable effect of the primary: MDE {p['mde']:.3g} nats" in text


@pytest.mark.parametrize("constant", [0.0, -0.02])
def test_a_zero_variance_is_inconclusive(constant):
    """Every seed's difference alike (+ 1 sink = vanilla + a constant, exactly): no variance, no MDE, no direction,
    whatever the exact Wilcoxon test says (ten differences of one sign give it p = 1/512), even where the MDE
    would have been far below `sized_for`."""
    from sinkdlm.experiment.endpoints.quant.report import quant_answer_line

    res, q = _planted([constant] * 10, [constant] * 10, 0.05)
    p = q["primary"]
    assert p["degenerate"] and p["mde"] is None and not p["decided"] and p["inconclusive"]
    line = quant_answer_line({**res, "quant": q})
    assert "**smaller**" not in line and "**larger**" not in line
    want = ("inconclusive (the Wilcoxon test rejects, but no variance; no MDE: no variance, sized for 0.05)"
            if constant else "inconclusive (no variance: every seed's difference alike, so no MDE)")
    assert p["rejects"] == bool(constant) and want in line
    for t in q["secondary"]:
        if t["metric"].startswith("delta:"):  # gated − vanilla and + 1 sink − vanilla: the planted constant
            assert t["mde"] is None and t["inconclusive"] and not t["survives"]
            assert t["verdict"] == "inconclusive (no variance: every seed's difference alike, so no MDE)"


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


def test_content_positions_and_sink_rows_are_summarised_apart(tmp_path):
    """An outlier that moves onto the sink row (SmolLM2's conversion: content 20,656 -> 1,253, the sink 22,802) must
    show: each arm's per-layer FFN ∞-norm over content positions and over sink rows, each the mean over seeds, and
    the largest over content positions per seed; the report's table gives that column and the figure draws both."""
    from sinkdlm.experiment.endpoints.quant.report import quant_section
    from sinkdlm.reporting import Document

    seeds = [500, 501]
    res, _, _ = _results(seeds)
    content = {500: [3.0, 40.0], 501: [5.0, 20.0]}
    sink = {500: [900.0, 1.0], 501: [700.0, 3.0]}
    for s in seeds:
        q = res["variants"]["sink1-front"]["seeds"][str(s)]["quant"]
        q.update(ffn_inf_norm_content=content[s], ffn_inf_norm_sink=sink[s],
                 ffn_inf_norm=[max(a, b) for a, b in zip(content[s], sink[s])])
        q["ffn_inf_norm_max"] = max(q["ffn_inf_norm"])
    q = quant_summary(res, seeds_declared=seeds)
    arm = q["arms"]["sink1-front"]
    assert [v["mean"] for v in arm["ffn_inf_norm_content"]] == pytest.approx([4.0, 30.0])
    assert [v["mean"] for v in arm["ffn_inf_norm_sink"]] == pytest.approx([800.0, 2.0])
    assert arm["ffn_inf_norm_content_max"]["mean"] == pytest.approx(np.mean([40.0, 20.0]))
    assert arm["ffn_inf_norm_max"]["mean"] == pytest.approx(800.0)
    assert q["arms"]["vanilla"]["ffn_inf_norm_sink"] == []  # no sink rows: nothing drawn dashed
    doc = Document("quant")
    quant_section(doc, {**res, "quant": q}, tmp_path)
    text = doc.to_markdown(tmp_path)
    assert "on content positions" in text and "30.00" in text
    assert (tmp_path / "figures" / "quant.png").is_file()
