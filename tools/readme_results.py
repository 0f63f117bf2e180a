"""Developer tooling: regenerate the README's result blocks from the committed results files.

Each block (on the pages of `PAGES`) sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->` and is generated from
`docs/results/NAME/`: an experiment's `results.json` (`sinkdlm.experiment.report.markdown_summary`; a block
`NAME#PART` holds one part of it, `report.summary_part`, e.g. the one-line verdict under a figure)
or an analysis over prompts' `intervals.json` (`sinkdlm.analysis.over_prompts_report.markdown_headline`);
the `bench/...` blocks of docs/benchmarks.md from `benchmarks/results/*.json` (`COMBINED`).
`tests/project/test_readme_results.py` checks that every block equals what this file generates.

    .venv/bin/python tools/readme_results.py          # what `make readme-results` runs
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = re.compile(r"<!-- results:([\w./#-]+) -->")
# The pages with generated blocks (docs/guide.md: the demo's measured time under its preset table).
PAGES = (README, ROOT / "docs" / "results" / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "guide.md")


def block_names(readme: Path = README) -> list[str]:
    return MARKER.findall(readme.read_text())


def _bench_result(name: str) -> dict | None:
    """benchmarks/results/NAME as a dict, or None when that benchmark has not been run (committed) yet."""
    path = ROOT / "benchmarks" / "results" / name
    return json.loads(path.read_text()) if path.is_file() else None


def _ar_vs_dlm(results_root: Path) -> str | None:
    ar, dlm = results_root / "smollm2" / "ar" / "intervals.json", results_root / "smollm2" / "dlm" / "results.json"
    if not (ar.is_file() and dlm.is_file()):
        return None
    from sinkdlm.experiment.endpoints.sinks.tables import ar_vs_dlm_markdown

    return ar_vs_dlm_markdown(json.loads(ar.read_text()), json.loads(dlm.read_text()))


def _bench_real_train(results_root: Path) -> str | None:
    r = _bench_result("bench_real_train.json")
    if r is None:
        return None
    b, l = r["batch"]
    lines = [f"{r['model']}, batch {b} × {l}, fp32, {r['threads']} threads, median of {r['repeats']} round-robin rounds "
             "(`benchmarks/bench_real_train.py`):", "", "| training step (forward + backward) | median s | speed-up vs transformers |",
             "|---|---:|---:|"]
    lines += [f"| {k} | {v:.3f} | {r['speedup_vs_transformers'][k]:.2f}× |" for k, v in r["median_s"].items()]
    lines += ["", f"The LM head on the masked positions only makes the step {r['masked_head_gain']:.2f}× faster than the head on "
              "every position."]
    return "\n".join(lines) + "\n"


def _threads(n: int) -> str:
    return f"{n} thread" + ("s" if n != 1 else "")


# bench_model.json's ratios (time / time) as docs/benchmarks.md names them.
MODEL_RATIOS = {
    "sink1_over_vanilla": "1 sink / vanilla",
    "sink1_over_joined_ref": "1 sink fast path / joined sequence with a boolean eq. 6 mask in SDPA",
    "hf_over_vanilla": "`transformers` Qwen2 (sdpa, bidirectional) / ours",
    "sink_logit_over_vanilla": "per-head sink logit (extra zero-value column through SDPA) / vanilla",
    "softmax_one_over_vanilla": "softmax-off-by-one (the same column, logit 0) / vanilla",
}


def _bench_model(results_root: Path) -> str | None:
    r = _bench_result("bench_model.json")
    if r is None:
        return None
    shapes = r["shapes"]
    passes = list(r["passes"])  # e.g. 2thr_wall, 1thr_cpu
    clock = {"wall": "wall time", "cpu": "CPU time"}
    heads = [f"{_threads(r['passes'][p]['threads'])}, {clock.get(r['passes'][p]['clock'], r['passes'][p]['clock'])}"
             for p in passes]
    lines = [f"Forward + backward of one training step ({r['description']}), median of {shapes['repeats']} "
             f"round-robin runs after {shapes['warmup']} warm-up, paired ratios (the median of per-round "
             "ratios; `benchmarks/bench_model.py`):", "",
             "| ratio | target | " + " | ".join(heads) + " |", "|---|---|" + "---:|" * len(passes)]
    for key, ratio in r["ratios"].items():
        target = ratio["target"].replace("<=", "≤").replace(">=", "≥").replace("none (report)", "report")
        cells = [f"{ratio[p]['paired_median']:.3f}" + (" (missed)" if ratio[p]["meets_target"] is False else "")
                 for p in passes]
        lines.append(f"| {MODEL_RATIOS.get(key, key)} | {target} | " + " | ".join(cells) + " |")
    load = r["environment"]["load_average"]
    lines += ["", f"Load average (1 min) {load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end."]
    return "\n".join(lines) + "\n"


def _bench_cache(results_root: Path, file: str = "bench_cache.json") -> str | None:
    r = _bench_result(file)
    if r is None:
        return None
    tokens = r["gen_length"] * r["batch"]
    warm = all("warmup_seconds" in v for v in r["variants"].values())  # (older results have no warm-up column)
    lines = [f"{r['prompt_length']}-token prompt, {r['gen_length']} tokens in blocks of {r['block_length']}, one token "
             f"per step unless a threshold is set; {r['model']}, batch {r['batch']}, {_threads(r['threads'])}, best of "
             f"{r['repeats']}, {r.get('device', 'CPU')}, all in one process (`benchmarks/bench_cache.py`):", "",
             "| mode | seconds | forwards | speed-up vs no cache | tokens differing from no cache |"
             + (" warm-up s | tokens agreeing with eager |" if warm else ""),
             "|---|---:|---:|---:|---:|" + ("---:|---:|" if warm else "")]
    for name, v in r["variants"].items():
        row = f"| {name} | {v['seconds']:.2f} | {v['forwards']} | {v['speedup']:.2f}× | {v['tokens_differing']} of {tokens} |"
        if warm:
            agree = v.get("tokens_agreeing_with_eager")
            row += f" {v['warmup_seconds']:.1f} | {'' if agree is None else f'{agree} of {tokens}'} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def _bench_sampling(results_root: Path) -> str | None:
    r = _bench_result("bench_sampling.json")
    if r is None:
        return None
    su, th, mem = r["setup"], r["threshold"], r["memory"]
    lines = [f"gen_length {su['gen_length']}, steps {su['steps']}, block {su['block_length']}, "
             f"{su['prompt_tokens']}-token prompts, {su['model']}, {_threads(su['threads'])}, best of {su['repeats']} "
             "interleaved repeats (`benchmarks/bench_sampling.py`):", "",
             "| batch | `generate` / reference loop (identical tokens) | sink cache on / off (identical tokens) "
             "| threshold 0.9 / one token per step |", "|---:|---:|---:|---:|"]
    lines += [f"| {b} | {v['generate_vs_reference']:.2f}× | {v['sink_cache_on_vs_off']:.2f}× | "
              f"{v['threshold_vs_one_per_step']:.2f}× ({v['threshold_forwards']} forwards instead of {su['steps']}) |"
              for b, v in r["batches"].items()]
    f = th["forwards"]
    lines += ["", f"With threshold 0.9 on {th['prompts']} prompts, {min(f)}-{max(f)} forwards (mean "
              f"{sum(f) / len(f):.0f}) replace {su['steps']}, and {th['outputs_differing']}/{th['prompts']} outputs differ "
              f"from one-token-per-step decoding ({100 * th['tokens_differing_share']:.0f} % of tokens); with random "
              "weights this says nothing about quality (pass `--checkpoint DIR` for a trained model). Resident "
              f"memory over {mem['steps']} steps: {mem['rss_mib_step8']:.1f} MiB at step 8, at most "
              f"{mem['rss_mib_max_after']:.1f} MiB after it, {mem['rss_mib_last']:.1f} MiB at the last step."]
    return "\n".join(lines) + "\n"


def _bench_ops(results_root: Path) -> str | None:
    r = _bench_result("bench_ops.json")
    if r is None:
        return None
    before = r.get("before", {}).get("variants", {})
    lines = [f"ATen ops dispatched by one forward + backward (`tiny` preset, {r['layers']} layers, batch {r['batch']} × "
             f"{r['seq_len']}, torch {r['torch']}; exact counts, `benchmarks/bench_ops.py`). Kernels leave out views, "
             "which launch nothing on a GPU. Host syncs: `nonzero`, boolean indexing and `item` in one training loss "
             "step" + (" (before: the code of the previous release, counted by the same script)" if before else "")
             + ":", "",
             "| variant | ops | / vanilla | kernels | / vanilla | host syncs per loss step |"
             + (" ops / vanilla before | syncs before |" if before else ""),
             "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if before else "")]
    for name, v in r["variants"].items():
        row = (f"| {name} | {v['ops']} | {v['ops_ratio']:.2f} | {v['kernels']} | {v['kernels_ratio']:.2f} | "
               f"{v['loss_step_syncs']} |")
        if before:
            b = before.get(name)
            row += f" {b['ops_ratio']:.2f} | {b['loss_step_syncs']} |" if b else " – | – |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def _bench_decode_ops(results_root: Path) -> str | None:
    r = _bench_result("bench_decode_ops.json")
    if r is None:
        return None
    before = r.get("before")
    lines = [f"One decoding step of `generate` ({r['preset']}, batch {r['batch']}, {r['prompt_length']}-token prompt, "
             f"{r['gen_length']} tokens in blocks of {r['block_length']}, one token per step, fp32, torch {r['torch']}; "
             "exact CPU counts, `benchmarks/bench_decode_ops.py`): ATen ops, kernels (non-view ops, one launch each "
             "on a GPU) and host syncs per step, and the graphs `compile=True` (aot_eager) builds for the generation"
             + (f"; before: {before['source']}, counted by the same script" if before else "") + ":", "",
             "| mode | ATen ops / step | / no cache | kernels / step | host syncs / step | graphs, compiled |"
             + (" ops / step before | kernels / step before | syncs / step before | graphs before |" if before else ""),
             "|---|---:|---:|---:|---:|---:|" + ("---:|---:|---:|---:|" if before else "")]
    for name, v in r["modes"].items():
        cache = {"no cache": None}.get(name, name)
        row = (f"| {name} | {v['ops_per_step']:.1f} | {v['ops_ratio']:.2f} | {v['kernels_per_step']:.1f} | "
               f"{v['syncs_per_step']:.2f} | {r['compiled_graphs'].get(cache, '–')} |")
        if before:
            b = before["modes"][name]
            row += (f" {b['ops_per_step']:.1f} | {b['kernels_per_step']:.1f} | {b['syncs_per_step']:.2f} | "
                    f"{before['compiled_graphs'].get(cache, '–')} |")
        lines.append(row)
    return "\n".join(lines) + "\n"


def _bench_gpu_decode(results_root: Path) -> str | None:
    r = _bench_result("bench_gpu_decode.json")
    if r is None:
        return _not_measured("benchmarks/gpu_suite.sh OUTDIR", "bench_gpu_decode.json")
    lines = [f"{r['device']}, {r['model']} ({r['parameters'] / 1e9:.2f} B parameters, {r['dtype']}), "
             f"{r['prompt_length']}-token prompt + {r['gen_length']} tokens in blocks of {r['block_length']}, one token "
             f"per step, best of {r['repeats']}; weight-read bound {r['bound_ms_per_step']:.2f} ms per step at "
             f"{r['bandwidth_gbs']:.0f} GB/s measured (`benchmarks/bench_gpu_decode.py`):", "",
             "| batch | mode | ms / step | tok/s | of the weight-read bound | warm-up s | tokens agreeing with eager |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for v in r["rows"]:
        warm = "" if v["warmup_s"] is None else f"{v['warmup_s']:.0f}"
        agree = "" if v["tokens_agreeing_with_eager"] is None else f"{v['tokens_agreeing_with_eager']} of {v['tokens']}"
        lines.append(f"| {v['batch']} | {v['mode']} | {v['ms_per_step']:.2f} | {v['tokens_per_s']:.0f} | "
                     f"{100 * v['fraction_of_bound']:.0f} % | {warm} | {agree} |")
    return "\n".join(lines) + "\n"


def _not_measured(command: str, results_file: str) -> str:
    """The block of a GPU benchmark that has not run yet: what would fill it."""
    return ("Not measured here yet: no results file from a GPU run of this code is committed (figures quoted in "
            "issues are not reproduced in this table). Whoever is lent a GPU runs `benchmarks/gpu_suite.sh OUTDIR`"
            + ("" if command.startswith("benchmarks/gpu_suite.sh") else f", which runs `{command}`")
            + f"; it writes `benchmarks/results/{results_file}`, and this table is generated from it.\n")


def _bench_cache_gpu(results_root: Path) -> str | None:
    return _bench_cache(results_root, "bench_cache_gpu.json") or _not_measured(
        "benchmarks/bench_cache.py --device cuda --preset qwen2.5-0.5b --dtype bfloat16", "bench_cache_gpu.json")


def _bench_block(results_root: Path, file: str = "bench_block.json") -> str | None:
    r = _bench_result(file)
    if r is None or "training" not in r:  # (a run cut after its decoding part is not a table yet)
        return None
    d, t = r["decoding"], r["training"]
    lines = [f"{d['prompt_length']}-token prompt, {d['gen_length']} new tokens one per step, blocks of {r['block_size']}; "
             f"{r['model']}, {r['device']}, best of {r['repeats']}, all in one process (`benchmarks/bench_block.py`):", "",
             "| decoding | forwards | seconds | tokens/s | block model's speed-up over it |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {v['forwards']} | {v['seconds']:.3f} | {v['tokens_per_s']:.1f} | {v['block_speedup']:.2f}× |"
              for name, v in d["rows"].items()]
    lines += ["", f"One training step (forward + backward + AdamW) on {t['batch']} × {t['seq_len']} tokens:", "",
              "| training step | seconds | µs per token |", "|---|---:|---:|"]
    lines += [f"| {name} | {v['seconds']:.3f} | {v['us_per_token']:.1f} |" for name, v in t["rows"].items()]
    lines += ["", f"A block model's training step costs {t['block_cost_ratio']:.2f}× a whole-sequence step per token."]
    load = r.get("load_average")
    if load and "end" in load:
        lines[-1] += f" Load average (1 min) {load['start'][0]:.1f} at the start, {load['end'][0]:.1f} at the end."
    return "\n".join(lines) + "\n"


def _bench_block_gpu(results_root: Path) -> str | None:
    return _bench_block(results_root, "bench_block_gpu.json") or _not_measured(
        "benchmarks/bench_block.py --device cuda --preset qwen2.5-0.5b --dtype bfloat16", "bench_block_gpu.json")


def _bench_gpu_train(results_root: Path) -> str | None:
    r = _bench_result("bench_gpu_train.json")
    if r is None:
        return _not_measured("benchmarks/bench_gpu_train.py", "bench_gpu_train.json")
    a = r["args"]
    lines = [f"{r['device']} (bf16 matmul {r['bf16_matmul_tflops']:.0f} TFLOP/s measured), `{a['preset']}` + 1 sink, "
             f"batch {a['batch']} × {a['seq_len']}, bf16 autocast, median of {a['repeats']} "
             "(`benchmarks/bench_gpu_train.py`):", "", "| training step | step ms | tokens/s | MFU | peak GiB |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {t['variant']} | {t['step_ms']:.0f} | {t['tokens_per_s']:.0f} | {100 * t['mfu']:.1f} % | "
              f"{t['peak_gib']:.1f} |" for t in r["train"]]
    lines += ["", "| forward + backward ratio | value |", "|---|---:|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in r["ratios"].items()]
    return "\n".join(lines) + "\n"


def _size(n: int | None) -> str:
    return "–" if n is None else (f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB")


def _minutes(s: float) -> str:
    return f"{s:.0f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"


def _quickstart_row(row: dict) -> tuple[str, str]:
    """(label, what it prints or writes) of one measured Quick-start line, from the line and its output."""
    line, out = row["line"], row["stdout_tail"]
    written = row.get("written") or {}
    if line.startswith("sinkdlm generate"):
        if "--chat" in line:
            return "`generate --chat`", f"`{out.splitlines()[-1] if out else ''}` (the model's chat template; stops at the end of its turn)"
        text = out.split("note:")[0].strip()
        if re.search(r"[A-Za-z]{2}", text):
            return "`generate` (the DLM)", f"`{' '.join(text.split())[:60]}`"
        marks = " ".join(f"`{c}`" for c in sorted(set(text)) if not c.isspace()) or "whitespace"
        return "`generate` (the DLM)", f"no text yet: {marks} and newlines (see below)"
    if line.startswith("sinkdlm analyze --compare"):
        return "`analyze --compare`", f"`{written.get('path')}/report.html`: the AR model's sinks beside the DLM's"
    if line.startswith("sinkdlm analyze --model $M"):
        return "`analyze` (the AR model)", (f"`{written.get('path')}/report.html`: sinks per layer, value norms, the "
                                            "sink-masking ablation")
    if line.startswith("sinkdlm analyze"):
        return "`analyze` (the DLM)", f"`{written.get('path')}/report.html`: how much attention the sink token takes per layer"
    if line.startswith("sinkdlm convert"):
        return "`convert --shift-logits`", f"`{written.get('path')}`, a {_size(written.get('bytes'))} checkpoint with one sink token"
    if line.startswith("sinkdlm train"):
        steps, batch, seq = (re.search(rf"--{k} (\d+)", line).group(1) for k in ("max-steps", "batch-size", "seq-len"))
        return (f"`train` ({steps} steps × {batch} × {seq} tokens)",
                f"a progress line from step 1 (loss, tokens/s, ETA); `{written.get('path')}`, "
                f"{_size(written.get('bytes'))} with the checkpoints and the optimizer state")
    return f"`{line.split('  #')[0][:40]}`", ""


def _bench_quickstart(results_root: Path) -> str | None:
    r = _bench_result("bench_quickstart.json")
    if r is None:
        return None
    busy = r["busy_cores_at_start"]
    lines = [f"What each line does, with its wall time and peak memory, measured by running the block above as "
             f"written on {r['cpu_count']} CPU cores" + (f" of an {r['cpu']}" if r.get("cpu") else "") + " ("
             + ("otherwise idle" if busy < 0.1 else f"{busy:.1f} of them busy with other work") + " at the start; "
             "`benchmarks/bench_quickstart.py`):", "",
             "| line | prints / writes | time | peak memory |", "|---|---|---:|---:|"]
    for row in r["lines"]:
        if row["line"].startswith("make "):
            continue
        label, what = _quickstart_row(row)
        status = "" if row["returncode"] == 0 else f" **(exit {row['returncode']})**"
        lines.append(f"| {label} | {what}{status} | {_minutes(row['wall_s'])} | {row['peak_rss_bytes'] / 1e9:.1f} GB |")
    return "\n".join(lines) + "\n"


def _bench_quickstart_python(results_root: Path) -> str | None:
    r = _bench_result("bench_quickstart.json")
    if r is None:
        return None
    py = r["python"]
    return (f"This takes {_minutes(py['wall_s'])} and {py['peak_rss_bytes'] / 1e9:.1f} GB (run as written, "
            "`benchmarks/bench_quickstart.py`).\n")


def _bench_quickstart_sinks(results_root: Path) -> str | None:
    """Where the Quick start's models put their attention, per layer (the `analyze` lines' analysis.json)."""
    import statistics

    r = _bench_result("bench_quickstart.json")
    if r is None:
        return None
    rows = [row.get("attention") for row in r["lines"] if row["line"].startswith("sinkdlm analyze")]
    dlm = next((a for a in rows if a and a.get("sink_token_mass")), None)
    ar = next((a for a in rows if a and not a.get("sink_token_mass")), None)
    if dlm is None or ar is None:
        return None
    pct = lambda v: f"{100 * v:.0f} %"
    q1, med, q3 = statistics.quantiles(dlm["sink_token_mass"], n=4)
    return (f"In the measured run the DLM's sink token took a median {pct(med)} of a layer's attention ({pct(q1)} to "
            f"{pct(q3)} over the middle half of its {len(dlm['sink_token_mass'])} layers); the AR model's detected "
            f"sinks took a median {pct(statistics.median(ar['detected_sink_mass']))} (`analyze`'s analysis.json, "
            "from `benchmarks/bench_quickstart.py`).\n")


def _bench_shift_logits(results_root: Path) -> str | None:
    """Validation loss after the Quick start's training, converted with and without `--shift-logits`."""
    r = _bench_result("bench_shift_logits.json")
    if r is None:
        return None
    d, rows = r["shift_minus_no_shift"], r["rows"]
    mean = lambda key: sum(row[key] for row in rows) / len(rows)
    return (f"After {r['max_steps']} steps of {r['batch_size']} × {r['seq_len']} tokens, the validation loss was "
            f"{mean('shift'):.2f} with the shift and {mean('no_shift'):.2f} without (mean of {len(rows)} seeds, each "
            f"the same sink draw, data and masks for both heads): shift − no shift {r['verdict']}; the smallest "
            f"difference {len(rows)} seeds detect is {r['mde']:.2f} (`benchmarks/bench_shift_logits.py`).\n")


def _bench_env_sizes(results_root: Path) -> str | None:
    """The disk the two environments take, `make demo`'s and `make install`'s (`du -sb` of each venv)."""
    r = _bench_result("env_sizes.json")
    if r is None:
        return None
    runtime, dev = r["environments"]["runtime"], r["environments"]["dev"]
    torch = runtime["largest_site_packages"].get("torch")
    return (f"On disk, `make demo`'s environment (the runtime) takes {_size(runtime['bytes'])}"
            + (f", torch {_size(torch)} of it" if torch else "") + f"; `make install`'s, with the dev extras, "
            f"{_size(dev['bytes'] - runtime['bytes'])} more ({_size(dev['bytes'])}; `du -sb` of each venv, "
            "`benchmarks/bench_env_sizes.py`).\n")


def _load(results_root: Path, name: str) -> dict | None:
    path = results_root / name / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _gap(est: float, low: float | None, high: float | None, digits: int) -> str:
    """"+0.0001 [-0.0009, +0.0012]" with `digits` decimals (the interval's own, not one machine's rounding)."""
    text = f"{est:+.{digits}f}"
    return text + (f" [{low:+.{digits}f}, {high:+.{digits}f}]" if low is not None and high is not None else "")


def _primary_row(r: dict, study: str, scale: str, digits: int, unit: str = "nats",
                 where: str = "at the end") -> list[str]:
    """One study's declared primary as a findings row: the answer from its stored decision and null reading
    (experiment/endpoints/primary.py), the gap at the end of training with the declared test's interval (`unit`:
    the metric's, "" for a rate; `where`: what the direction is said of). A direction only where the declared test
    rejected with a spread (a zero variance is no evidence) and its interval, where it has one, excludes 0."""
    from sinkdlm.experiment.endpoints.primary import declared_decision

    p = r["primary"]
    a, b = (r["variants"][n]["label"] for n in p["pair"])
    _, est, pval, decided = declared_decision(p)
    iv = p["t"] if p["test"] == "t" else p["rank"]
    u = f" {unit}" if unit else ""
    degenerate = bool((p.get("t") or {}).get("degenerate"))
    low, high = iv.get("low"), iv.get("high")
    excludes = low is None or high is None or low > 0 or high < 0
    if decided and not degenerate and excludes:
        said = f"{a} {where}" if where else a  # "" when the sentence around it names the metric
        answer = f"lower with {said} (p = {pval:.2g})" if est < 0 else f"higher with {said} (p = {pval:.2g})"
        g0, te = p.get("step0_gap"), p.get("training_effect")
        if g0 and te and g0["high"] < 0 < te["low"]:  # started ahead, and training narrowed the lead
            answer += (f", the rest of a head start from the conversion ({g0['mean']:+.{digits}f} at step 0) that "
                       f"training narrowed (Δ_train {te['mean']:+.{digits}f})")
    elif decided:
        answer = ("no difference detected: inconclusive (no variance: every seed's difference alike)" if degenerate else
                  "no difference detected: inconclusive (the test rejects, but its interval does not exclude 0)")
    elif p.get("inconclusive", True):
        answer = f"no difference detected: inconclusive (MDE {p['t']['mde']:.2g}{u})"
    else:
        answer = (f"no difference, bounded within ±{p['bound']:.2g}{u} (MDE {p['t']['mde']:.2g}, below the "
                  f"{p['sized_for']:g} it was sized for)")
    return [study, scale, f"{a} − {b}: {answer}", _gap(est, low, high, digits) + u]


def _finished(results_root: Path, name: str) -> dict | None:
    """docs/results/NAME/results.json where it is the study's final result: every run its preset declares (each
    variant × seed) is in it. A results.json written while runs are missing (one shard's merge, an interim report)
    is None, as is one whose preset is not known (nothing to check it against)."""
    r = _load(results_root, name)
    if r is None:
        return None
    from sinkdlm.experiment.presets import PRESETS

    preset = PRESETS.get(r.get("preset", ""))
    if preset is None:
        return None
    declared = preset()
    have = {(n, int(s)) for n, v in r["variants"].items() for s in v.get("seeds", {})}
    if not {(v.name, int(s)) for v in declared.variants for s in declared.seeds} <= have:
        return None
    if declared.quantization is not None and not (r.get("quant") or {}).get("complete"):
        return None  # the endpoint's own flag: every declared seed scored quantized
    return r


def _final_primaries(results_root: Path) -> tuple[dict | None, dict | None]:
    """block-sinks' results.json where final (`_finished`) and its declared primary was measured; quant's where
    final with its endpoint's results (an unmeasured primary is a row that says so, `_quant_rows`)."""
    block, quant = _finished(results_root, "block-sinks"), _finished(results_root, "quant")
    block = block if block and block.get("primary") and not block["primary"].get("missing") else None
    return block, quant if quant and quant.get("quant") else None


def _steps(r: dict) -> str:
    return f"{r['train']['max_steps']:,} steps"


def _block_rows(r: dict, where: str = "in the moving-sink rate") -> list[list[str]]:
    """The block-sinks study (docs/method.md §15): its declared primary (vanilla in blocks − vanilla on the whole
    sequence, on the moving-sink rate) and its secondaries, + 1 sink − vanilla at each block size on the rate and on
    val_loss (each block size's own bound), from the report's Benjamini-Hochberg family (results.json's
    `comparisons`: a direction only where a comparison `survives`, with a spread)."""
    from sinkdlm.experiment.endpoints.block_sizes import block_size

    link = "[sinks under block-causal attention](docs/results/block-sinks/report.md)"
    scale = f"tiny DLMs, {len(r['variants'])} arms × {len(r['seeds'])} seeds × {_steps(r)}"
    rows = [_primary_row(r, link, scale, 3, unit="", where=where)]
    variants = r["variants"]
    sink_pairs = [c for c in r.get("comparisons", []) if not c.get("missing")
                  and variants[c["pair"][0]].get("switches", {}).get("num_sink_tokens", 0) > 0
                  and not variants[c["pair"][1]].get("switches", {}).get("num_sink_tokens", 0)
                  and block_size(variants[c["pair"][0]]) == block_size(variants[c["pair"][1]])]
    sizes = lambda c: -(block_size(variants[c["pair"][0]]) or 10**9)  # noqa: E731  (the whole sequence first)
    for metric, words, unit in (("content_sink_set_change_rate", "moving-sink rate", ""), ("val_loss", "val_loss", " nats")):
        tests = sorted((c for c in sink_pairs if c["metric"] == metric), key=sizes)
        if not tests:
            continue
        said, gaps = [], []
        for c in tests:
            size = block_size(variants[c["pair"][0]])
            at = "whole sequence" if size is None else f"blocks of {size}"
            if c.get("degenerate"):
                word = "inconclusive (no variance)"
            elif c.get("survives") and c.get("n", 0) >= 2:
                word = f"{'higher' if c['mean'] > 0 else 'lower'} (BH-adjusted p = {c['p_adjusted']:.2g})"
            else:
                word = "no difference detected"
            said.append(f"{at}: {word}")
            gaps.append(f"{at}: " + _gap(c["mean"], c.get("low"), c.get("high"), 3))
        rows.append([link, f"{scale}, secondary (BH family)", f"+ 1 sink − vanilla, {words}: " + "; ".join(said),
                     "; ".join(gaps) + unit])
    return rows


def _quant_rows(r: dict) -> list[list[str]]:
    """The quant study (docs/method.md §16): its declared primary (+ 1 sink's Δ_quant − vanilla's under the declared
    scheme, exact Wilcoxon with the Hodges-Lehmann estimate and interval) and each declared secondary pair (under
    the declared scheme and on the largest FFN ∞-norm, BH family, intervals at the adjusted level), in the
    endpoint's own words (`quant.report.primary_words`, the secondary tests' stored `verdict`)."""
    from sinkdlm.experiment.endpoints.quant.report import primary_words

    q = r["quant"]
    p, labels = q["primary"], {n: v["label"] for n, v in r["variants"].items()}
    link = "[does a sink make a DLM quantizable?](docs/results/quant/report.md)"
    scale = f"tiny DLMs, {len(r['variants'])} arms × {len(r['seeds'])} seeds × {_steps(r)}"
    if p.get("missing"):
        return [[link, scale, f"not measured ({p['missing']})", "–"]]
    a, b = (labels[n] for n in p["pair"])
    rank = p["rank"]
    rows = [[link, f"{scale}, {p['scheme']}", f"{a}'s Δ_quant − {b}'s: {primary_words(p, q, a, b)}",
             _gap(rank["estimate"], rank.get("low"), rank.get("high"), 4) + " nats, Hodges-Lehmann"]]
    for pair in (r.get("declared") or {}).get("quantization", {}).get("secondary", []):
        tests = {e["metric"]: e for e in q.get("secondary", []) if e["pair"] == list(pair)}
        delta, norm = tests.get(f"delta:{p['scheme']}"), tests.get("ffn_inf_norm_max")
        if delta is None:
            continue
        said = f"Δ_quant: {delta['verdict']}" + (f"; largest FFN ∞-norm: {norm['verdict']}" if norm else "")
        adj, nadj = delta["adjusted"], (norm or {}).get("adjusted")
        gap = (_gap(adj["mean"], adj.get("low"), adj.get("high"), 4) + " nats"
               + (f"; ∞-norm {_gap(nadj['mean'], nadj.get('low'), nadj.get('high'), 1)}" if nadj else "")
               + f" (at the adjusted level {100 * adj['confidence']:.3g} %)")
        rows.append([link, f"{scale}, {p['scheme']}, secondary (BH family)",
                     f"{labels[pair[0]]} − {labels[pair[1]]}: {said}", gap])
    return rows


def _answers(results_root: Path) -> str | None:
    """The front page's answers of the block-sinks and quant studies (issues 65, 66): per finished study
    (`_finished`) one sentence, its declared primary's answer as the findings table gives it, beside the study's
    figure. None while neither is finished."""
    said = []
    b, q = _final_primaries(results_root)
    if b:
        _, _, answer, gap = _block_rows(b, where="")[0]  # the sentence names the rate first
        fig = results_root / "block-sinks" / "figures" / "block_sizes.png"
        said.append(f"**Do sinks move differently as the block shrinks?** The moving-sink rate, {answer}, {gap} "
                    "([report](docs/results/block-sinks/report.md))."
                    + (" ![Moving-sink rate against block size, per arm, 95 % CI]"
                       "(docs/results/block-sinks/figures/block_sizes.png)" if fig.is_file() else ""))
    if q and not q["quant"]["primary"].get("missing"):
        _, _, answer, gap = _quant_rows(q)[0]
        fig = results_root / "quant" / "figures" / "quant.png"
        scheme = q["quant"]["primary"]["scheme"]
        said.append(f"**Does a sink make a DLM quantizable ({scheme}{', W8A8' if scheme == 'int8-dynamic' else ''})?** "
                    f"{answer}, {gap} ([report](docs/results/quant/report.md))."
                    + (" ![Δ_quant per arm and scheme, FFN ∞-norm per layer, 95 % CI]"
                       "(docs/results/quant/figures/quant.png)" if fig.is_file() else ""))
    return "\n\n".join(said) + "\n" if said else None


def _replicated(results_root: Path, t: dict) -> dict | None:
    """The escape sizing's exploratory contrast for a declared escape pair where it was one-sided on every seed
    (the "earlier on 5 of 5" that motivated the pair) and the declared test did not decide it: it did not replicate."""
    sizing = results_root / "escape-sizing" / "sizing.json"
    explored = json.loads(sizing.read_text())["contrasts"].get(" / ".join(t["pair"])) if sizing.is_file() else None
    if explored and max(explored["minus"], explored["plus"]) == explored["seeds"] and not t.get("decided"):
        return explored
    return None


def _escape_replication(results_root: Path) -> str | None:
    """One sentence per declared escape pair whose exploratory sizing pointed one way on every seed and whose
    declared test did not decide: the sizing's count beside the declared study's."""
    esc = _load(results_root, "escape")
    said = []
    for t in (esc or {}).get("escape", {}).get("tests", []):
        explored = _replicated(results_root, t)
        if explored:
            a, b = (esc["variants"][n]["label"] for n in t["pair"])
            way = "earlier" if explored["minus"] else "later"
            said.append(f"{a} left the plateau {way} than {b} on {explored['seeds']} of {explored['seeds']} seeds in the "
                        f"exploratory sizing ([escape-sizing](escape-sizing/README.md), runs seen before the rule was "
                        f"written); the declared study did not replicate it: earlier on {t['minus']}, later on "
                        f"{t['plus']} of {t['seeds']} seeds, p = {t['p'] if t['primary'] else t['p_adjusted']:.2g}.")
    return " ".join(said) + "\n" if said else None


def _findings(results_root: Path) -> str | None:
    """The front page's table of what the project has found about the paper's claim so far: one row per declared
    question (study, scale, answer, interval), read from each study's results.json (and the escape sizing's
    exploratory counts, for the replication row); block-sinks and quant only once final (`_finished`)."""
    from sinkdlm.experiment.endpoints.sinks.stats import extra_sink_mass, uniform_share

    rows = []
    study, real, late, esc = (_load(results_root, n) for n in ("study", "smollm2/dlm", "late-sink", "escape"))
    if study:
        rows.append(_primary_row(study, "[from scratch](docs/results/study/report.md)",
                                 f"tiny DLMs, {len(study['variants'])} arms × {len(study['seeds'])} seeds × {_steps(study)}", 3))
    if real:
        rows.append(_primary_row(real, "[SmolLM2-135M converted](docs/results/smollm2/dlm/report.md)",
                                 f"AR → DLM, {len(real['seeds'])} seeds × {_steps(real)}", 3))
    if late:
        rows.append(_primary_row(late, "[sink added late](docs/results/late-sink/report.md)",
                                 f"a trained tiny DLM continued, {len(late['seeds'])} seeds × {_steps(late)}", 4))
    for r, name in ((late, "late-sink"), (real, "smollm2/dlm")):
        for v in (r or {}).get("variants", {}).values():
            mass, u = extra_sink_mass(v), uniform_share(v)
            if not mass or u is None or v["label"] not in {r["variants"][n]["label"] for n in r["primary"]["pair"]}:
                continue
            where = ("below" if mass["high"] < u else "above" if mass["low"] > u else "about")
            rows.append([f"[does the sink token take attention?](docs/results/{name}/report.md)", f"{v['label']}, "
                         f"{mass['n']} seeds", f"{where} one key's uniform share 1/keys = {100 * u:.2f} %",
                         f"{100 * mass['mean']:.1f} [{100 * mass['low']:.1f}, {100 * mass['high']:.1f}] % of the attention"])
    for t in (esc or {}).get("escape", {}).get("tests", []):
        a, b = (esc["variants"][n]["label"] for n in t["pair"])
        r = t["ratio"]
        answer = (f"{a} vs {b}: later on {t['plus']}, earlier on {t['minus']} of {t['seeds']} seeds, p = "
                  f"{t['p_adjusted'] if not t['primary'] else t['p']:.2g}: "
                  + (f"{a} leaves the plateau {'earlier' if t['estimate'] < 0 else 'later'}" if t.get("decided") else
                     "no difference detected" if t.get("inconclusive", True) else
                     f"no difference (MDE {t['mde']:.2f} log2, below the {t['sized_for']:g} it was sized for)"))
        explored = _replicated(results_root, t)
        if explored:
            answer += (f"; the exploratory \"{'earlier' if explored['minus'] else 'later'} on {explored['seeds']} of "
                       f"{explored['seeds']} seeds\" ([sizing](docs/results/escape-sizing/README.md)) did not replicate")
        rows.append(["[leaving the unigram plateau](docs/results/escape/report.md)",
                     f"tiny DLMs, {len(esc['variants'])} arms × {len(esc['seeds'])} seeds × {_steps(esc)}", answer,
                     f"ratio of escape steps {r['estimate']:.2f}× [{r['low']:.2f}, {r['high']:.2f}]"])
    block, quant = _final_primaries(results_root)
    if block:
        rows += _block_rows(block)
    if quant:
        rows += _quant_rows(quant)
    if not rows:
        return None
    return ("| study | scale | answer | interval (the declared test's, about 95 %) |\n|---|---|---|---|\n"
            + "".join("| " + " | ".join(row) + " |\n" for row in rows))


def _bench_quant(results_root: Path) -> str | None:
    """`--quantize` speed and memory (issue 66): the MLP's ratios and decoding per scheme, from bench_quant.json, then
    the same from each other machine's `bench_quant_NAME.json` (W8A8's speed turns on the CPU's int8 instructions)."""
    r = _bench_result("bench_quant.json")
    if r is None:
        return None
    text = _bench_quant_machine(r)
    for path in sorted((ROOT / "benchmarks" / "results").glob("bench_quant_*.json")):
        other = json.loads(path.read_text())
        text += f"\n**On another machine** (`benchmarks/results/{path.name}`):\n\n" + _bench_quant_machine(other)
    return text


def _int8_words(r: dict) -> str:
    flags = r.get("int8_flags")
    return ("int8 dot-product instructions not recorded" if flags is None else
            f"int8 dot-product instructions: {', '.join(flags) if flags else 'none'}")


def _bench_quant_machine(r: dict) -> str:
    """One machine's bench_quant results as markdown: the MLP's ratios, decoding per scheme, the KV cache, int4."""
    rows = {(row["scheme"], row["mode"], row["tokens"]): row["ratio"] for row in r["mlp"]["rows"]}
    modes = [(m, n) for m in ("eager", "compiled", "compiled, freezing") for n in (1, 128) if any(k[1:] == (m, n) for k in rows)]
    d, ff, _ = r["mlp"]["shape"]
    lines = [f"torch {r['torch']}, torchao {r['torchao']}, {r['cpu']} ({_int8_words(r)}), {_threads(r['threads'])}, median of "
             f"{r['repeats']} interleaved repeats, every ratio within one process (`benchmarks/bench_quant.py`). "
             f"sinkdlm's SwiGLU MLP at {d} → {ff} → {d}, fp32 time / quantized time (above 1: the quantized one is "
             "faster; compiled: against compiled fp32; freezing: inductor's `freezing`, the weights folded into the "
             "graph as constants, torchao's CPU recipe for W8A8):", "",
             "| scheme | " + " | ".join(f"{m}, {n} token{'s' if n > 1 else ''}" for m, n in modes) + " |",
             "|---|" + "---:|" * len(modes)]
    for scheme in dict.fromkeys(k[0] for k in rows):
        lines.append(f"| `{scheme}` | " + " | ".join(f"{rows[(scheme, m, n)]:.2f}" for m, n in modes) + " |")
    s = r["decode_setting"]
    lines += ["", f"Decoding: batch {s['batch']}, a {s['prompt']}-token prompt, {s['gen_length']} tokens in blocks of "
              f"{s['block_length']}, one token per step, the {s['cache']} cache; peak resident memory while decoding "
              "(VmHWM after the model is loaded), one child process per scheme:", "",
              "| model | scheme | tokens / s | speed-up vs fp32 | weights MiB | peak RSS decoding MiB | "
              "generated tokens equal to fp32's |", "|---|---|---:|---:|---:|---:|---:|"]
    for m in r["decode"]:
        for name, v in m["variants"].items():
            peak = v.get("peak_decode_mib")
            lines.append(f"| {m['model']} | {name} | {v['tokens_per_second']:.1f} | {v['speedup']:.2f}× | "
                         f"{v['weight_bytes'] / 2**20:.1f} | {'–' if peak is None else f'{peak:.0f}'} | "
                         f"{v['tokens_equal_fp32']} of {s['gen_length'] * s['batch']} |")
    for m in r["decode"]:
        kv = m.get("kv_cache_bytes")
        if kv:
            lines += ["", f"{m['model']}: the KV cache of {s['prompt'] + s['gen_length']} columns takes "
                      f"{kv['fp32'] / 2**20:.2f} MiB in fp32 and {kv['int8'] / 2**20:.2f} MiB with `--kv-cache-dtype "
                      f"int8` ({kv['fp32'] / kv['int8']:.2f}× less: int8 keys and values, a float32 scale per token "
                      "and head, the sink's columns in fp32)."]
    if r.get("int4_refusal"):
        lines += ["", f"`int4-weight` on this CPU: \"{r['int4_refusal']}\""]
    return "\n".join(lines) + "\n"


def _bench_serve(results_root: Path) -> str | None:
    r = _bench_result("bench_serve.json")
    if r is None:
        return None
    su = r["setup"]
    lines = ["`max_tokens` = steps (one token per step), temperature 0.8 with a seed per request, prompts of 4-24 words, "
             f"{su['rounds']} requests per client one after another, {_threads(su['threads'])} on {su['machine']} "
             f"({su['cores']} cores; load average {su['load_at_start']:.1f} at the start, {su['load_at_end']:.1f} at "
             "the end, so the absolute figures carry the machine's other work; both servers ran alternately in one "
             "process). Batched: `--max-batch-size 16 --batch-window-ms 10`; one at a time: `--max-batch-size 1`.", ""]
    for m in r["models"].values():
        lines += [f"*{m['description']}*, `max_tokens` {m['gen']}:", "",
                  "| clients | tokens/s batched | one at a time | batched / one at a time | p50 / p95 latency batched "
                  "| one at a time | answers differing |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for clients, v in m["by_clients"].items():
            a, b = v["batched"], v["one at a time"]
            lines.append(f"| {clients} | {a['tokens_per_s']:.1f} | {b['tokens_per_s']:.1f} | {v['throughput_ratio']:.2f}× "
                         f"| {a['p50_s']:.2f} / {a['p95_s']:.2f} s | {b['p50_s']:.2f} / {b['p95_s']:.2f} s "
                         f"| {v['answers_differing']} of {a['requests']} |")
        lines.append("")
    lines.append("At 1 client both servers do the same work, so that row's ratio is the noise of this shared machine. On "
                 "a CPU a batch's forward costs about the sum of its rows' (every step runs the whole sequence), and a "
                 "batch pads its prompts to the longest: batching mostly shares the wait, not the work. Answers "
                 "differing: each batched answer against the same request's from the one-at-a-time server.")
    return "\n".join(lines) + "\n"


def _times(ratio: float) -> str:
    """A measured ratio as the front page states it: below 1 (at the shown precision) it says "slower"."""
    return f"{ratio:.2f}×" + (" (slower)" if round(ratio, 2) < 1 else "")


def _bench_speed(results_root: Path) -> str | None:
    """The README's speed lines (the block-diffusion and quantization issues): one measured ratio per question, each
    against its baseline in the same process, from bench_block.json, bench_decoding.json and bench_quant.json."""
    lines = []
    b = _bench_result("bench_block.json")
    if b is not None:
        d, rows = b["decoding"], b["decoding"]["rows"]
        lines.append(
            f"**Block decoding speed:** with its exact cache a block model makes "
            f"{_times(rows['whole sequence, no cache']['block_speedup'])} the tokens/s of the whole-sequence model "
            f"without a cache and {_times(rows['whole sequence, dual cache']['block_speedup'])} those of its dual cache "
            f"({d['gen_length']} new tokens after a {d['prompt_length']}-token prompt, blocks of {b['block_size']}; "
            f"`{b['preset']}` preset, random weights, {b['device'].split(',')[0]}, {_threads(b['threads'])}; "
            "[details](docs/benchmarks.md#block-diffusion)).")
    r = _bench_result("bench_decoding.json")
    if r is not None:
        ls = {n: m for n, m in r["lengths"].items() if isinstance(m, dict)}  # (not `_wall_s`)
        th = r["threshold"]
        dual, both = ([_times(m[mode]["speedup_vs_reference"]) for m in ls.values()] for mode in ("dual", f"dual + {th:g}"))
        lines.append(
            f"**Fast-dLLM speed:** against LLaDA's reference loop, the whole-sequence model's dual cache makes "
            + " and ".join(f"{x} the tokens per CPU second at {n}" if k == 0 else f"{x} at {n}"
                           for k, (x, n) in enumerate(zip(dual, ls))) + " new tokens; "
            f"with threshold {th:g}, {' and '.join(both)} (`{r['model']['preset']}` + {r['model']['num_sink_tokens']} "
            f"sink fine-tuned on arithmetic, {r['machine']['processor']} CPU, {_threads(r['machine']['threads'])}; "
            "too weak to judge accuracy: [details](docs/benchmarks.md#decoding-on-a-fine-tuned-model)).")
    q = _bench_result("bench_quant.json")
    if q is not None:
        m = max(q["decode"], key=lambda m: m["parameters"])  # the largest model decoded
        v, kv = m["variants"], m.get("kv_cache_bytes")
        fp, w8, kvrow = v["fp32"], v.get("int8-weight"), v.get("fp32, int8 KV cache")
        parts = []
        if w8:
            parts.append(f"`--quantize int8-weight` takes its weights {fp['weight_bytes'] / 2**20:.0f} → "
                         f"{w8['weight_bytes'] / 2**20:.0f} MiB (peak while decoding {fp['peak_decode_mib']:.0f} → "
                         f"{w8['peak_decode_mib']:.0f} MiB) at {_times(w8['speedup'])} float32's tokens/s")
        if kv and kvrow:
            parts.append(f"`--kv-cache-dtype int8` its cache {kv['fp32'] / kv['int8']:.1f}× smaller at "
                         f"{_times(kvrow['speedup'])}")
        dyn = [(mm["model"], mm["variants"]["int8-dynamic"]["speedup"]) for mm in q["decode"]
               if "int8-dynamic" in mm["variants"]]
        if dyn:
            parts.append(f"`int8-dynamic` decodes at {_times(dyn[-1][1])} on {dyn[-1][0]}")
        lines.append(f"**int8 on a CPU** ({q['cpu']}, {_threads(q['threads'])}), {m['model']}: " + "; ".join(parts)
                     + " ([details](docs/benchmarks.md#quantization)).")
    return "\n\n".join(lines) + "\n" if lines else None

# Blocks built from other files than one results folder.
COMBINED = {"bench/serve": _bench_serve, "smollm2/ar-vs-dlm": _ar_vs_dlm, "bench/real-train": _bench_real_train, "bench/model": _bench_model,
            "bench/cache": _bench_cache, "bench/sampling": _bench_sampling, "bench/ops": _bench_ops,
            "bench/gpu-train": _bench_gpu_train, "bench/cache-gpu": _bench_cache_gpu,
            "bench/decode-ops": _bench_decode_ops, "bench/gpu-decode": _bench_gpu_decode, "bench/quant": _bench_quant,
            "bench/quickstart": _bench_quickstart, "bench/quickstart-python": _bench_quickstart_python,
            "bench/quickstart-sinks": _bench_quickstart_sinks, "bench/shift-logits": _bench_shift_logits,
            "bench/env-sizes": _bench_env_sizes, "bench/block": _bench_block, "bench/speed": _bench_speed, "bench/block-gpu": _bench_block_gpu,
            "findings": _findings, "findings/answers": _answers,
            "escape/replication": _escape_replication}


def generated_block(name: str, results_root: Path = ROOT / "docs" / "results") -> str | None:
    """The markdown for block `name`, or None when its results are not committed (yet)."""
    if name in COMBINED:
        return COMBINED[name](results_root)
    name, _, part = name.partition("#")  # NAME#PART: one part of the summary (report.SUMMARY_PARTS), e.g. under a figure
    folder = results_root / name
    if part:
        if not (folder / "results.json").is_file():
            return None
        from sinkdlm.experiment.report import summary_part

        return summary_part(json.loads((folder / "results.json").read_text()), part)
    if (folder / "results.json").is_file():
        from sinkdlm.experiment.report import markdown_summary

        return markdown_summary(json.loads((folder / "results.json").read_text()))
    if (folder / "intervals.json").is_file():
        from sinkdlm.analysis.over_prompts_report import markdown_headline

        return markdown_headline(json.loads((folder / "intervals.json").read_text()))
    return None


def readme_block(readme: Path, name: str) -> str:
    text = readme.read_text()
    start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    return text.split(start, 1)[1].split(end, 1)[0].lstrip("\n")


def update(readme: Path = README) -> list[str]:
    """Rewrite every block whose results exist; the names that changed."""
    text = readme.read_text()
    changed = []
    for name in block_names(readme):
        block = generated_block(name)
        if block is None:
            continue
        start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
        if end not in text:
            raise ValueError(f"{readme} has {start} but no {end}")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        new = f"{head}{start}\n{block}{end}{tail}"
        if new != text:
            changed.append(name)
            text = new
    if changed:
        readme.write_text(text)
    return changed


if __name__ == "__main__":
    for page in PAGES:
        if page.is_file():
            print(f"{page.relative_to(ROOT)}: updated", ", ".join(update(page)) or "nothing")
