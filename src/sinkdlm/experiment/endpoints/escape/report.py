"""The escape endpoint in the report (docs/method.md §11): formats results.json's `escape`
(`escape.summary` computed every number) and draws its figures (`escape.figures`).

`escape_verdict_line` is the one sentence (a direction only where the adjusted test rejects and its interval
excludes 0, and only once the declared seeds are in: "interim: k of N seeds" before); `escape_section` adds to
the report the declared tests, the Kaplan-Meier figure and the onset / lag tables; `draw_escape_runs` draws one
figure per run from its `probes.json` and metrics log, on demand (`make reports`: a study has dozens of runs,
and their figures are not committed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sinkdlm.experiment.packed import read_run_json
from sinkdlm.reporting import Document
from sinkdlm.stats import signed


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
    if t.get("inconclusive", True):  # the MDE exceeds the effect the seeds were sized for (or either is unknown)
        return f"no difference detected (inconclusive with {t['seeds']} seeds{mde})"
    bound = f"; the interval bounds the log2 ratio within ±{t['bound']:.2f}" if t.get("bound") is not None else ""
    return (f"no difference{bound} (MDE {t['mde']:.2f} log2, below the {t['sized_for']:g} the seeds were "
            "sized for)")


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


def _sign_words(g: dict[str, Any]) -> str:
    """"lag > 0 on 12, < 0 on 8 of 20 runs (exact sign test p = 0.503)": every run by its known sign."""
    sg = g.get("signs")
    if not sg:  # a results.json summarised before the signs were kept
        return "signs not recorded"
    n = sg["positive"] + sg["negative"] + sg["zero"] + sg["unknown"]
    extra = "".join(f", {k} {sg[k]}" for k in ("zero", "unknown") if sg[k])
    p = "–" if sg.get("p") is None else f"{sg['p']:.2g}"
    return f"lag > 0 on {sg['positive']}, < 0 on {sg['negative']}{extra} of {n} runs (exact sign test p = {p})"


def _selection_words(g: dict[str, Any]) -> str:
    """Why the mean over the runs with both steps observed is no verdict: those runs' escapes against the escaped
    runs whose onset was censored (their lags are negative and left out of the mean)."""
    sel = g.get("selection")
    if not sel:
        return ""
    return (f"the mean over the {sel['observed_onset']} runs with an observed onset, {_lag_ci(g)} steps, leaves out "
            f"{sel['censored_onset']} escaped runs with a censored onset (negative lags), which escaped at median "
            f"{_steps(sel['escape_median_censored_onset'])} against {_steps(sel['escape_median_observed_onset'])} "
            f"(Mann-Whitney p = {sel['p']:.2g}): a selection, no verdict")


def _early_onset_words(g: dict[str, Any]) -> str:
    """Whether an exploratory onset came before the arm's first escape (then its lag is positive almost by
    construction), from the stored medians."""
    onset, first = g.get("onset_median"), g.get("first_escape")
    text = f"at median step {_steps(onset)}"
    if onset is not None and first is not None and onset < first:
        text += f", before the arm's first escape (step {_steps(first)}): a positive lag almost by construction"
    return text


def _lag_difference_words(d: dict[str, Any], seeds: int) -> str:
    """What a paired lag difference says: described only, since the seeds with both lags observed in both arms
    are a selection on the onset (`escape.summary._lags`)."""
    return f"described, not tested: {d['seeds']} of {seeds} seeds have both lags (a selection on the onset)"


def escape_answer_line(results: dict[str, Any]) -> str | None:
    """The question the escape study asks, answered in plain words from results.json's `escape` alone: when each
    arm leaves the plateau (Kaplan-Meier medians, runs still on it), what the declared primary says, whether the
    plateau ends when the sinks form (the lag under the declared onset and under the exploratory first-reach
    onset, labelled so; by their known signs, described, not tested) and whether a sink token moves that moment;
    then what is not known."""
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
    for t in esc["tests"]:  # the primary first, then the secondaries (a shard may lack some arms)
        a, b = (_label(results, x) for x in t["pair"])
        p = "–" if t.get("p") is None else f"{t['p'] if t['primary'] else t.get('p_adjusted'):.2g}"
        text += (f"The declared {'test' if t['primary'] else 'secondary, Bonferroni-adjusted'}, {a} against {b}: "
                 f"ratio of escape steps {_ratio_ci(t)}, later on {t['plus']}, earlier on {t['minus']}"
                 + (f", tied or undetermined on {t['ties'] + t['undetermined']}" if t['ties'] + t['undetermined'] else "")
                 + f" of {t['seeds']} seeds (p = {p}), {_test_words(results, t, esc).replace('**', '')}. ")
    reached = esc.get("onset_lag_exploratory") or {}
    declared = results.get("declared", {}).get("escape") or {}
    mark = declared.get("onset_mass", "–")
    if lags:
        seen = ", ".join(f"{_label(results, n)} {g['runs'] - g.get('onset_censored', 0)} of {g['runs']}"
                         for n, g in lags.items())
        text += (f"The declared sink onset (the largest attention mass on detected sinks in a layer ≥ "
                 f"{declared.get('onset_first_layer', 0)} staying at or above {mark}) was seen on {seen} runs; "
                 "the lag escape − onset, every run by its known sign (a censored onset after an escape is a "
                 "negative lag), described, not tested: "
                 + "; ".join(f"{_label(results, n)} {_sign_words(g)}" for n, g in lags.items()) + ". ")
    if reached:
        text += (f"Exploratory (not declared), the onset as the first probe where that mass reaches {mark}: "
                 + "; ".join(f"{_label(results, n)} {_early_onset_words(g)}" for n, g in reached.items()) + ". ")
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
        escaped = g.get("escaped", n - g.get("escape_censored", 0))
        rows.append([_label(results, name), str(n), f"{escaped} of {n}",
                     f"{n - g.get('onset_censored', 0)} of {n}", _steps(g.get("onset_median")),
                     _steps(g.get("escape_median")), _steps((km.get(name) or {}).get("median")),
                     _sign_words(g), iv + (f" ({_runs(len(g['per_seed']))})" if len(g.get("per_seed") or []) != 1 else ""),
                     f"{g.get('onset_first', 0)} of {escaped}"])
    if not rows:
        return None
    return (["arm", "runs", "escaped", "sink onset seen", "median onset step", "median escape step (escaped runs)",
             "Kaplan-Meier median escape step", "sign of the lag escape − onset, every run (described)",
             "lag, mean [95 % CI] over the runs with both observed: a selection, no verdict (steps)",
             "escaped runs whose onset came at or before the escape"], rows)


def escape_lag_difference_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The paired difference of lags between the declared pairs' arms (seeds with both lags)."""
    esc = results.get("escape") or {}
    rows = []
    for d in esc.get("lag_differences") or []:
        a, b = (_label(results, n) for n in d["pair"])
        iv = _lag_ci(d)
        rows.append([f"{a} − {b}", str(d["seeds"]), iv, f"{100 * d['confidence']:.1f} %",
                     _lag_difference_words(d, len(esc.get("seeds_in") or []))])
    if not rows:
        return None
    return ["lag difference (steps)", "seeds", "mean [interval] (t over seeds)", "level (Bonferroni)", "reading"], rows


def draw_escape_runs(out: Path) -> tuple[list[Path], int]:
    """One figure per run of the study in `out` (its results.json) with an escape record whose probes.json is on
    disk, into figures/escape_runs/ (`make reports`; not committed): the paths, and how many runs had none to
    draw from."""
    out = Path(out)
    results = json.loads((out / "results.json").read_text())
    fig_dir = out / "figures"
    from sinkdlm.experiment.endpoints.escape.figures import plot_escape_run
    from sinkdlm.training.rundir import read_metrics

    declared = (results.get("declared") or {}).get("escape") or {}
    drawn, missing = [], 0
    for name, v in results["variants"].items():
        for seed, rec in sorted(v["seeds"].items(), key=lambda kv: int(kv[0])):
            if not rec.get("escape"):
                continue
            run = out / "runs" / f"{name}-s{seed}"
            probes = run / "escape" / "probes.json"
            if not probes.is_file():
                missing += 1
                continue
            path = plot_escape_run(rec["escape"], read_run_json(probes), read_metrics(run / "train"),
                                   f"{v['label']}, seed {seed}", fig_dir / "escape_runs" / f"{name}-s{seed}.png",
                                   onset_mass=declared.get("onset_mass"),
                                   onset_first_layer=declared.get("onset_first_layer", 0))
            if path:
                drawn.append(path)
    return drawn, missing


def escape_section(doc: Document, results: dict[str, Any], out: Path) -> None:
    """The report's escape section (nothing when results.json has no `escape`)."""
    from sinkdlm.experiment.endpoints.escape.figures import plot_escape_km

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
                      f"{declared.get('onset_mass', '–')}. The lag is escape − onset per run: a lag near 0 says the "
                      "plateau ends when sinks form, a positive one that sinks form first. Every run counts by its "
                      "known sign (an onset censored after an observed escape is a negative lag, an escape censored "
                      "after an observed onset a positive one; both censored: unknown), with the exact sign test "
                      "over them. Described, not tested: no lag test was declared. The mean over the runs with both "
                      "steps observed is shown, but those runs are a selection (the runs left out, with a censored "
                      "onset, escaped earlier), so no verdict is read from it, nor from the paired difference of "
                      "lags between arms below, taken on the seeds with both lags.")
        doc.table(*lag)
        selected = [f"{_label(results, n)}: {_selection_words(g)}" for n, g in (esc.get("onset_lag") or {}).items()
                    if g.get("selection")]
        if selected:
            doc.paragraph("Why the mean over the runs with both steps observed is no verdict: " + "; ".join(selected) + ".")
        diff = escape_lag_difference_rows(results)
        if diff:
            doc.table(*diff)
    reached = escape_lag_table(results, "onset_lag_exploratory")
    if reached:
        first = "; ".join(f"{_label(results, n)}: onset {_early_onset_words(g)}"
                          for n, g in (esc.get("onset_lag_exploratory") or {}).items())
        doc.paragraph(f"*Exploratory, not declared:* the same table with the onset taken as the first probe at which "
                      f"that largest mass over layers {declared.get('onset_first_layer', 0)} and up *reaches* "
                      f"{declared.get('onset_mass', '–')}, whether or not it stays (the declared rule censors the "
                      "onset of a run whose sinks form, fade and form again). Read from the same probes; no test, "
                      f"raw intervals. Where this onset comes before any run has escaped, a positive lag under it is "
                      f"nearly automatic: {first}.")
        doc.table(*reached)
    doc.heading("Each run", 3)
    doc.paragraph("One figure per run, its probe loss (plateau, threshold, escape step), the attention on detected "
                  "sinks per layer (and on the sink token for a sink arm) and its pre-clip gradient norm against the "
                  "training step, is drawn on demand from the run's `escape/probes.json` and `train/metrics.jsonl` "
                  "by `make reports` into `figures/escape_runs/<variant>-s<seed>.png` (not committed).")
