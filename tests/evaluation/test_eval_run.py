"""`evaluate` end to end with a tiny random DiffusionLM, `evaluate_dir`, and `sinkdlm eval`: output
structure, values in [0, 1] with binomial standard errors, determinism, user errors before work, and every
item's result the same at batch sizes 1 and 8 (also through the lm-eval model)."""

from __future__ import annotations

import copy
import json
import dataclasses
import math

import pytest
import torch
from typer.testing import CliRunner

import sinkdlm.cli  # noqa: F401  (registers the commands on the app)
from sinkdlm import CheckpointError, DiffusionLM, ModelConfig, generate
from sinkdlm.cli import app
from sinkdlm.data import load_documents, train_bpe_tokenizer
from sinkdlm.evaluation import DLMPredictor, GenRequest, evaluate, evaluate_dir, format_table
from sinkdlm.config import EvalConfig
from sinkdlm.config.commands import LMEvalConfig, ScoringOptions

TASKS = ["shakespeare_cloze", "shakespeare_next_line"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tok = train_bpe_tokenizer([d[:50_000] for d in load_documents("shakespeare", "train")[:3]], 300)
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=512, initializer_range=0.2,
        mask_token_id=tok.mask_token_id, num_sink_tokens=1,
    )
    model = DiffusionLM(cfg).eval()
    ckpt = tmp_path_factory.mktemp("eval") / "ckpt"
    model.save_pretrained(ckpt, tokenizer=tok)
    return model, tok, ckpt


def test_evaluate_end_to_end_on_both_shakespeare_tasks(tiny):
    model, tok, _ = tiny
    scores = evaluate(model, tok, EvalConfig(tasks=",".join(TASKS), limit=8, mc_num=4, progress=False))
    assert list(scores) == TASKS
    assert set(scores["shakespeare_cloze"]) == {"exact_match", "acc"}
    assert set(scores["shakespeare_next_line"]) == {"acc", "acc_norm"}
    for metrics in scores.values():
        for s in metrics.values():
            assert set(s) == {"value", "stderr", "n", "per_item", "items"} and s["n"] == 8 == len(s["per_item"])
            assert 0.0 <= s["value"] <= 1.0
            assert s["value"] * 8 == pytest.approx(round(s["value"] * 8))  # a count of correct items
            assert s["stderr"] == pytest.approx(math.sqrt(s["value"] * (1 - s["value"]) / 8))
    assert evaluate(model, tok, EvalConfig(tasks=",".join(TASKS), limit=8, mc_num=4, progress=False)) == scores  # seeded: repeatable
    table = format_table(scores)
    assert "shakespeare_next_line  acc_norm" in table and "± " in table


def test_evaluate_arithmetic_end_to_end(tiny):
    model, tok, _ = tiny
    scores = evaluate(model, tok, EvalConfig(tasks="arithmetic", limit=2, gen_steps=32, progress=False))
    assert list(scores) == ["arithmetic"] and list(scores["arithmetic"]) == ["exact_match"]
    s = scores["arithmetic"]["exact_match"]
    assert s["n"] == 2 and s["value"] in (0.0, 0.5, 1.0)


@torch.no_grad()
def test_cloze_generation_samples_as_many_tokens_as_the_true_word(tiny):
    """The exact-match generation samples exactly len(tokens(" word")) tokens after the context, one per
    step. References: for a one-token word, the argmax over non-mask ids at a single [MASK]; for a longer
    word, the sampler called directly with that length."""
    model, tok, _ = tiny
    pred = DLMPredictor(model, tok)
    mask_id, eos = model.config.mask_token_id, tok.eos_token_id

    def text(new_ids):
        new_ids = new_ids[: new_ids.index(eos)] if eos in new_ids else new_ids
        return tok.decode(new_ids, skip_special_tokens=True)

    ctx = "To be, or not to be, that is"
    ids, target = pred.encode_pair(ctx, " the")
    assert len(target) == 1
    logits = model(torch.tensor(ids + [mask_id])[None]).logits[0, -1]
    logits[mask_id] = -math.inf
    assert pred.generate([GenRequest(ctx, length_of=" the")]) == [text([int(logits.argmax())])]

    ids, target = pred.encode_pair(ctx, " questionable")
    assert len(target) > 1
    seq = generate(model, ids, gen_length=len(target), steps=len(target))[0, len(ids):].tolist()
    assert pred.generate([GenRequest(ctx, length_of=" questionable")]) == [text(seq)]


def test_evaluate_dir_reads_a_checkpoint_and_reports_bad_input_first(tiny, tmp_path):
    model, tok, ckpt = tiny
    config = EvalConfig(tasks="shakespeare_next_line", limit=4, mc_num=2, progress=False)
    assert evaluate_dir(dataclasses.replace(config, model=ckpt, device="cpu")) == evaluate(model, tok, config)
    tasks = EvalConfig(tasks=",".join(TASKS))
    with pytest.raises(CheckpointError, match="does not exist"):
        evaluate_dir(dataclasses.replace(tasks, model=tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json is missing"):
        evaluate_dir(dataclasses.replace(tasks, model=tmp_path / "empty"))
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((ckpt / "config.json").read_text())
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        evaluate_dir(dataclasses.replace(tasks, model=no_weights))
    # The task name is checked before the directory: the message lists the known tasks.
    with pytest.raises(ValueError, match="unknown task 'hellaswag'; known tasks: shakespeare_cloze"):
        evaluate_dir(EvalConfig(tasks="hellaswag", model=tmp_path / "missing"))
    with pytest.raises(ValueError, match="mc_num"):
        evaluate(model, tok, dataclasses.replace(tasks, mc_num=0))


def test_eval_command_prints_a_table_and_writes_json(tiny, tmp_path):
    _, _, ckpt = tiny
    out = tmp_path / "sub" / "scores.json"
    args = ["eval", "--model", str(ckpt), "--tasks", "shakespeare_cloze,shakespeare_next_line", "--limit", "4",
            "--mc-num", "2", "--out", str(out), "--no-progress", "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    assert written["limit"] == 4 and written["tasks"] == TASKS
    for task, metrics in written["scores"].items():
        for metric, s in metrics.items():
            assert s["n"] == 4
            assert f"{s['value']:.4f}" in result.output
    assert "shakespeare_cloze      exact_match" in result.output


@pytest.mark.parametrize(
    "case,pattern",
    [
        ("unknown_task", "unknown task 'nope' (--tasks); known tasks: shakespeare_cloze, shakespeare_next_line, shakespeare_word_order, arithmetic"),
        ("missing_model", "does not exist"),
        ("out_under_file", "is a file, not a directory"),
        ("out_is_dir", "is a directory"),
        ("bad_cache", "cache must be one of prefix, dual (or none), got 'full'"),
    ],
)
def test_eval_command_errors_are_one_line_before_any_work(tiny, tmp_path, case, pattern, capsys):
    _, _, ckpt = tiny
    model, tasks, out = str(ckpt), "shakespeare_cloze", str(tmp_path / "s.json")
    if case == "unknown_task":
        tasks = "shakespeare_cloze,nope"
    elif case == "missing_model":
        model = str(tmp_path / "nope")
    elif case == "out_under_file":
        (tmp_path / "file").write_text("x")
        out = str(tmp_path / "file" / "s.json")
    elif case == "out_is_dir":
        out = str(tmp_path)
    extra = ["--cache", "full"] if case == "bad_cache" else []
    with pytest.raises(SystemExit) as exc:
        sinkdlm.cli.main(["eval", "--model", model, "--tasks", tasks, "--out", out, "--no-progress", *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and pattern in err and "Traceback" not in err
    assert not (tmp_path / "s.json").exists()


def test_generation_tasks_use_the_remasking_settings(tiny):
    """EvalConfig's remasking settings reach the sampler of the generation tasks (the greedy check keeps
    LLaDA's one commit per step), and a bad one is refused before any item is scored."""
    model, tok, _ = tiny
    config = EvalConfig(tasks="arithmetic", schedule="dream", remasking="topk_margin", top_k=7, progress=False)
    rule = config.remasking_options()
    pred = DLMPredictor(model, tok, config)
    prompt = tok("1 + 2 =")["input_ids"]
    got = pred.generate_ids([prompt], 8, steps=4)
    want = generate(model, [prompt], gen_length=8, steps=4, seed=0, **rule)[0, len(prompt):].tolist()
    assert got == [want]
    assert got != DLMPredictor(model, tok).generate_ids([prompt], 8, steps=4)  # the LLaDA default differs here
    with pytest.raises(ValueError, match="only schedule='dream' defines"):
        evaluate(model, tok, EvalConfig(tasks="arithmetic", limit=1, remasking="origin", schedule="llada",
                                        progress=False))


# ----------------------------------------------------------------------------- scores do not depend on the batch (issue 67)
@pytest.mark.slow  # ~5 s; the same property through the lm-eval model stays default (the next test)
def test_evaluate_gives_every_item_the_same_result_at_batch_sizes_1_and_8(tiny):
    model, tok, _ = tiny
    model = copy.deepcopy(model).double()  # float64: the batches' padded shapes cannot round a near-tie the other way
    per_batch = {
        b: evaluate(model, tok, EvalConfig(tasks="shakespeare_cloze,shakespeare_next_line", limit=6, mc_num=4,
                                           batch_size=b, progress=False))
        for b in (1, 8)
    }
    for task, metrics in per_batch[1].items():
        for name, score in metrics.items():
            assert score["per_item"] == per_batch[8][task][name]["per_item"], (task, name)
    # the numbers under the outcomes: every request's ELBO draws its own masks, wherever it is batched
    pairs = [("To be, or not", " to be"), ("Now is the winter", " of our discontent"), ("O", " Romeo, Romeo")] * 2
    lls = [DLMPredictor(model, tok, ScoringOptions(batch_size=b, mc_num=5, progress=False)).loglikelihood(pairs[:n])
           for b, n in ((1, 6), (8, 6), (8, 2))]
    assert lls[0] == pytest.approx(lls[1], rel=1e-9) and lls[2] == pytest.approx(lls[0][:2], rel=1e-9)
    assert lls[0][:3] == lls[0][3:]  # a request's draws come from its tokens: the same request, the same numbers


def test_the_lm_eval_model_gives_the_same_items_at_batch_sizes_1_and_8(tiny):
    from lm_eval.api.instance import Instance

    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    _, _, ckpt = tiny
    contexts = ["To be, or not", "Now is the winter of our", "O Romeo, Romeo", "A horse"]
    ll = [Instance("loglikelihood", {}, (c, x), i) for i, c in enumerate(contexts) for x in (" the", " thy love")]
    gen = [Instance("generate_until", {}, (c, dict(until=["\n"], max_gen_toks=8, do_sample=sample, temperature=0.9)), i)
           for i, c in enumerate(contexts) for sample in (False, True)]
    results = {}
    for b in (1, 8):
        lm = SinkDLMEvalModel(LMEvalConfig(model=str(ckpt), batch_size=b, mc_num=6, block_length=4, device="cpu",
                                           progress=False))
        lm.model.double()  # in place (the predictor holds this very model); float64, as above
        results[b] = (lm.loglikelihood(ll, disable_tqdm=True), lm.generate_until(gen, disable_tqdm=True))
    (lls1, gens1), (lls8, gens8) = results[1], results[8]
    assert [g for _, g in lls1] == [g for _, g in lls8] and gens1 == gens8
    # the same draws through float64 forwards of other padded shapes: equal up to float64 rounding
    assert [v for v, _ in lls1] == pytest.approx([v for v, _ in lls8], rel=1e-9)
