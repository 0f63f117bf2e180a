"""`analyze` and `compare`: run the sink analysis of a model and write analysis.json, figures and a report.

`analyze(model, tokenizer, prompts, ...)` generates from the prompts (batched) with a `SinkRecorder`
on the sampler callback, optionally runs the sink-masking ablation (`ablation.py`), and writes to
`out_dir`:
  analysis.json          the numbers (schema: `ANALYSIS_KEYS`, README "analysis.json");
  analysis_arrays.npz    per-run arrays for `compare` (largest-sink positions, norm samples, maps);
  the PNG figures        stable names in `FIGURES`, listed under the `figures` key;
  report.md, report.html what was measured, on what, and the numbers (HTML: figures inlined).
`compare({label: dir, ...}, out_dir)` reads several such directories and writes one side-by-side
report with combined figures. Matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from sinkdlm.analysis.ablation import check_ks, run_ablation, split_continuation
from sinkdlm.validation import check_epsilon, check_int, check_scale
from sinkdlm.analysis.recorder import SinkRecorder
from sinkdlm.atomic import atomic_write, atomic_write_json
from sinkdlm.reporting import Document

SCHEMA_VERSION = 1
FIGURES = {
    "attention_maps": "attention_maps.png",
    "value_norm_scatter": "value_norm_scatter.png",
    "layer_bars": "layer_bars.png",
    "non_sink_fraction": "non_sink_fraction.png",
    "largest_sink_positions": "largest_sink_positions.png",
}
ANALYSIS_KEYS = (
    "schema_version", "model", "setup", "epsilon", "scale", "non_sink_fraction", "non_sink_fraction_by_epsilon",
    "non_sink_fraction_per_layer", "sinks_per_head", "sink_attention_mass", "sink_token_types", "value_norm",
    "moving", "extra_sink", "virtual_sink", "ablation", "figures", "arrays", "samples", "timing",
)
ARRAYS_NAME = "analysis_arrays.npz"


# ----------------------------------------------------------------------------- input checks
def check_options(*, epsilon, scale, gen_length, steps, block_length=None, ablation_k=None,
                  figure_steps=None, out_dir=None, mc_num=16, batch_size=8) -> list[int] | None:
    """Every user error of `analyze` as a ValueError, before any work. Returns the K list (or None)."""
    check_epsilon(epsilon)
    check_scale(scale)
    check_int("gen_length", gen_length, 1)
    check_int("steps", steps, 1)
    check_int("mc_num", mc_num, 1)
    check_int("batch_size", batch_size, 1)
    if block_length is not None:
        check_int("block_length", block_length, 1)
        if gen_length % block_length:
            raise ValueError(f"block_length={block_length} must divide gen_length={gen_length}")
    if figure_steps is not None:
        a, b = figure_steps
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a < steps and (b == -1 or a < b < steps)):
            raise ValueError(f"figure_steps must be (a, b) with 0 <= a < b < steps={steps} (b = -1: last step), "
                             f"got {figure_steps!r}")
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"out_dir {str(out_dir)!r} exists and is not a directory")
    return None if ablation_k is None else check_ks(ablation_k)


def prompts_from_documents(documents: Sequence[str], tokenizer, num_prompts: int, prompt_length: int,
                           seed: int = 0) -> list[str]:
    """`num_prompts` windows of `prompt_length` tokens from the documents (seeded offsets), as text."""
    check_int("num_prompts", num_prompts, 1)
    check_int("prompt_length", prompt_length, 2)
    from sinkdlm.data import encode_texts

    docs = [ids for ids in encode_texts(tokenizer, list(documents)) if len(ids) >= prompt_length]
    if not docs:
        raise ValueError(f"no document has {prompt_length} tokens; lower --prompt-length")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(num_prompts):
        ids = docs[i % len(docs)]
        start = int(torch.randint(0, len(ids) - prompt_length + 1, (), generator=gen))
        out.append(tokenizer.decode(ids[start:start + prompt_length]))
    return out


# ----------------------------------------------------------------------------- analyze
def analyze(
    model,
    tokenizer,
    prompts: list[str],
    *,
    gen_length: int,
    steps: int,
    block_length: int | None = None,
    epsilon: float = 3.0,
    scale: str = "sum",
    ablation_k: list[int] | None = None,
    include_extra_sink: bool = False,
    ablation_task=None,
    ablation_protocol: str = "clean",
    out_dir: str | Path,
    seed: int = 0,
    figure_steps: tuple[int, int] | None = None,
    figure_layer: int | None = None,
    batch_size: int = 8,
    mc_num: int = 16,
    label: str | None = None,
    generate_kwargs: dict | None = None,
    progress: bool = True,
) -> dict:
    """Sink analysis of `model` generating from `prompts`; writes and returns analysis.json's dict.

    epsilon/scale   sink threshold (Rulli et al. eq. 3) and received-attention scale (docs/method.md §6).
    ablation_k      run the sink-masking ablation for these K (0 is always added as the baseline):
                    with `ablation_task` (protocol: `sinkdlm.analysis.ablation`) its score, else the
                    per-token ELBO of held-out continuations (each prompt's last
                    `min(gen_length, len // 2)` tokens) with `mc_num` samples.
    ablation_protocol  with `ablation_task`: "clean" (sinks of step t-1 found on its un-ablated
                    attention, default) or "ablated" (on the masked model's own maps).
    figure_steps    the two steps of the attention-map figure (default: first and last).
    batch_size      prompts per `generate` call (attention maps of a step scale with it).
    generate_kwargs passed on to `generate` (e.g. temperature, remasking, shift_logits).

    An autoregressive model (`config.causal`: a Qwen2/LLaMA checkpoint opened as is) is analysed the
    same way on its greedy left-to-right generation (one step per token, causal maps), and its ablation
    scores the exact continuation log-likelihood per token (docs/method.md §10).
    """
    from tqdm.auto import tqdm

    from sinkdlm.data import encode_texts
    from sinkdlm.diffusion.sampling import generate

    ks = check_options(epsilon=epsilon, scale=scale, gen_length=gen_length, steps=steps, block_length=block_length,
                       ablation_k=ablation_k, figure_steps=figure_steps, out_dir=out_dir, mc_num=mc_num,
                       batch_size=batch_size)
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError("every prompt must be a non-empty string")
    if ablation_task is not None and not callable(ablation_task):
        raise ValueError("ablation_task must be a callable task(model, generate_kwargs) -> float")
    generate_kwargs = dict(generate_kwargs or {})
    reserved = {"callback", "output_attentions", "output_values", "key_masks_fn", "return_dict", "seed",
                "attention_hook_fn"}
    if reserved & set(generate_kwargs):
        raise ValueError(f"generate_kwargs may not set {sorted(reserved & set(generate_kwargs))}; analyze sets them")
    cfg = model.config
    ids = encode_texts(tokenizer, list(prompts))
    if any(not row for row in ids):
        raise ValueError("a prompt encodes to no tokens; give non-empty prompts")
    longest = max(len(r) for r in ids)
    if longest + gen_length > cfg.max_content_length:
        raise ValueError(f"prompt ({longest} tokens) + gen_length ({gen_length}) is longer than the model's "
                         f"{cfg.content_length_note()} positions; shorten the prompts or gen_length")
    pairs = None
    if ks is not None and ablation_task is None:
        pairs = [p for p in (split_continuation(r, gen_length) for r in ids) if p is not None]
        if not pairs:
            raise ValueError("the ELBO ablation needs prompts of at least 2 tokens (prefix + held-out continuation)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    decoded: dict[int, str] = {}

    def decode(i: int) -> str:
        if i not in decoded:
            decoded[i] = tokenizer.decode([i])
        return decoded[i]

    recorder = SinkRecorder(cfg, epsilon=epsilon, scale=scale, decode=decode, figure_layer=figure_layer,
                            figure_steps=figure_steps or (0, -1), seed=seed)
    chunks = [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]
    was_training = model.training
    model.eval()
    samples, steps_taken = [], 0
    start = time.perf_counter()
    steps_per_chunk = gen_length if cfg.causal else steps  # an AR model takes one step per token
    last_layer = cfg.num_hidden_layers - 1
    with tqdm(total=len(chunks) * steps_per_chunk, desc="sink analysis: generation", unit="step",
              disable=not progress, leave=False) as bar:
        def step_hook(step, input_ids, attention_mask):
            # The recorder sees one layer's maps at a time inside the forward (docs/method.md §10):
            # an 8B model's analysis never holds every layer's [B, H, S, S] at once.
            record = recorder.step_hook(step, input_ids, attention_mask)

            def hook(layer, attn, values, column=None):
                record(layer, attn, values, column)
                if layer == last_layer:
                    bar.update(1)
            return hook

        for chunk in chunks:
            out = generate(model, chunk, gen_length, steps, block_length=block_length, seed=seed,
                           attention_hook_fn=step_hook, return_dict=True, **generate_kwargs)
            steps_taken = max(steps_taken, out.steps_taken)
            for row in out.sequences[:, out.prompt_length:].tolist():
                samples.append(tokenizer.decode(row, skip_special_tokens=True))
    gen_seconds = time.perf_counter() - start

    ablation, abl_seconds = None, 0.0
    if ks is not None:
        start = time.perf_counter()
        total = len(ks) if ablation_task is not None else len(pairs) * (1 if cfg.causal else mc_num)
        with tqdm(total=total, desc="sink analysis: ablation", disable=not progress, leave=False) as bar:
            ablation = run_ablation(
                model, ks, epsilon=epsilon, scale=scale, include_extra_sink=include_extra_sink,
                ablation_task=ablation_task, prefixes=[p for p, _ in pairs] if pairs else None,
                continuations=[c for _, c in pairs] if pairs else None, mc_num=mc_num, batch_size=batch_size * 2,
                seed=seed, shift_logits=generate_kwargs.get("shift_logits"), progress=bar.update,
                protocol=ablation_protocol,
            )
        abl_seconds = time.perf_counter() - start
    model.train(was_training)

    summary = recorder.summary()
    arrays = recorder.arrays()
    lengths = [len(r) for r in ids]
    analysis = {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "label": label or "model",
            **{k: getattr(cfg, k) for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                            "hidden_size", "vocab_size", "mask_token_id", "num_sink_tokens",
                                            "sink_position", "sink_zero_value", "gated_attention",
                                            "sink_logit", "softmax_one", "causal", "shift_logits")},
            "kind": "autoregressive (causal)" if cfg.causal else "diffusion (bidirectional)",
            "source_format": cfg.extra.get("source_format", "sinkdlm"),
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(model.dtype).removeprefix("torch."),
            "device": str(model.device),
        },
        "setup": {
            "num_prompts": len(prompts), "prompt_tokens": {"min": min(lengths), "mean": sum(lengths) / len(lengths),
                                                            "max": max(lengths)},
            "gen_length": gen_length, "steps": steps, "steps_taken": steps_taken,
            "block_length": block_length or gen_length, "batch_size": batch_size, "seed": seed,
            "max_sequence_positions": recorder.max_positions,
            "figure_layer": recorder.figure_layer, "generate_kwargs": generate_kwargs,
            "figure_prompt_tokens": lengths[recorder.figure_row] if recorder.figure_row < len(lengths) else None,
        },
        **{k: v for k, v in summary.items() if k != "counts"},
        "ablation": ablation,
        "figures": {},
        "arrays": ARRAYS_NAME,
        "samples": samples[:5],
        "timing": {"generation_seconds": gen_seconds, "ablation_seconds": abl_seconds},
    }
    _save_arrays(out_dir / ARRAYS_NAME, arrays)
    analysis["figures"] = _write_figures(out_dir, analysis, arrays)
    atomic_write_json(out_dir / "analysis.json", analysis)
    _analysis_doc(analysis, out_dir).write(out_dir)
    return analysis


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    atomic_write(path, lambda tmp: np.savez_compressed(tmp, **arrays), suffix=".npz")


def _floats(values) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in values], dtype=float)


def _extra_positions(analysis: dict) -> list[int]:
    """Layout positions of the extra sinks in the largest-sink figure (front: 0..n-1; end: only
    when every row has the same length, else the rows disagree)."""
    m = analysis["model"]
    n = m["num_sink_tokens"]
    if not n:
        return []
    if m["sink_position"] == "front":
        return list(range(n))
    p = analysis["setup"]["prompt_tokens"]
    if p["min"] != p["max"]:
        return []
    size = p["max"] + analysis["setup"]["gen_length"] + n
    return list(range(size - n, size))


HEAD_CHOICE = "head shown: the one of this layer with the largest received attention (strongest sink)"


def _map_marks(analysis: dict, size: int) -> tuple[list[int], int | None]:
    """(extra-sink positions, first generated position) inside the figure row's `[S', S']` map."""
    m, setup = analysis["model"], analysis["setup"]
    n, p = m["num_sink_tokens"], setup.get("figure_prompt_tokens")
    front = m["sink_position"] == "front"
    sinks = list(range(n)) if front else list(range(size - n, size))
    return sinks, None if p is None else p + (n if front else 0)


def _write_figures(out_dir: Path, analysis: dict, arrays: dict) -> dict[str, str]:
    from sinkdlm.analysis import figures as F

    label = analysis["model"]["label"]
    written = {}
    if "attention_maps" in arrays:
        layer, head = (int(x) for x in arrays["attention_map_layer_head"])
        titles = [f"layer {layer}, head {head}, step {int(s)}" for s in arrays["attention_map_steps"]]
        sinks, prompt_end = _map_marks(analysis, arrays["attention_maps"].shape[-1])
        F.plot_attention_maps(list(arrays["attention_maps"]), titles, out_dir / FIGURES["attention_maps"],
                              sink_positions=sinks, prompt_end=prompt_end, note=HEAD_CHOICE,
                              title=f"{label}: attention maps")
        written["attention_maps"] = FIGURES["attention_maps"]
    F.plot_value_norm_scatter(arrays["sink_norm_sample"], arrays["normal_norm_sample"],
                              out_dir / FIGURES["value_norm_scatter"], title=f"{label}: value norms, sinks vs normal tokens")
    written["value_norm_scatter"] = FIGURES["value_norm_scatter"]
    extra = analysis["extra_sink"]
    if extra is not None:
        F.plot_layer_bars(_floats(extra["value_norm"]), _floats(extra["others_value_norm"]),
                          _floats(extra["attention_mass"]), out_dir / FIGURES["layer_bars"],
                          title=f"{label}: the extra sink token per layer")
    else:
        plot_detected_sink_bars({label: analysis}, out_dir / FIGURES["layer_bars"],
                                title=f"{label}: detected sinks per layer")
    written["layer_bars"] = FIGURES["layer_bars"]
    curve = {float(e): v for e, v in analysis["non_sink_fraction_by_epsilon"].items()}
    F.plot_non_sink_fraction({label: curve}, out_dir / FIGURES["non_sink_fraction"], scale=analysis["scale"],
                             mark_epsilon=analysis["epsilon"], title=f"{label}: non-sink fraction vs ϵ")
    written["non_sink_fraction"] = FIGURES["non_sink_fraction"]
    F.plot_largest_sink_positions(arrays["largest_sink_positions"], out_dir / FIGURES["largest_sink_positions"],
                                  num_positions=analysis["setup"]["max_sequence_positions"],
                                  extra_sink_positions=_extra_positions(analysis),
                                  title=f"{label}: largest sink over denoising steps")
    written["largest_sink_positions"] = FIGURES["largest_sink_positions"]
    return written


def plot_detected_sink_bars(analyses: Mapping[str, dict], path, *, title: str | None = None) -> Path:
    """Per-layer bars of the *detected* sinks (any model): value norm of sink vs normal tokens and
    the share of attention on sinks, one row per model (the `plot_layer_bars` layout, with labels
    that do not claim an extra sink token)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    from sinkdlm.analysis.figures import integer_ticks, save_figure, say_empty

    fig = Figure(figsize=(11, 3.2 * len(analyses)), layout="constrained")
    axes = fig.subplots(len(analyses), 2, squeeze=False, sharey="col")  # rows compare on one scale
    for (ax_norm, ax_mass), (label, a) in zip(axes, analyses.items()):
        per = a["value_norm"]["per_layer"]
        sink, normal, mass = _floats(per["sink_mean"]), _floats(per["normal_mean"]), _floats(a["sink_attention_mass"])
        layers = np.arange(len(mass))
        ax_norm.bar(layers - 0.2, sink, width=0.4, color="tab:red", label=f"sinks at ϵ={a['epsilon']:g}")
        ax_norm.bar(layers + 0.2, normal, width=0.4, color="tab:blue", label="normal tokens")
        ax_norm.set(xlabel="layer", ylabel="mean value L2 norm", title=f"{label}: value norm per layer")
        ax_norm.legend(fontsize=8)
        virtual = a.get("virtual_sink")
        if virtual is None:
            ax_mass.bar(layers, mass, width=0.7, color="tab:purple")
        else:  # sink_logit / softmax_one: the virtual column's share beside the detected sinks'
            ax_mass.bar(layers - 0.2, mass, width=0.4, color="tab:purple", label=f"sinks at ϵ={a['epsilon']:g}")
            ax_mass.bar(layers + 0.2, _floats(virtual["attention_mass"]), width=0.4, color="tab:orange",
                        label=virtual["label"])
            ax_mass.legend(fontsize=8)
        for ax in (ax_norm, ax_mass):
            integer_ticks(ax)
            if not np.nan_to_num(mass).any():
                say_empty(ax)
        ax_mass.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax_mass.set(xlabel="layer", ylabel="attention mass on sinks", title=f"{label}: attention on detected sinks")
    if title:
        fig.suptitle(title, fontsize=12)
    return save_figure(fig, path)


# ----------------------------------------------------------------------------- report documents
def _text(text: str) -> str:
    """A decoded token or sample as one safe table/list cell: Python-escaped, `|` and backticks too."""
    return repr(text).replace("|", "\\x7c").replace("`", "\\x60")


def _num(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


FIGURE_CAPTIONS = {
    "attention_maps": "Attention map of one head at two denoising steps (One-Token Fig. 1): bright columns are "
                      "sinks; a moving sink changes column between steps.",
    "value_norm_scatter": "Value-space L2 norms (eq. 16) of sink tokens vs normal tokens (One-Token Fig. 1), "
                          "a uniform sample of each.",
    "layer_bars": "Per layer: mean value norm of the sink vs the other tokens, and the share of attention "
                  "on the sink (One-Token Fig. 3; detected sinks when the model has no extra sink token).",
    "non_sink_fraction": "Share of (step, layer, head, key) that are not sinks, as a function of ϵ "
                         "(Rulli et al. Fig. 10).",
    "largest_sink_positions": "Position of the largest sink at every denoising step: share of (row, layer, "
                              "head) whose largest sink sits at that position (-1 = no sink at ϵ).",
}


def _setup_text(a: dict) -> str:
    s, m = a["setup"], a["model"]
    sinks = (f"{m['num_sink_tokens']} extra sink token(s) ({m['sink_position']})" if m["num_sink_tokens"]
             else "no extra sink token")
    return (f"Measured on the attention maps of every layer and head at every denoising step of "
            f"{s['num_prompts']} generations ({s['prompt_tokens']['mean']:.0f} prompt tokens on average, "
            f"{s['gen_length']} generated tokens, {s['steps_taken']} steps, block length {s['block_length']}) "
            f"of `{m['label']}` ({m['num_hidden_layers']} layers × {m['num_attention_heads']} heads, {sinks}). "
            f"Key j is a sink of a (step, layer, head) when its received attention c_j > mean_(k≠j) c_k + ϵ "
            f"(Rulli et al. eq. 3) with ϵ = {a['epsilon']:g} on the column-**{a['scale']}** scale (docs/method.md §6).")


def _analysis_doc(a: dict, out_dir: Path) -> Document:
    doc = Document(f"Attention-sink analysis: {a['model']['label']}")
    doc.paragraph(_setup_text(a))
    doc.heading("Summary")
    vn = a["value_norm"]
    rows = [
        ["non-sink fraction at ϵ", _pct(a["non_sink_fraction"])],
        ["sinks per head (mean)", _num(sum(x or 0 for x in a["sinks_per_head"]) / len(a["sinks_per_head"]), 3)],
        ["value norm: sink / normal tokens", f"{_num(vn['sink_mean'], 3)} / {_num(vn['normal_mean'], 3)}"],
        ["largest sink moves (consecutive steps)", _pct(a["moving"]["mean"]["largest_sink_change_rate"])],
        ["sink set changes (consecutive steps), content keys", _pct(a["moving"]["mean"].get("content_sink_set_change_rate"))],
        ["Jaccard of consecutive sink sets, content keys", _num(a["moving"]["mean"].get("content_sink_set_jaccard"), 3)],
        # every key, the extra sinks' included: the alternative definition (docs/method.md §6)
        ["sink set changes, every key", _pct(a["moving"]["mean"]["sink_set_change_rate"])],
        ["Jaccard of consecutive sink sets, every key", _num(a["moving"]["mean"]["sink_set_jaccard"], 3)],
    ]
    if a["extra_sink"] is not None:
        rows.append(["attention on the extra sink (all layers)", _pct(a["extra_sink"]["mean_attention_mass"])])
        rows.append(["heads whose largest sink is the extra sink", _pct(a["moving"]["mean"]["extra_sink_share"])])
    if a.get("virtual_sink") is not None:
        v = a["virtual_sink"]
        rows.append([f"attention on the {v['label']} (all layers)", _pct(v["mean_attention_mass"])])
        rows.append([f"non-sink fraction at ϵ, {v['label']} as one more key", _pct(v["mean_non_sink_fraction_with_virtual"])])
    doc.table(["quantity", "value"], rows)
    doc.heading("Non-sink fraction vs ϵ")
    curve = a["non_sink_fraction_by_epsilon"]
    doc.table(["ϵ", *curve], [["non-sink", *(_pct(v) for v in curve.values())]])
    doc.heading("Per layer")
    mv = a["moving"]
    header = ["layer", "non-sink", "sinks/head", "attn on sinks", "norm sink", "norm normal", "largest moves",
              "set changes (content keys)", "Jaccard (content keys)"]
    per = vn["per_layer"]
    layers = range(len(a["sinks_per_head"]))
    content_change = mv.get("content_sink_set_change_rate") or [None for _ in layers]  # absent in older files
    content_jaccard = mv.get("content_sink_set_jaccard") or [None for _ in layers]
    rows = [[i, _pct(a["non_sink_fraction_per_layer"][i]), _num(a["sinks_per_head"][i], 3),
             _pct(a["sink_attention_mass"][i]), _num(per["sink_mean"][i], 3), _num(per["normal_mean"][i], 3),
             _pct(mv["largest_sink_change_rate"][i]), _pct(content_change[i]),
             _num(content_jaccard[i], 3)] for i in layers]
    doc.table(header, rows)
    if a["extra_sink"] is not None:
        e = a["extra_sink"]
        doc.heading("Extra sink token (One-Token Fig. 3)")
        doc.table(["layer", "attention mass", "sink value norm", "others value norm", "largest-sink share"],
                  [[i, _pct(e["attention_mass"][i]), _num(e["value_norm"][i], 3), _num(e["others_value_norm"][i], 3),
                    _pct(e["largest_sink_share"][i])] for i in range(len(e["attention_mass"]))])
    doc.heading("Tokens under the sinks (Rulli et al. Table 2)")
    types = a["sink_token_types"]
    doc.table(["type", "count", "share"], [[t, c, _pct(types["shares"][t])] for t, c in types["counts"].items()])
    if types["top_tokens"]:
        doc.table(["top sink token", "id", "count"], [[_text(t["text"]), t["id"], t["count"]] for t in types["top_tokens"]])
    if a["ablation"] is not None:
        _ablation_section(doc, {a["model"]["label"]: a["ablation"]})
    doc.heading("Figures")
    for name, file in a["figures"].items():
        doc.image(out_dir / file, FIGURE_CAPTIONS[name])
    if a["samples"]:
        doc.heading("Sample generations")
        doc.bullets([f"`{_text(s)}`" for s in a["samples"][:3]])
    return doc


def _ablation_section(doc: Document, ablations: Mapping[str, dict]) -> None:
    first = next(iter(ablations.values()))
    doc.heading("Sink-masking ablation (Rulli et al. Table 1)")
    extra = "including" if first["include_extra_sink"] else "never masking"
    doc.paragraph(f"Score: `{first['metric']}` (higher is better). Protocol: {first['protocol']}; the top-K sinks at "
          f"ϵ = {first['epsilon']:g} of every (layer, head) get -inf pre-softmax logits, {extra} the extra sink "
          f"token. Δ = score(K) − score(0), paired over the same inputs.")
    header = ["model", "K", "score", "Δ", "± s.e. of Δ", "masked keys / head"]
    rows = []
    for label, ab in ablations.items():
        for k in ab["k"]:
            se = (ab.get("delta_stderr") or {}).get(str(k))
            rows.append([label, k, _num(ab["scores"][str(k)]), _num(ab["delta"][str(k)]), _num(se, 2),
                         _num(ab["masked_keys_per_head"][str(k)], 3)])
    doc.table(header, rows)
