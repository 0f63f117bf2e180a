"""The experiment's report: tables, the README's Markdown summary, report.md / report.html, `regenerate`.

Every number and verdict comes from `sinkdlm.experiment.summary` (`summarise` stores them in
results.json; the intervals the tables add beside them are computed there on demand); this module
only formats them. `markdown_summary` renders the tables that the README shows, from a results.json
alone (a test regenerates the README's tables from the committed file), and `ar_vs_dlm_markdown` the
README's table of an experiment's DLMs beside the autoregressive model they came from (analysed over
prompts); `regenerate` rebuilds a committed experiment's results.json and report from its stored records.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from sinkdlm.atomic import atomic_write_json
from sinkdlm.experiment.summary import (
    ANALYSIS_METRICS, METHOD_ITEMS, METHOD_SEEDS, SINK_TOKEN_TYPES, analysis_record, epsilon_intervals,
    experiment_timing, extra_sink_mass, masking_intervals, pooled_value_norm_difference, seed_interval, summarise,
    paired_val_loss_differences, task_chance, task_metrics, token_type_intervals, training_curves,
)
from sinkdlm.reporting import Document
from sinkdlm.stats import signed


# ----------------------------------------------------------------------------- formatting
def _fmt_interval(s: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    if not s or s.get("mean") is None:
        return "–"
    text = f"{scale * s['mean']:.{digits}f}"
    text = text[1:] if text.startswith("-") and float(text) == 0 else text  # never "-0.0"
    if s.get("degenerate"):
        return text + " (no spread)"
    if s.get("low") is not None and s.get("high") is not None:
        low, high = (signed(scale * s[k], digits).lstrip("+") for k in ("low", "high"))
        text += f" [{low}, {high}]"
    elif s.get("n", 2) < 2:  # one seed: no interval (not the whole range)
        text += " [–]"
    return text


def _setting(results: dict[str, Any], key: str) -> Any:
    """A training setting of the experiment: results.json keeps only what the preset set, the rest are
    TrainConfig's defaults (so a report never prints "None sequences")."""
    from sinkdlm.config import TrainConfig
    from sinkdlm.config.fields import field_default

    value = results["train"].get(key)
    if value is None:
        field = next(f for f in dataclasses.fields(TrainConfig) if f.name == key)
        value = field_default(field)
    return value


def _fmt_diff(c: dict, bold: bool = True) -> str:
    """"Δ [low, high]" of a comparison, and its direction in bold when it survives the adjustment."""
    if c.get("missing"):
        return c["verdict"].removeprefix("missing: ")
    scale = c.get("scale", 1.0)
    digits = 1 if scale != 1.0 else 3
    cell = signed(scale * c["mean"], digits)
    if c.get("degenerate"):
        return cell + " (no variance)"
    if c["low"] is not None:
        cell += f" [{signed(scale * c['low'], digits)}, {signed(scale * c['high'], digits)}]"
    if bold and c.get("survives"):
        cell += f" **{c['verdict'].split(' ')[0]}**"
    return cell


def _is_pct(metric: str) -> bool:
    return "/" in metric


def results_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    variants = results["variants"]
    metrics = ["val_loss"] + task_metrics(results)
    def head(m):
        chance = task_chance(m) if _is_pct(m) else None
        return f"`{m}`" + ((" %" + (f" (chance {100 * chance:.0f})" if chance else "")) if _is_pct(m) else " (↓)")

    header = ["variant"] + [head(m) for m in metrics]
    rows = [[v["label"]] + [_fmt_interval(v["summary"].get(m), 100.0 if _is_pct(m) else 1.0, 1 if _is_pct(m) else 3)
                            for m in metrics] for v in variants.values()]
    return header, rows


def _short_verdict(c: dict) -> str:
    if c.get("missing"):
        return "missing"
    if not c.get("in_family", True):
        return "not tested (alternative)"
    if c.get("degenerate"):
        return "no variance estimate"
    if c.get("survives"):
        return c["verdict"].split(" (")[0].split(" by ")[0]
    if c.get("excludes_zero"):
        return f"inconclusive after BH (adjusted p = {c['p_adjusted']:.2g})" if c.get("p_adjusted") is not None else "inconclusive"
    return f"no difference detected ({c['n']} seeds)"


def comparisons_table(results: dict[str, Any], metrics: set[str] | None = None) -> tuple[list[str], list[list[str]]]:
    rows = []
    for c in results["comparisons"]:
        if metrics is not None and c["metric"] not in metrics:
            continue
        scale = c.get("scale", 1.0)
        digits = 1 if scale != 1.0 else 3
        ci = "–" if c.get("low") is None else f"[{signed(scale * c['low'], digits)}, {signed(scale * c['high'], digits)}]"
        mean = "–" if c.get("mean") is None else signed(scale * c["mean"], digits)
        adj = "–" if c.get("p_adjusted") is None else f"{c['p_adjusted']:.2g}"
        mde = "–" if c.get("mde") is None else f"{scale * c['mde']:.{digits}f}"
        rows.append([f"{c['variant']} − {c['baseline']}", f"`{c['metric']}`", mean, ci, mde, adj,
                     c.get("method_label", "–"), _short_verdict(c)])
    return ["difference", "metric", "Δ", "95 % CI (raw)", "MDE (80 % power)", "BH-adjusted p", "interval",
            "verdict"], rows


def sinks_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    rows = []
    for v in results["variants"].values():
        s = v["summary"]
        if "non_sink_fraction" not in s:
            continue
        rows.append([
            v["label"], _fmt_interval(s.get("non_sink_fraction"), 100.0, 1),
            _fmt_interval(s.get("content_sink_set_change_rate")), _fmt_interval(s.get("content_sink_set_jaccard")),
            f"{_fmt_interval(s.get('sink_set_change_rate'))} / {_fmt_interval(s.get('sink_set_jaccard'))}",
            _fmt_interval(extra_sink_mass(v), 100.0, 1),
        ])
    if not rows:
        return None
    return (["variant", "non-sink fraction %", "sink-set change rate (content keys)", "consecutive Jaccard (content keys)",
             "change rate / Jaccard over every key", "attention on the extra sink %"], rows)


def epsilon_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Fig. 10: non-sink fraction vs ϵ, mean [95 % CI] over seeds."""
    eps_keys: list[str] = []  # the first analysed variant's ϵ, every row on the same columns
    rows = []
    for v in results["variants"].values():
        curve = epsilon_intervals(v, eps_keys)
        if curve is None:
            continue
        eps_keys = eps_keys or list(curve)
        rows.append([v["label"]] + [_fmt_interval(curve[e], 100.0, 1) for e in eps_keys])
    return (["variant"] + [f"ϵ = {e}" for e in eps_keys], rows) if rows else None


def token_type_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Table 2: what tokens the sinks sit on, share mean [95 % CI] over seeds."""
    rows = []
    for v in results["variants"].values():
        shares = token_type_intervals(v)
        if shares is not None:
            rows.append([v["label"]] + [_fmt_interval(shares[t], 100.0, 1) for t in SINK_TOKEN_TYPES])
    return (["variant"] + [f"{t} %" for t in SINK_TOKEN_TYPES], rows) if rows else None


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def pivot_comparisons(results: dict[str, Any], metrics: list[str]) -> tuple[list[str], list[list[str]]] | None:
    """One row per compared pair, one column per metric: "Δ [raw CI]", with the verdict's direction in
    bold only when the comparison survives the multiplicity adjustment (compact enough for the README)."""
    by_pair: dict[tuple[str, str], dict[str, dict]] = {}
    labels: dict[tuple[str, str], str] = {}
    for c in results["comparisons"]:
        key = tuple(c.get("pair") or (c["variant"], c["baseline"]))
        by_pair.setdefault(key, {})[c["metric"]] = c
        labels[key] = f"{c['variant']} − {c['baseline']}"
    metrics = [m for m in metrics if any(m in per for per in by_pair.values())]
    if not by_pair or not metrics:
        return None
    rows = [[labels[key]] + [_fmt_diff(per[m]) if m in per else "–" for m in metrics] for key, per in by_pair.items()]
    header = ["difference"] + [f"`{m}`" + (" (points)" if _is_pct(m) else "") for m in metrics]
    return header, rows


QUESTION_METRICS = ("val_loss", "shakespeare_word_order/acc", "shakespeare_next_line/acc_norm", "shakespeare_cloze/acc",
                    "non_sink_fraction", "content_sink_set_change_rate")


def _layer_values(layers: list[dict], key: str, digits: int = 1) -> str:
    return "/".join("–" if lay.get(key) is None else f"{lay[key]:.{digits}f}" for lay in layers)


def _per_layer_finding(lay: dict, sinks: str, others: str) -> str:
    """"lower in a, higher in b, no difference detected in c of n layers" from the per-layer paired
    intervals over seeds, a direction only where a layer survives Benjamini-Hochberg over the layers."""
    tests = lay.get("per_layer_tests") or {}
    n = lay["compared_layers"]
    if len(lay["seeds"]) < 2:
        return (f"{sinks} above {others} in {lay['positive_layers']} and below in {lay['negative_layers']} of {n} layers "
                "(point estimates from 1 seed: no interval, no verdict)")
    tested = tests.get("tested", 0)
    lower, higher = tests.get("lower", []), tests.get("higher", [])

    def which(layers):
        return f" (layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))})" if layers else ""

    text = (f"per layer, {sinks} lower than {others} in {len(lower)}{which(lower)}, higher in {len(higher)}{which(higher)}, "
            f"no difference detected in {tested - len(lower) - len(higher)} of {tested} layers tested (paired t over "
            f"{len(lay['seeds'])} seeds per layer, Benjamini-Hochberg over those layers)")
    if n > tested:
        text += f"; {n - tested} more without a variance estimate (every seed alike) or with sinks in one seed only"
    return text


def value_norm_lines(results: dict[str, Any]) -> list[str]:
    """The value-norm findings, stated per layer (One-Token Fig. 3): sinks vs normal tokens in every model,
    and the extra sink vs the other tokens from the second layer on, each with the step-0 control (the
    converted model before training) or a note that this run did not measure it."""
    lines = []
    vn = [(v, v["summary"]["value_norm_layers"]) for v in results["variants"].values() if v["summary"].get("value_norm_layers")]
    if vn:
        parts = []
        for v, lay in vn:
            label, seeds = v["label"], lay["seeds"]
            pooled = pooled_value_norm_difference(v, seeds)  # the same seeds, for contrast
            text = (f"{label}: {_per_layer_finding(lay, 'sinks', 'normal tokens')}; mean per layer "
                    f"{_layer_values(lay['layers'], 'a')} vs {_layer_values(lay['layers'], 'b')}")
            if len(seeds) < len(results["seeds"]):
                text += f" (per-layer norms recorded for seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} only)"
            s0 = v["summary"].get("step0_value_norm_layers")
            if s0:  # one model, no interval: what the converted model had before training
                text += (f"; step-0 control (one model, no interval) {_layer_values(s0['layers'], 'a')} vs "
                         f"{_layer_values(s0['layers'], 'b')} (sink above normal in {s0['positive_layers']} of "
                         f"{s0['compared_layers']} layers)")
            else:
                text += "; step-0 control: not measured in this run"
            if lay.get("layer_mean"):
                text += (f"; the unweighted mean over layers of sink − normal (a summary, not a statement about every "
                         f"layer) {lay['layer_mean']['verdict']}")
            if pooled is not None:
                text += f"; pooled over layers (weighted by sink counts), the same seeds: {signed(pooled)}"
            parts.append(text)
        lines.append("- **Do sinks carry smaller value vectors than normal tokens?** (value norm of sinks vs of "
                     "normal tokens, paired within layer and seed) " + "; ".join(parts) + ".")
    extra = [(name, v["label"], v["summary"]["extra_sink_layers"]) for name, v in results["variants"].items()
             if v["summary"].get("extra_sink_layers")]
    if extra:
        parts = []
        for name, label, e in extra:
            mass = "/".join("–" if m is None else _fmt_interval(m, 100.0, 1) for m in e["attention_mass"])
            text = f"{label}: attention on it per layer {mass} % (over seeds {', '.join(e['attention_mass_seeds'])})"
            vo = e.get("value_norm_vs_others")
            if vo:
                later = vo["layers"][vo["from_layer"]:]
                text += (f"; from the second layer on, {_per_layer_finding(vo, 'the extra sink', 'the other tokens')}; "
                         f"mean per layer {_layer_values(later, 'a')} vs {_layer_values(later, 'b')} "
                         f"(seed{'s' if len(vo['seeds']) > 1 else ''} {', '.join(vo['seeds'])})")
                s0 = (results["variants"][name]["summary"].get("step0_extra_sink_layers") or {}).get("value_norm_vs_others")
                if s0:
                    s0_later = s0["layers"][s0["from_layer"]:]
                    text += (f"; step-0 control (one model, no interval) {_layer_values(s0_later, 'a')} vs "
                             f"{_layer_values(s0_later, 'b')} (below in {s0['negative_layers']} of {s0['compared_layers']} "
                             "layers)")
                else:
                    text += "; step-0 control: not measured in this run"
                if vo.get("layer_mean"):
                    text += f"; the unweighted mean over those layers {vo['layer_mean']['verdict']}"
            else:
                text += "; its value norm per layer was not recorded for these runs"
            parts.append(text)
        lines.append("- **Is the extra sink's value norm below the other tokens' from the second layer on "
                     "(One-Token Fig. 3)?** " + "; ".join(parts) + ".")
    return lines


MASKING_METRICS = {"continuation_elbo_per_token": "continuation ELBO / token (nats)",
                   "continuation_logprob_per_token": "continuation log-likelihood / token (nats)"}


def masking_table(results: dict[str, Any]) -> tuple[str, list[str], list[list[str]]] | None:
    """The sink-masking curve of every variant (Rulli et al. Table 1): (what the score is, header, rows),
    one row per variant, setting of the extra sink and K; None when no variant ran the ablation."""
    rows, metrics = [], set()
    for v in results["variants"].values():
        m = v["summary"].get("masking")
        if not m:
            continue
        metrics.add(m["metric"])
        has_extra = bool(v.get("switches", {}).get("num_sink_tokens"))
        for setting in m["settings"]:
            extra = ("masked when among the top K" if setting["include_extra_sink"] else "never masked") if has_extra else "–"
            if not setting["measured"]:
                rows.append([v["label"], extra, "–", "not measured in this run",
                             "not measured in this run", "–"])
                continue
            for k, row in setting["k"].items():
                d = row["delta"]
                if d.get("missing"):
                    delta = (("–" if d.get("mean") is None else f"{signed(d['mean'], 3)} (mean over {_seeds(d['seeds'])})")
                             + ": per-request scores not recorded, no interval")
                    word = "no interval"
                else:
                    delta = _fmt_diff(d, bold=False) if not d.get("degenerate") else _fmt_interval(d)
                    word = _short_verdict(d)
                masked = _fmt_interval(row["masked_keys_per_head"], 1.0, 2)
                if row["seeds"] < len(v["seeds"]):
                    masked += f" ({_seeds(row['seeds'])} recorded it)"
                rows.append([v["label"], extra, k, delta, masked, word])
    if not rows:
        return None
    what = " / ".join(MASKING_METRICS.get(m, f"`{m}`") for m in sorted(metrics))
    header = ["variant", "extra sink", "K", f"Δ {what} vs K = 0 [95 % CI, seeds × prompts]",
              "keys masked per (row, layer, head) [95 % CI over seeds]", "verdict"]
    return what, header, rows


def _seeds(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def masking_note(results: dict[str, Any]) -> str:
    from sinkdlm.config import AnalyzeConfig

    eps = results.get("analysis_settings", {}).get("epsilon", AnalyzeConfig.epsilon)
    return (f"Sink masking (Rulli et al. Table 1): the top-K sinks (ϵ = {eps:g}) of every layer and head get -inf pre-softmax "
            "logits, detected on the unablated forward of the same noised input; a head with fewer than K sinks has "
            "only its sinks masked, so the column of masked keys says how many K really hid. A variant with an extra "
            "sink token is scored twice: with the extra sink never masked (it holds most of the attention, so sparing "
            "it makes masking look cheap) and with it a candidate like any other key. Δ is paired within seed and "
            "held-out request and its interval is over seeds × prompts (two-way random effects, t with seeds − 1 df); "
            "a direction only where it survives the report's adjustment.")


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
    return lines + value_norm_lines(results)


def multiplicity_note(results: dict[str, Any]) -> str:
    """Which adjustment, over which family, and what survived it."""
    mult = results.get("multiplicity")
    if not mult:
        return ""
    left = mult["left_out"]
    const = results.get("constant_metrics") or []
    out = (f"Multiplicity: {mult['method']} at q = {100 * mult['q']:g} % over the family of {mult['size']} paired "
           f"comparisons in this report ({mult['family']}). Left out, because they are no tests: "
           f"{left['alternative definitions']} comparisons of alternative definitions (shown for reference), "
           f"{left['no variance estimate']} without a variance estimate"
           + (f" (metrics that cannot vary: {', '.join(f'`{m}`' for m in const)})" if const else "")
           + f", {left['one seed']} with one seed, {left['missing']} missing. "
           f"{mult['raw_excluding_zero']} of the {mult['size']} raw 95 % intervals exclude zero, where "
           f"{mult['expected_by_chance']:.1f} would by chance alone; {mult['survivors']} survive the adjustment")
    if mult.get("min_p_adjusted") is not None:
        out += f" (smallest adjusted p = {mult['min_p_adjusted']:.2g})"
    return out + (". A direction, and bold, only for those; the raw interval stays in every table. Without an "
                  "equivalence test (none was declared), an interval that includes zero means no difference "
                  "detected, not the same.")


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
            f"(`{val['estimator']}`)")
    if ses:
        text += f"; Monte-Carlo standard error per run {min(ses):.4f}-{max(ses):.4f} nats"
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
                     _fmt_interval(v["summary"].get("val_loss")),
                     "–" if nsf0 is None else f"{100 * nsf0:.1f}",
                     _fmt_interval(v["summary"].get("non_sink_fraction"), 100.0, 1)])
    if not rows:
        return None
    return ["variant", "step 0 `val_loss`", "trained `val_loss` [95 % CI]", "step 0 non-sink %",
            "trained non-sink % [95 % CI]"], rows


def markdown_summary(results: dict[str, Any]) -> str:
    """The README's tables for one experiment, generated from its results.json only."""
    t = results["train"]
    n = len(results["seeds"])
    tasks = task_metrics(results)
    headline = ["val_loss"] + [m for m in tasks if m.endswith(("word_order/acc", "cloze/acc", "next_line/acc_norm", "/exact_match"))
                               and "cloze/exact" not in m]
    parts = [
        f"Preset `{results['preset']}`: {results['description']}. {_setting(results, 'max_steps')} steps × "
        f"{_setting(results, 'batch_size')} × {_setting(results, 'seq_len')} tokens per run, seeds {results['seeds']} ({results['machine'].get('cpu_count')} CPU cores"
        f"{' + CUDA' if results['machine'].get('cuda') else ''}). {cost_line(results)} "
        f"Mean [95 % CI]: validation loss over the {n} seeds (Student t); accuracies over seeds and items "
        "(two-way random effects, so the CI says whether an accuracy is above chance).",
        "",
        _md_table(*results_table(results)),
        "",
        validation_note(results),
    ]
    step0 = step0_table(results)
    if step0:
        parts += ["", "Step-0 control (the converted model before training, the same protocol):", "", _md_table(*step0)]
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
                  "below):", "", _md_table(*pivot)]
    questions = questions_list(results)
    if questions:
        parts += ["", "What held and what did not (a direction only where the comparison survives the adjustment):",
                  "", *questions, "", multiplicity_note(results)]
    sinks = sinks_table(results)
    if sinks:
        parts += ["", "Attention sinks (ϵ = 3, every seed's model, mean [95 % CI] over seeds; shares kept in [0, 1]):",
                  "", _md_table(*sinks)]
        pivot = pivot_comparisons(results, ["non_sink_fraction", "content_sink_set_change_rate", "content_sink_set_jaccard"])
        if pivot:
            parts += ["", _md_table(*pivot)]
    masking = masking_table(results)
    if masking:
        parts += ["", masking_note(results), "", _md_table(*masking[1:])]
    return "\n".join(parts) + "\n"


def ar_vs_dlm_markdown(ar: dict, dlm: dict) -> str:
    """Rulli et al.'s contrast on one set of weights, split by kind so that every table compares like with
    like: the AR model alone (decoding steps, exact log-likelihood, intervals over prompts, from
    `analyze --per-prompt`), then the DLMs adapted from it side by side (denoising steps, ELBO,
    intervals over seeds, or seeds × prompts for the masking Δ, from the experiment's results.json).
    No number of one table is compared with the other's: the steps, the score and the unit differ."""
    from sinkdlm.analysis.over_prompts_report import fmt_interval as _fmt

    s = ar["summary"]
    n_prompts = ar["setup"]["num_prompts"]
    ab = s.get("ablation") or {}
    ks = [k for k in ("1", "10") if k in ab]
    ar_rows = [["sink-set change rate between consecutive decoding steps (content keys)",
                _fmt(s["moving"].get("content_sink_set_change_rate") or s["moving"].get("sink_set_change_rate"), 1, 4)],
               ["largest-sink position change rate between consecutive decoding steps",
                _fmt(s["moving"].get("largest_sink_change_rate"), 1, 4)]]
    for k in ks:
        ar_rows.append([f"Δ continuation log-likelihood / token (nats), top-{k} sinks masked in every head",
                        _fmt(ab[k].get("delta"), 1, 3)])
        ar_rows.append([f"keys masked per (row, layer, head) at K = {k}", _fmt(ab[k].get("masked_keys_per_head"), 1, 2)])
    lines = [f"The AR model ({ar['model'].get('label', 'model')}), greedy decoding, one token per step; mean over "
             f"{n_prompts} prompts [95 % CI, Student t over prompts; Δ paired within prompt]:", "",
             "| measure | AR |", "|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in ar_rows]

    names = [n for n, v in dlm["variants"].items() if v["seeds"]]
    variants = [dlm["variants"][n] for n in names]

    def over_seeds(v: dict, get, share: bool = False) -> str:
        iv = seed_interval(v, get, share)
        return "n/a" if iv is None else _fmt(iv, 1, 4 if share else 3)

    def masking(v: dict) -> dict | None:
        return v["summary"].get("masking") or masking_intervals(v)

    def masking_cell(v: dict, include: bool, k: str, what: str) -> str:
        m = masking(v)
        if not v.get("switches", {}).get("num_sink_tokens") and include:
            return "– (no extra sink)"
        setting = next((st for st in (m or {}).get("settings", []) if st["include_extra_sink"] == include), None)
        if setting is None or not setting["measured"]:
            return "not measured in this run"
        row = setting["k"].get(k)
        if row is None:
            return "–"
        if what == "masked":
            return _fmt_interval(row["masked_keys_per_head"], 1.0, 2) if row["masked_keys_per_head"] else "not recorded"
        d = row["delta"]
        return "no interval (per-request scores not recorded)" if d.get("missing") else _fmt_interval(d, 1.0, 3)

    dlm_rows = [["sink-set change rate between consecutive denoising steps (content keys)"]
                + [over_seeds(v, lambda a: (a.get("moving") or {}).get("content_sink_set_change_rate")
                              or (None if v["switches"].get("num_sink_tokens") else (a.get("moving") or {}).get("sink_set_change_rate")),
                              True) for v in variants],
                ["largest-sink position change rate between consecutive denoising steps"]
                + [over_seeds(v, lambda a: (a.get("moving") or {}).get("largest_sink_change_rate"), True) for v in variants]]
    for k in ks:
        for include, which in ((False, "an extra sink never masked"), (True, "the extra sink a candidate too")):
            dlm_rows.append([f"Δ continuation ELBO / token (nats), top-{k} sinks masked in every head, {which} "
                             "[seeds × prompts]"] + [masking_cell(v, include, k, "delta") for v in variants])
            dlm_rows.append([f"keys masked per (row, layer, head) at K = {k}, {which}"]
                            + [masking_cell(v, include, k, "masked") for v in variants])
    dlm_rows.append(["share of all attention on the extra sink token"]
                    + [over_seeds(v, lambda a: (a.get("extra_sink") or {}).get("mean_attention_mass"), True)
                       if v["switches"].get("num_sink_tokens") else "–" for v in variants])
    dlm_rows.append(["share of heads whose largest sink is the extra sink"]
                    + [over_seeds(v, lambda a: (a.get("moving") or {}).get("extra_sink_share"), True)
                       if v["switches"].get("num_sink_tokens") else "–" for v in variants])
    header = ["measure"] + [v["label"] for v in variants]
    lines += ["", f"The DLMs adapted from it (preset `{dlm['preset']}`), {dlm['train'].get('max_steps', '?')} training "
              f"steps, analysed while denoising; mean over {len(dlm['seeds'])} seeds [95 % CI, Student t over "
              "seeds; the masking Δ paired within seed and request, its interval over seeds × prompts]:", "",
              "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in dlm_rows]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the report
def write_report(results: dict[str, Any], out: Path) -> tuple[Path, Path]:
    from sinkdlm.analysis.figures import plot_paired_differences, plot_score_bars, plot_training_curves

    out = Path(out)
    fig_dir = out / "figures"
    variants = results["variants"]
    doc = Document(f"sinkdlm experiment `{results['preset']}`")
    m = results["machine"]
    doc.paragraph(
        f"{results['description']}. Seeds {results['seeds']}; every variant trained with the same budget "
        f"({_setting(results, 'max_steps')} steps × {_setting(results, 'batch_size')} sequences × "
        f"{_setting(results, 'seq_len')} tokens on `{_setting(results, 'data')}`) and the same "
        f"seeds, so the comparisons are paired. Machine: {m['processor']}, {m['cpu_count']} cores, torch {m['torch']}, "
        f"CUDA {'yes' if m['cuda'] else 'no'}. {cost_line(results)}"
    )
    doc.heading("Results (mean [95 % CI])")
    doc.table(*results_table(results))
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
    note = multiplicity_note(results)
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
                  "interval that crosses 0 detects no difference")
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

    _analysis_section(doc, results, out)
    doc.heading("Files")
    doc.bullets([
        "`results.json`: every number above, per seed (analysis summaries and per-item outcomes included)",
        "`runs/<variant>-s<seed>/train/metrics.jsonl`: training curves",
        "`runs/<variant>-s<seed>/eval.json`: task scores with per-item outcomes",
        "`runs/<variant>-s<seed>/analysis/`: per-model sink analysis", "`compare/report.html`: analyses side by side",
    ])
    return doc.write(out)


def _analysis_section(doc: Document, results: dict[str, Any], out: Path) -> None:
    sinks = sinks_table(results)
    if sinks is None:
        return
    eps = results.get("analysis_settings", {}).get("epsilon", 3.0)
    doc.heading(f"Attention sinks (ϵ = {eps}; mean [95 % CI] over the analysed seeds, shares kept in [0, 1])")
    doc.table(*sinks)
    doc.paragraph("Moving sinks are compared over the content keys: the extra sink's key is a sink at nearly every "
                  "step and would count as overlap for the sink models only (docs/method.md §6). The definition "
                  "over every key is kept beside it as the alternative.")
    header, rows = comparisons_table(results, set(ANALYSIS_METRICS))
    if rows:
        doc.table(header, rows)
    lines = value_norm_lines(results)
    if lines:
        doc.heading("Value norms per layer (One-Token Fig. 3)", 3)
        doc.paragraph("Pooling over layers weights each layer by its number of sinks and can flip the sign, so sinks "
                      "and normal tokens are compared within each layer and seed, and summarised by the unweighted "
                      "mean over layers.")
        doc.bullets([line.removeprefix("- ") for line in lines])
    eps_t = epsilon_table(results)
    if eps_t:
        doc.heading("Non-sink fraction vs ϵ (Rulli et al. Fig. 10)", 3)
        doc.table(*eps_t)
    types = token_type_table(results)
    if types:
        doc.heading("What the sinks sit on (Rulli et al. Table 2)", 3)
        doc.table(*types)
    masking = masking_table(results)
    if masking:
        doc.heading("Sink-masking ablation (Rulli et al. Table 1)", 3)
        doc.paragraph(masking_note(results))
        doc.table(*masking[1:])
    samples = [(v["label"], seed, rec["analysis"]) for v in results["variants"].values()
               for seed, rec in list(v["seeds"].items())[:1] if (rec.get("analysis") or {}).get("samples")]
    if samples:
        doc.heading("Generations (first seed; repetition rate = 1 − distinct / total pieces)", 3)
        for label, seed, a in samples:
            rate = "–" if a.get("repetition_rate") is None else f"{a['repetition_rate']:.2f}"
            doc.paragraph(f"{label}, seed {seed}: repetition rate {rate}; over seeds "
                          f"{_fmt_interval(v_summary(results, label).get('repetition_rate'), 1.0, 2)}")
            doc.bullets([f"`{x[:160]!r}`" for x in a["samples"][:4]])
    for name, v in results["variants"].items():
        seed, first = next(iter(v["seeds"].items()))
        # The experiment's own copy first: the stored `analysis_dir` is the path the run was started
        # with (relative to its working directory), which a moved or committed experiment no longer has.
        adir = out / "runs" / f"{name}-s{seed}" / "analysis"
        if not (adir / "analysis.json").is_file():
            adir = Path(first.get("analysis_dir") or adir)
        if not (adir / "analysis.json").is_file():
            continue
        figures = json.loads((adir / "analysis.json").read_text()).get("figures", {})
        names = figures.values() if isinstance(figures, dict) else figures
        for file in names:
            doc.image(adir / file, f"{v['label']}: {Path(file).stem.replace('_', ' ')}")


def v_summary(results: dict[str, Any], label: str) -> dict[str, Any]:
    return next((v.get("summary") or {}) for v in results["variants"].values() if v["label"] == label)


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
    results["timing"] = experiment_timing(results)
    results["regenerated"] = {"analysis_records_refreshed": refreshed,
                              "note": "statistics recomputed from the stored per-seed records; no model was re-run"}
    summarise(results, pairs or [tuple(p) for p in results.get("comparison_pairs", [])] or None)
    atomic_write_json(out / "results.json", results)
    write_report(results, out)
    return results
