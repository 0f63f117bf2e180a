"""The command line's robustness: fast import, one device resolver, CLI-spelled errors, named data errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sinkdlm.config import ModelConfig
from sinkdlm.data.corpus import load_documents
from sinkdlm.config.fields import check_device
from sinkdlm.model.loader import resolve_device
from sinkdlm.config.checks import check_epsilon, check_int, check_optional_int, cli_message

SRC = str(Path(__file__).resolve().parents[2] / "src")
HEAVY = ("transformers", "datasets", "matplotlib", "lm_eval")


def _fresh_modules(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", code + "; import sys, json; print(json.dumps(sorted(sys.modules)))"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_cli_does_not_import_heavy_libraries():
    loaded = _fresh_modules("import sinkdlm.cli")
    assert not [m for m in HEAVY if m in loaded], "heavy imports on the --help path"
    assert "torch" not in loaded  # --help must not be slower than importing torch


def test_top_level_names_are_lazy_and_register_hf():
    loaded = _fresh_modules("import sinkdlm")
    assert not [m for m in (*HEAVY, "torch") if m in loaded]
    # Looking up the model registers the Auto classes, as `import sinkdlm` documented before.
    code = ("from sinkdlm import DiffusionLM; from transformers import AutoConfig; "
            "assert AutoConfig.for_model('sinkdlm').model_type == 'sinkdlm'")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC}, check=True)


def test_help_shows_full_option_names():
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "80", "TERM": "dumb"}
    out = subprocess.run([sys.executable, "-m", "sinkdlm", "train", "--help"], env=env, check=True,
                         capture_output=True, text=True).stdout
    for flag in ("--attention-anneal-steps", "--num-sink-tokens", "--cache-dir", "--text-field"):
        assert flag in out, flag
    assert "…" not in out
    # train's options default to None (config-file layering); --help shows what they resolve to
    flat = " ".join(out.split())  # every field and default: tests/config/test_config.py
    assert "Global batch in sequences per optimizer step. [default: 16]" in flat and "[default: --no-resume]" in flat
    assert "[default: 128]" in flat.split("--seq-len", 1)[1].split("--", 1)[0]


# ----------------------------------------------------------------------------- device
def test_resolve_device():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == want and resolve_device("auto").type == want
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    for bad in ("gpu", "cuda:x", "auto:0", ""):
        with pytest.raises(ValueError, match="--device must be one of auto"):
            check_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available on this machine; use --device cpu or auto"):
            resolve_device("cuda:0")


# ----------------------------------------------------------------------------- one home
def test_max_content_length_is_positions_minus_sinks():
    cfg = ModelConfig(max_position_embeddings=1024, num_sink_tokens=4)
    assert cfg.max_content_length == 1020
    assert "1020 (max_position_embeddings=1024 minus 4 sink tokens)" == cfg.content_length_note()
    assert ModelConfig(max_position_embeddings=64).max_content_length == 64


def test_validators():
    assert check_int("n", 3) == 3 and check_optional_int("limit", None, none_means="all") is None
    for bad in (0, True, 1.5, "2"):
        with pytest.raises(ValueError, match=r"n must be an integer >= 1, got"):
            check_int("n", bad)
    with pytest.raises(ValueError, match=r"or left unset: all items"):
        check_optional_int("limit", 0, none_means="all items")
    assert check_epsilon("3") == 3.0
    for bad in (-1, float("nan"), "x"):
        with pytest.raises(ValueError, match="epsilon must be"):
            check_epsilon(bad)


def test_cli_message_uses_flag_names():
    flags = ["--seq-len", "--steps", "--text-field", "--gen-length"]
    msg = cli_message("seq_len=2048 is too long; lower seq_len. steps must be >= 1, got None; "
                      "denoising steps; text_field 'x'; max_seq_len=3", flags)
    assert msg == ("--seq-len=2048 is too long; lower --seq-len. --steps must be >= 1, got nothing; "
                   "denoising steps; --text-field 'x'; max_seq_len=3")


def test_cli_message_names_the_flag_of_a_value_opening_the_message():
    flags = ["--dtype", "--preset", "--tasks", "--steps"]
    assert cli_message("dtype 'x' is not a dtype", flags) == "--dtype 'x' is not a dtype"
    assert cli_message("unknown model preset 'x'; choose", flags) == "unknown model preset 'x' (--preset); choose"
    assert cli_message("unknown task '5'; known", flags) == "unknown task '5' (--tasks); known"
    assert cli_message("denoising steps 'x' here", flags) == "denoising steps 'x' here"  # prose stays


def test_seed_range():
    from sinkdlm.config.checks import SEED_MAX, check_seed

    assert check_seed(0) == 0 and check_seed(SEED_MAX) == SEED_MAX
    for bad in (-1, SEED_MAX + 1, 10**20, True, "1"):
        with pytest.raises(ValueError, match=r"--seed must be an integer in \[0, 4294967295\]"):
            check_seed(bad, "--seed")


# ----------------------------------------------------------------------------- data errors
@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_non_utf8_file_is_named(tmp_path, suffix):
    path = tmp_path / f"latin{suffix}"
    body = "caf\xe9 au lait\n\nsecond paragraph\n" if suffix == ".txt" else '{"text": "caf\xe9"}\n'
    path.write_bytes(body.encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{path.name} is not UTF-8 text .*must be UTF-8"):
        load_documents(str(path), "train")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cache_dir_is_one_line(tmp_path):
    from sinkdlm.io.files import ensure_writable_dir

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(ValueError, match=r"--cache-dir .*ro is not writable .*choose another directory"):
        ensure_writable_dir(ro / "cache", flag="--cache-dir")


def test_unwritable_cache_dir_stops_training_before_work(tmp_path, capsys):
    """A --cache-dir under a regular file cannot be created (fails for root too): one error line."""
    from sinkdlm.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--preset", "tiny", "--data", "shakespeare", "--out", str(tmp_path / "run"),
              "--max-steps", "1", "--cache-dir", str(blocker / "cache")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --cache-dir ") and "is not writable" in err and len(err.strip().splitlines()) == 1


def test_generate_device_auto_and_surplus_steps_note(tmp_path):
    from typer.testing import CliRunner

    from sinkdlm.cli.app import app
    from helpers import word_tokenizer

    cfg_kw = dict(vocab_size=47, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64, max_position_embeddings=64, num_sink_tokens=1)
    model = ModelConfig(**cfg_kw)
    from sinkdlm.model.transformer import DiffusionLM

    torch.manual_seed(0)
    DiffusionLM(model).save_pretrained(tmp_path, tokenizer=word_tokenizer())
    result = CliRunner().invoke(app, ["generate", "--model", str(tmp_path), "--prompt", "w1 w2", "--gen-length", "4",
                                      "--steps", "6", "--device", "auto", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["tokens"]) == 4 and out["steps_taken"] == 4  # one token per step at most
    assert "note: --steps 6 > --gen-length 4" in result.stderr  # explained, not silently changed


# ----------------------------------------------------------------------------- first-run messages
def test_packing_says_what_it_does_once(tmp_path, capsys):
    from sinkdlm.data import train_bpe_tokenizer
    from sinkdlm.data.packing import pack_corpus

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"paragraph {i} " + "word " * 40 for i in range(20)))
    tok = train_bpe_tokenizer(["word paragraph " * 50], 300)
    path = pack_corpus(str(corpus), tok, 16, "train", cache_dir=tmp_path / "cache")
    out = capsys.readouterr().err  # progress goes to stderr
    assert "[sinkdlm] packing the train split of" in out and "16-token rows" in out
    rows = np.load(path).shape[0]
    assert f"packed {rows} rows ({rows * 16} tokens)" in out
    pack_corpus(str(corpus), tok, 16, "train", cache_dir=tmp_path / "cache")
    assert "packing" not in capsys.readouterr().err  # cached: nothing to say


def test_sft_truncation_names_the_flag():
    from sinkdlm.data import train_bpe_tokenizer
    from sinkdlm.data.sft import tokenize_sft

    tok = train_bpe_tokenizer(["question answer " * 50], 300)
    with pytest.warns(UserWarning, match="raise --seq-len"):
        tokenize_sft([{"prompt": "question", "response": "answer " * 30}], tok, 12)


def test_missing_tensorboard_is_said(tmp_path, monkeypatch, capsys):
    from sinkdlm.training.trainer import MetricsLog

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    log = MetricsLog(tmp_path, 0, True, True)
    assert log.writer is None
    assert "TensorBoard is not installed" in capsys.readouterr().err


def test_prompts_jsonl_errors_name_the_flag_the_file_and_the_line(tmp_path):
    """`analyze --prompts FILE.jsonl` (read before the model, torch-free): one object per line with "prompt" or
    "text"; a line that is not JSON, or that lacks the field, is one line naming --prompts, the file and the line."""
    import re
    import subprocess
    import sys

    from sinkdlm.cli.analyze_cmd import read_prompts

    good = tmp_path / "p.jsonl"
    good.write_text('{"prompt": "To be"}\n\n{"text": "or not"}\n')
    assert read_prompts(good) == ["To be", "or not"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=rf"^--prompts {re.escape(str(bad))}:2 is not valid JSON"):
        read_prompts(bad)
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"prompt": "a"}\n["a list"]\n')
    with pytest.raises(ValueError, match=rf'^--prompts {re.escape(str(nofield))}:2 needs a string field "prompt" or "text"'):
        read_prompts(nofield)
    code = "import sys, sinkdlm.cli.analyze_cmd, sinkdlm.io.jsonl; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.mark.parametrize("given, parsed", [
    (["--compare", "a", "b", "c", "--out", "o"], ["--compare", "a", "--compare", "b", "--compare", "c", "--out", "o"]),
    (["--out", "o", "--compare", "a", "b"], ["--out", "o", "--compare", "a", "--compare", "b"]),
    (["--compare", "a", "--compare", "b", "--quiet"], ["--compare", "a", "--compare", "b", "--quiet"]),
])
def test_an_option_of_several_values_is_typed_once_with_them_all(given, parsed):
    """`analyze --compare A B C`: three directories, as click reads a repeated option; the other options untouched."""
    from sinkdlm.cli.app import _spread_values

    assert _spread_values(["analyze", *given]) == ["analyze", *parsed]


def test_compare_takes_three_directories_and_refuses_one(tmp_path, capsys):
    """Each of three --compare directories is read (the third, missing its analysis.json, is named); one is refused."""
    from sinkdlm.cli import main

    dirs = [tmp_path / name for name in ("ar", "block", "whole")]
    for d in dirs:
        d.mkdir()
    for argv, words in ((["--compare", *map(str, dirs)], "analysis.json is missing"),
                        (["--compare", str(dirs[0])], "--compare needs two or more directories, got one")):
        with pytest.raises(SystemExit) as exc:
            main(["analyze", *argv, "--out", str(tmp_path / "cmp")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err
