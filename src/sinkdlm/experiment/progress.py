"""What an unfinished experiment has measured so far: `DIR/progress.md` and its one figure.

A study on a CPU runs for many hours and is interrupted (docs/method.md §7, "One model at a time");
`sinkdlm experiment` rewrites this page after every training run and every saved chunk of the fixed
validation, so what is finished can be read, and committed, while the rest runs. It reads only the files the runs keep
(`runs/*/train/metrics.jsonl`, `val.json` / `val.partial.json`, `interim.json`) and states no verdict:
the interim intervals are raw, over the seeds trained so far; the final report adjusts them. From an AR
initialisation it also shows each pair's step-0 gap and training effect so far (`interim.json`'s `head_start`).
The page is committed while a study runs, so it stays light: Markdown and one PNG (the gradient-norm
peaks; the trainer's validation loss is a column), no HTML copy (CONTRIBUTING.md, "What a study commits").
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from sinkdlm.experiment.formatting import fmt_interval
from sinkdlm.experiment.summary import TARGET_MDE
from sinkdlm.experiment.variance import validation_seconds, validation_values
from sinkdlm.reporting import Document
from sinkdlm.training.rundir import grad_norm_peaks, local_checkpoint, read_metrics

PROGRESS = "progress"  # the page's stem: progress.md


def write_progress(out: Path, title: str, labels: dict[str, str], seeds: list[int], max_steps: int,
                   validation_sequences: int | None = None, escape=None) -> Path:
    """Write `out/progress.md` (and its one figure, `out/figures/progress_grad_norm.png`): per run, the training steps done, the
    trainer's last losses and its largest pre-clip gradient norm, the fixed-validation sequences scored,
    and each pair's interim comparison (`interim.json`). `labels`: variant name -> label. `escape`: the preset's
    declared escape endpoint (`presets.Escape`): each finished run's escape step and sink onset get a column."""
    from sinkdlm.analysis.figures import plot_training_curves

    out = Path(out)
    rows, grad_curves = [], {}
    steps_left, step_rates, val_rates, seqs_left, busy = 0, [], [], 0, 0
    # the step-0 controls (from an AR checkpoint): one fixed validation each, per variant or per seed
    converted = sorted(p.name for p in (out / "converted").glob("*") if p.is_dir()) if (out / "converted").is_dir() else []
    for name in (n for n in converted if n in labels or n.rpartition("-s")[0] in labels):
        if validation_sequences:
            scored = len(validation_values(out / "step0" / name))
            seqs_left += validation_sequences - scored
            if scored and (spent := validation_seconds(out / "step0" / name)):
                val_rates.append(spent / scored)
    for name, label in labels.items():
        for seed in seeds:
            run = out / "runs" / f"{name}-s{seed}"
            timing = json.loads((run / "timing.json").read_text()) if (run / "timing.json").is_file() else {}
            m = read_metrics(run / "train")
            train_rows = [r for r in m if "loss" in r]
            vals = [(r["step"], r["val_loss"]) for r in m if "val_loss" in r]
            peaks = grad_norm_peaks(m)
            if peaks:
                grad_curves.setdefault(label, {})[str(seed)] = tuple(map(list, zip(*peaks)))
            step = train_rows[-1]["step"] if train_rows else 0
            done = (run / "train" / "DONE.json").is_file()
            scored = len(validation_values(run))
            # a finished run whose weights are gone before its validation is done trains again (units.train_stage)
            summary = json.loads((run / "train" / "DONE.json").read_text()) if done else {}
            retrain = ("checkpoint" in summary and not (run / "val.json").is_file()
                       and not local_checkpoint(run / "train", summary).is_dir())
            if done and timing.get("train"):
                step_rates.append(timing["train"] / max_steps)
            steps_left += max_steps if retrain else 0 if done else max_steps - step
            if not done and _training_now(run / "train"):
                busy += 1
            if scored and (spent := validation_seconds(run)):
                val_rates.append(spent / scored)
            seqs_left += (validation_sequences or 0) - scored
            rows.append([label, str(seed), f"{step}/{max_steps}" + (" (done; weights gone: trains again)" if retrain
                                                                     else " (done)" if done else ""),
                         f"{train_rows[-1]['loss']:.3f}" if train_rows else "–",
                         f"{vals[-1][1]:.3f} (step {vals[-1][0]})" if vals else "–",
                         f"{max(p for _, p in peaks):,.0f}" if peaks else "–",
                         f"{scored}" + (f"/{validation_sequences}" if validation_sequences else ""),
                         *([_escape_cell(run, m, escape) if done else "–"] if escape is not None else [])])
    finished = steps_left == 0 and seqs_left <= 0  # every run trained and scored: the verdicts are report.md's
    doc = Document(f"{title}: progress ({'every run measured; the report is report.md' if finished else 'unfinished'})")
    doc.paragraph("What the runs have measured so far, rewritten after every training run and every saved chunk "
                  "of the fixed validation. No verdicts: intervals are raw 95 % intervals over the seeds trained so far; the final "
                  "report (report.md) adjusts them for multiplicity.")
    doc.paragraph(_remaining(steps_left, step_rates, seqs_left, val_rates, busy))
    doc.heading("Runs")
    doc.table(["variant", "seed", "steps", "last training loss (one batch)", "trainer's validation (its own noise)",
               "largest pre-clip gradient norm", "fixed-validation sequences scored",
               *(["left the plateau at step (sink onset)"] if escape is not None else [])], rows)
    figures = out / "figures"
    if grad_curves:
        path = plot_training_curves(grad_curves, figures / "progress_grad_norm.png",
                                    ylabel="largest pre-clip grad norm per log interval", log_y=True)
        doc.image(path, "Largest pre-clip gradient norm between logged steps (log scale): one thin line per seed, "
                        "the mean over seeds thick; every update is clipped to the preset's grad_clip")
    interim_path = out / "interim.json"
    if interim_path.is_file():
        interim = json.loads(interim_path.read_text())
        doc.heading("Interim comparisons (fixed validation, sequences scored so far)")
        irows = []
        for sp in interim.get("val_loss_splits", []):
            a, b = (labels.get(n, n) for n in sp["pair"])
            d = sp["difference"]
            train = "–" if sp.get("var_train") is None else (
                f"{sp['var_train'] ** 0.5:.3f} [{sp['sd_train_interval'][0]:.3f}, {sp['sd_train_interval'][1]:.3f}]")
            need = sp.get("seeds_for_target")
            irows.append([f"{a} − {b}", f"{sp['seeds']}", f"{sp['sequences']} × {sp['draws']}",
                          fmt_interval(d) if d.get("low") is not None else f"{d['mean']:+.4f} (one seed: no interval)",
                          f"{sp['validation_se_diff']:.4f}", train,
                          "–" if need is None else f"{need:,} (upper end {sp['seeds_for_target_upper']:,})"])
        if irows:
            doc.table(["difference", "seeds", "sequences × draws", "`val_loss` Δ [95 % CI, raw]", "validation SE of Δ",
                       "training-seed sd [95 % CI]", f"seeds per variant for MDE {TARGET_MDE:g} nats"], irows)
        else:
            doc.paragraph("No pair has scored sequences on every seed yet.")
        heads = interim.get("head_start") or []
        if heads:  # from an AR initialisation: what the converted models started with, and what training did
            doc.heading("Head start and training effect so far (step-0 controls, the same sequences)")
            doc.table(["difference", "seeds", "sequences", "step-0 gap [95 % CI, raw]", "Δ_train [95 % CI, raw]"],
                      [[" − ".join(labels.get(n, n) for n in h["pair"]), f"{h['seeds']}", f"{h['sequences']}",
                        fmt_interval(h["step0_gap"]), fmt_interval(h["training_effect"])] for h in heads])
            doc.paragraph("Δ_train = (a(T) − a(0)) − (b(T) − b(0)): positive when training narrowed a lead a had at step 0.")
    return doc.write_markdown(out, PROGRESS)


def _escape_cell(run: Path, metrics: list[dict], escape) -> str:
    """A finished run's escape step and sink onset under the declared rule (docs/method.md §11): `>` marks a
    run censored at its last probe (it had not left the plateau, or its sinks had not formed, by then)."""
    from sinkdlm.experiment.endpoints.escape.probe import PROBES, escape_record

    probes = run / "escape" / PROBES
    if not probes.is_file():
        return "–"
    record = escape_record(probes, metrics, escape)

    def step(e: dict) -> str:
        return f"> {e['step']:,}" if e["censored"] else f"{e['step']:,}"

    return f"{step(record['escape'])} ({step(record['onset'])})"


ACTIVE_S = 600  # a run whose metrics log was written this recently is being trained (the trainer logs every few s)


def _training_now(train_dir: Path, now: float | None = None) -> bool:
    """Whether a run is being trained now: its metrics log was written in the last `ACTIVE_S` seconds."""
    log = train_dir / "metrics.jsonl"
    return log.is_file() and (time.time() if now is None else now) - log.stat().st_mtime < ACTIVE_S


def _remaining(steps: int, step_rates: list[float], sequences: int, seq_rates: list[float], busy: int = 0) -> str:
    """What is left of training and of the fixed validation, and its time at the median rates measured so far
    (the seconds of one process); `busy`: runs being trained side by side now (shards), which divide the wall time."""
    def cost(n: int, rates: list[float], unit: str) -> str:
        if n <= 0:
            return "done"
        if not rates:
            return f"{n:,} {unit} (no rate measured yet)"
        rate = statistics.median(rates)
        each = f"{rate:.1f}" if rate >= 1 else f"{rate:.2g}"  # a tiny model's step takes a fraction of a second
        return f"{n:,} {unit}, about {_hours(n * rate)} at {each} s each"

    side_by_side = ""
    if busy >= 2 and steps > 0 and step_rates:
        side_by_side = (f" {busy} runs are training side by side now (their logs were written in the last "
                        f"{ACTIVE_S // 60} minutes): if they go on so, the training left takes about "
                        f"{_hours(steps * statistics.median(step_rates) / busy)} of wall time.")
    return (f"**Left:** training {cost(steps, step_rates, 'steps')}; fixed validation "
            f"{cost(sequences, seq_rates, 'sequences')} (rates: the median over the models measured on this "
            "machine, one process each; plus a few minutes per run of evaluation and analysis, and the retraining of "
            "a run whose checkpoint is gone before its measurements are done)." + side_by_side)


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours >= 0.1 else f"{60 * hours:.0f} min"
