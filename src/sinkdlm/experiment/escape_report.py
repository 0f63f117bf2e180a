"""The escape endpoint in the report (issue 54, docs/method.md §11): formats results.json's `escape`
(`experiment.escape_summary` computed every number) and draws its figures (`experiment.escape_figures`).

`escape_verdict_line` is the one sentence (a direction only where the adjusted test rejects and its interval
excludes 0, and only once the declared seeds are in: "interim: k of N seeds" before); `escape_section` adds to
the report the declared tests, the Kaplan-Meier figure, the onset / lag tables and one figure per run (linked,
not embedded: a study has dozens of runs), each drawn from the run's `probes.json` and metrics log where they
are still on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sinkdlm.reporting import Document
from sinkdlm.stats import mean_interval, signed


def _label(results: dict[str, Any], name: str) -> str:
    return results["variants"][name]["label"]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _log2_ci(t: dict[str, Any]) -> str:
    """"-0.42 [-1.10, +0.31]" of a test's log2 ratio; an unbounded side (censoring) is ±∞."""
    if t.get("estimate") is None:
        return "–"
    low = "−∞" if t.get("low") is None else signed(t["low"], 2)
    high = "+∞" if t.get("high") is None else signed(t["high"], 2)
    return f"{signed(t['estimate'], 2)} [{low}, {high}]"


def _ratio_ci(t: dict[str, Any]) -> str:
    r = t.get("ratio") or {}
    if r.get("estimate") is None:
        return "–"
    low = "0" if r.get("low") is None else f"{r['low']:.2f}"
    high = "∞" if r.get("high") is None else f"{r['high']:.2f}"
    return f"{r['estimate']:.2f}× [{low}, {high}]"


def _interim(esc: dict[str, Any]) -> str | None:
    if esc.get("complete"):
        return None
    return f"interim: {len(esc.get('seeds_in') or [])} of {len(esc.get('seeds_declared') or [])} seeds"


def _test_words(results: dict[str, Any], t: dict[str, Any], esc: dict[str, Any]) -> str:
    """What one test says, by the project rule: a direction only when `decided` (the summary's rule)."""
    a = _label(results, t["pair"][0])
    interim = _interim(esc)
    if interim:
        return f"no verdict ({interim})"
    if t.get("decided"):
        return f"{a} leaves the plateau **{'earlier' if t['estimate'] < 0 else 'later'}**"
    mde = f"; MDE {t['mde']:.2f} log2" if t.get("mde") is not None else ""
    return f"no difference detected (inconclusive with {t['seeds']} seeds{mde})"


def escape_verdict_line(results: dict[str, Any]) -> str | None:
    """The declared escape primary (and its secondaries) in one sentence."""
    esc = results.get("escape") or {}
    tests = esc.get("tests") or []
    if not tests:
        return None
    said = []
    for t in tests:
        a, b = (_label(results, n) for n in t["pair"])
        p = "–" if t.get("p") is None else f"{t['p']:.3g}"
        q = t.get("p_adjusted")
        adj = "" if t["primary"] else ", Bonferroni-adjusted p = " + ("–" if q is None else f"{q:.3g}")
        said.append(f"{'primary' if t['primary'] else 'secondary'} {a} / {b}: log2 ratio of escape steps "
                    f"{_log2_ci(t)} (ratio {_ratio_ci(t)}; censored exact sign test over {t['seeds']} seeds, p = {p}{adj}): "
                    + _test_words(results, t, esc))
    head = "**Escape from the unigram plateau**" + (f" ({_interim(esc)})" if _interim(esc) else "")
    return head + ": " + "; ".join(said) + "."


def _lag_words(g: dict[str, Any], arms: int, decide: bool) -> str:
    """One arm's lag in words: its mean with a t interval over its runs (both steps observed) at 95 % Bonferroni-
    adjusted over the `arms` it is said beside, and, where `decide` (every declared seed in), what that interval
    says: a direction only where it excludes 0; no spread is inconclusive."""
    d = list(g.get("per_seed") or [])
    if not d:
        return "no run with both steps"
    if len(d) == 1:
        return f"{d[0]:+,.0f} steps (one run: no interval)"
    iv = mean_interval(d, 1 - 0.05 / arms)
    if iv.degenerate:
        return f"{iv.mean:+,.0f} steps on all {len(d)} runs (no spread: inconclusive)"
    text = _lag_ci({"mean": iv.mean, "low": iv.low, "high": iv.high}) + f" steps ({len(d)} runs)"
    if decide:
        text += (": the sinks form first, the plateau ends later" if iv.low > 0 else
                 ": the plateau ends first, the sinks form later" if iv.high < 0 else ": no lag detected")
    return text


def _lag_difference_words(d: dict[str, Any], a: str, bold: bool = False) -> str:
    """What a paired lag difference says once every seed is in: a direction where it is decided; no spread
    (every seed the same difference) is inconclusive, not "no difference"."""
    if d.get("decided"):
        word = "shorter" if d["mean"] < 0 else "longer"
        return f"the lag is {'**' + word + '**' if bold else word} with {a}"
    if d.get("low") is None and d.get("seeds", 0) >= 2:
        return "inconclusive (no spread over the seeds: no interval)"
    return "no difference detected"


def escape_answer_line(results: dict[str, Any]) -> str | None:
    """The question the escape study asks, answered in plain words from results.json's `escape` alone: when each
    arm leaves the plateau (Kaplan-Meier medians, runs still on it), what the declared primary says, whether the
    plateau ends when the sinks form (the lag under the declared onset and under the exploratory first-reach
    onset, labelled so) and whether a sink token moves that moment; then what is not known."""
    esc = results.get("escape") or {}
    km, lags = esc.get("km") or {}, esc.get("onset_lag") or {}
    if not km or not esc.get("tests"):
        return None
    interim = _interim(esc)
    n_in = len(esc.get("seeds_in") or [])
    head = (f"**When does the DLM leave the unigram plateau, and do its sinks form first?** ({n_in} seeds"
            + (f"; {interim}, no verdict" if interim else "") + "). ")
    medians = "; ".join(
        f"{_label(results, n)} {format(k['median'], ',') if k.get('median') is not None else 'not reached'} "
        f"({k['n'] - k['escaped']} of {k['n']} runs censored)" for n, k in km.items())
    text = head + (f"Median escape step (Kaplan-Meier; a censored run was still on the plateau at its last probe): "
                   f"{medians}. ")
    primary = next((t for t in esc["tests"] if t["primary"]), None)  # None: a shard without the primary's arms
    if primary is not None:
        a, b = (_label(results, x) for x in primary["pair"])
        text += (f"The declared test, {a} against {b}: ratio of escape steps {_ratio_ci(primary)}, "
                 f"{_test_words(results, primary, esc).replace('**', '')}. ")
    reached = esc.get("onset_lag_exploratory") or {}
    declared = results.get("declared", {}).get("escape") or {}
    mark = declared.get("onset_mass", "–")
    level = f"mean [t interval over the runs, 95 % Bonferroni-adjusted over {len(lags)} arms]"
    if lags:
        seen = ", ".join(f"{_label(results, n)} {g['runs'] - g.get('onset_censored', 0)} of {g['runs']}"
                         for n, g in lags.items())
        text += (f"The declared sink onset (the largest attention mass on detected sinks in a layer ≥ "
                 f"{declared.get('onset_first_layer', 0)} staying at or above {mark}) was seen on {seen} runs; "
                 f"the lag escape − onset ({level}): "
                 + "; ".join(f"{_label(results, n)} {_lag_words(g, len(lags), not interim)}" for n, g in lags.items())
                 + ". ")
    if reached:
        text += (f"Exploratory (not declared), the onset as the first probe where that mass reaches {mark}: "
                 + "; ".join(f"{_label(results, n)} at median step {_steps(g.get('onset_median'))}, lag "
                             f"{_lag_words(g, len(reached), not interim)}" for n, g in reached.items()) + ". ")
    moved = [d for d in esc.get("lag_differences") or [] if d.get("seeds")]
    if moved:
        text += "Does a sink token move that moment (paired lag difference, declared onset, Bonferroni): " + "; ".join(
            f"{_label(results, d['pair'][0])} − {_label(results, d['pair'][1])} {_lag_ci(d)} steps over {d['seeds']} "
            f"seed{'s' if d['seeds'] != 1 else ''}, "
            + (f"no verdict ({interim})" if interim else _lag_difference_words(d, _label(results, d["pair"][0])))
            for d in moved) + ". "
    text += ("Not known: whether any of this holds beyond the tiny model, this corpus and this schedule (one of "
             "each here), and what sets the escape step when it is not the sinks.")
    return text


def escape_tests_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Each declared pair's censored sign test: the counts (censored pairs included), the estimate with its
    interval and exact coverage, p (adjusted for the secondaries), the MDE and what it says."""
    esc = results.get("escape") or {}
    rows = []
    for t in esc.get("tests") or []:
        a, b = (_label(results, n) for n in t["pair"])
        censored = sum(any(c) for c in (t.get("censored") or {}).values())
        coverage = f"{100 * t['confidence']:.1f} % (exact {_pct(t.get('exact_confidence'))})"
        p = "–" if t.get("p") is None else f"{t['p']:.3g}"
        if not t["primary"] and t.get("p_adjusted") is not None:
            p += f" (adjusted {t['p_adjusted']:.3g})"
        rows.append([f"{a} / {b}", "primary" if t["primary"] else "secondary", str(t["seeds"]),
                     f"{t['plus']} / {t['minus']} / {t['ties']} / {t['undetermined']}", str(censored),
                     _log2_ci(t), coverage, _ratio_ci(t), p, "–" if t.get("mde") is None else f"{t['mde']:.2f}",
                     _test_words(results, t, esc)])
    if not rows:
        return None
    return (["arm / baseline", "role", "seeds", "later / earlier / ties / undetermined", "pairs with a censored run",
             "median log2 ratio [interval]", "interval level", "ratio of escape steps", "p", "MDE (log2, 80 %)",
             "verdict"], rows)


def _lag_ci(g: dict[str, Any]) -> str:
    """"+300 [+120, +480]" of a stored lag interval; one value, or no spread, says so."""
    if g.get("mean") is None:
        return "–"
    text = f"{g['mean']:+,.0f}"  # steps, as the other columns print them
    if g.get("low") is not None and g.get("high") is not None:
        return text + f" [{g['low']:+,.0f}, {g['high']:+,.0f}]"
    return text + (" (no spread: no interval)" if len(g.get("per_seed") or []) >= 2 else " (one run: no interval)")


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def _steps(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def escape_lag_table(results: dict[str, Any], key: str = "onset_lag") -> tuple[list[str], list[list[str]]] | None:
    """Per arm: runs, escapes and onsets observed, the median onset and escape steps, and the lag
    (escape − onset, runs with both observed) with its t interval over seeds. `key`: "onset_lag_exploratory" for
    the onset as the first probe where the mass reaches the mark."""
    esc = results.get("escape") or {}
    lags = esc.get(key) or {}
    km = esc.get("km") or {}
    rows = []
    for name, g in lags.items():
        n = g.get("runs", len(g.get("per_seed") or []))
        iv = _lag_ci(g)
        rows.append([_label(results, name), str(n), f"{n - g.get('escape_censored', 0)} of {n}",
                     f"{n - g.get('onset_censored', 0)} of {n}", _steps(g.get("onset_median")),
                     _steps(g.get("escape_median")), _steps((km.get(name) or {}).get("median")),
                     iv + (f" ({_runs(len(g['per_seed']))})" if len(g.get("per_seed") or []) != 1 else ""), f"{g.get('onset_first', 0)} of {len(g.get('per_seed') or [])}"])
    if not rows:
        return None
    return (["arm", "runs", "escaped", "sink onset seen", "median onset step", "median escape step (escaped runs)",
             "Kaplan-Meier median escape step", "lag escape − onset, mean [95 % CI] (steps)",
             "onset at or before the escape"], rows)


def escape_lag_difference_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The paired difference of lags between the declared pairs' arms (seeds with both lags)."""
    esc = results.get("escape") or {}
    rows = []
    for d in esc.get("lag_differences") or []:
        a, b = (_label(results, n) for n in d["pair"])
        iv = _lag_ci(d)
        if _interim(esc):
            word = f"no verdict ({_interim(esc)})"
        else:
            word = _lag_difference_words(d, a, bold=True)
        rows.append([f"{a} − {b}", str(d["seeds"]), iv, f"{100 * d['confidence']:.1f} %", word])
    if not rows:
        return None
    return ["lag difference (steps)", "seeds", "mean [interval] (t over seeds)", "level (Bonferroni)", "verdict"], rows


def _draw_runs(results: dict[str, Any], out: Path, fig_dir: Path) -> tuple[list[str], int]:
    """One figure per run with an escape record whose probes.json is still on disk: markdown links, and how
    many runs had none to draw from."""
    from sinkdlm.experiment.escape_figures import plot_escape_run
    from sinkdlm.training.rundir import read_metrics

    declared = (results.get("declared") or {}).get("escape") or {}
    links, missing = [], 0
    for name, v in results["variants"].items():
        drawn = []
        for seed, rec in sorted(v["seeds"].items(), key=lambda kv: int(kv[0])):
            if not rec.get("escape"):
                continue
            run = out / "runs" / f"{name}-s{seed}"
            probes = run / "escape" / "probes.json"
            if not probes.is_file():
                missing += 1
                continue
            path = plot_escape_run(rec["escape"], json.loads(probes.read_text()), read_metrics(run / "train"),
                                   f"{v['label']}, seed {seed}", fig_dir / "escape_runs" / f"{name}-s{seed}.png",
                                   onset_mass=declared.get("onset_mass"),
                                   onset_first_layer=declared.get("onset_first_layer", 0))
            if path:
                drawn.append(f"[{seed}]({path.relative_to(out).as_posix()})")
        if drawn:
            links.append(f"{v['label']}: seeds " + ", ".join(drawn))
    return links, missing


def escape_section(doc: Document, results: dict[str, Any], out: Path) -> None:
    """The report's escape section (nothing when results.json has no `escape`)."""
    from sinkdlm.experiment.escape_figures import plot_escape_km

    esc = results.get("escape") or {}
    declared = (results.get("declared") or {}).get("escape") or {}
    if not esc.get("tests") and not esc.get("km"):
        return
    out = Path(out)
    doc.heading("Escape from the unigram plateau (declared endpoint, docs/method.md §11)")
    doc.paragraph(
        f"Every run is probed every {declared.get('every', '–')} steps on a fixed set ({declared.get('sequences', '–')} "
        f"validation rows, {declared.get('draws', '–')} masking draws each); it has escaped at the first probe from "
        f"which its probe loss stays below the unigram plateau minus {declared.get('margin', '–')} nats, and a run "
        "still above at its last probe is censored there. Declared before the runs: the primary is the log2 ratio "
        "of escape steps (arm / baseline, < 0: the arm escapes earlier) by the censored exact sign test at 5 %, "
        f"tested once; the secondaries are adjusted by {esc.get('adjustment', {}).get('secondary', 'Bonferroni')}. "
        "The interval is the sign test's order-statistic interval taken on the censored pairs' bounds, so it covers "
        "at least at its level (its exact level beside it) and may be unbounded on a side. A direction is stated only "
        "when the adjusted test rejects and the interval excludes 0, and only once every declared seed is in.")
    verdict = escape_verdict_line(results)
    if verdict:
        doc.paragraph(verdict)
    table = escape_tests_table(results)
    if table:
        doc.table(*table)
        doc.paragraph("Counts: pairs where the arm escaped later / earlier than the baseline, ties (equal steps, or "
                      "both censored: dropped by the sign test) and undetermined (one side censored at a step that "
                      "does not order the pair: given the signs that make p largest). MDE: the smallest median "
                      "shift of the log2 ratio that the exact sign test over these pairs detects with 80 % power at "
                      "the adjusted level, at the observed spread of the pairs (censored values at their bounds).")
    km = plot_escape_km(results, out / "figures" / "escape_km.png")
    if km:
        doc.image(km, "Fraction of runs still on the unigram plateau against the training step, per arm "
                      "(Kaplan-Meier, 95 % pointwise band; + : a run censored at its last probe)")
    lag = escape_lag_table(results)
    if lag:
        doc.heading("Does the plateau end when sinks form?", 3)
        doc.paragraph(f"Sink onset: the first probe from which the largest attention mass on detected sinks over "
                      f"layers {declared.get('onset_first_layer', 0)} and up stays at or above "
                      f"{declared.get('onset_mass', '–')}. The lag is escape − onset per run (both observed; a "
                      "censored run has no lag and is counted in the columns before it): a lag near 0 says the "
                      "plateau ends when sinks form, a positive one that sinks form first. Described per arm "
                      "(t interval over seeds), not tested; the paired difference of lags between arms below is "
                      f"adjusted by {esc.get('adjustment', {}).get('lags', 'Bonferroni')}.")
        doc.table(*lag)
        diff = escape_lag_difference_rows(results)
        if diff:
            doc.table(*diff)
    reached = escape_lag_table(results, "onset_lag_exploratory")
    if reached:
        doc.paragraph(f"*Exploratory, not declared:* the same table with the onset taken as the first probe at which "
                      f"that largest mass over layers {declared.get('onset_first_layer', 0)} and up *reaches* "
                      f"{declared.get('onset_mass', '–')}, whether or not it stays (the declared rule censors the "
                      "onset of a run whose sinks form, fade and form again). Read from the same probes; no test, "
                      "raw intervals.")
        doc.table(*reached)
    links, missing = _draw_runs(results, out, out / "figures")
    if links or missing:
        doc.heading("Each run", 3)
        note = (f" {missing} run{'s' if missing != 1 else ''} with an escape record but no probes.json here: not drawn."
                if missing else "")
        doc.paragraph("One figure per run: its probe loss (plateau, threshold, escape step), the attention on detected "
                      "sinks per layer (and on the sink token for a sink arm) and its pre-clip gradient norm, against "
                      "the training step." + note)
        if links:
            doc.bullets(links)
