"""Escape steps of the `block-sinks` study read from its training logs (issue 65; exploratory).

What: for every finished run of the study (`runs/<arm>-s<seed>/train/DONE.json` exists) the step at which it left
the unigram plateau (docs/method.md §11), recomputed as `tools/escape_sizing.py` does: the trailing mean of
`--window` logged single-batch training losses stands in for the probe, the threshold is the training split's
unigram entropy minus the `escape` preset's margin, and a run still above it at its last logged step is censored
there. Then, per contrast (+ 1 sink − vanilla at each block size; blocks of 4 and of 16 − the whole sequence), the
paired log2 ratios of escape steps over the seeds both arms have finished and the censored sign test.

Why exploratory: `block-sinks` (§15) declared no escape endpoint before its runs; this rule is applied after they
were seen, from logs not written for it (one training batch's loss every 50 steps, not a fixed probe).

One plateau serves every arm: a block model's training loss is its block NELBO (§13: each masked token's
cross-entropy / t of its block, summed over the L' = L = 128 positions, 128 a multiple of 4 and 16, so no EOS
padding, / L'), and a token is masked with probability t, so a predictor of the unigram p at every masked position
has expected loss (1/L) Σ_i −ln p(x_i), the unigram entropy of the training tokens, whatever the block size.

    python tools/block_sinks_escape.py [--study docs/results/block-sinks] [--out docs/results/block-sinks-escape] [--window 5]

Writes OUT/escape.json and OUT/README.md, both labelled exploratory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ (loaded by path in the tests)

from escape_sizing import run_escape, train_plateau  # noqa: E402

from sinkdlm.experiment.endpoints.escape.probe import censored_sign_test  # noqa: E402
from sinkdlm.experiment.presets import get_preset  # noqa: E402
from sinkdlm.io.atomic import atomic_write_bytes, atomic_write_json  # noqa: E402

PRESET = "block-sinks"
# (arm, baseline): + 1 sink - vanilla at each block size, then the study's primary pair direction and block 16
CONTRASTS = (("sink1-front", "vanilla"), ("block16-sink1", "block16"), ("block4-sink1", "block4"),
             ("block4", "vanilla"), ("block16", "vanilla"))


def finished_escapes(study: Path, threshold: float, window: int) -> dict[str, dict]:
    """{run name: `escape_step` record + variant, seed} of every run of `study` whose train/DONE.json exists."""
    out = {}
    for run in sorted((study / "runs").iterdir()):
        if (run / "train" / "DONE.json").is_file():
            variant, seed = run.name.rsplit("-s", 1)
            out[run.name] = {"variant": variant, "seed": seed, **run_escape(run, threshold, window)}
    return out


def contrasts(runs: dict[str, dict]) -> dict[str, dict]:
    """{"arm − base": `censored_sign_test` of arm against base} over the seeds both have finished."""
    by_variant: dict[str, dict[str, dict]] = {}
    for r in runs.values():
        by_variant.setdefault(r["variant"], {})[r["seed"]] = r
    return {f"{arm} − {base}": {"arm": arm, "base": base,
                                **censored_sign_test(by_variant.get(arm, {}), by_variant.get(base, {}))}
            for arm, base in CONTRASTS}


def summarize(study: Path, plateau: dict[str, float], window: int) -> dict:
    """escape.json's record: the rule, each finished run's escape step, the contrasts, how many runs were in."""
    margin = get_preset("escape").escape.margin
    preset = get_preset(PRESET)
    threshold = plateau["train_entropy"] - margin
    runs = finished_escapes(study, threshold, window)
    return {"exploratory": True, "study": str(study),
            "rule": {"threshold": threshold, "margin": margin, "window_logged_losses": window,
                     "logged_every": preset.train.log_every, "plateau": plateau},
            "runs_in": len(runs), "runs_total": len(preset.variants) * len(preset.seeds),
            "runs": runs, "contrasts": contrasts(runs)}


def _cell(c: dict, seed: str) -> str:
    """A pair's log2 ratio, a bound marked ≥ / ≤ when one side is censored, ? when both are."""
    arm_cens, base_cens = c["censored"][seed]
    if arm_cens and base_cens:
        return f"s{seed} ?"
    return f"s{seed} {'≥' if arm_cens else '≤' if base_cens else ''}{c['per_seed'][seed]:+.2f}"


def write(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "escape.json", result)
    rule, plateau = result["rule"], result["rule"]["plateau"]
    n, total = result["runs_in"], result["runs_total"]
    lines = [f"# Escape from the unigram plateau in `block-sinks` (exploratory, {n} of {total} runs)", "",
             f"Escape steps of the {n} finished runs (train/DONE.json) of the study's {total} in `{result['study']}`, "
             "read from their training logs by `tools/block_sinks_escape.py` (issue 65) under the `escape` rule "
             f"(docs/method.md §11) as nearly as the logs allow: the trailing mean of {rule['window_logged_losses']} "
             f"logged single-batch losses (one every {rule['logged_every']} steps) stands in for the fixed probe; "
             f"threshold = the training split's unigram entropy {plateau['train_entropy']:.3f} nats − margin "
             f"{rule['margin']} = {rule['threshold']:.3f}; a run still above it at its last logged step is censored there. "
             "**Exploratory**: the study declared no escape endpoint before its runs (§15); this rule was applied "
             "after they were seen, and nothing here is a declared test.", "",
             "One plateau serves every arm. A block model's training loss is its block NELBO (§13): each masked "
             "token's cross-entropy divided by its block's t, summed and divided by L' (= L = 128 here, a multiple "
             "of 4 and 16, so no EOS padding). A token is masked with probability t, so a model that predicts the "
             "unigram p at every masked position has expected loss (1/L) Σ −ln p(x_i), the training tokens' unigram "
             "entropy, whatever the block size (and whether t is drawn per block or per sequence). What a block "
             "model can use beyond the unigram (the clean blocks before its own) moves when it leaves the plateau, "
             "not the plateau's level.", "",
             "| run | escape step | censored |", "|---|---:|:--:|"]
    lines += [f"| {k} | {r['step']} | {'yes' if r['censored'] else ''} |" for k, r in result["runs"].items()]
    lines += ["", "Per contrast, paired by seed over the seeds both arms have finished: d = log2(escape_arm / "
              "escape_base) (≥ / ≤: a bound, one side censored; ?: both censored); the censored sign test "
              "(`censored_sign_test`, §11: undetermined pairs counted against the hypothesis, ties dropped).", "",
              "| contrast | seeds | log2 ratio per seed | median | +/−/tie/undetermined | p (censored sign) |",
              "|---|---:|---|---:|---|---:|"]
    for k, c in result["contrasts"].items():
        per = ", ".join(_cell(c, s) for s in c["per_seed"]) or "–"
        est = "–" if c["estimate"] is None else f"{c['estimate']:+.2f}"
        p = "–" if c["p"] is None else f"{c['p']:.3g}"
        lines.append(f"| {k} | {c['seeds']} | {per} | {est} | "
                     f"{c['plus']}/{c['minus']}/{c['ties']}/{c['undetermined']} | {p} |")
    atomic_write_bytes(out / "README.md", ("\n".join(lines) + "\n").encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="docs/results/block-sinks")
    ap.add_argument("--out", default="docs/results/block-sinks-escape")
    ap.add_argument("--window", type=int, default=5, help="trailing mean over this many logged losses")
    args = ap.parse_args()
    result = summarize(Path(args.study), train_plateau(PRESET), args.window)
    write(Path(args.out), result)
    print((Path(args.out) / "README.md").read_text())


if __name__ == "__main__":
    main()
