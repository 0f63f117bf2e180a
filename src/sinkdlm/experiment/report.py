"""The experiment's report: the tables every endpoint shares, the README's Markdown summary, report.md / report.html,
`regenerate`.

Every number and verdict comes from `sinkdlm.experiment.summary` and the endpoints (`experiment.endpoints`), which
store them in results.json; this module only formats what they share (the results table, the notes on validation,
sizing and multiplicity, the cost; `formatting` holds the number formats and the tables of paired comparisons) and
places each endpoint's own section, Markdown lines and summary parts where its `slot` says (`ENDPOINTS`, in the
registry's order). `markdown_summary` renders the tables that the README shows, from a results.json alone (a test
regenerates the README's tables from the committed file); `regenerate` rebuilds a committed experiment's
results.json and report from its stored records.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from sinkdlm.experiment.endpoints import ENDPOINTS
from sinkdlm.experiment.endpoints.base import compared_baseline
from sinkdlm.experiment.endpoints.block_sizes import has_block_arms
from sinkdlm.experiment.endpoints.primary import declared_test_name
from sinkdlm.experiment.endpoints.sinks.stats import analysis_record
from sinkdlm.experiment.formatting import (comparisons_table, fmt_interval, is_percent, md_table, pivot_comparisons,
                                           train_setting)
from sinkdlm.experiment.metrics import METHOD_ITEMS, METHOD_SEEDS, TRAINING_METRICS
from sinkdlm.experiment.summary import (
    experiment_timing, paired_val_loss_differences, summarise, task_chance, task_metrics, training_curves,
)
from sinkdlm.experiment.units import DONE
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.machine import machine_words
from sinkdlm.reporting import Document
from sinkdlm.training.rundir import grad_norm_peak_steps


def results_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    variants = results["variants"]
    metrics = ["val_loss"] + task_metrics(results)
    def head(m):
        chance = task_chance(m) if is_percent(m) else None
        return f"`{m}`" + ((" %" + (f" (chance {100 * chance:.0f})" if chance else "")) if is_percent(m) else " (↓)")

    header = ["variant"] + [head(m) for m in metrics]
    rows = [[v["label"]] + [fmt_interval(v["summary"].get(m), 100.0 if is_percent(m) else 1.0, 1 if is_percent(m) else 3)
                            for m in metrics] for v in variants.values()]
    return header, rows


QUESTION_METRICS = ("val_loss", "shakespeare_word_order/acc", "shakespeare_next_line/acc_norm", "shakespeare_cloze/acc",
                    "non_sink_fraction", "content_sink_set_change_rate")


def questions_list(results: dict[str, Any]) -> list[str]:
    """One line per compared pair: the question it asks and every headline metric's verdict."""
    from sinkdlm.experiment.presets import PAIR_QUESTIONS

    by_pair: dict[tuple[str, str], list[dict]] = {}
    for c in results["comparisons"]:
        by_pair.setdefault(tuple(c["pair"]), []).append(c)
    lines = []
    for pair, cs in by_pair.items():
        per = {c["metric"]: c for c in cs}
        said = [f"`{m}` {per[m]['verdict']}" for m in QUESTION_METRICS if m in per]
        if said:
            q = PAIR_QUESTIONS.get(pair, f"{cs[0]['variant']} vs {cs[0]['baseline']}?")
            lines.append(f"- **{q}** ({cs[0]['variant']} − {cs[0]['baseline']}) " + "; ".join(said) + ".")
    return lines + [line for endpoint in ENDPOINTS for line in endpoint.questions(results)]


def multiplicity_note(results: dict[str, Any]) -> str:
    """Which adjustment, over which family, and what survived it."""
    mult = results.get("multiplicity")
    if not mult:
        return ""
    left = mult["left_out"]
    const = results.get("constant_metrics") or []
    out = (f"Multiplicity: {mult['method']} at q = {100 * mult['q']:g} % over the family of {mult['size']} paired "
           f"comparisons in this report ({mult['family']}). Left out of it: "
           + ("the declared primary comparison (tested once at 5 % by its declared test, above); and, because they "
              "are no tests, " if left.get("declared primary") else "because they are no tests, ")
           + f"{left['alternative definitions']} comparisons of alternative definitions (shown for reference), "
           + (f"{left['different bounds']} comparison{'s' if left['different bounds'] != 1 else ''} of the validation "
              "bound between arms of different block sizes (not compared: different bounds, docs/method.md §15), "
              if left.get("different bounds") else "")
           + f"{left['no variance estimate']} without a variance estimate"
           + (f" (metrics that cannot vary: {', '.join(f'`{m}`' for m in const)})" if const else "")
           + f", {left['one seed']} with one seed, {left['missing']} missing. "
           f"{mult['raw_excluding_zero']} of the {mult['size']} raw 95 % intervals exclude zero, where "
           f"{mult['expected_by_chance']:.1f} would by chance alone; {mult['survivors']} survive{'s' if mult['survivors'] == 1 else ''} the adjustment")
    if mult.get("min_p_adjusted") is not None:
        out += f" (smallest adjusted p = {mult['min_p_adjusted']:.2g})"
    eq = mult.get("equivalence_tests")
    same = (f" The family includes the {eq} declared equivalence tests (TOST); elsewhere an interval that includes "
            "zero means no difference detected, not the same." if eq else
            " Without an equivalence test (none was declared), an interval that includes zero means no difference "
            "detected, not the same.")
    return out + ". A direction, and bold, only for those; the raw interval stays in every table." + same


def machines_words(results: dict[str, Any], out: Path) -> str:
    """"Machine: ..." of the report's first paragraph: results.json's (where the report was written), or, where the
    runs trained on different machines (a study resumed across sessions; each run's train/DONE.json names its own),
    each machine with the seeds it trained, and whether every seed's runs shared one (float32 rounding differs
    between CPUs, docs/method.md §11, so a pair split across two is said)."""
    seeds_on: dict[str, set[str]] = {}
    per_seed: dict[str, set[str]] = {}
    for name, v in results["variants"].items():
        for seed in v["seeds"]:
            done = out / "runs" / f"{name}-s{seed}" / "train" / DONE
            machine = json.loads(done.read_text()).get("machine") if done.is_file() else None
            if machine:
                words = machine_words(machine)
                seeds_on.setdefault(words, set()).add(seed)
                per_seed.setdefault(seed, set()).add(words)
    m = results["machine"]
    tail = f", {m['cpu_count']} cores, torch {m['torch']}, CUDA {'yes' if m['cuda'] else 'no'}"
    if len(seeds_on) < 2:
        return f"Machine: {machine_words(m)}{tail}."
    listed = "; ".join(f"{w}: seeds {', '.join(sorted(s, key=int))}" for w, s in seeds_on.items())
    split = sorted((s for s, ws in per_seed.items() if len(ws) > 1), key=int)
    pairs = (f"seeds {', '.join(split)} trained on more than one, so their pairs cross machines" if split else
             "every seed's runs trained on one of them, so each pair is on one machine")
    return f"The runs finished training on {len(seeds_on)} machines ({listed}); {pairs}. Report written on {machine_words(m)}{tail}."


def cost_line(results: dict[str, Any]) -> str:
    """What the experiment took, from results.json (`experiment_timing`)."""
    t = experiment_timing(results)
    parts = "+".join(t.get("compute_parts", ["train", "eval", "analysis"]))
    minutes = lambda sec: f"{sec / 60:.0f}" if sec >= 6000 else f"{sec / 60:.1f}"  # noqa: E731
    text = f"Compute: {minutes(t['compute_s'])} min ({parts}) summed over the {t['runs']} runs"
    rs = t.get("run_train_s") or {}
    if rs.get("median") is not None:
        text += f" (training {rs['min']:.0f}-{rs['max']:.0f} s per run, median {rs['median']:.0f} s)"
    if t.get("elapsed_s") is not None:
        text += f"; elapsed since the first start {minutes(t['elapsed_s'])} min"
    return text + (f". {t['note'][0].upper()}{t['note'][1:]}" if t.get("note") else "") + "."


def validation_note(results: dict[str, Any]) -> str:
    """How `val_loss` was measured: the study's fixed validation and each run's Monte-Carlo error."""
    val = results.get("validation")
    if not val:
        return ("`val_loss`: the training loop's validation (one random draw per sequence, each run its own "
                "noise; this experiment predates the fixed validation of docs/method.md §1).")
    ses = [rec["val_loss_se"] for v in results["variants"].values()
           for rec in [*v["seeds"].values(), *([v["step0"]] if v.get("step0") else [])]
           if isinstance(rec.get("val_loss_se"), (int, float))]
    text = (f"`val_loss`: the fixed validation of docs/method.md §1 — {val['tokens']:,} tokens, {val['draws']} "
            f"draws per sequence from noise seed {val['noise_seed']}, the same for every run and variant "
            f"(`{val['estimator']}`)" + (", scored under bf16 autocast" if val.get("bf16") else ""))
    if ses:
        text += f"; Monte-Carlo standard error per run {min(ses):.4f}-{max(ses):.4f} nats"
    if has_block_arms(results):  # docs/method.md §15: one bound per block size
        text += (". A block model's `val_loss` is its block NELBO, a different bound for each block size (smaller "
                 "blocks, tighter; the whole sequence its own size): it is compared only between arms of one block "
                 "size, and a pair of different block sizes reads \"not compared: different bounds\"")
    return text + "."


def step0_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The step-0 control beside the trained runs: what training did, apart from what the converted
    model already had (its own first-token sink)."""
    rows = []
    for v in results["variants"].values():
        s0 = v.get("step0")
        if not s0:
            continue
        a0 = s0.get("analysis") or {}
        nsf0 = a0.get("non_sink_fraction")
        rows.append([v["label"], f"{s0['val_loss']:.3f} ± {s0['val_loss_se']:.3f} (MC SE)",
                     fmt_interval(v["summary"].get("val_loss")),
                     "–" if nsf0 is None else f"{100 * nsf0:.1f}",
                     fmt_interval(v["summary"].get("non_sink_fraction"), 100.0, 1)])
    if not rows:
        return None
    return ["variant", "step 0 `val_loss`", "trained `val_loss` [95 % CI]", "step 0 non-sink %",
            "trained non-sink % [95 % CI]"], rows


def _about_hours(h: float) -> str:
    return f"about {h:,.0f} h" if h >= 10 else f"about {h:.1f} h"


def sizing_note(results: dict[str, Any]) -> str | None:
    """What detecting the target val_loss difference would take (summary.study_sizing), in one paragraph."""
    sz = results.get("sizing")
    if not sz:
        return None
    parts = []
    for row in sz["pairs"]:
        a, b = (results["variants"].get(n, {}).get("label", n) for n in row["pair"])
        pair = f"{a} − {b}"
        if row["seeds"] is None:
            parts.append(f"{pair}: no spread to size from")
            continue
        met = row["mde"] is not None and row["mde"] <= sz["target"]
        cost = "" if row["compute_h"] is None else f", {_about_hours(row['compute_h'])} of compute for the two variants"
        split = row.get("split")
        if split:  # the fixed validation's variance split (docs/method.md §7)
            lo, hi = split["sd_train_interval"]
            upper = split.get("seeds_upper")
            spread = (f"spread of the per-seed differences {row['sd']:.3f}: training seeds {split['sd_train']:.3f} "
                      f"[95 % CI {lo:.3f}, {hi:.3f}], validation noise of the difference {split['validation_se_diff']:.4f}"
                      + ("" if upper is None else f"; at the interval's upper end {upper:,} seeds"))
        else:
            spread = f"spread of the per-seed differences {row['sd']:.3f}"
        adjusted = ""
        adj = row.get("adjusted")
        if adj:  # a direction is stated only after the report's adjustment, which asks a smaller raw p-value
            def seeds_at(level: dict[str, Any]) -> str:
                h = level["compute_h"]
                return ("no spread to size from" if level["seeds"] is None else f"{level['seeds']:,} seeds"
                        + ("" if h is None else f" ({_about_hours(h)})"))
            now, worst = adj["adjusted_now"], adj["adjusted_worst"]
            adjusted = (f"; to also survive the report's Benjamini-Hochberg adjustment over {adj['family']} comparisons "
                        f"it must clear a raw p of {now['alpha']:.2g} given the other comparisons' p-values now: "
                        f"{seeds_at(now)}, and {worst['alpha']:.2g} if it were the family's only discovery: "
                        f"{seeds_at(worst)}")
        declared = ""
        rank = row.get("declared_test")
        if rank:  # the t test prices the seeds; the declared rank test needs a few more, and at least min_seeds
            h = rank.get("compute_h")
            declared = (f"; the declared {declared_test_name(rank['test'])} test needs about "
                        f"{rank['seeds']:,} seeds"
                        + ("" if h is None else f" ({_about_hours(h)})")
                        + f" (its efficiency against the t test is {rank['are']:.3f} for normal differences, and "
                        f"below {rank['min_seeds']} seeds it cannot reject at all)")
        parts.append(f"{pair}: {'met with' if met else 'needs'} {row['seeds']:,} seeds per variant{cost} "
                     f"(this study ran {row['seeds_run']}; {spread}){declared}{adjusted}")
    per_run = sz.get("per_run_compute_s")
    run = "" if per_run is None else (f" A run took {per_run / 60:,.1f} min of compute here "
                                      f"({', '.join(sz.get('compute_parts') or [])}).")
    return (f"**Sizing.** To detect a `val_loss` difference of {sz['target']:g} nats with {100 * sz['power']:.0f} % "
            f"power (two-sided 5 %) at the observed spread: " + "; ".join(parts) + "." + run)


def mde_line(results: dict[str, Any]) -> str | None:
    """Which `val_loss` contrasts reach the study's target MDE (summary.study_sizing's target) and which do not."""
    target = (results.get("sizing") or {}).get("target")
    rows = [(f"{c['variant']} − {c['baseline']}", c["mde"]) for c in results.get("comparisons", [])
            if c["metric"] == "val_loss" and c.get("mde") is not None and not c.get("different_bounds")]
    if target is None or not rows:
        return None
    met = [f"{pair} ({mde:.3f})" for pair, mde in rows if mde <= target]
    not_met = [f"{pair} ({mde:.3f})" for pair, mde in rows if mde > target]
    return (f"**Minimum detectable effect** (`val_loss`, 80 % power, two-sided 5 %, at each contrast's observed spread; "
            f"target {target:g} nats): reached by {len(met)} of {len(rows)} contrasts"
            + (f" ({'; '.join(met)})" if met else "") + (f"; not by {'; '.join(not_met)}" if not_met else "") + ".")


def time_line(results: dict[str, Any]) -> str | None:
    """How long the experiment took from its first start to its report, and on what (a page's "how long will
    this take" answer, from the runner's `timing` and `machine`): the wall time, what the runs' own measured
    stages add up to (wall time beyond them is waiting or work outside the runs), the spread of one run's
    training (the same work each run: a wide spread is the machine's other load) and that load where recorded."""
    t, machine = results.get("timing") or {}, results.get("machine") or {}
    if t.get("elapsed_s") is None:
        return None
    where = ("a CUDA GPU" if machine.get("cuda") else f"{machine['cpu_count']} CPU cores" if machine.get("cpu_count")
             else "this machine")
    stages = {"train": "training", "sft": "SFT", "validation": "validation", "eval": "evaluation", "analysis": "analysis"}
    parts = ", ".join(stages.get(k, k) for k in t.get("compute_parts", []))
    text = (f"The `{results.get('preset', 'experiment')}` experiment took {t['elapsed_s'] / 60:.0f} min here from its "
            f"first start to its report, on {where} ({t['runs']} runs); its runs' measured stages "
            f"({parts}) add up to {t['compute_s'] / 60:.1f} min")
    rs = t.get("run_train_s") or {}
    if rs.get("min") is not None and rs["max"] > rs["min"]:
        text += f", and training the same {train_setting(results, 'max_steps'):,} steps took {rs['min']:.0f}-{rs['max']:.0f} s per run"
    load = machine.get("load_average_at_start")
    return text + (f". Load average (1 min) {load:.1f} when it started." if load is not None
                   else ". The machine's other load was not recorded: a busy CPU makes every stage slower.")


def arm_cost_line(results: dict[str, Any]) -> str | None:
    """What training one run of each arm took (the runs' own `train_seconds`: median and range over the seeds), for
    a study whose arms train different parameters on equal steps and tokens (`--trainable`; docs/method.md §12's "at equal
    compute"). Described, not compared: the runs shared the machine with other runs, so the step cost of each mode
    is measured in benchmarks/ instead. None unless the arms differ in what they train."""
    variants = results.get("variants") or {}
    # an arm's own override, else the study's setting (TrainConfig's default where the preset left it)
    mode = {name: (v.get("train") or {}).get("trainable") or train_setting(results, "trainable")
            for name, v in variants.items()}
    if len(set(mode.values())) < 2:
        return None
    said = []
    for name, v in variants.items():
        secs = sorted(r["train_seconds"] for r in v["seeds"].values() if isinstance(r.get("train_seconds"), (int, float)))
        if not secs:
            continue
        spread = f" ({secs[0]:.0f}-{secs[-1]:.0f})" if len(secs) > 1 else ""
        said.append(f"{v['label']} (`{mode[name]}`) {statistics.median(secs):.0f} s{spread}")
    if not said:
        return None
    return (f"**What training one run took** ({train_setting(results, 'max_steps'):,} steps × "
            f"{train_setting(results, 'batch_size')} × {train_setting(results, 'seq_len')} tokens for every arm; "
            "median (range) over the seeds): " + "; ".join(said) + ". Equal steps and tokens, not equal arithmetic: "
            "a frozen weight gets no gradient and no optimizer state. The runs shared the machine with other runs, "
            "so these times describe this study; the step cost of each mode is measured in docs/benchmarks.md.")


# The parts of the summary that a results page can place on their own (`<!-- results:NAME#PART -->`),
# e.g. a one-line verdict under its figure: the shared ones, then each endpoint's `parts`.
SUMMARY_PARTS = {"mde": mde_line, "time": time_line, "arm_cost": arm_cost_line,
                 **{name: part for endpoint in ENDPOINTS for name, part in endpoint.parts.items()}}


def summary_part(results: dict[str, Any], part: str) -> str | None:
    """One part of the summary (`SUMMARY_PARTS`) as a markdown paragraph, or None when the results lack it."""
    if part not in SUMMARY_PARTS:
        raise ValueError(f"unknown summary part {part!r}: choose from {sorted(SUMMARY_PARTS)}")
    text = SUMMARY_PARTS[part](results)
    return None if text is None else text + "\n"


def markdown_summary(results: dict[str, Any]) -> str:
    """The README's tables for one experiment, generated from its results.json only."""
    n = len(results["seeds"])
    tasks = task_metrics(results)
    headline = ["val_loss"] + [m for m in tasks if m.endswith(("word_order/acc", "cloze/acc", "next_line/acc_norm", "/exact_match"))
                               and "cloze/exact" not in m]
    parts = [
        f"Preset `{results['preset']}`: {results['description']}. {train_setting(results, 'max_steps'):,} steps × "
        f"{train_setting(results, 'batch_size')} × {train_setting(results, 'seq_len')} tokens per run, seeds {results['seeds']} ({results['machine'].get('cpu_count')} CPU cores"
        f"{' + CUDA' if results['machine'].get('cuda') else ''}). {cost_line(results)} "
        f"Mean [95 % CI]: validation loss over the {n} seeds (Student t); accuracies over seeds and items "
        "(two-way random effects, so the CI says whether an accuracy is above chance).",
        "",
        md_table(*results_table(results)),
        "",
        validation_note(results),
    ]
    for endpoint in ENDPOINTS:  # the declared endpoints' own lines (primary, equivalence, plateau)
        if endpoint.slot != "analysis":
            parts += endpoint.markdown(results)
    step0 = step0_table(results)
    if step0:
        parts += ["", "Step-0 control (the converted model before training, the same protocol):", "", md_table(*step0)]
    chance_lines = []
    for m in tasks:
        chance = task_chance(m)
        if chance is None:
            continue
        above = [v["label"] for v in results["variants"].values() if v["summary"].get(m, {}).get("above_chance")]
        chance_lines.append(f"`{m}`: {len(above)} of {len(results['variants'])} variants above chance "
                            f"({100 * chance:.0f} %)" + (f" ({', '.join(above)})" if above else ""))
    if chance_lines:
        parts += ["", "Above chance (the 95 % CI's lower end above the chance accuracy; one test per variant and task, "
                  "not adjusted): " + "; ".join(chance_lines) + "."]
        split = [m for m in tasks if task_chance(m) is not None
                 and 0 < sum(bool(v["summary"].get(m, {}).get("above_chance")) for v in results["variants"].values())
                 < len(results["variants"])]
        if split:
            parts[-1] += (" Above chance for some variants only (" + ", ".join(f"`{m}`" for m in split) + ") is a "
                          "difference in significance, not a significant difference: the paired difference below "
                          "is the test of it.")
    pivot = pivot_comparisons(results, headline)
    if pivot:
        parts += ["", "Paired differences, Δ [raw 95 % CI] (validation loss: t over seeds; accuracies: over seeds and "
                  "items; a direction in bold only where the comparison survives the Benjamini-Hochberg adjustment "
                  "below):", "", md_table(*pivot)]
    questions = questions_list(results)
    if questions:
        parts += ["", "What held and what did not (a direction only where the comparison survives the adjustment):",
                  "", *questions, "", multiplicity_note(results)]
    for endpoint in ENDPOINTS:  # the sink analysis' tables
        if endpoint.slot == "analysis":
            parts += endpoint.markdown(results)
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- the report
def missing_line(results: dict[str, Any]) -> str:
    """The runs a launched study's report leaves out, and that its seeds are the ones measured whole."""
    missing = results["missing_runs"]
    return (f"**Not measured: {', '.join(missing)}** (their jobs failed; `sinkdlm experiment --status` shows their "
            f"logs). Every number here is over seeds {', '.join(map(str, results['seeds']))}, the ones whose every "
            "run and control was measured, so the comparisons stay paired; submitting the same command again "
            "resumes the missing runs and rewrites this report.")


# A paired val_loss figure of a study with block arms: which pairs it leaves out (docs/method.md §15).
BOUNDS_NOTE = ". Pairs of different block sizes are not drawn: their val_loss are different bounds, not compared"


def write_report(results: dict[str, Any], out: Path) -> tuple[Path, Path]:
    from sinkdlm.analysis.figures import plot_paired_differences, plot_score_bars, plot_training_curves

    out = Path(out)
    fig_dir = out / "figures"
    variants = results["variants"]
    doc = Document(f"sinkdlm experiment `{results['preset']}`")
    doc.paragraph(
        f"{results['description']}. Seeds {results['seeds']}; every variant trained with the same budget "
        f"({train_setting(results, 'max_steps'):,} steps × {train_setting(results, 'batch_size')} sequences × "
        f"{train_setting(results, 'seq_len')} tokens on `{train_setting(results, 'data')}`) and the same "
        f"seeds, so the comparisons are paired. {machines_words(results, out)} {cost_line(results)}"
    )
    if results.get("missing_runs"):  # a launched study whose jobs failed for good (docs/method.md §14)
        doc.paragraph(missing_line(results))
    arm_cost = arm_cost_line(results)
    if arm_cost:  # arms that train different parameters: what each one's runs took
        doc.paragraph(arm_cost)
    from sinkdlm.experiment.figures import plot_forest

    def sections(slot: str) -> None:  # each endpoint's own section, where its slot places it
        for endpoint in ENDPOINTS:
            if endpoint.slot == slot:
                endpoint.section(doc, results, out)

    sections("lead")  # the declared primary, the escape endpoint
    doc.heading("Results (mean [95 % CI])")
    doc.table(*results_table(results))
    forest = plot_forest(results, fig_dir / "forest.png", compared_baseline(results))
    if forest:
        doc.image(forest, "Every compared pair: the paired val_loss difference with its 95 % CI over seeds (< 0: the "
                          "first arm is better), ± the study's MDE (the smallest difference it would detect with 80 % "
                          "power) and, where the preset declared a claim of \"≈\", ± its margin with the TOST verdict. "
                          "\"Survives BH\": the difference stays significant after the Benjamini-Hochberg adjustment "
                          "over the report's family of paired comparisons (false discovery rate 5 %), so its direction "
                          "is stated; \"not after BH\": the raw interval excludes 0, the adjusted p does not stay "
                          "below 5 %" + BOUNDS_NOTE * has_block_arms(results))
    sections("body")  # the learning curves, the equivalence claims, the plateau
    doc.paragraph(f"`val_loss` is the validation ELBO bound per token (lower is better), its interval {METHOD_SEEDS}; "
                  f"task metrics are accuracies in %, their intervals over {METHOD_ITEMS}, so they count which items "
                  "were drawn as well as which models training produced. \"(no spread)\": every seed and item alike, no "
                  "interval.")

    doc.paragraph(validation_note(results))
    step0 = step0_table(results)
    if step0:
        doc.heading("Step-0 control")
        doc.paragraph("The converted model before training, scored with the same protocol (fixed validation, sink "
                      "analysis): what training did, apart from what the converted model already had.")
        doc.table(*step0)

    doc.heading("Paired comparisons")
    doc.paragraph(
        f"Each difference is paired: over seeds (validation loss, sink metrics: {METHOD_SEEDS}) or over seeds and "
        f"items (accuracies: {METHOD_ITEMS}). A direction is stated only when the comparison survives the "
        "Benjamini-Hochberg adjustment over the report's family of paired comparisons; the raw 95 % interval is "
        "shown either way. No equivalence margin was declared, so an interval that includes zero says no difference "
        "was detected, not that there is none. MDE: the smallest true difference these seeds would detect with 80 % "
        "power (two-sided 5 %, noncentral t from the observed spread of the paired differences; docs/method.md §7)."
    )
    header, rows = comparisons_table(results)
    doc.table(header, rows) if rows else doc.paragraph("Only one variant: nothing to compare.")
    if any(c["metric"] in TRAINING_METRICS for c in results["comparisons"]):
        doc.paragraph("`log10_peak_grad_norm`: the log10 of each run's largest pre-clip gradient norm in training, so "
                      "a difference is a log ratio (−1: a tenth of the baseline's peak). It measures the loss spikes "
                      "that a moving sink causes (docs/method.md §5); it is described, not called better or worse.")
    for note in (sizing_note(results), multiplicity_note(results)):  # what these seeds could detect, the family
        if note:
            doc.paragraph(note)

    curves = training_curves(results)
    if curves:
        doc.heading("Training")
        doc.image(plot_training_curves(curves, fig_dir / "val_loss.png"),
                  "Validation loss of the training loop (its own per-run noise, not the fixed validation) vs step: "
                  "one thin line per seed and the mean over seeds (thick); no interval is drawn, the paired "
                  "comparison is the next figure")
    diffs = paired_val_loss_differences(results)
    if diffs:
        doc.image(plot_paired_differences(diffs, fig_dir / "val_loss_paired.png"),
                  f"Paired differences of the final `val_loss` (variant − baseline on the same seed): each seed's "
                  f"difference (dots, labelled by seed) and the mean with its 95 % interval ({METHOD_SEEDS}); an "
                  "interval that crosses 0 detects no difference" + BOUNDS_NOTE * has_block_arms(results))
    bars = {}
    for k in task_metrics(results):
        per = {}
        for v in variants.values():
            s = v["summary"].get(k)
            if s and s.get("mean") is not None:  # the interval as reported (clipped to [0, 1]: asymmetric)
                has = s.get("low") is not None and s.get("high") is not None
                per[v["label"]] = (s["mean"], s["low"], s["high"]) if has else (s["mean"], 0.0)
        if per:
            bars[k] = per
    if bars:
        doc.image(plot_score_bars(bars, fig_dir / "scores.png", ylabel="accuracy"), "Task scores (mean and 95 % CI over seeds and items, clipped to [0, 1])")

    sections("analysis")  # the attention sinks
    doc.heading("Files")
    doc.bullets([
        "`results.json`: every number above, per seed (analysis summaries and per-item outcomes included)",
        "`runs/<variant>-s<seed>/train/metrics.jsonl`: training curves",
        "`runs/<variant>-s<seed>/eval.json`: task scores with per-item outcomes",
        "`runs/<variant>-s<seed>/analysis/`: per-model sink analysis", "`compare/report.html`: analyses side by side",
    ])
    return doc.write(out)


def regenerate(experiment_dir: str | Path, pairs: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Rebuild a finished experiment's results.json, report.md and report.html from its stored records,
    with the current statistics: the per-seed records in results.json, refreshed from every
    `runs/<variant>-s<seed>/analysis/analysis.json` that is still there (so fields added to
    `analysis_record` since, such as the per-layer value norms, are filled where the stored analysis
    holds them). Nothing is re-run. The preset's pairs are kept unless `pairs` is given."""
    out = Path(experiment_dir)
    results = json.loads((out / "results.json").read_text())
    refreshed = 0
    for name, v in results["variants"].items():
        for seed, rec in v["seeds"].items():
            stored = out / "runs" / f"{name}-s{seed}" / "analysis" / "analysis.json"
            if stored.is_file():
                rec["analysis"] = analysis_record(json.loads(stored.read_text()))
                refreshed += 1
            peak = grad_norm_peak_steps(out / "runs" / f"{name}-s{seed}" / "train")
            if peak:  # where the run's largest pre-clip gradient norm fell (the metrics log keeps it)
                rec["train_grad_norm_peak"], rec["train_grad_norm_peak_steps"] = peak
    results["timing"] = experiment_timing(results)
    val = results.get("validation") or {}
    if val.get("draws") and results.get("comparison_pairs"):  # runs whose val.json keeps its values: the split
        from sinkdlm.experiment.presets import Validation
        from sinkdlm.experiment.variance import val_loss_splits

        key = Validation(draws=val["draws"], noise_seed=val["noise_seed"], bf16=bool(val.get("bf16")))
        splits = val_loss_splits(out, [tuple(p) for p in results["comparison_pairs"]], results["seeds"], key)
        seq_len, tokens = int((results.get("train") or {}).get("seq_len") or 0), val.get("tokens")
        # only runs scored on the whole set (a stale partial file is no final result)
        complete = [sp for sp in splits if not (seq_len and tokens) or sp["sequences"] * seq_len == tokens]
        if complete:
            results["val_loss_splits"] = complete
    from sinkdlm.experiment.presets import PRESETS

    preset = PRESETS.get(results.get("preset", ""))
    for key in ("primary", "escape"):  # the effect the seeds were sized for, declared with the study in its preset
        stored, now = (results.get("declared") or {}).get(key), preset and getattr(preset(), key)
        if stored and now and "sized_for" not in stored:
            stored["sized_for"] = now.sized_for
    results["regenerated"] = {"analysis_records_refreshed": refreshed,
                              "note": "statistics recomputed from the stored per-seed records; no model was re-run"}
    summarise(results, pairs or [tuple(p) for p in results.get("comparison_pairs", [])] or None)
    atomic_write_json(out / "results.json", results)
    write_report(results, out)
    return results
