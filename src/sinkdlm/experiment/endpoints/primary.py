"""The declared primary comparison (docs/method.md §7): the study's final loss, tested once by its declared test.

A preset declares it before the run (`ExperimentPreset.primary`): the pair, the metric and the test. The runner
copies the declaration into results.json's `declared`; this endpoint takes its comparison out of the report's
multiplicity family (`claim`) and stores what was measured as results.json's `primary` (`judge`):

* the declared test: an exact Wilcoxon signed-rank or sign test with the Hodges-Lehmann / median estimate
  (`stats.rank_test`) beside the paired t interval, or (`t`, for fewer seeds than an exact test can reject with)
  the paired t test with the Wilcoxon beside it; `rejects` is what the declared test says, `agree` whether the two
  agree, and what a test that rejects nothing can still say (`null_reading`);
* from an AR initialisation, the step-0 gap and the training effect Δ_train, and the gap's trajectory over the
  runs' `val_curve` steps (`endpoints.trajectory`).

In the report: `verdict_line` (the declared test in one sentence), `answer_line` (the paper's question in plain
words: the head start, how the gap moved, what remains, what is not known), `primary_lines` (the report's
paragraphs) and `primary_seed_table` (the pair seed by seed, each run's peak pre-clip gradient norm beside it),
under the figure of the gap over training.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sinkdlm.experiment.endpoints.base import Endpoint, Study
from sinkdlm.experiment.endpoints.block_sizes import not_compared
from sinkdlm.experiment.endpoints.detection import inconclusive
from sinkdlm.experiment.endpoints.trajectory import (_at, _unconverted_words, gap_movement, head_start,
                                                     plot_gap_trajectory, tokens_per_step, trajectory)
from sinkdlm.experiment.formatting import fmt_ci, fmt_level, fmt_p, md_table
from sinkdlm.experiment.metrics import paired_seed_differences
from sinkdlm.reporting import Document
from sinkdlm.stats import mean_interval, rank_test, signed


def declared_test_name(test: str) -> str:
    """How the reports name a declared test (`t`, `wilcoxon` or `sign`)."""
    return {"t": "paired t", "sign": "exact sign"}.get(test, "exact Wilcoxon signed-rank")


def declared_decision(primary: dict[str, Any]) -> tuple[str, float | None, float | None, bool]:
    """(test name, estimate, p, rejects) of a measured primary by its declared test: the paired t test's mean,
    or the rank test's estimate (Hodges-Lehmann / median). A results.json from before `rejects` was stored
    reads the declared test's own flag."""
    test = primary.get("test", "wilcoxon")
    rank, t = primary.get("rank") or {}, primary.get("t") or {}
    name = declared_test_name(test)
    estimate, p = (t.get("mean"), t.get("p")) if test == "t" else (rank.get("estimate"), rank.get("p"))
    rejects = primary.get("rejects", primary.get("t_rejects" if test == "t" else "rank_rejects"))
    return name, estimate, p, bool(rejects)


def declared_primary_entry(results: dict[str, Any], comparisons: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The comparison (pair, metric) the preset declared primary, taken out of the multiplicity family: it is
    tested once, at 5 %, by its declared test (docs/method.md §7); the family adjusts every other comparison."""
    declared = (results.get("declared") or {}).get("primary")
    if not declared:
        return None
    metric = declared.get("metric", "val_loss")
    entry = next((c for c in comparisons if c["pair"] == list(declared["pair"]) and c["metric"] == metric), None)
    if entry is not None and not entry.get("missing") and not entry.get("different_bounds"):
        entry.update(in_family=False, declared_primary=True)
        return entry
    return None


def primary_verdict(entry: dict[str, Any], primary: dict[str, Any]) -> None:
    """The declared primary's row in the comparisons: the declared test's decision, not a BH-adjusted one."""
    name, estimate, p, rejects = declared_decision(primary)
    where = f"the declared primary: {name} test, p = {'–' if p is None else f'{p:.3g}'}, at 5 % outside the family"
    entry["p_adjusted"], entry["survives"] = None, rejects
    if rejects and estimate is not None:
        better = entry.get("lower_is_better")
        quality = "" if better is None else (" (better)" if (estimate < 0) == better else " (worse)")
        entry["verdict"] = f"{'lower' if estimate < 0 else 'higher'}{quality} by {abs(estimate):.3g} ({where})"
    else:
        entry["verdict"] = f"no difference detected ({where})"


def null_reading(d: list[float], mde: float | None, interval: dict[str, Any], rejects: bool,
                 sized_for: float | None, confidence: float = 0.95) -> dict[str, Any]:
    """What a declared test that rejects nothing can still say (docs/method.md §7): `bound`, the largest |end| of
    its interval (the difference lies within ±bound); `posthoc_margin`, the largest |end| of the paired t interval
    at 1 - 2α, the smallest margin at which TOST at α would call the pair equivalent (post hoc: no margin was
    declared); and `inconclusive`, only where the MDE exceeds the effect the seeds were `sized_for` (or either
    is unknown: `endpoints.detection.inconclusive`, the rule the endpoints share)."""
    if rejects:
        return {"inconclusive": False}
    low, high = interval.get("low"), interval.get("high")
    out: dict[str, Any] = {"bound": None if low is None or high is None else max(abs(low), abs(high)),
                           "sized_for": sized_for,
                           "inconclusive": inconclusive(mde, sized_for)}
    iv = mean_interval(d, 1 - 2 * (1 - confidence)) if len(d) >= 2 else None
    out["posthoc_margin"] = None if iv is None or iv.degenerate else max(abs(iv.low), abs(iv.high))
    return out


def primary_endpoint(results: dict[str, Any], comparisons: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any] | None:
    """results.json's `primary`: the declared comparison measured (see the module docstring)."""
    declared = (results.get("declared") or {}).get("primary")
    if not declared:
        return None
    a_name, b_name = declared["pair"]
    metric, test = declared.get("metric", "val_loss"), declared.get("test", "wilcoxon")
    variants = results["variants"]
    if a_name not in variants or b_name not in variants:
        return {**declared, "missing": "a variant of the declared pair was not run"}
    a, b = variants[a_name], variants[b_name]
    bounds = not_compared(a, b, metric)
    if bounds:  # two block sizes' val_loss: different bounds, no test (docs/method.md §15)
        return {**declared, "missing": bounds}
    entry = next((c for c in comparisons if c["pair"] == [a_name, b_name] and c["metric"] == metric), None)
    d = list(paired_seed_differences(a, b, metric).values())
    alpha = 1 - confidence
    out: dict[str, Any] = {**declared, "seeds": len(d)}
    if entry is not None:
        out["t"] = {k: entry.get(k) for k in ("mean", "low", "high", "p", "df", "degenerate", "mde")}
    # test "t": the paired t test decides (a study with fewer than 6 seeds, where no exact test can reach 5 %);
    # the exact Wilcoxon test is still computed and shown beside it, for the tails
    rank_name = "wilcoxon" if test == "t" else test
    rank = rank_test(d, rank_name, confidence) if d else None
    out["rank"] = rank
    t_says = entry is not None and entry.get("p") is not None and entry["p"] < alpha and not entry.get("degenerate")
    r_says = rank is not None and rank.get("p") is not None and rank["p"] < alpha
    out["t_rejects"], out["rank_rejects"] = bool(t_says), bool(r_says)
    out["rejects"] = bool(t_says if test == "t" else r_says)  # what the declared test says
    out["agree"] = t_says == r_says
    out.update(null_reading(d, out["t"].get("mde") if entry is not None else None,
                            out["t"] if test == "t" else (rank or {}), out["rejects"], declared.get("sized_for"),
                            confidence))
    if metric == "val_loss" and any((rec.get("step0") or {}) for rec in a["seeds"].values()):
        out.update(head_start(results, a_name, b_name, rank_name, confidence))
    # the val_loss gap over training: only between arms of one block size (one bound)
    traj = None if not_compared(a, b) else trajectory(a, b, tokens_per_step(results), confidence)
    if traj:
        out["trajectory"] = traj
    return out


def _up(x: float, digits: int = 2) -> str:
    """x rounded *up* to `digits` significant digits: a bound or margin said in words never claims more."""
    scale = 10 ** (math.floor(math.log10(abs(x))) - digits + 1) if x else 1
    return f"{math.ceil(abs(x) / scale) * scale:.{max(0, -math.floor(math.log10(scale)))}f}"


def null_words(p: dict[str, Any]) -> str:
    """What a declared test that rejects nothing says (`endpoints.null_reading`): "inconclusive" only where the
    MDE exceeds the effect the study was sized for; otherwise no difference, the bound its interval puts on it,
    and the equivalence margin it would pass at, labelled post hoc."""
    n_seeds = f"{p['seeds']} seed{'' if p['seeds'] == 1 else 's'}"
    if p.get("inconclusive", True):
        return f"no difference detected (inconclusive with {n_seeds})"
    text = "no difference"
    if p.get("bound") is not None:
        text += f"; the interval bounds it within ±{_up(p['bound'])}"
    if p.get("posthoc_margin") is not None:
        text += f"; equivalence at a post-hoc margin of ±{_up(p['posthoc_margin'], 1)}, not declared"
    mde = (p.get("t") or {}).get("mde")
    return text + (f" (MDE {mde:.2g}, below the {p['sized_for']:g} the study was sized for)" if mde is not None else "")


def primary_lines(results: dict[str, Any]) -> list[str]:
    """The declared primary comparison in words: the gap at the end with its declared test and the t interval,
    where they disagree, and (from an AR initialisation) the step-0 gap and the training effect beside it."""
    p = results.get("primary")
    if not p or p.get("missing"):
        return []
    variants = results["variants"]
    a, b = (variants[n]["label"] for n in p["pair"])
    rank, t = p.get("rank") or {}, p.get("t") or {}
    by_t = p["test"] == "t"
    n_seeds = f"{p['seeds']} seed{'' if p['seeds'] == 1 else 's'}"
    rank_test_name = declared_test_name("wilcoxon" if by_t else p["test"])  # beside a declared t: the Wilcoxon
    name, estimate, _, decided = declared_decision(p)
    est = "median" if p["test"] == "sign" else "Hodges-Lehmann"
    tokens = (p.get("trajectory") or {}).get("points", [{}])[-1].get("tokens")
    after = f" after {tokens:,} training tokens per run" if tokens else ""
    conf = f"{100 * rank.get('confidence', 0.95):g} %"
    if decided and estimate is not None:  # the declared test's answer, which a head start alone can give
        head = f"the declared test says **{'lower' if estimate < 0 else 'higher'}** with {a} than with {b}{after}"
    else:
        head = (f"no difference detected{after} (inconclusive with {n_seeds})" if p.get("inconclusive", True)
                else f"{after.strip()}: {null_words(p)}" if after else null_words(p))
    rank_ci = (f"[{signed(rank['low'], 3)}, {signed(rank['high'], 3)}] ({fmt_level(rank)} interval)"
               if rank.get("low") is not None
               else f"(no {conf} interval: the smallest p with {rank.get('n')} seeds is {rank.get('min_p', 1):.3g})")
    rank_part = f"{est} {signed(rank.get('estimate', 0), 3)} {rank_ci}, p = {fmt_p(rank.get('p'))}"
    t_part = f"paired t {fmt_ci(t)}, p = {fmt_p(t.get('p'))}"
    detail = (f"{t_part}; beside it the {rank_test_name} test: {rank_part}" if by_t else f"{rank_part}; {t_part}")
    lines = [f"**Primary endpoint** (declared before the run): {a} − {b} `{p['metric']}` at the end of training, "
             f"{name} test over {n_seeds}: {head}; {detail}."]
    if p["agree"] and t.get("p") is not None and rank.get("p") is not None:  # said either way, where both ran
        lines.append(f"The paired t test and the {rank_test_name} test agree: "
                     f"{'both reject' if p['t_rejects'] else 'neither rejects'} at 5 %.")
    elif not p["agree"]:
        lines.append(f"The t interval and the {rank_test_name} test disagree: the t test "
                     f"{'rejects' if p['t_rejects'] else 'does not reject'} and the rank test "
                     f"{'rejects' if p['rank_rejects'] else 'does not'}; the declared test ({name}) decides"
                     + (", and a rank test cannot reject with this few seeds." if by_t and rank.get("low") is None
                        else ", and a few seeds' tails (e.g. a gradient-norm spike) can move the t interval on their own."))
    if p.get("step0_gap"):
        g0, te = p["step0_gap"], p["training_effect"]
        controls = ("each seed's own conversion" if g0.get("per_seed_controls")
                    else "one conversion shared by every seed (nothing in it depends on the seed)")
        lines.append(f"Before training (step 0, {controls}) the gap was {fmt_ci(g0)}; training changed it by "
                     f"{fmt_ci(te)} (Δ_train = ({a}(T) − {a}(0)) − ({b}(T) − {b}(0)), paired per seed, p = "
                     f"{fmt_p(te.get('p'))}). A head start is not a training effect: only Δ_train says what "
                     "training with the change did" + _unconverted_words(results, te) + ".")
    moved = gap_movement(p)
    if moved:
        lines.append(f"How the gap moved over training: {moved}.")
    return lines


def verdict_line(results: dict[str, Any]) -> str | None:
    """The declared primary test in one sentence that a reader cannot take for more than it is: the gap at the
    end by the declared test (a direction only where that test rejects, named as the declared test's answer),
    and, from an AR initialisation, the step-0 gap and the training effect beside it, each with its interval,
    then how the gap moved (`gap_movement`)."""
    p = results.get("primary")
    if not p or p.get("missing"):
        return None
    a, b = (results["variants"][n]["label"] for n in p["pair"])
    rank, t = p.get("rank") or {}, p.get("t") or {}
    tokens = (p.get("trajectory") or {}).get("points", [{}])[-1].get("tokens")
    after = f" after {tokens:,} training tokens per run" if tokens else " at the end of training"
    n_seeds = f"{p['seeds']} seed{'' if p['seeds'] == 1 else 's'}"
    name, estimate, p_value, decided = declared_decision(p)
    if p["test"] == "t":
        gap, how = fmt_ci(t), f"{name} over {n_seeds}, p = {fmt_p(p_value)}"
    else:
        est = "median" if p["test"] == "sign" else "Hodges-Lehmann"
        ci = (f" [{signed(rank['low'], 3)}, {signed(rank['high'], 3)}]" if rank.get("low") is not None else "")
        gap = signed(estimate, 3) + ci if estimate is not None else "–"
        level = f", {fmt_level(rank)} interval" if rank.get("low") is not None else ""
        how = f"{est}{level}, {name} test over {n_seeds}, p = {fmt_p(p_value)}"
    word = (f"the declared test says **{'lower' if estimate < 0 else 'higher'}** with {a} at this checkpoint"
            if decided and estimate is not None else null_words(p))
    text = f"**Verdict of the declared test**: {a} − {b} `{p['metric']}`{after}: {gap} ({how}): {word}"
    if p.get("step0_gap"):
        text += (f"; before training (step 0) the gap was {fmt_ci(p['step0_gap'])}; training changed it by "
                 f"{fmt_ci(p['training_effect'])} (Δ_train, p = {fmt_p(p['training_effect'].get('p'))}"
                 + ("; an arm without conversion: the step-0 gap closing, not a gain from the sink"
                    if p["training_effect"].get("unconverted") else "") + ")")
    moved = gap_movement(p, short=True)
    if moved:
        text += f"; {moved}"
    return text + "."


def answer_line(results: dict[str, Any]) -> str | None:
    """The paper's question ("after training, is the model with the sink token better?") answered from the
    primary's numbers in plain words: the head start (step-0 gap), how the gap moved (Δ_train, a direction only
    where its comparison survives the report's adjustment; the gap at each scored step), what remains at the last
    checkpoint (the declared test) and what is not known. Only from an AR initialisation (a step-0 gap)."""
    p = results.get("primary")
    if not p or p.get("missing") or not p.get("step0_gap"):
        return None
    a, b = (results["variants"][n]["label"] for n in p["pair"])
    traj = p.get("trajectory") or {}
    points = [q for q in traj.get("points") or [] if q.get("mean") is not None and q["step"] > 0]
    g0, te = p["step0_gap"], p["training_effect"]
    change = next((c for c in results.get("comparisons") or []
                   if c["pair"] == list(p["pair"]) and c["metric"] == "val_loss_change"), {})
    name, estimate, p_value, decided = declared_decision(p)
    # where the conversion alone left the sink model (a sink added to a trained DLM may start behind: docs/method.md §12)
    ahead = g0.get("low") is not None and g0["high"] < 0
    behind = g0.get("low") is not None and g0["low"] > 0
    text = f"**The paper's question in plain words** ({a} − {b} `{p['metric']}`, {p['seeds']} seeds): "
    if ahead or behind:
        text += (f"the sink model started {'ahead' if ahead else 'behind'} from the conversion alone, a gap of "
                 f"{fmt_ci(g0)} at step 0, before any training. ")
    else:
        text += f"at step 0, before any training, the conversion alone left a gap of {fmt_ci(g0)} (no difference detected). "
    lead = "head start" if ahead else "deficit" if behind else "gap"
    narrowed = te.get("mean") is not None and g0.get("mean") is not None and (te["mean"] > 0) == (g0["mean"] < 0)
    if change.get("survives") and te.get("mean") is not None and g0.get("mean") is not None:
        how = "narrowed" if narrowed else "widened"
        text += f"Training {how} that {lead} by {fmt_ci(te)} (Δ_train, BH-adjusted p = {fmt_p(change.get('p_adjusted'))})"
    else:
        text += f"Training changed it by {fmt_ci(te)} (Δ_train: no direction detected after the adjustment)"
    if points:
        text += ": the mean gap was " + ", ".join(f"{fmt_ci(q)} at {_at(q['step'], traj)}" for q in points)
    text += _unconverted_words(results, te) + ". "
    last = points[-1] if points else None
    where = f"the last checkpoint, {_at(last['step'], traj)}," if last else "the end of training"
    rank = p.get("rank") or {}
    remains = (f"{signed(estimate, 3)} [{signed(rank['low'], 3)}, {signed(rank['high'], 3)}] (Hodges-Lehmann, "
               f"{fmt_level(rank)} interval)" if p["test"] != "t" and rank.get("low") is not None and estimate is not None
               else fmt_ci(p.get("t")))
    if decided and estimate is not None:
        text += (f"What remains at {where} is {remains}, {'lower' if estimate < 0 else 'higher'} with {a} by the "
                 f"declared test ({name}, p = {fmt_p(p_value)}): the rest of the head start, not a gain that training "
                 "with the sink token produced, which Δ_train measures. "
                 if change.get("survives") and narrowed and ahead and estimate < 0
                 else f"At {where} the gap is {remains}: the declared test finds {a} "
                      f"{'lower' if estimate < 0 else 'higher'} ({name}, p = {fmt_p(p_value)}). ")
    else:
        text += f"At {where} the gap is {remains}: {null_words(p)} ({name}, p = {fmt_p(p_value)}). "
    unknown = [f"what happens after {_at(last['step'], traj)}" if last else "what happens with more training"]
    if not traj.get("slope_per_decade"):
        n = traj.get("scored_steps", 0)
        unknown.append(f"whether the remaining gap closes, holds or reverses ({n} scored step{'s' if n != 1 else ''} "
                       "after step 0 give no trend)")
    unknown.append("whether it holds for another model, corpus or length of training (one model, one corpus here)")
    return text + "Not known: " + "; ".join(unknown) + "."


def primary_seed_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The primary pair seed by seed: each run's fixed val_loss, its step-0 control where there is one, the
    paired difference, and each run's largest pre-clip gradient norm with the logged interval it fell in (a spike
    shows in its seed's row; "step not recorded" where the run's metrics log was not kept). A pair of different
    block sizes has no difference columns: its val_loss are two different bounds (docs/method.md §15)."""
    p = results.get("primary")
    if not p or p.get("missing"):
        return None
    a, b = (results["variants"][n] for n in p["pair"])
    paired = not_compared(a, b) is None
    step0 = any((rec.get("step0") or {}) for rec in a["seeds"].values())
    header = ["seed", f"{a['label']} val_loss", f"{b['label']} val_loss"] + (["difference"] if paired else [])
    header += [f"{a['label']} step 0", f"{b['label']} step 0"] + (["Δ_train"] if paired else []) if step0 else []
    header += [f"{a['label']} peak grad norm (at steps)", f"{b['label']} peak grad norm (at steps)"]

    def peak(rec: dict[str, Any]) -> str:
        g = rec.get("train_grad_norm_peak")
        if g is None:
            return "–"
        where = rec.get("train_grad_norm_peak_steps")
        return f"{g:.0f} ({where[0]:,}-{where[1]:,})" if where else f"{g:.0f} (step not recorded)"

    rows = []
    for seed in sorted(a["seeds"], key=int):
        ra, rb = a["seeds"][seed], b["seeds"].get(seed) or {}
        num = lambda v, d=3: "–" if v is None else f"{v:.{d}f}"  # noqa: E731
        row = [seed, num(ra.get("val_loss")), num(rb.get("val_loss"))]
        if paired:
            row.append("–" if rb.get("val_loss") is None else signed(ra["val_loss"] - rb["val_loss"], 3))
        if step0:
            ca, cb = ra.get("val_loss_change"), rb.get("val_loss_change")
            row += [num((ra.get("step0") or {}).get("val_loss")), num((rb.get("step0") or {}).get("val_loss"))]
            if paired:
                row.append("–" if ca is None or cb is None else signed(ca - cb, 3))
        row += [peak(ra), peak(rb)]
        rows.append(row)
    return header, rows


class Primary(Endpoint):
    """The declared primary comparison: tested once at 5 % by its declared test, outside the family."""

    name = "primary"
    slot = "lead"
    parts = {"verdict": verdict_line, "answer": answer_line}

    def claim(self, study: Study) -> list[dict[str, Any]]:
        declared_primary_entry(study.results, study.comparisons)  # tested once at 5 %, outside the family
        return []

    def judge(self, study: Study) -> None:
        value = primary_endpoint(study.results, study.comparisons, study.confidence)
        if value is not None:
            study.results["primary"] = value
        entry = next((c for c in study.comparisons if c.get("declared_primary")), None)
        if entry is not None and study.results.get("primary"):  # its row says what the declared test decided
            primary_verdict(entry, study.results["primary"])

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        primary = primary_lines(results)
        if not primary:
            return
        doc.heading("Primary endpoint")
        gap = plot_gap_trajectory(results, Path(out) / "figures" / "gap_trajectory.png")
        if gap:
            doc.image(gap, "Does the lead vanish, hold or grow with training? The paired gap on the fixed validation "
                           "at each scored step (step 0: the converted models, when the runs start from an AR "
                           "checkpoint), mean and 95 % CI over seeds")
        doc.paragraph(verdict_line(results))
        for line in primary:
            doc.paragraph(line)
        per_seed = primary_seed_table(results)
        if per_seed:
            doc.table(*per_seed)

    def markdown(self, results: dict[str, Any]) -> list[str]:
        primary = primary_lines(results)
        if not primary:
            return []
        # each its own paragraph, then the primary pair seed by seed (peak gradient norms beside)
        per_seed = primary_seed_table(results)
        return [x for line in primary for x in ("", line)] + (["", md_table(*per_seed)] if per_seed else [])
