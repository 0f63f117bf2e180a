"""The lm-eval model `sinkdlm` under the real lm-evaluation-harness runner, on local tasks written here.

References are computed in the test, independently of the library's batching:
  * one-token multiple-choice answers: the "mc_count" ELBO is then exact, so the harness's numbers
    must equal `log_softmax(model(context + [MASK]))[answer]`, and is_greedy must equal "the answer
    is the argmax over the non-mask vocabulary";
  * generate_until: the sampler called directly, cut at EOS and the stop string by hand;
  * loglikelihood_rolling (with method=chain, deterministic): windows of max_length - 1 tokens, each
    conditioned on as many preceding tokens as fit, scored by an eager left-to-right unmasking loop.
No network: the datasets are local JSON files and the offline switches are set.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from sinkdlm import DiffusionLM, ModelConfig, generate  # noqa: E402
from sinkdlm.data import train_bpe_tokenizer  # noqa: E402
from sinkdlm.model import CheckpointError  # noqa: E402

TEXTS = [
    "the cat sat on the mat and the dog sat on the log.",
    "a bird in the hand is worth two in the bush, they say.",
    "to be or not to be, that is the question of the day.",
    "all the world is a stage and all the men and women merely players.",
] * 20
MAX_POS = 128  # 127 content tokens + 1 sink: the rolling document below needs three windows


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    root = tmp_path_factory.mktemp("lmeval")
    tok = train_bpe_tokenizer(TEXTS, 300)
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=MAX_POS, initializer_range=0.3,
        mask_token_id=tok.mask_token_id, num_sink_tokens=1,
    )
    model = DiffusionLM(cfg).eval()
    ckpt = root / "ckpt"
    model.save_pretrained(ckpt, tokenizer=tok)

    # One-token answers: words whose " word" is a single vocabulary entry.
    words = sorted({w for t in TEXTS for w in t.replace(",", "").replace(".", "").split()})
    single = [w for w in words if len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1]
    assert len(single) >= 4, single
    mc_docs = [
        {"question": q, "choices": single[i % 2: i % 2 + 4], "label": i % 4}
        for i, q in enumerate(["the cat sat on the", "a bird in the", "to be or not to", "all the world is", "a dog"])
    ]
    gen_docs = [{"prompt": p, "answer": "x"} for p in ["the cat sat", "to be or", "all the world"]]
    long_text = " ".join(TEXTS[:12])
    data = root / "data"
    data.mkdir()
    for name, rows in (("mc", mc_docs), ("gen", gen_docs), ("roll", [{"text": long_text}])):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = root / "tasks"
    tasks.mkdir()

    def write_task(name, body):
        jsonl = data / (name.split("_")[1] + ".jsonl")
        (tasks / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {jsonl}\n"
            f"test_split: test\n{body}"
        )

    write_task("local_mc", (
        "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\ndoc_to_choice: choices\n"
        "doc_to_target: label\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    ))
    write_task("local_gen", (
        "output_type: generate_until\ndoc_to_text: \"{{prompt}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\", \".\"]\n  max_gen_toks: 40\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    ))
    write_task("local_roll", (
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    ))
    return {"tok": tok, "model": model, "ckpt": ckpt, "tasks": tasks, "mc": mc_docs, "gen": gen_docs, "text": long_text}


def run_harness(setup, tasks, model_args):
    import sinkdlm.evaluation.lm_eval_model  # noqa: F401  (the documented import registers "sinkdlm")
    from lm_eval.tasks import TaskManager

    # include_defaults=False: only the tasks written here (indexing lm-eval's thousands takes seconds)

    return lm_eval.simple_evaluate(
        model="sinkdlm", model_args=model_args, tasks=tasks,
        task_manager=TaskManager(include_path=str(setup["tasks"]), include_defaults=False), log_samples=True,
    )


def enc(tok, text):
    return tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


@torch.no_grad()
def test_multiple_choice_is_the_exact_one_token_likelihood(setup):
    tok, model = setup["tok"], setup["model"]
    out = run_harness(setup, ["local_mc"], f"pretrained={setup['ckpt']},mc_num=8,seed=3")
    samples = sorted(out["samples"]["local_mc"], key=lambda s: s["doc_id"])
    correct = []
    for doc, sample in zip(setup["mc"], samples):
        ref_ll, ref_greedy = [], []
        for choice in doc["choices"]:
            ctx, ans = enc(tok, doc["question"]), enc(tok, " " + choice)
            assert len(ans) == 1
            x = torch.tensor(ctx + [model.config.mask_token_id])[None]
            logits = model(x).logits[0, -1].double()
            ref_ll.append(float(torch.log_softmax(logits, -1)[ans[0]]))
            logits[model.config.mask_token_id] = -math.inf
            ref_greedy.append(int(logits.argmax()) == ans[0])
        got = [r[0] for r in sample["resps"]]
        assert [g[0] for g in got] == pytest.approx(ref_ll, abs=1e-4)
        assert [bool(g[1]) for g in got] == ref_greedy
        correct.append(max(range(len(ref_ll)), key=lambda i: ref_ll[i]) == doc["label"])
    assert out["results"]["local_mc"]["acc,none"] == pytest.approx(sum(correct) / len(correct))
    assert out["config"]["model"] == "sinkdlm"


def _cut_at_stops(tok, prompt: str, seq) -> str:
    """What generate_until answers from a sampled `seq [1, P + N]`: its first 40 new tokens (max_gen_toks), cut at
    EOS, decoded, cut at the task's stop strings."""
    new = seq[0, len(enc(tok, prompt)):][:40].tolist()
    if tok.eos_token_id in new:
        new = new[: new.index(tok.eos_token_id)]
    text = tok.decode(new, skip_special_tokens=True)
    for stop in ("\n", "."):
        text = text.split(stop)[0]
    return text


@pytest.mark.slow  # the cut at stop strings through the harness: the cached variant below, by default
@torch.no_grad()
def test_generate_until_is_the_sampler_cut_at_stop_strings(setup):
    tok, model = setup["tok"], setup["model"]
    out = run_harness(setup, ["local_gen"], f"pretrained={setup['ckpt']}")
    samples = sorted(out["samples"]["local_gen"], key=lambda s: s["doc_id"])
    for doc, sample in zip(setup["gen"], samples):
        # max_gen_toks=40 with blocks of 32: two blocks (64 tokens, one per step), the first 40 kept.
        assert sample["resps"][0][0] == _cut_at_stops(tok, doc["prompt"], generate(
            model, enc(tok, doc["prompt"]), gen_length=64, steps=64, block_length=32))


@torch.no_grad()
def test_generate_until_with_cache_and_threshold_is_the_cached_sampler(setup):
    tok, model = setup["tok"], setup["model"]
    out = run_harness(setup, ["local_gen"], f"pretrained={setup['ckpt']},cache=dual,threshold=0.5")
    samples = sorted(out["samples"]["local_gen"], key=lambda s: s["doc_id"])
    for doc, sample in zip(setup["gen"], samples):
        seq = generate(model, enc(tok, doc["prompt"]), gen_length=64, steps=None, block_length=32, cache="dual", threshold=0.5)
        new = seq[0, len(enc(tok, doc["prompt"])):][:40].tolist()
        if tok.eos_token_id in new:
            new = new[: new.index(tok.eos_token_id)]
        text = tok.decode(new, skip_special_tokens=True)
        for stop in ("\n", "."):
            text = text.split(stop)[0]
        assert sample["resps"][0][0] == text


def test_generate_until_uses_the_remasking_model_args(setup):
    from sinkdlm.config.commands import RemaskingOptions
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    lm = SinkDLMEvalModel.create_from_arg_string(f"pretrained={setup['ckpt']},schedule=dream,remasking=topk_margin,"
                                                 "top_k=5,alg_temp=0")
    given = dict(schedule="dream", remasking="topk_margin", top_k=5, alg_temp=0.0)
    assert lm.predictor.remasking == {**RemaskingOptions().remasking_options(), **given}  # the rest: the defaults
    assert lm.settings.mc_num == 128 and lm.settings.batch_size == 32  # lm-eval's defaults, not `sinkdlm eval`'s


def test_the_model_takes_its_typed_settings_as_model_args_give_them(setup):
    """From Python the model takes an `LMEvalConfig`; the model_args string is parsed into the same settings,
    so both score a request alike (same draws: the same seed)."""
    from lm_eval.api.instance import Instance

    from sinkdlm.config.commands import LMEvalConfig
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    typed = SinkDLMEvalModel(LMEvalConfig(model=setup["ckpt"], mc_num=4, batch_size=8, method="mc", seed=3,
                                          check_greedy=False, device="cpu"))
    parsed = SinkDLMEvalModel.create_from_arg_string(f"pretrained={setup['ckpt']},mc_num=4,method=mc,seed=3,"
                                                     "check_greedy=false", {"batch_size": 8, "device": "cpu"})
    assert parsed.settings == LMEvalConfig(model=setup["ckpt"], mc_num=4, batch_size=8, method="mc", seed=3,
                                           check_greedy=False, device="cpu")
    req = [Instance(request_type="loglikelihood", doc={}, arguments=("the king", " is dead"), idx=0)]
    assert typed.loglikelihood(req, disable_tqdm=True) == parsed.loglikelihood(req, disable_tqdm=True)
    assert typed.loglikelihood(req, disable_tqdm=True)[0][1] is False  # check_greedy=False: never claimed
    with pytest.raises(TypeError, match="takes an LMEvalConfig"):  # model_args go through create_from_arg_obj
        SinkDLMEvalModel({"pretrained": str(setup["ckpt"])})


def test_every_remasking_option_is_a_model_arg(tmp_path):
    """The remasking model_args are RemaskingOptions' fields (one home): each is parsed by its declared type
    and named in the unknown-argument message, before the checkpoint is read."""
    import dataclasses

    from sinkdlm.config.commands import RemaskingOptions
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel, _remasking_args

    names = [f.name for f in dataclasses.fields(RemaskingOptions)]
    given = {"eps": "0.01", "top_p": "0.9", "top_k": "3", "remasking": "entropy", "alg_temp": "none", "mc_num": "2"}
    assert _remasking_args(given) == {"eps": 0.01, "top_p": 0.9, "top_k": 3, "remasking": "entropy"}
    assert given == {"mc_num": "2"}  # the remasking ones are taken out, the rest left for the signature
    with pytest.raises(ValueError, match="unknown model_args.*bogus") as err:
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope"), bogus=1))
    assert all(n in str(err.value).split("known: ")[1].split(", ") for n in names)
    with pytest.raises(ValueError, match="eps='tiny' must be a number"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope"), eps="tiny"))


@torch.no_grad()
def test_loglikelihood_rolling_sums_window_likelihoods(setup):
    tok, model = setup["tok"], setup["model"]
    out = run_harness(setup, ["local_roll"], f"pretrained={setup['ckpt']},method=chain")
    got = out["samples"]["local_roll"][0]["resps"][0][0]
    ids, mask_id = enc(tok, setup["text"]), model.config.mask_token_id
    max_len = MAX_POS - 1
    assert len(ids) > 2 * max_len  # three windows
    ref, s = 0.0, 0
    while s < len(ids):
        cont = ids[s: s + max_len - 1]
        ctx = ids[max(0, s + len(cont) - max_len): s] or [tok.eos_token_id]
        x = torch.tensor(ctx + [mask_id] * len(cont))
        for k, y in enumerate(cont):  # chain rule: unmask left to right
            ref += float(torch.log_softmax(model(x[None]).logits[0, len(ctx) + k].double(), -1)[y])
            x[len(ctx) + k] = y
        s += len(cont)
    assert got == pytest.approx(ref, rel=1e-4)
    words = len(setup["text"].split())
    assert out["results"]["local_roll"]["word_perplexity,none"] == pytest.approx(math.exp(-ref / words), rel=1e-3)


def test_bad_model_args_are_clear(setup, tmp_path):
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    with pytest.raises(ValueError, match="unknown model_args.*mc_nums"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(setup["ckpt"]), mc_nums=4))
    with pytest.raises(ValueError, match="needs model_args pretrained"):
        SinkDLMEvalModel.create_from_arg_obj({})
    with pytest.raises(CheckpointError, match="does not exist"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope")))
    with pytest.raises(ValueError, match="mc_num='many' must be an integer"):  # before the missing directory
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope"), mc_num="many"))
    with pytest.raises(ValueError, match="method='elbo' must be one of mc, mc_count, chain"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope"), method="elbo"))
    with pytest.raises(ValueError, match="cache must be one of prefix, dual"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope"), cache="full"))
    with pytest.raises(ValueError, match="threshold='high' must be a number"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope"), threshold="high"))
    with pytest.raises(ValueError, match="top_k='all' must be an integer"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(tmp_path / "nope"), top_k="all"))
    with pytest.raises(ValueError, match=r"must lie in \(0, 1\]"):  # the range, once the model is read
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(setup["ckpt"]), top_p="1.5"))
    with pytest.raises(ValueError, match="schedule must be one of llada, dream"):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(setup["ckpt"]), schedule="cosine"))


def test_sinkdlm_lm_eval_command_forwards_to_lm_eval_with_the_model_registered(monkeypatch):
    import lm_eval.__main__
    from lm_eval.api.registry import get_model

    from sinkdlm.cli import main
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    seen = {}

    def fake_cli():
        seen["argv"] = list(sys.argv)
        seen["model"] = get_model("sinkdlm")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", fake_cli)
    monkeypatch.setattr(sys, "argv", ["sinkdlm"])
    args = ["--model", "sinkdlm", "--model_args", "pretrained=DIR,mc_num=128", "--tasks", "arc_easy", "--help"]
    with pytest.raises(SystemExit) as exc:  # typer's standalone mode exits 0 after the command
        main(["lm-eval", *args])
    assert exc.value.code == 0
    assert seen == {"argv": ["lm_eval", *args], "model": SinkDLMEvalModel}
    assert get_model("dummy").__name__ == "DummyLM"  # lm-eval's own models are still there


def _lm_eval(args: list[str], monkeypatch, capsys, raises: Exception | None = None) -> tuple[int, str, list | None]:
    """`sinkdlm lm-eval ARGS` with lm-eval's own command line replaced (it records its argv, or raises `raises`, as
    a Hub that cannot be reached would): (exit code, stderr, the argv lm-eval got, None if it never ran)."""
    import lm_eval.__main__

    from sinkdlm.cli import main

    seen = []

    def fake_cli():
        seen.append(list(sys.argv))
        if raises is not None:
            raise raises

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", fake_cli)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["lm-eval", *args])
    return exc.value.code, capsys.readouterr().err, (seen[0] if seen else None)


def test_a_dataset_not_in_the_cache_is_refused_before_the_model_loads(monkeypatch, capsys, tmp_path):
    """Offline (the switches unset: sinkdlm sets them, and says so), a task whose dataset is in no local cache is
    one error line before lm-eval runs (its model, a path that does not exist, is never opened): it names the
    dataset, the cache, a local task YAML, and the command with the switches at 0 (not the one just run)."""
    import datasets.config
    import huggingface_hub.constants

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    code, err, ran = _lm_eval(["--model_args", f"pretrained={tmp_path / 'nope'}", "--tasks", "arc_easy"],
                              monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and ran is None and len(lines) == 2, err
    assert lines[0] == ("[sinkdlm] lm-eval runs offline here: set HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1 "
                        "(export =0 to let it download)")
    assert lines[1].startswith("error: lm-eval task arc_easy needs the dataset 'allenai/ai2_arc', which is not in "
                               f"the local cache ({tmp_path / 'datasets'} or {tmp_path / 'hub'})")
    assert "--include_path" in lines[1] and lines[1].endswith("run it with HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0")


def test_online_by_choice_is_kept_and_never_told_to_go_online(monkeypatch, capsys, tmp_path):
    """HF_DATASETS_OFFLINE=0 set by the user stays 0 (no cache check, lm-eval runs); a Hub that cannot be reached
    then is said as such, without suggesting the switch the user already set; lm-eval gets `--device auto` when no
    device was asked for, so no CUDA line appears on a machine without one."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    unreachable = ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub (LocalEntryNotFoundError)")
    code, err, ran = _lm_eval(["--model_args", f"pretrained={tmp_path / 'nope'}", "--tasks", "arc_easy"],
                              monkeypatch, capsys, raises=unreachable)
    assert code == 2 and ran[-2:] == ["--device", "auto"] and os.environ["HF_DATASETS_OFFLINE"] == "0"
    line = err.strip()
    assert line.startswith("error: lm-eval task arc_easy needs the dataset 'allenai/ai2_arc'") and "\n" not in line
    assert "the Hub could not be reached (HF_DATASETS_OFFLINE=0 here: no network?)" in line
    assert "HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0" not in line and "lm-eval runs offline" not in err


@pytest.mark.slow
def test_command_line_wrapper_runs_lm_eval(setup, tmp_path):
    """`python -m sinkdlm.evaluation.lm_eval_model` = lm-eval's CLI with `--model sinkdlm` registered."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "sinkdlm.evaluation.lm_eval_model", "--model", "sinkdlm",
        "--model_args", f"pretrained={setup['ckpt']},mc_num=2", "--tasks", "local_mc",
        "--include_path", str(setup["tasks"]), "--output_path", str(tmp_path / "out"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in Path(tmp_path / "out").rglob("results*.json")]
    assert results and "acc,none" in results[0]["results"]["local_mc"]


def test_harness_scores_keep_lm_evals_numbers_and_per_item_outcomes(setup):
    from sinkdlm.evaluation.harness import evaluate_harness

    ours = evaluate_harness(setup["ckpt"], ["local_mc"], include_path=setup["tasks"], mc_num=8, seed=3)
    ref = run_harness(setup, ["local_mc"], f"pretrained={setup['ckpt']},mc_num=8,seed=3")
    samples = sorted(ref["samples"]["local_mc"], key=lambda s: s["doc_id"])
    for metric in ("acc", "acc_norm"):
        s = ours["local_mc"][metric]
        assert s["n"] == len(setup["mc"]) == len(s["per_item"])
        assert s["per_item"] == [float(x[metric]) for x in samples]
        assert s["value"] == pytest.approx(ref["results"]["local_mc"][f"{metric},none"])
        assert s["items"]
    with pytest.raises(ValueError, match="no lm-eval task"):
        evaluate_harness(setup["ckpt"], [])


@pytest.mark.slow  # two lm-eval runs and a server: about 30 s on a busy 2-core machine
def test_lm_evals_local_completions_against_sinkdlm_serve_gives_sinkdlm_lm_evals_answers(setup, tmp_path):
    """lm-eval's OpenAI-compatible model pointed at `sinkdlm serve` (issue 67): the same `generate_until` answers
    as `sinkdlm lm-eval` on the same model and settings (greedy, one token per step, one block: max_gen_toks 16
    fits lm-eval's blocks of 32). A float64 copy of the model, so the two paths' batch shapes cannot round a
    near-tie apart."""
    pytest.importorskip("fastapi")
    pytest.importorskip("tenacity")  # lm-eval's API models (lm-eval[api])
    import threading
    import time

    from lm_eval.tasks import TaskManager

    from sinkdlm.config.commands import ServeConfig
    from sinkdlm.serving.server import bind, build_server

    model = DiffusionLM.from_pretrained(setup["ckpt"]).double().eval()
    f64 = tmp_path / "f64"
    model.save_pretrained(f64, tokenizer=setup["tok"])
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    src = (setup["tasks"] / "local_gen.yaml").read_text()
    (tasks / "local_gen16.yaml").write_text(src.replace("task: local_gen", "task: local_gen16")
                                            .replace("max_gen_toks: 40", "max_gen_toks: 16"))
    sock = bind("127.0.0.1", 0)
    server = build_server(model, setup["tok"], ServeConfig(model_name="tiny"), None, "tiny")
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        manager = TaskManager(include_path=str(tasks), include_defaults=False)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
        served = lm_eval.simple_evaluate(
            model="local-completions", tasks=["local_gen16"], task_manager=manager, log_samples=True,
            model_args=f"model=tiny,base_url={url},tokenizer_backend=huggingface,tokenizer={f64},"
                       "tokenized_requests=False,max_retries=1")
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    import sinkdlm.evaluation.lm_eval_model  # noqa: F401  (registers "sinkdlm")

    direct = lm_eval.simple_evaluate(model="sinkdlm", model_args=f"pretrained={f64}", tasks=["local_gen16"],
                                     task_manager=manager, log_samples=True)
    answers = [[s["resps"][0][0] for s in sorted(out["samples"]["local_gen16"], key=lambda s: s["doc_id"])]
               for out in (served, direct)]
    assert answers[0] == answers[1] and any(answers[0]), answers


@torch.no_grad()
def test_a_block_model_through_lm_eval(setup, tmp_path):
    """A block model (docs/method.md §13) in the harness: a one-token choice's log-likelihood is exact (its block
    beside the clean blocks before it: the block-causal forward written here), and generate_until is the block
    decoder's output (in its own blocks, with its cache), cut at the stop strings."""
    tok = setup["tok"]
    model = DiffusionLM(setup["model"].config.replace(block_size=4)).eval()
    model.load_state_dict(setup["model"].state_dict())
    ckpt = tmp_path / "block"
    model.save_pretrained(ckpt, tokenizer=tok)
    out = run_harness(setup, ["local_mc", "local_gen"], f"pretrained={ckpt},mc_num=8,seed=3")
    plain = DiffusionLM(model.config.replace(block_size=None)).eval()  # block-causality only from the mask below
    plain.load_state_dict(model.state_dict())
    for doc, sample in zip(setup["mc"], sorted(out["samples"]["local_mc"], key=lambda s: s["doc_id"])):
        ref = []
        for choice in doc["choices"]:
            ctx, ans = enc(tok, doc["question"]), enc(tok, " " + choice)
            x = torch.tensor(ctx + [model.config.mask_token_id])
            blocks = torch.arange(len(x)) // 4
            mask = (blocks[:, None] >= blocks[None, :])[None, None]  # block-causal, written here
            ref.append(float(torch.log_softmax(plain(x[None], attention_mask=mask).logits[0, -1].double(), -1)[ans[0]]))
        assert [r[0][0] for r in sample["resps"]] == pytest.approx(ref, abs=1e-4)
    for doc, sample in zip(setup["gen"], sorted(out["samples"]["local_gen"], key=lambda s: s["doc_id"])):
        seq = generate(model, enc(tok, doc["prompt"]), gen_length=40, steps=40)  # the whole block (32 >= 4), unpadded
        assert sample["resps"][0][0] == _cut_at_stops(tok, doc["prompt"], seq)
