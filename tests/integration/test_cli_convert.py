"""`sinkdlm convert --from-hf DIR --out DIR`: the CLI only parses arguments and calls
`convert_hf_checkpoint`; the result must be the same model `transformers` runs (causal parity),
and user errors must come out as one `error: ...` line with exit code 2.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from typer.testing import CliRunner

import sinkdlm.cli  # noqa: F401  (registers the commands on the app)
from sinkdlm import CheckpointError, DiffusionLM
from sinkdlm.cli import app, main

from numerics import assert_model_close

VOCAB = 96


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, attn_implementation="eager",
    )
    model = Qwen2ForCausalLM(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    path = tmp_path_factory.mktemp("hf")
    model.save_pretrained(str(path))
    return path, model.eval()


def test_convert_command_writes_a_checkpoint_with_hf_parity(hf_dir, tmp_path):
    src, hf = hf_dir
    out = tmp_path / "dlm"
    result = CliRunner().invoke(app, ["convert", "--from-hf", str(src), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output and f"mask_token_id {VOCAB}" in result.output
    # the checkpoint, and --out's record of what convert wrote (sinkdlm.io.out_dir)
    assert sorted(p.name for p in out.iterdir()) == [".sinkdlm-out.json", "config.json", "model.safetensors"]
    ours = DiffusionLM.from_pretrained(out)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_model_close(ours(ids, causal=True).logits[..., :VOCAB], hf(ids).logits, ours.config)  # transformers'


def test_convert_command_passes_the_switches(hf_dir, tmp_path):
    src, _ = hf_dir
    out = tmp_path / "dlm"
    args = [
        "convert", "--from-hf", str(src), "--out", str(out), "--num-sink-tokens", "2",
        "--sink-position", "end", "--sink-zero-value", "--gated-attention", "--seed", "5",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "2 sink token(s) (end)" in result.output
    cfg = DiffusionLM.from_pretrained(out).config
    assert (cfg.num_sink_tokens, cfg.sink_position, cfg.sink_zero_value, cfg.gated_attention) == (2, "end", True, True)


def test_convert_help_lists_the_options():
    result = CliRunner().invoke(app, ["convert", "--help"])
    assert result.exit_code == 0
    for opt in ("--from-hf", "--out", "--num-sink-tokens", "--sink-position", "--gated-attention"):
        assert opt in result.output


def test_library_error_reaches_the_app_as_checkpoint_error(tmp_path):
    result = CliRunner().invoke(app, ["convert", "--from-hf", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert result.exit_code != 0
    assert isinstance(result.exception, CheckpointError)


@pytest.mark.parametrize("case", ["missing", "no-config", "bad-switch"])
def test_main_prints_one_error_line_and_exits_2(hf_dir, tmp_path, capsys, case):
    src, _ = hf_dir
    if case == "missing":
        args, match = ["--from-hf", str(tmp_path / "nope")], "does not exist"
    elif case == "no-config":
        (tmp_path / "empty").mkdir()
        args, match = ["--from-hf", str(tmp_path / "empty")], "config.json is missing"
    else:
        args, match = ["--from-hf", str(src), "--num-sink-tokens", "1", "--sink-position", "middle"], "error: --sink-position must be one of"
    with pytest.raises(SystemExit) as exc:
        main(["convert", *args, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and match in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
