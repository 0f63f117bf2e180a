"""The sink-analysis tables of an experiment's report: attention sinks per variant (Rulli et al. Fig. 10,
Table 2), the value norms stated per layer with the step-0 control (One-Token Fig. 3), the sink-masking
curve over seeds × prompts with the keys it really masked (Rulli et al. Table 1), whether the sink token takes
over the moving sinks (`takeover_line`, `takeover_layer_table`), and the AR model beside the DLMs adapted from it,
one table per kind (README). Numbers come from `endpoints.sinks.stats` (stored in results.json, or computed there
on demand); this module only formats them."""

from __future__ import annotations

from typing import Any

from sinkdlm.experiment.formatting import fmt_diff, fmt_interval, short_verdict, train_setting
from sinkdlm.experiment.endpoints.sinks.stats import (
    SINK_TOKEN_TYPES, epsilon_intervals, extra_sink_mass, interval_of, masking_intervals, pooled_value_norm_difference,
    seed_interval, step0_analysis, token_type_intervals, uniform_share,
)
from sinkdlm.stats import signed


def sinks_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    rows = []
    for v in results["variants"].values():
        s = v["summary"]
        if "non_sink_fraction" not in s:
            continue
        rows.append([
            v["label"], fmt_interval(s.get("non_sink_fraction"), 100.0, 1),
            fmt_interval(s.get("content_sink_set_change_rate")), fmt_interval(s.get("content_sink_set_jaccard")),
            f"{fmt_interval(s.get('sink_set_change_rate'))} / {fmt_interval(s.get('sink_set_jaccard'))}",
            fmt_interval(extra_sink_mass(v), 100.0, 1) + _uniform(v),
        ])
    if not rows:
        return None
    return (["variant", "non-sink fraction %", "sink-set change rate (content keys)", "consecutive Jaccard (content keys)",
             "change rate / Jaccard over every key", "attention on the extra sink % (one key's uniform share 1/keys)"],
            rows)


def _uniform(v: dict[str, Any], percent: bool = True) -> str:
    """" (1/keys 1.54 %)": the yardstick printed beside a share of one token, where the keys were recorded."""
    u = uniform_share(v) if v.get("switches", {}).get("num_sink_tokens") else None
    return "" if u is None else f" (1/keys {100 * u:.2f} %)" if percent else f" (1/keys {u:.4f})"


def epsilon_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Fig. 10: non-sink fraction vs ϵ, mean [95 % CI] over seeds."""
    eps_keys: list[str] = []  # the first analysed variant's ϵ, every row on the same columns
    rows = []
    for v in results["variants"].values():
        curve = epsilon_intervals(v, eps_keys)
        if curve is None:
            continue
        eps_keys = eps_keys or list(curve)
        rows.append([v["label"]] + [fmt_interval(curve[e], 100.0, 1) for e in eps_keys])
    return (["variant"] + [f"ϵ = {e}" for e in eps_keys], rows) if rows else None


def token_type_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Table 2: what tokens the sinks sit on, share mean [95 % CI] over seeds."""
    rows = []
    for v in results["variants"].values():
        shares = token_type_intervals(v)
        if shares is not None:
            rows.append([v["label"]] + [fmt_interval(shares[t], 100.0, 1) for t in SINK_TOKEN_TYPES])
    return (["variant"] + [f"{t} %" for t in SINK_TOKEN_TYPES], rows) if rows else None


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

    def which(layers):  # a few layers are named; a longer list is the full report's per-layer table
        return f" (layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))})" if 0 < len(layers) <= 3 else ""

    text = (f"per layer, {sinks} lower than {others} in {len(lower)}{which(lower)}, higher in {len(higher)}{which(higher)}, "
            f"no difference detected in {tested - len(lower) - len(higher)} of {tested} layers tested (paired t over "
            f"{len(lay['seeds'])} seeds per layer, Benjamini-Hochberg over those layers; per layer in the full report)")
    if n > tested:
        text += f"; {n - tested} more without a variance estimate (every seed alike) or with sinks in one seed only"
    return text


def value_norm_lines(results: dict[str, Any]) -> list[str]:
    """The value-norm findings, stated per layer (One-Token Fig. 3): sinks vs normal tokens in every model,
    and the extra sink vs the other tokens from the second layer on, each with the step-0 control (the
    converted model before training) or a note that this run did not measure it. The per-layer numbers
    themselves are a table of the full report (`value_norm_layer_table`), not a list in a sentence."""
    lines = []
    vn = [(v, v["summary"]["value_norm_layers"]) for v in results["variants"].values() if v["summary"].get("value_norm_layers")]
    if vn:
        parts = []
        for v, lay in vn:
            label, seeds = v["label"], lay["seeds"]
            pooled = pooled_value_norm_difference(v, seeds)  # the same seeds, for contrast
            text = f"{label}: {_per_layer_finding(lay, 'sinks', 'normal tokens')}"
            if len(seeds) < len(results["seeds"]):
                text += f" (per-layer norms recorded for seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} only)"
            s0 = v["summary"].get("step0_value_norm_layers")
            if s0:  # one model, no interval: what the converted model had before training
                text += (f"; step-0 control (one model, no interval): sink above normal in {s0['positive_layers']} of "
                         f"{s0['compared_layers']} layers")
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
            shown = [m["mean"] for m in e["attention_mass"] if m and m.get("mean") is not None]
            text = (f"{label}: attention on it {100 * min(shown):.1f}-{100 * max(shown):.1f} % per layer (over seeds "
                    f"{', '.join(e['attention_mass_seeds'])}; per layer in the full report)" if shown else
                    f"{label}: attention on it not recorded")
            vo = e.get("value_norm_vs_others")
            if vo:
                later = vo["layers"][vo["from_layer"]:]
                text += (f"; from the second layer on, {_per_layer_finding(vo, 'the extra sink', 'the other tokens')} "
                         f"(seed{'s' if len(vo['seeds']) > 1 else ''} {', '.join(vo['seeds'])})")
                s0 = (results["variants"][name]["summary"].get("step0_extra_sink_layers") or {}).get("value_norm_vs_others")
                if s0:
                    text += (f"; step-0 control (one model, no interval): below in {s0['negative_layers']} of "
                             f"{s0['compared_layers']} layers")
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


def value_norm_layer_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Per layer, for every model: the mean value norm of sinks / normal tokens over seeds (and of the step-0
    control), and for models with extra sinks the attention on them (%, mean [95 % CI]) and their value norm
    / the other tokens'. The numbers behind `value_norm_lines`."""
    columns: list[tuple[str, list[str]]] = []
    for name, v in results["variants"].items():
        s = v["summary"]
        lay = s.get("value_norm_layers")
        if lay:
            columns.append((f"{v['label']}: sinks / normal", [f"{_layer_values([x], 'a')} / {_layer_values([x], 'b')}"
                                                              for x in lay["layers"]]))
            s0 = s.get("step0_value_norm_layers")
            if s0:
                columns.append((f"{v['label']} step 0: sinks / normal",
                                [f"{_layer_values([x], 'a')} / {_layer_values([x], 'b')}" for x in s0["layers"]]))
        e = s.get("extra_sink_layers")
        if e:
            columns.append((f"{v['label']}: attention on the extra sink %",
                            ["–" if m is None else fmt_interval(m, 100.0, 1) for m in e["attention_mass"]]))
            vo = e.get("value_norm_vs_others")
            if vo:
                columns.append((f"{v['label']}: extra sink / others value norm",
                                [f"{_layer_values([x], 'a')} / {_layer_values([x], 'b')}" for x in vo["layers"]]))
    if not columns:
        return None
    depth = max(len(c) for _, c in columns)
    rows = [[str(i)] + [c[i] if i < len(c) else "–" for _, c in columns] for i in range(depth)]
    return ["layer"] + [h for h, _ in columns], rows


MASKING_METRICS = {"continuation_elbo_per_token": "continuation ELBO / token (nats)",
                   "continuation_block_elbo_per_token": "continuation block ELBO / token (nats)",
                   "continuation_logprob_per_token": "continuation log-likelihood / token (nats)"}


def masking_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The sink-masking curve of every variant (Rulli et al. Table 1): (header, rows),
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
                    delta = fmt_diff(d, bold=False) if not d.get("degenerate") else fmt_interval(d)
                    word = short_verdict(d)
                masked = fmt_interval(row["masked_keys_per_head"], 1.0, 2)
                if row["seeds"] < len(v["seeds"]):
                    masked += f" ({_seeds(row['seeds'])} recorded it)"
                rows.append([v["label"], extra, k, delta, masked, word])
    if not rows:
        return None
    what = " / ".join(MASKING_METRICS.get(m, f"`{m}`") for m in sorted(metrics))
    header = ["variant", "extra sink", "K", f"Δ {what} vs K = 0 [95 % CI, seeds × prompts]",
              "keys masked per (row, layer, head) [95 % CI over seeds]", "verdict"]
    return header, rows


def _seeds(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def masking_note(results: dict[str, Any]) -> str:
    from sinkdlm.config import AnalyzeConfig

    eps = results.get("analysis_settings", {}).get("epsilon", AnalyzeConfig.epsilon)
    return (f"Sink masking (Rulli et al. Table 1): the top-K sinks (ϵ = {eps:g}) of every layer and head get -inf pre-softmax "
            "logits, detected on the unablated forward of the same noised input; a head with fewer than K sinks has "
            "only its sinks masked, so the column of masked keys says how many K really hid. A variant with an extra "
            "sink token is scored twice: with the extra sink never masked (in the heads where it is the largest sink, "
            "masking then spares the sink that matters) and with it a candidate like any other key. Δ is paired within seed and "
            "held-out request and its interval is over seeds × prompts (two-way random effects, t with seeds − 1 df); "
            "a direction only where it survives the report's adjustment.")


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
            return fmt_interval(row["masked_keys_per_head"], 1.0, 2) if row["masked_keys_per_head"] else "not recorded"
        d = row["delta"]
        return "no interval (per-request scores not recorded)" if d.get("missing") else fmt_interval(d, 1.0, 3)

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
    dlm_rows.append(["share of all attention on the extra sink token (one key's uniform share 1/keys)"]
                    + [over_seeds(v, lambda a: (a.get("extra_sink") or {}).get("mean_attention_mass"), True)
                       + _uniform(v, percent=False) if v["switches"].get("num_sink_tokens") else "–" for v in variants])
    dlm_rows.append(["share of heads whose largest sink is the extra sink"]
                    + [over_seeds(v, lambda a: (a.get("moving") or {}).get("extra_sink_share"), True)
                       if v["switches"].get("num_sink_tokens") else "–" for v in variants])
    header = ["measure"] + [v["label"] for v in variants]
    lines += ["", f"The DLMs adapted from it (preset `{dlm['preset']}`), {train_setting(dlm, 'max_steps')} training "
              f"steps, analysed while denoising; mean over {len(dlm['seeds'])} seeds [95 % CI, Student t over "
              "seeds; the masking Δ paired within seed and request, its interval over seeds × prompts]:", "",
              "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in dlm_rows]
    return "\n".join(lines) + "\n"


def takeover_line(results: dict[str, Any]) -> str | None:
    """Does the sink token take over the moving sinks? For each compared arm that has an extra sink: the attention
    on it (all layers, mean [95 % CI] over the analysed seeds) after training and in its step-0 control (one model),
    and the moving-sink rate (sink-set change rate over content keys) against the baseline with the comparison's
    own verdict (a direction only where it survives the report's adjustment)."""
    said = []
    for c in results.get("comparisons") or []:
        if c.get("metric") != "content_sink_set_change_rate":
            continue
        a, b = (results["variants"][n] for n in c["pair"])
        mass = extra_sink_mass(a)
        if mass is None:
            continue
        m0 = ((step0_analysis(a) or {}).get("extra_sink") or {}).get("mean_attention_mass")
        if m0 is not None:
            step0 = f"; {100 * m0:.1f} % in its step-0 control"
        elif (a.get("step0") or {}).get("per_seed"):  # one seed's control would stand for all
            step0 = "; its step-0 controls, one per seed, were not all analysed: not shown"
        else:
            step0 = ""
        u = uniform_share(a)
        uniform = "" if u is None else f"; a uniformly attended key would get 1/keys = {100 * u:.2f} %"
        said.append(f"{a['label']}: the sink token holds {fmt_interval(mass, 100.0, 1)} % of the attention (all layers"
                    f"{uniform}{step0}); its moving-sink rate (sink-set change rate, content keys) against "
                    f"{b['label']}: {c['verdict']}")
    if not said:
        return None
    return "**Does the sink token take over the moving sinks?** " + "; ".join(said) + "."


# The per-layer measures of `takeover_layer_table`: (what, read from a seed's analysis record, scale, digits).
LAYER_MEASURES = (
    ("moving-sink rate (sink-set change rate, content keys)",
     lambda a: (a.get("moving_per_layer") or {}).get("content_sink_set_change_rate"), 1.0, 3),
    ("attention on the sink token %", lambda a: (a.get("extra_sink") or {}).get("attention_mass"), 100.0, 1),
)


def takeover_layer_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Does the sink token take over the moving sinks, layer by layer (docs/method.md §12: a sink added late may take over in
    some layers only): per arm, the moving-sink rate and the attention on the sink token in each layer, mean [95 %
    CI, Student t over the analysed seeds, kept in [0, 1]], and each step-0 control's (one model, no interval) once.
    Described, not tested: the declared comparisons are the all-layer rates of the paired-comparison table."""
    rows, n_layers, controls = [], 0, set()

    def add(label: str, what: str, series: list[list[float]], scale: float, digits: int) -> None:
        nonlocal n_layers
        series = [s for s in series if s and len(s) == len(series[0])]
        if not series:
            return
        n_layers = max(n_layers, len(series[0]))
        if len(series) == 1:
            cells = [f"{scale * x:.{digits}f}" for x in series[0]]
        else:
            cells = [fmt_interval(interval_of([s[i] for s in series], share=True), scale, digits)
                     for i in range(len(series[0]))]
        rows.append([label, what, *cells])

    for v in results["variants"].values():
        recs = [rec["analysis"] for rec in v["seeds"].values() if rec.get("analysis")]
        for what, get, scale, digits in LAYER_MEASURES:
            what += _uniform(v) if scale == 100.0 else ""  # a share beside its yardstick
            add(v["label"], f"{what} ({len(recs)} seeds)", [get(a) for a in recs if get(a)], scale, digits)
        step0 = v.get("step0") or {}
        where = step0.get("analysis_dir") or step0.get("checkpoint")
        control = step0_analysis(v)  # only a control that stands for every seed
        if control and where not in controls:  # arms that share a control print it once
            controls.add(where)
            for what, get, scale, digits in LAYER_MEASURES:
                if get(control):
                    add(f"{v['label']}: its step-0 control", what, [get(control)], scale, digits)
    if not rows:
        return None
    return ["arm", "measure", *(f"layer {i}" for i in range(n_layers))], [r + ["–"] * (n_layers + 2 - len(r)) for r in rows]
