"""What quantization costs a real AR model (issue 66, item 4): SmolLM2-135M's exact next-token cross-entropy on
fixed validation sequences, unquantized and under each `--quantize` scheme, paired over the sequences.

The sequences: the first `--tokens` tokens (whole rows of `--seq-len`) of the packed shakespeare validation split,
tokenized with the model's own tokenizer, as a study builds its fixed validation (`experiment/fixed_set.py`:
`training.trainer.load_batches`). A sequence's score is its mean next-token cross-entropy over its L − 1 predicted
tokens (nats), exact: `diffusion.likelihood.loglikelihood`'s AR path (one causal forward, the first token the
prefix). Each scheme quantizes a fresh copy of the model (`model.quantize.quantize_model`: the block linears; the
embeddings, norms and head stay float32) and scores the same sequences in the same process, so Δ_quant = quantized −
unquantized is paired per sequence; its interval is the Student t interval over the sequences (`stats`). The weights
are fixed (a released checkpoint, no training seed) and the score is exact (no noise draws), so the only spread is
over the sequences: the interval says how the Δ would move on other text like this, not over training seeds.
Optionally (`--outliers`, the default) the FFN ∞-norm per layer of the unquantized model on the same sequences
(`analysis.outliers.measure_outliers`, one more float32 pass).

The DLM conversions of the same model are measured by the `real-quant` experiment preset (docs/results/real-quant),
not here.

    python tools/quant_real.py [--model GGUF] [--tokens 16384] [--seq-len 128] [--schemes int8-weight,int8-dynamic]
                               [--out docs/results/quant-real]
    python tools/quant_real.py --readme-only      # OUT/README.md again from OUT/results.json

Writes OUT/results.json and OUT/README.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

from sinkdlm.io.atomic import atomic_write_bytes, atomic_write_json

SCHEMES = ("int8-weight", "int8-dynamic")
METHOD = "paired t over sequences"


def validation_sequences(tokenizer, max_len: int, tokens: int, seq_len: int = 128, data: str = "shakespeare",
                         cache_dir: str | None = None) -> torch.Tensor:
    """The first `tokens` tokens (whole rows, rounded up) of the packed validation split of `data`, `[N, seq_len]`,
    as a study's fixed validation reads them (`experiment.fixed_set.validation_inputs`)."""
    from sinkdlm.config import TrainConfig
    from sinkdlm.training.trainer import load_batches

    cfg = TrainConfig(data=data, seq_len=seq_len, cache_dir=cache_dir)
    val = load_batches(cfg, tokenizer, max_len, "validation")
    rows = min(len(val), -(-tokens // seq_len))
    x0, _ = val.get(list(range(rows)))
    return x0


@torch.inference_mode()
def sequence_ce(model, x: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Per sequence `[N]` (float64) the mean next-token cross-entropy of an AR model on `x [N, L]`: token i
    predicted from tokens < i, for i = 1 .. L − 1 (exact: `loglikelihood`'s causal path, prefix = the first token)."""
    from sinkdlm.diffusion.likelihood import loglikelihood

    cfg = model.config
    if not (cfg.causal and cfg.shift_logits):
        raise ValueError("sequence_ce scores an autoregressive model (causal, shifted logits); a DLM's fixed "
                         "validation is diffusion.likelihood.validation_elbo")
    if x.dim() != 2 or x.shape[1] < 2:
        raise ValueError(f"x must be [N, L] with L >= 2, got shape {tuple(x.shape)}")
    out = loglikelihood(model, x[:, :1], x[:, 1:], batch_size=batch_size)
    return (-out.logprob / (x.shape[1] - 1)).double()


def scheme_delta(model, x: torch.Tensor, scheme: str, reference: torch.Tensor, batch_size: int = 8) -> dict:
    """One scheme on a fresh copy of `model`: its per-sequence CE, Δ = quantized − `reference` per sequence, the
    paired t interval of the mean Δ over the sequences, and the seconds (quantizing and scoring)."""
    from sinkdlm.model.quantize import quantize_model
    from sinkdlm.stats import paired_difference

    t0 = time.perf_counter()
    quantized = quantize_model(copy.deepcopy(model), scheme)
    values = sequence_ce(quantized, x, batch_size)
    seconds = time.perf_counter() - t0
    interval = replace(paired_difference(values.tolist(), reference.tolist()), method=METHOD)
    return {"val_loss": float(values.mean()), "delta": interval.mean, "interval": interval.to_dict(),
            "per_sequence": values.tolist(), "seconds": seconds}


def ffn_inf_norm(model, x: torch.Tensor, batch_size: int = 8) -> list[float]:
    """The FFN output's ∞-norm per layer of `model` over every position of `x` (`analysis.outliers`)."""
    from sinkdlm.analysis.outliers import measure_outliers

    with torch.inference_mode():
        out = measure_outliers(model, [(x[lo:lo + batch_size].to(model.device), None)
                                       for lo in range(0, len(x), batch_size)])
    return out["per_layer"]["ffn"]["content"]["inf_norm"]


def measure(model, x: torch.Tensor, schemes: tuple[str, ...], batch_size: int = 8, outliers: bool = True) -> dict:
    """The reference scores, every scheme's Δ (see the module docstring) and optionally the FFN ∞-norms."""
    model.eval()
    t0 = time.perf_counter()
    reference = sequence_ce(model, x, batch_size)
    seconds = time.perf_counter() - t0
    record = {"sequences": int(x.shape[0]), "seq_len": int(x.shape[1]), "tokens": int(x.numel()),
              "predicted_tokens": int(x.shape[0] * (x.shape[1] - 1)),
              "val_loss": float(reference.mean()), "reference_seconds": seconds,
              "reference_per_sequence": reference.tolist(),
              "schemes": {s: scheme_delta(model, x, s, reference, batch_size) for s in schemes}}
    if outliers:
        t0 = time.perf_counter()
        record["ffn_inf_norm"] = ffn_inf_norm(model, x, batch_size)
        record["outliers_seconds"] = time.perf_counter() - t0
    return record


def _num(x, digits=4):
    return "—" if x is None else f"{x:+.{digits}f}"


def write(out: Path, r: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", r)
    lines = ["# What quantization costs SmolLM2-135M (AR), on fixed validation sequences", "",
             f"Model: `{r['model']}` (a causal AR model, dequantised to float32 on load; the block linears quantized "
             "by torchao; the embeddings, norms and head kept float32). Sequences: the first "
             f"{r['sequences']} sequences of {r['seq_len']} tokens ({r['tokens']:,} tokens, {r['predicted_tokens']:,} "
             f"predicted) of the packed `{r['data']}` validation split, tokenized with the model's own tokenizer. "
             "Score: a sequence's mean next-token cross-entropy (nats), exact. Machine: "
             f"{r['machine']['cpu']}, {r['machine']['threads']} thread(s); torch {r['machine']['torch']}, torchao "
             f"{r['machine']['torchao']}, Python {r['machine']['python']}. `python tools/quant_real.py "
             f"{r['argv']}`.", "",
             *([r["note"], ""] if r.get("note") else []),
             f"Unquantized (float32) val_loss: {r['val_loss']:.5f} nats ({r['reference_seconds']:.0f} s).", "",
             "Δ_quant = quantized − unquantized, per sequence, then averaged; its 95 % interval is the Student t "
             f"interval over the {r['sequences']} sequences (paired: the same sequences, the same process). The "
             "weights are fixed (a released checkpoint) and the score exact, so there is no seed and no noise "
             "variance: the interval is over the text only.", "",
             "| scheme | val_loss | Δ_quant (nats) | 95 % interval | p | seconds |", "|---|---:|---:|---|---:|---:|"]
    for s, v in r["schemes"].items():
        iv = v["interval"]
        ci = "degenerate" if iv["degenerate"] else f"[{_num(iv['low'], 5)}, {_num(iv['high'], 5)}]"
        p = "—" if iv["p"] is None else f"{iv['p']:.2g}"
        lines.append(f"| `{s}` | {v['val_loss']:.5f} | {_num(v['delta'], 5)} | {ci} | {p} | {v['seconds']:.0f} |")
    if r.get("ffn_inf_norm"):
        norms = r["ffn_inf_norm"]
        top = max(range(len(norms)), key=norms.__getitem__)
        lines += ["", f"FFN output ∞-norm per layer of the unquantized model on the same sequences "
                      f"(`analysis.outliers`; largest {norms[top]:.1f} at layer {top}):", "",
                  ", ".join(f"{v:.1f}" for v in norms) + "."]
    lines += ["", "The DLM conversions of this model (vanilla, + 1 sink) are measured by the `real-quant` experiment "
                  "preset: [its report](../real-quant/report.md)."]
    atomic_write_bytes(out / "README.md", ("\n".join(lines) + "\n").encode())


def main() -> None:
    import sys

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a model sinkdlm loads (default: the example SmolLM2-135M GGUF)")
    ap.add_argument("--tokens", type=int, default=16_384, help="validation tokens (whole sequences, rounded up)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--data", default="shakespeare")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--no-outliers", dest="outliers", action="store_false")
    ap.add_argument("--out", type=Path, default=Path("docs/results/quant-real"))
    ap.add_argument("--note", default=None, help="a sentence on how the seconds were measured (kept in results.json)")
    ap.add_argument("--readme-only", action="store_true",
                    help="rewrite OUT/README.md (and --note) from OUT/results.json, measuring nothing")
    args = ap.parse_args()
    if args.readme_only:
        r = json.loads((args.out / "results.json").read_text())
        write(args.out, r if args.note is None else {**r, "note": args.note})
        print((args.out / "README.md").read_text())
        return
    from sinkdlm.checkpoint.example_model import example_model_path
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.io.machine import cpu_name
    from sinkdlm.model.quantize import check_quantize, torchao_version

    schemes = tuple(s for s in args.schemes.split(",") if s)
    for s in schemes:
        check_quantize(s, torch.device("cpu"), torch.float32)
    path = args.model or str(example_model_path())
    model, tok = load_model_and_tokenizer(path, device="cpu", dtype="float32")
    x = validation_sequences(tok, model.config.max_content_length, args.tokens, args.seq_len, args.data)
    r = measure(model, x, schemes, args.batch_size, args.outliers)
    r = {"model": Path(path).name, "data": args.data, **r,
         "machine": {"cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                     "torchao": torchao_version(), "python": platform.python_version()},
         "argv": " ".join(sys.argv[1:]), "note": args.note}
    write(args.out, r)
    print((args.out / "README.md").read_text())


if __name__ == "__main__":
    main()
