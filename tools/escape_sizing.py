"""Size the `escape` study (issue 54) from the committed from-scratch study's runs (exploratory).

For every run of `docs/results/study/runs/<variant>-s<seed>/train/metrics.jsonl` it recomputes the escape step
under the `escape` preset's rule as nearly as the training log allows: the log holds one training batch's loss
every 50 steps, not a fixed probe, so the probe loss is stood in for by the trailing mean of `--window` logged
losses, and the plateau is the training split's unigram entropy (the level of the training loss at the plateau,
docs/method.md §11) minus the preset's declared margin. A run still above it at its last logged step is censored
there. Then, per contrast against vanilla, the paired log2 ratios of escape steps, their spread over seeds (the
censored pairs at their bounds), the censored sign test (`experiment.escape.censored_sign_test`) and the exact
sign test's minimum detectable effect at each number of seeds (`sign_test_mde`).

    python tools/escape_sizing.py [--study docs/results/study] [--out docs/results/escape-sizing] [--window 5]

Writes OUT/sizing.json and OUT/README.md (both labelled exploratory: the rule was written after these runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from sinkdlm.config import ModelConfig
from sinkdlm.experiment.endpoints.escape.probe import censored_sign_test, escape_step, sign_test_mde, unigram_plateau
from sinkdlm.experiment.presets import get_preset
from sinkdlm.io.atomic import atomic_write_bytes, atomic_write_json
from sinkdlm.training.rundir import read_metrics
from sinkdlm.training.trainer import load_batches, prepare_tokenizer

SEEDS_CONSIDERED = (6, 8, 10, 12, 16, 20, 24)


def train_plateau(preset: str) -> dict[str, float]:
    """`unigram_plateau` of the training split of `preset`'s corpus under its tokenizer (the probe set: the same
    tokens, so `train_entropy` is the level of the logged training loss on the plateau, docs/method.md §11)."""
    cfg = get_preset(preset).train
    tok = prepare_tokenizer(cfg, ModelConfig.from_preset(cfg.preset).vocab_size)
    train = load_batches(cfg, tok, cfg.seq_len, "train")
    tokens, _ = train.get(list(range(len(train))))
    return unigram_plateau(tokens, tokens)


def run_escape(run: Path, threshold: float, window: int) -> dict:
    """`escape_step` of one run directory's trailing mean of `window` logged training losses (train/metrics.jsonl)."""
    rows = [r for r in read_metrics(run / "train") if "loss" in r]
    steps = np.array([r["step"] for r in rows])
    loss = np.convolve([r["loss"] for r in rows], np.ones(window) / window, mode="valid")
    return escape_step(list(zip(steps[window - 1:].tolist(), loss.tolist())), threshold)


def run_escapes(study: Path, threshold: float, window: int) -> dict[str, dict]:
    """{run name: escape_step record + variant, seed} from each run's trailing-mean training loss."""
    out = {}
    for run in sorted((study / "runs").iterdir()):
        variant, seed = run.name.rsplit("-s", 1)
        out[run.name] = {"variant": variant, "seed": seed, **run_escape(run, threshold, window)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="docs/results/study")
    ap.add_argument("--out", default="docs/results/escape-sizing")
    ap.add_argument("--window", type=int, default=5, help="trailing mean over this many logged losses")
    args = ap.parse_args()
    preset = get_preset("escape")
    plateau = train_plateau("study")  # the committed runs' settings (the tokenizer, the corpus)
    threshold = plateau["train_entropy"] - preset.escape.margin
    runs = run_escapes(Path(args.study), threshold, args.window)
    by_variant: dict[str, dict[str, dict]] = {}
    for r in runs.values():
        by_variant.setdefault(r["variant"], {})[r["seed"]] = r
    contrasts = {}
    for name in sorted(by_variant):
        if name == "vanilla":
            continue
        test = censored_sign_test(by_variant[name], by_variant["vanilla"])
        d = list(test["per_seed"].values())
        sd = statistics.stdev(d) if len(d) >= 2 else None
        contrasts[f"{name} / vanilla"] = {**test, "sd": sd}
    sds = [c["sd"] for c in contrasts.values() if c["sd"]]
    pooled = float(np.sqrt(np.mean(np.square(sds))))
    mde = {n: sign_test_mde(pooled, n) for n in SEEDS_CONSIDERED}
    last = max(r["last_probe"] for r in runs.values())
    by_step = {s: sum(not r["censored"] and r["step"] <= s for r in runs.values()) for s in (2400, 4000, 4800, 6000, last)}
    result = {"exploratory": True, "rule": {"threshold": threshold, "margin": preset.escape.margin,
                                            "window_logged_losses": args.window, "plateau": plateau},
              "runs": runs, "contrasts": contrasts, "pooled_sd_log2": pooled, "sign_test_mde_log2": mde,
              "escaped_by_step": by_step, "runs_total": len(runs), "preset": {
                  "seeds": len(preset.seeds), "max_steps": preset.train.max_steps, "every": preset.escape.every}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "sizing.json", result)
    lines = ["# Sizing the `escape` study (exploratory)", "",
             f"Escape steps of the {len(runs)} committed runs of `{args.study}` recomputed by `tools/escape_sizing.py` "
             "under the `escape` rule as nearly as their training log allows: the trailing mean of "
             f"{args.window} logged single-batch losses (one every 50 steps) stands in for the fixed probe; threshold = "
             f"the training split's unigram entropy {plateau['train_entropy']:.3f} nats − margin "
             f"{preset.escape.margin} = {threshold:.3f}. Exploratory: the rule was written after these runs were seen.",
             "", "| run | escape step | censored |", "|---|---:|:--:|"]
    lines += [f"| {k} | {r['step']} | {'yes' if r['censored'] else ''} |" for k, r in runs.items()]
    lines += ["", "Runs escaped by step: " + ", ".join(f"{s}: {n}/{len(runs)}" for s, n in by_step.items()), "",
              "| contrast | seeds | log2 ratio per seed | median | sd | +/−/tie/undetermined | p (censored sign) |",
              "|---|---:|---|---:|---:|---|---:|"]
    for k, c in contrasts.items():
        per = ", ".join(f"{v:+.2f}" for v in c["per_seed"].values())
        lines.append(f"| {k} | {c['seeds']} | {per} | {c['estimate']:+.2f} | {c['sd']:.2f} | "
                     f"{c['plus']}/{c['minus']}/{c['ties']}/{c['undetermined']} | {c['p']:.3g} |")
    lines += ["", f"Pooled sd of the log2 ratio over the contrasts: {pooled:.2f} (censored values at their bounds).", "",
              "Minimum detectable median shift (log2) of the exact two-sided sign test at 5 %, 80 % power, normal "
              "differences with the pooled sd:", "", "| seeds | MDE (log2) |", "|---:|---:|"]
    lines += [f"| {n} | {'–' if m is None else f'{m:.2f}'} |" for n, m in mde.items()]
    atomic_write_bytes(out / "README.md", ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
