"""`sinkdlm generate` on a tiny checkpoint directory: same tokens as the library, JSON, steps view, errors."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from sinkdlm import DiffusionLM, ModelConfig, generate
from sinkdlm.cli import app, main

from helpers import word_tokenizer

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = ModelConfig(
        vocab_size=47, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, initializer_range=0.3, num_sink_tokens=1,
    )
    torch.manual_seed(0)
    model = DiffusionLM(cfg).eval()
    tok = word_tokenizer()
    assert tok.mask_token_id == cfg.mask_token_id
    directory = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(directory, tokenizer=tok)
    return directory, model, tok


def run(*args: str):
    result = CliRunner().invoke(app, ["generate", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


PROMPT = "w1 w2 w3 w4"


@pytest.mark.parametrize("extra", [[], ["--block-length", "4"], ["--threshold", "0.2", "--block-length", "4"],
                                   ["--block-length", "4", "--cache", "dual"],
                                   ["--threshold", "0.2", "--block-length", "4", "--cache", "prefix"]])
def test_json_output_matches_the_library(checkpoint, extra):
    directory, model, tok = checkpoint
    result = run("--model", str(directory), "--prompt", PROMPT, "--gen-length", "8", "--steps", "8", "--json",
                 "--device", "cpu", *extra)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) == {"text", "tokens", "steps_taken", "seconds"}
    ids = tok(PROMPT)["input_ids"]
    kw = {}
    if "--block-length" in extra:
        kw["block_length"] = 4
    if "--threshold" in extra:
        kw["threshold"] = 0.2
    if "--cache" in extra:
        kw["cache"] = extra[extra.index("--cache") + 1]
    want = generate(model, ids, gen_length=8, steps=8, return_dict=True, **kw)
    assert out["tokens"] == want.sequences[0, len(ids):].tolist()
    assert out["steps_taken"] == want.steps_taken and out["seconds"] > 0
    assert out["text"] == tok.decode(out["tokens"], skip_special_tokens=True)
    if "--threshold" not in extra:
        assert out["steps_taken"] == 8


@pytest.mark.parametrize("extra,kw", [
    (["--schedule", "dream", "--remasking", "topk_margin"], dict(schedule="dream", remasking="topk_margin")),
    (["--schedule", "dream", "--remasking", "entropy", "--eps", "0.01", "--top-k", "5", "--top-p", "0.9"],
     dict(schedule="dream", remasking="entropy", eps=0.01, top_k=5, top_p=0.9)),
    (["--remasking", "maskgit_plus", "--alg-temp", "0.5", "--temperature", "0.8"],
     dict(remasking="maskgit_plus", alg_temp=0.5, temperature=0.8)),
])
def test_dream_sampler_flags_match_the_library(checkpoint, extra, kw):
    directory, model, tok = checkpoint
    result = run("--model", str(directory), "--prompt", PROMPT, "--gen-length", "8", "--steps", "4", "--json",
                 "--device", "cpu", *extra)
    assert result.exit_code == 0, result.output
    ids = tok(PROMPT)["input_ids"]
    want = generate(model, ids, gen_length=8, steps=4, **kw)
    assert json.loads(result.stdout)["tokens"] == want[0, len(ids):].tolist()


def test_plain_text_and_prompt_file(checkpoint, tmp_path):
    directory, model, tok = checkpoint
    (tmp_path / "p.txt").write_text(PROMPT)
    a = run("--model", str(directory), "--prompt-file", str(tmp_path / "p.txt"), "--gen-length", "8", "--steps", "4")
    b = run("--model", str(directory), "--prompt", PROMPT, "--gen-length", "8", "--steps", "4")
    assert a.exit_code == b.exit_code == 0
    assert a.stdout == b.stdout
    want = generate(model, tok(PROMPT)["input_ids"], gen_length=8, steps=4)[0, 4:].tolist()
    assert a.stdout.strip() == tok.decode(want, skip_special_tokens=True)


def test_show_steps_prints_the_text_filling_in(checkpoint):
    directory, *_ = checkpoint
    result = run("--model", str(directory), "--prompt", PROMPT, "--gen-length", "8", "--steps", "4", "--show-steps")
    assert result.exit_code == 0
    lines = result.stdout.strip().splitlines()
    steps = [ln for ln in lines if ln.startswith("[step")]
    assert len(steps) == 4 and len(lines) == 5
    blanks = [ln.count("_") for ln in steps]
    assert blanks == [6, 4, 2, 0]  # 8 tokens over 4 steps: 2 committed per step
    # With --json the steps go to stderr and stdout stays one JSON object.
    js = run("--model", str(directory), "--prompt", PROMPT, "--gen-length", "8", "--steps", "4", "--show-steps", "--json")
    assert json.loads(js.stdout)["steps_taken"] == 4
    assert js.stderr.count("[step") == 4


@pytest.mark.parametrize(
    "args,match",
    [
        (["--gen-length", "10", "--steps", "10", "--block-length", "4"], "--gen-length=10 is not divisible by --block-length=4"),
        (["--gen-length", "8", "--steps", "1", "--block-length", "4"], "fewer than the number of blocks"),
        (["--gen-length", "8"], "--steps is required"),
        (["--gen-length", "80", "--steps", "80"], "--gen-length (80)"),
        (["--gen-length", "8", "--steps", "8", "--dtype", "int8"], "is not one of float32, bfloat16, float16"),
        (["--gen-length", "8", "--steps", "8", "--cache", "full"], "--cache must be prefix or dual, got 'full'"),
        (["--gen-length", "8", "--steps", "8", "--cache", "dual"], "pass a --block-length"),
        (["--gen-length", "8", "--steps", "8", "--remasking", "conf"], "low_confidence, random, maskgit_plus, topk_margin"),
        (["--gen-length", "8", "--steps", "8", "--schedule", "cosine"], "must be one of llada, dream"),
        (["--gen-length", "8", "--steps", "8", "--top-p", "1.5"], "must lie in (0, 1]"),
    ],
)
def test_user_errors_exit_2_with_a_message(checkpoint, capsys, args, match):
    directory, *_ = checkpoint
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", str(directory), "--prompt", PROMPT, *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and match in err


def test_prompt_options_are_exclusive(checkpoint, capsys, tmp_path):
    directory, *_ = checkpoint
    for args in ([], ["--prompt", "w1", "--prompt-file", str(tmp_path / "x")]):
        with pytest.raises(SystemExit) as exc:
            main(["generate", "--model", str(directory), "--gen-length", "4", "--steps", "4", *args])
        assert exc.value.code == 2 and "exactly one of --prompt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--model", str(directory), "--prompt-file", str(tmp_path / "none"), "--gen-length", "4",
              "--steps", "4"])
    assert "does not exist" in capsys.readouterr().err


def test_help_lists_the_options():
    result = CliRunner().invoke(app, ["generate", "--help"])
    for opt in ("--model", "--prompt", "--prompt-file", "--gen-length", "--steps", "--block-length",
                "--temperature", "--threshold", "--cache", "--json", "--show-steps"):
        assert opt in result.stdout


def test_a_prompt_file_is_batched_and_each_prompt_gets_its_tokens_alone(checkpoint, tmp_path, capsys):
    """--prompt-file with several prompts (lines, or .jsonl) decodes them in batches of --batch-size, sampled with a
    seed; each answer is the one --prompt gives that prompt alone (the reference). float64 weights, stored so,
    so the batch's padded shapes cannot round a near-tie the other way."""
    _, model, tok = checkpoint
    directory = tmp_path / "f64"
    model.double().save_pretrained(directory, tokenizer=tok)
    model.float()
    prompts = ["w1 w2 w3 w4 w5 w6", "w7", "w2 w9 w4", "w5 w5"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n\n")  # a blank line is no prompt
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    kw = ["--gen-length", "8", "--steps", "8", "--block-length", "4", "--temperature", "0.9", "--seed", "3",
          "--model", str(directory), "--json"]
    alone = []
    for p in prompts:
        result = run("--prompt", p, *kw)
        assert result.exit_code == 0, result.output
        alone.append(json.loads(result.stdout)["tokens"])
    assert len({tuple(t) for t in alone}) > 1
    for name, batch_size in (("p.txt", "3"), ("p.jsonl", "8")):
        result = run("--prompt-file", str(tmp_path / name), "--batch-size", batch_size, *kw)
        assert result.exit_code == 0, result.output
        assert [json.loads(line)["tokens"] for line in result.stdout.splitlines()] == alone, name
    plain = run("--prompt-file", str(tmp_path / "p.txt"), *kw[:-1])
    assert len(plain.stdout.splitlines()) == len(prompts)  # one answer a line
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--prompt-file", str(tmp_path / "p.txt"), "--batch-size", "0", *kw])
    assert exc.value.code == 2 and "--batch-size must be an integer >= 1" in capsys.readouterr().err
