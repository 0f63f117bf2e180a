"""The committed escape and late-sink numbers equal a recomputation from their per-run files, written here without
the library's summary code: escape steps and onsets from the packed probes (read by hand with numpy, as
docs/results/README.md says a reader can), then the Kaplan-Meier medians, the lag signs and the paired sign
counts; the late-sink primary from each run's val.json."""

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _first_from(steps: list[int], holds: list[bool]) -> tuple[int, bool]:
    """The first step from which `holds` is true at every later probe; censored at the last probe otherwise."""
    for i, s in enumerate(steps):
        if all(holds[i:]):
            return s, False
    return steps[-1], True


@pytest.fixture(scope="module")
def escape():
    study = RESULTS / "escape"
    if not (study / "per_run.npz").is_file():
        pytest.skip("the escape study's pack is not in this checkout")
    results = json.loads((study / "results.json").read_text())
    declared = results["declared"]["escape"]
    runs = {}
    with np.load(study / "per_run.npz") as z:
        for name, v in results["variants"].items():
            for seed in v["seeds"]:
                key = f"runs/{name}-s{seed}/escape/probes.json"
                slim = json.loads((study / key).read_text())
                steps = z[f"{key}:step"].tolist()
                loss = z[f"{key}:probe:loss"]
                mass = z[f"{key}:probe:detected_sink_mass"][:, declared["onset_first_layer"]:].max(1)
                threshold = slim["plateau"]["probe_cross_entropy"] - declared["margin"]
                runs[name, seed] = (_first_from(steps, list(loss < threshold)),
                                    _first_from(steps, list(mass >= declared["onset_mass"])))
    return results, runs


def test_the_escape_medians_lag_signs_and_paired_counts_match_a_recomputation(escape):
    results, runs = escape
    esc = results["escape"]
    for name, v in results["variants"].items():
        e = {s: runs[name, s][0] for s in v["seeds"]}
        o = {s: runs[name, s][1] for s in v["seeds"]}
        escaped = sorted(step for step, c in e.values() if not c)
        assert all(c_step >= escaped[-1] for c_step, c in e.values() if c)  # every censoring after every escape,
        assert esc["km"][name]["median"] == escaped[len(e) // 2 - 1]  # so S(t) = (#escaped after t) / n exactly
        pos = sum((ec and not oc) or (not ec and not oc and es > os) for (es, ec), (os, oc) in zip(e.values(), o.values()))
        neg = sum((oc and not ec) or (not ec and not oc and es < os) for (es, ec), (os, oc) in zip(e.values(), o.values()))
        signs = esc["onset_lag"][name]["signs"]
        assert (signs["positive"], signs["negative"]) == (pos, neg)
        assert signs["p"] == pytest.approx(stats.binomtest(pos, pos + neg).pvalue)
    for t in esc["tests"]:  # later / earlier: both escaped and ordered, or one censored at or after the other's escape
        a, b = t["pair"]
        later = earlier = 0
        for s in results["variants"][a]["seeds"]:
            (ea, ca), (eb, cb) = runs[a, s][0], runs[b, s][0]
            later += (not ca and not cb and ea > eb) or (ca and not cb and ea >= eb)
            earlier += (not ca and not cb and ea < eb) or (cb and not ca and eb >= ea)
        assert (t["plus"], t["minus"]) == (later, earlier)


def test_the_late_sink_primary_and_its_null_reading_match_a_recomputation():
    study = RESULTS / "late-sink"
    results = json.loads((study / "results.json").read_text())
    p = results["primary"]
    a, b = p["pair"]
    val = lambda run: json.loads((study / "runs" / run / "val.json").read_text())["val_loss"]  # noqa: E731
    d = np.array([val(f"{a}-s{s}") - val(f"{b}-s{s}") for s in results["seeds"]])
    walsh = [(d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d))]
    assert p["rank"]["estimate"] == pytest.approx(np.median(walsh))
    assert p["rank"]["p"] == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)
    low, high = stats.t.interval(0.90, len(d) - 1, d.mean(), d.std(ddof=1) / np.sqrt(len(d)))
    assert p["posthoc_margin"] == pytest.approx(max(abs(low), abs(high)))
    assert p["bound"] == pytest.approx(max(abs(p["rank"]["low"]), abs(p["rank"]["high"])))
    assert not p["inconclusive"] and p["t"]["mde"] < p["sized_for"]
