"""The declared primary comparison in words (formats results.json's `primary`; `experiment.endpoints` computed it).

* `verdict_line`: the declared test in one sentence: the gap at the end by the declared test (a direction only
  where it rejects), the step-0 gap and Δ_train beside it, then how the gap moved (a trend only where enough
  scored steps exist, else the change between the scored steps, named as such; never a direction from a raw
  interval outside the report's multiplicity family);
* `answer_line`: the paper's question answered from the same numbers in plain words: how large the head start
  was, how the gap moved over training, what remains at the last checkpoint and what is not known;
* `primary_lines`: the report's paragraphs; `primary_seed_table`: the pair seed by seed (each run's peak pre-clip
  gradient norm with the logged interval it fell in).
"""

from __future__ import annotations

import math
from typing import Any

from sinkdlm.experiment.endpoints import declared_decision, declared_test_name
from sinkdlm.stats import signed


def _ci(d: dict[str, Any] | None, digits: int = 3) -> str:
    """"+0.170 [+0.018, +0.318]" of a stored interval (no bounds: the mean alone, and why)."""
    if not d or d.get("mean") is None:
        return "–"
    text = signed(d["mean"], digits)
    if d.get("degenerate"):
        return text + " (no spread: no interval)"
    if d.get("low") is not None and d.get("high") is not None:
        text += f" [{signed(d['low'], digits)}, {signed(d['high'], digits)}]"
    return text


def _p(p: float | None) -> str:
    return "– (one seed: no test)" if p is None else f"{p:.3g}"


def _level(rank: dict[str, Any]) -> str:
    """"exact 96.9 %" of a rank interval: its exact coverage, not the nominal level (a discrete test)."""
    exact = rank.get("exact_confidence")
    return f"exact {100 * exact:.1f} %" if exact is not None else f"nominal {100 * rank.get('confidence', 0.95):g} %"


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


def _at(step: int, traj: dict[str, Any]) -> str:
    tokens = traj.get("tokens_per_step")
    return f"step {step:,}" + (f" ({step * tokens:,} tokens)" if tokens and step else "")


def gap_movement(p: dict[str, Any], short: bool = False) -> str | None:
    """How the gap moved over the scored steps: the trend per 10× tokens where the trajectory has one, else the
    change between the scored steps, named as such; raw intervals, outside the multiplicity family, so no
    direction word."""
    traj = p.get("trajectory") or {}
    slope = traj.get("slope_per_decade")
    if slope:
        return (f"its trend {_ci(slope)} nats per 10× training tokens (a slope per seed over {traj.get('scored_steps')} "
                f"scored steps spanning {traj.get('decades', 0):.1f} decades, t over seeds; raw interval, outside the "
                "multiplicity family: described, not tested)")
    changes = traj.get("step_changes") or []
    if not changes:
        return None
    why = (f"{traj.get('scored_steps')} scored step{'s' if traj.get('scored_steps') != 1 else ''} after step 0, "
           f"fewer than the {traj.get('trend_min_steps', 4)} log-spaced over a decade that a trend per 10× tokens needs"
           if (traj.get("scored_steps") or 0) < traj.get("trend_min_steps", 4)
           else f"{traj.get('scored_steps')} scored steps spanning {traj.get('decades') or 0:.1f} decades, less than "
                f"the {traj.get('trend_min_decades', 1):g} a trend per 10× tokens needs")
    if short:
        c = traj.get("scored_change") or changes[-1]
        return (f"the gap's change between the scored steps {c['from_step']:,} and {c['to_step']:,}: {_ci(c)} "
                f"(paired per seed, raw interval outside the multiplicity family; no trend: {why})")
    said = "; ".join(f"{c['from_step']:,} → {c['to_step']:,}: {_ci(c)}" for c in changes)
    return (f"the change of the gap between the scored steps (paired per seed, t over seeds; raw intervals, outside "
            f"the multiplicity family: described, not tested; no trend: {why}): {said}")


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
    rank_ci = (f"[{signed(rank['low'], 3)}, {signed(rank['high'], 3)}] ({_level(rank)} interval)"
               if rank.get("low") is not None
               else f"(no {conf} interval: the smallest p with {rank.get('n')} seeds is {rank.get('min_p', 1):.3g})")
    rank_part = f"{est} {signed(rank.get('estimate', 0), 3)} {rank_ci}, p = {_p(rank.get('p'))}"
    t_part = f"paired t {_ci(t)}, p = {_p(t.get('p'))}"
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
        lines.append(f"Before training (step 0, {controls}) the gap was {_ci(g0)}; training changed it by "
                     f"{_ci(te)} (Δ_train = ({a}(T) − {a}(0)) − ({b}(T) − {b}(0)), paired per seed, p = "
                     f"{_p(te.get('p'))}). A head start is not a training effect: only Δ_train says what "
                     "training with the change did" + _unconverted_words(results, te) + ".")
    moved = gap_movement(p)
    if moved:
        lines.append(f"How the gap moved over training: {moved}.")
    return lines


def _unconverted_words(results: dict[str, Any], te: dict[str, Any]) -> str:
    """Where an arm had no conversion (`metrics.unconverted`), what Δ_train is there instead."""
    names = [results["variants"][n]["label"] for n in te.get("unconverted") or []]
    if not names:
        return ""
    return (f"; but {' and '.join(names)} had no conversion (its step 0 is the starting checkpoint, the same model "
            "on every seed), so here Δ_train is the gap at the end minus the step-0 gap: how much of the "
            "conversion's step-0 gap training closed, not a gain from the sink")


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
        gap, how = _ci(t), f"{name} over {n_seeds}, p = {_p(p_value)}"
    else:
        est = "median" if p["test"] == "sign" else "Hodges-Lehmann"
        ci = (f" [{signed(rank['low'], 3)}, {signed(rank['high'], 3)}]" if rank.get("low") is not None else "")
        gap = signed(estimate, 3) + ci if estimate is not None else "–"
        level = f", {_level(rank)} interval" if rank.get("low") is not None else ""
        how = f"{est}{level}, {name} test over {n_seeds}, p = {_p(p_value)}"
    word = (f"the declared test says **{'lower' if estimate < 0 else 'higher'}** with {a} at this checkpoint"
            if decided and estimate is not None else null_words(p))
    text = f"**Verdict of the declared test**: {a} − {b} `{p['metric']}`{after}: {gap} ({how}): {word}"
    if p.get("step0_gap"):
        text += (f"; before training (step 0) the gap was {_ci(p['step0_gap'])}; training changed it by "
                 f"{_ci(p['training_effect'])} (Δ_train, p = {_p(p['training_effect'].get('p'))}"
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
                 f"{_ci(g0)} at step 0, before any training. ")
    else:
        text += f"at step 0, before any training, the conversion alone left a gap of {_ci(g0)} (no difference detected). "
    lead = "head start" if ahead else "deficit" if behind else "gap"
    narrowed = te.get("mean") is not None and g0.get("mean") is not None and (te["mean"] > 0) == (g0["mean"] < 0)
    if change.get("survives") and te.get("mean") is not None and g0.get("mean") is not None:
        how = "narrowed" if narrowed else "widened"
        text += f"Training {how} that {lead} by {_ci(te)} (Δ_train, BH-adjusted p = {_p(change.get('p_adjusted'))})"
    else:
        text += f"Training changed it by {_ci(te)} (Δ_train: no direction detected after the adjustment)"
    if points:
        text += ": the mean gap was " + ", ".join(f"{_ci(q)} at {_at(q['step'], traj)}" for q in points)
    text += _unconverted_words(results, te) + ". "
    last = points[-1] if points else None
    where = f"the last checkpoint, {_at(last['step'], traj)}," if last else "the end of training"
    rank = p.get("rank") or {}
    remains = (f"{signed(estimate, 3)} [{signed(rank['low'], 3)}, {signed(rank['high'], 3)}] (Hodges-Lehmann, "
               f"{_level(rank)} interval)" if p["test"] != "t" and rank.get("low") is not None and estimate is not None
               else _ci(p.get("t")))
    if decided and estimate is not None:
        text += (f"What remains at {where} is {remains}, {'lower' if estimate < 0 else 'higher'} with {a} by the "
                 f"declared test ({name}, p = {_p(p_value)}): the rest of the head start, not a gain that training "
                 "with the sink token produced, which Δ_train measures. "
                 if change.get("survives") and narrowed and ahead and estimate < 0
                 else f"At {where} the gap is {remains}: the declared test finds {a} "
                      f"{'lower' if estimate < 0 else 'higher'} ({name}, p = {_p(p_value)}). ")
    else:
        text += f"At {where} the gap is {remains}: {null_words(p)} ({name}, p = {_p(p_value)}). "
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
    shows in its seed's row; "step not recorded" where the run's metrics log was not kept)."""
    p = results.get("primary")
    if not p or p.get("missing"):
        return None
    a, b = (results["variants"][n] for n in p["pair"])
    step0 = any((rec.get("step0") or {}) for rec in a["seeds"].values())
    header = ["seed", f"{a['label']} val_loss", f"{b['label']} val_loss", "difference"]
    header += [f"{a['label']} step 0", f"{b['label']} step 0", "Δ_train"] if step0 else []
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
        row = [seed, num(ra.get("val_loss")), num(rb.get("val_loss")),
               "–" if rb.get("val_loss") is None else signed(ra["val_loss"] - rb["val_loss"], 3)]
        if step0:
            ca, cb = ra.get("val_loss_change"), rb.get("val_loss_change")
            row += [num((ra.get("step0") or {}).get("val_loss")), num((rb.get("step0") or {}).get("val_loss")),
                    "–" if ca is None or cb is None else signed(ca - cb, 3)]
        row += [peak(ra), peak(rb)]
        rows.append(row)
    return header, rows
