"""Fast decoding on a trained model (issue 11): accuracy and speed of every decoding mode on `arithmetic`.

A `tiny` DLM is fine-tuned from scratch on the `arithmetic` training problems (cached under
benchmarks/.cache/decoding, reused on later runs), then decodes held-out `arithmetic` test problems
in batches of up to 8 problems of equal prompt length (no padding, so the reference loop runs them
too; Fast-dLLM reports batch 1, which on a CPU measures Python overhead more than decoding) with, at
each generation length (blocks of 32):

  reference loop      LLaDA's `generate()` written plainly (tests/diffusion/test_sampling.py), one token per step
  generate            `sinkdlm.generate`, one token per step            (must give identical tokens)
  threshold 0.9       Fast-dLLM parallel decoding: every masked token above 0.9 confidence
  prefix / dual       Fast-dLLM KV caches, one token per step
  prefix + 0.9, dual + 0.9

The modes run interleaved problem by problem (rotating order) in this one process, so load on the
machine hits them alike; speed is generated tokens per second of process CPU time (1 thread), given as
a ratio to the reference loop. Accuracy is exact match of the final answer with its 95 % interval over
items, and each mode's difference to the reference loop is paired over the same items
(`sinkdlm.stats`). Raw numbers: benchmarks/results/bench_decoding.json.

    .venv/bin/python benchmarks/bench_decoding.py [--problems 200] [--gen-lengths 128 256] [--train-steps 2000]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))
from test_sampling import reference_generate  # noqa: E402  (the reference loop the tests check against)

from sinkdlm import generate  # noqa: E402
from sinkdlm.io.atomic import atomic_write_json  # noqa: E402
from sinkdlm.io.machine import cpu_name  # noqa: E402
from sinkdlm.data.sft import arithmetic_dataset  # noqa: E402
from sinkdlm.evaluation.predictor import DLMPredictor  # noqa: E402
from sinkdlm.evaluation.scoring import answer_matches  # noqa: E402
from sinkdlm.checkpoint.manager import load_model_and_tokenizer  # noqa: E402
from sinkdlm.stats import accuracy_interval, paired_accuracy_difference, verdict  # noqa: E402

OUT = ROOT / "results" / "bench_decoding.json"
CACHE = ROOT / ".cache" / "decoding"
BLOCK, THRESHOLD = 32, 0.9
REF = "reference loop"
MODES = {  # name -> generate() options
    "generate": dict(),
    f"threshold {THRESHOLD}": dict(threshold=THRESHOLD),
    "prefix": dict(cache="prefix"),
    "dual": dict(cache="dual"),
    f"prefix + {THRESHOLD}": dict(cache="prefix", threshold=THRESHOLD),
    f"dual + {THRESHOLD}": dict(cache="dual", threshold=THRESHOLD),
}


def trained_model(steps: int, seed: int = 0):
    """The benchmark's model: `tiny` + 1 sink, SFT from scratch on `arithmetic` (cached). Rows of 320
    tokens (prompt + answer + EOS padding, as LLaDA's SFT) cover a prompt and 256 generated tokens."""
    from sinkdlm.experiment.units import train_stage
    from sinkdlm.training import TrainConfig
    from sinkdlm.training.trainer import prepare_tokenizer

    run = CACHE / f"tiny-sink1-arith-{steps}"
    tok_dir = CACHE / "tokenizer"
    if not (tok_dir / "tokenizer.json").is_file():
        tok_cfg = TrainConfig.resolve(preset="tiny", data="shakespeare", out=str(run))
        tok = prepare_tokenizer(tok_cfg, 2048)  # the Shakespeare BPE (digits are in its byte alphabet)
        tok.save_pretrained(str(tok_dir))
    summary = train_stage(run, dict(
        preset="tiny", num_sink_tokens=1, sft=True, data="arithmetic", tokenizer=str(tok_dir),
        max_steps=steps, batch_size=8, seq_len=320, lr=3e-3, min_lr=3e-4, eval_every=max(steps // 4, 1),
        save_every=max(steps // 4, 1), log_every=100, seed=seed,
    ))
    model, tok = load_model_and_tokenizer(summary["checkpoint"])
    return model.eval(), tok, summary


def run_mode(model, name: str, prompt: torch.Tensor, gen_length: int):
    """(new tokens [B, gen_length], CPU seconds, forwards) of one mode on prompts `[B, P]`."""
    c0 = time.process_time()
    if name == REF:
        seq = reference_generate(model, prompt, gen_length, gen_length, BLOCK)
        forwards = gen_length
    else:
        opts = MODES[name]
        steps = None if "threshold" in opts else gen_length
        res = generate(model, prompt, gen_length=gen_length, steps=steps, block_length=BLOCK, return_dict=True, **opts)
        seq, forwards = res.sequences, res.steps_taken
    return seq[:, prompt.shape[1]:], time.process_time() - c0, forwards


def batches(pred: DLMPredictor, items: list[dict], batch: int) -> list[list[int]]:
    """Item indices grouped by prompt length (no padding: the reference loop takes `[B, P]`), in
    chunks of at most `batch`; every mode decodes exactly these batches."""
    by_len: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        by_len.setdefault(len(pred.encode(item["prompt"])), []).append(i)
    return [idx[k: k + batch] for _, idx in sorted(by_len.items()) for k in range(0, len(idx), batch)]


def bench_length(model, pred: DLMPredictor, items: list[dict], gen_length: int, batch: int) -> dict:
    names = [REF, *MODES]
    out = {n: {"tokens": [None] * len(items), "correct": [None] * len(items), "cpu_s": 0.0, "forwards": 0}
           for n in names}
    groups = batches(pred, items, batch)
    done = 0
    for g, idx in enumerate(groups):
        prompt = torch.tensor([pred.encode(items[i]["prompt"]) for i in idx])
        for name in names[g % len(names):] + names[: g % len(names)]:
            new, cpu_s, forwards = run_mode(model, name, prompt, gen_length)
            rec = out[name]
            for row, i in enumerate(idx):
                rec["tokens"][i] = new[row].tolist()
                rec["correct"][i] = float(answer_matches(pred.decode(new[row].tolist()), items[i]["answer"]))
            rec["cpu_s"] += cpu_s
            rec["forwards"] += forwards * len(idx)
        done += len(idx)
        print(f"  gen {gen_length}: {done}/{len(items)} problems", flush=True)
    ref = out[REF]
    rows = {}
    for name in names:
        rec = out[name]
        acc = accuracy_interval([rec["correct"]])
        diff = paired_accuracy_difference([rec["correct"]], [ref["correct"]])
        tps = len(items) * gen_length / rec["cpu_s"]
        rows[name] = {
            "accuracy": acc.to_dict(), "vs_reference": {**diff.to_dict(), "verdict": verdict(diff, scale=100, unit=" points")},
            "tokens_per_cpu_s": tps, "speedup_vs_reference": tps / (len(items) * gen_length / ref["cpu_s"]),
            "forwards_per_problem": rec["forwards"] / len(items),
            "identical_to_reference": sum(a == b for a, b in zip(rec["tokens"], ref["tokens"])) / len(items),
        }
    return rows


def _merged(results: dict) -> dict:
    """`results` plus the other lengths of an earlier run on the same model and problems (so lengths
    can run in separate processes, one per core)."""
    if OUT.is_file():
        old = json.loads(OUT.read_text())
        if old.get("model", {}).get("train_steps") == results["model"]["train_steps"] and old.get("problems") == results["problems"] \
                and old.get("batch") == results["batch"]:
            results["lengths"] = {**old.get("lengths", {}), **results["lengths"]}
    return results


def _ci(iv: dict, fmt: str) -> str:
    """"mean [low, high]" in percent; an interval that could not be formed (no variance) shows "–"."""
    f = lambda x: "–" if x is None else format(100 * x, fmt)  # noqa: E731
    return f"{f(iv['mean'])} [{f(iv['low'])}, {f(iv['high'])}]"


def table(results: dict) -> str:
    """The README's markdown table of a results file."""
    lines = ["| gen length | mode | exact match % [95 % CI] | Δ vs reference (points) [95 % CI] | forwards per batch | "
             "tokens / CPU s | speed-up | identical tokens |", "|---:|---|---|---|---:|---:|---:|---:|"]
    for gen_length, rows in sorted(results["lengths"].items(), key=lambda kv: int(kv[0])):
        for name, r in rows.items():
            if name.startswith("_"):
                continue
            a, d = r["accuracy"], r["vs_reference"]
            lines.append(f"| {gen_length} | {name} | {_ci(a, '.1f')} | {_ci(d, '+.1f')} | {r['forwards_per_problem']:.1f} | "
                         f"{r['tokens_per_cpu_s']:.0f} | {r['speedup_vs_reference']:.2f}× | "
                         f"{100 * r['identical_to_reference']:.0f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--gen-lengths", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--train-steps", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8, help="problems per batch (equal prompt lengths)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, summary = trained_model(args.train_steps)
    pred = DLMPredictor(model, tok)
    items = arithmetic_dataset("test", args.problems, seed=0)
    results = {
        "machine": {"platform": platform.platform(), "processor": cpu_name(),
                    "threads": args.threads, "torch": torch.__version__, "device": "cpu"},
        "model": {"preset": "tiny", "num_sink_tokens": 1, "train_steps": args.train_steps,
                  "train_seconds": summary.get("seconds"), "val_loss": summary["last"].get("val_loss")},
        "problems": len(items), "batch": args.batch, "block_length": BLOCK, "threshold": THRESHOLD, "lengths": {},
    }
    for gen_length in args.gen_lengths:
        t0 = time.perf_counter()
        results["lengths"][str(gen_length)] = bench_length(model, pred, items, gen_length, args.batch)
        results["lengths"][str(gen_length)]["_wall_s"] = time.perf_counter() - t0
        atomic_write_json(OUT, _merged(results))
    print(table(results))

if __name__ == "__main__":
    main()
