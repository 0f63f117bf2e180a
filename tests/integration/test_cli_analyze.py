"""`sinkdlm analyze` and `sinkdlm analyze --compare` on tiny checkpoints: analysis.json keys and
values, figures, reports, and user errors as one `error:` line before any work."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import matplotlib.image as mpimg
import pytest
import torch
from typer.testing import CliRunner

import sinkdlm.cli  # noqa: F401  (registers the commands on the app)
from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.analysis import ANALYSIS_KEYS, FIGURES, analyze, compare, non_sink_fraction
from sinkdlm.cli import app, main
from sinkdlm.data import train_bpe_tokenizer
from sinkdlm.config import AnalyzeConfig, SampleConfig

TEXTS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n",
    "And by opposing end them. To die—to sleep,\nNo more; and by a sleep to say we end\n",
]
REQUIRED = ("epsilon", "scale", "non_sink_fraction", "non_sink_fraction_by_epsilon", "sink_token_types",
            "value_norm", "moving", "extra_sink", "ablation", "figures")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tok = train_bpe_tokenizer(TEXTS * 4, 300)
    base = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, sinks in (("vanilla", 0), ("sink", 1)):
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                          initializer_range=0.3, num_sink_tokens=sinks, mask_token_id=tok.mask_token_id)
        DiffusionLM(cfg).save_pretrained(base / name, tokenizer=tok)
        out[name] = base / name
    prompts = base / "prompts.txt"
    prompts.write_text("\n".join(TEXTS) + "\n\n")
    return out, prompts, tok


def invoke(*args):
    result = CliRunner().invoke(app, ["analyze", *map(str, args)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result


def check_png(path):
    assert path.is_file() and path.stat().st_size > 0
    image = mpimg.imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) > 50


@pytest.mark.parametrize("name", [pytest.param("vanilla", marks=pytest.mark.slow), "sink"])  # vanilla: make test-slow
def test_analyze_command_writes_json_figures_and_reports(checkpoints, tmp_path, name):
    dirs, prompts, _ = checkpoints
    out = tmp_path / "out"
    result = invoke("--model", dirs[name], "--prompts", prompts, "--gen-length", 8, "--steps", 4, "--epsilon", 1,
                    "--ablation-k", "1,3", "--mc-num", 2, "--batch-size", 2, "--out", out, "--quiet")
    assert "non-sink fraction at ϵ=1" in result.output and "K=3" in result.output
    a = json.loads((out / "analysis.json").read_text())
    assert set(REQUIRED) <= set(a) and set(ANALYSIS_KEYS) <= set(a)
    assert a["epsilon"] == 1.0 and a["scale"] == "sum" and a["setup"]["num_prompts"] == 6  # one per line
    assert set(a["non_sink_fraction_by_epsilon"]) == {"0", "1", "2", "3", "4", "6", "8", "10"}
    curve = [a["non_sink_fraction_by_epsilon"][e] for e in ("0", "2", "4", "10")]
    assert curve == sorted(curve) and 0 < curve[0] and curve[-1] <= 1  # fewer sinks at a higher ϵ
    assert a["non_sink_fraction"] == a["non_sink_fraction_by_epsilon"]["1"]
    assert set(a["value_norm"]) >= {"sink_mean", "normal_mean"} and a["value_norm"]["normal_mean"] > 0
    assert set(a["sink_token_types"]["counts"]) >= {"mask", "whitespace", "punctuation", "other"}
    assert len(a["moving"]["sink_set_jaccard"]) == 2
    assert a["ablation"]["k"] == [0, 1, 3] and a["ablation"]["delta"]["0"] == 0.0
    if name == "sink":
        assert len(a["extra_sink"]["attention_mass"]) == 2 and a["extra_sink"]["value_norm"][0] > 0
        assert a["sink_token_types"]["counts"]["sink"] >= 0
    else:
        assert a["extra_sink"] is None
    from sinkdlm.analysis.outliers_report import FIGURE as OUTLIERS

    shown = {**FIGURES, "outliers": OUTLIERS}  # the per-layer activation outliers too (docs/method.md)
    assert a["figures"] == shown  # stable names, all six written
    for file in a["figures"].values():
        check_png(out / file)
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "ϵ = 1" in md and "column-**sum**" in md and "Sink-masking ablation" in md
    # the page links each figure beside it (a committed report adds no second copy of its figures)
    assert sorted(re.findall(r'<img src="([^"]+)"', page)) == sorted(shown.values()) and "<table>" in page
    assert "data:image" not in page
    with open(out / "analysis_arrays.npz", "rb") as f:
        assert f.read(2) == b"PK"


def test_analyze_library_figures_match_the_recorded_numbers(checkpoints, tmp_path):
    """analysis.json and the arrays agree with a direct computation on the saved maps."""
    import numpy as np

    from sinkdlm.data import load_tokenizer

    dirs, _, _ = checkpoints
    model, tok = DiffusionLM.from_pretrained(dirs["sink"]), load_tokenizer(dirs["sink"])
    a = analyze(model, tok, TEXTS[:2], AnalyzeConfig(sample=SampleConfig(gen_length=8, steps=4), epsilon=1.0, out=tmp_path,
                                                     quiet=True, figure_steps="1,3", label="tiny+sink"))
    assert a["model"]["label"] == "tiny+sink" and a["ablation"] is None and a["setup"]["steps_taken"] == 4
    with np.load(tmp_path / "analysis_arrays.npz") as z:
        assert z["attention_map_steps"].tolist() == [1, 3]
        maps = torch.from_numpy(z["attention_maps"])
        assert torch.allclose(maps.sum(-1), torch.ones(())) and z["largest_sink_positions"].shape[:2] == (4, 2)
        assert z["sinks_by_epsilon_layer"].shape == (8, 2)
    assert 0.0 <= non_sink_fraction(maps, 1.0)[1.0] <= 1.0


def test_redraw_draws_a_stored_analysis_again_from_its_json_and_arrays(checkpoints, tmp_path):
    """What a study commits of a run's analysis (analysis.json and its arrays) is enough: `redraw` writes the
    same report.md and every figure again, and leaves analysis.json as it was."""
    from sinkdlm.analysis.comparison import redraw
    from sinkdlm.data import load_tokenizer

    dirs, _, _ = checkpoints
    model, tok = DiffusionLM.from_pretrained(dirs["sink"]), load_tokenizer(dirs["sink"])
    analyze(model, tok, TEXTS[:2], AnalyzeConfig(sample=SampleConfig(gen_length=8, steps=4), epsilon=1.0, out=tmp_path,
                                                 quiet=True, label="tiny+sink"))
    written, stored = (tmp_path / "report.md").read_text(), (tmp_path / "analysis.json").read_bytes()
    for path in [*tmp_path.glob("*.png"), *tmp_path.glob("report.*")]:
        path.unlink()
    assert redraw(tmp_path) == tmp_path / "report.md"
    assert (tmp_path / "report.md").read_text() == written and (tmp_path / "analysis.json").read_bytes() == stored
    for file in FIGURES.values():
        check_png(tmp_path / file)
    (tmp_path / "analysis_arrays.npz").unlink()
    with pytest.raises(ValueError, match="analysis_arrays.npz is missing"):
        redraw(tmp_path)


@pytest.mark.slow  # ~38 s (two analyses on the corpus); the CLI --compare parsing: tests/cli/test_cli_robust.py
def test_analyze_from_data_and_compare(checkpoints, tmp_path):
    dirs, _, _ = checkpoints
    for name in dirs:
        invoke("--model", dirs[name], "--data", "shakespeare", "--num-prompts", 2, "--prompt-length", 12,
               "--gen-length", 8, "--steps", 4, "--ablation-k", 1, "--mc-num", 2, "--out", tmp_path / name, "--quiet")
        assert json.loads((tmp_path / name / "analysis.json").read_text())["setup"]["num_prompts"] == 2
    result = invoke("--compare", tmp_path / "vanilla", tmp_path / "sink", "--out", tmp_path / "cmp")
    assert "comparing vanilla, sink" in result.output
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "| quantity | vanilla | sink |" in md and "Sink-masking ablation" in md
    info = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert info["models"] == ["vanilla", "sink"]
    assert {"non_sink_fraction", "sink_mass_layers", "layer_bars", "value_norm_scatter",
            "largest_sink_positions", "attention_maps", "ablation_curve", "outliers"} == set(info["figures"])
    for file in info["figures"].values():
        check_png(tmp_path / "cmp" / file)
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert sorted(re.findall(r'<img src="([^"]+)"', page)) == sorted(info["figures"].values())
    assert "data:image" not in page
    again = compare({"A": tmp_path / "vanilla", "B": tmp_path / "sink"}, tmp_path / "cmp2")
    assert again["models"] == ["A", "B"]


@pytest.mark.parametrize("case", ["epsilon", "scale", "no-weights", "empty-prompts", "k", "compare-missing",
                                  "no-source", "figure-steps"])
def test_bad_input_is_one_error_line_before_any_work(checkpoints, tmp_path, capsys, case):
    dirs, prompts, _ = checkpoints
    out = tmp_path / "out"
    base = ["analyze", "--model", str(dirs["vanilla"]), "--prompts", str(prompts), "--gen-length", "8",
            "--steps", "4", "--out", str(out)]
    if case == "epsilon":
        args, match = base + ["--epsilon", "-1"], "epsilon must be a finite number >= 0"
    elif case == "scale":
        args, match = base + ["--scale", "max"], "unknown scale 'max'"
    elif case == "no-weights":
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "config.json").write_text((dirs["vanilla"] / "config.json").read_text())
        args, match = ["analyze", "--model", str(broken), "--prompts", str(prompts), "--gen-length", "8",
                       "--steps", "4", "--out", str(out)], "model.safetensors is missing"
    elif case == "empty-prompts":
        empty = tmp_path / "empty.txt"
        empty.write_text("\n \n")
        args, match = ["analyze", "--model", str(dirs["vanilla"]), "--prompts", str(empty), "--gen-length", "8",
                       "--steps", "4", "--out", str(out)], "holds no prompt"
    elif case == "k":
        args, match = base + ["--ablation-k", "1,x"], "comma-separated integers"
    elif case == "compare-missing":
        args, match = ["analyze", "--compare", str(tmp_path), str(tmp_path), "--out", str(out)], "analysis.json is missing"
    elif case == "no-source":
        args, match = base[:3] + base[5:], "exactly one of --prompts FILE or --data NAME"
    else:
        args, match = base + ["--figure-steps", "2,9"], "--figure-steps must be"
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and match in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_library_rejects_bad_input_before_writing(checkpoints, tmp_path):
    dirs, _, tok = checkpoints
    model = DiffusionLM.from_pretrained(dirs["vanilla"])
    ok = AnalyzeConfig(sample=SampleConfig(gen_length=8, steps=4), out=tmp_path / "o", quiet=True)
    for prompts, kw, match in [
        ([], {}, "non-empty list"), ("a prompt", {}, "non-empty list"), (["", "x"], {}, "non-empty string"),
        (["x"], {"epsilon": -0.1}, "epsilon"), (["x"], {"scale": "avg"}, "scale"),
        (["x"], {"ablation_k": [1, -2]}, "ablation_k"),
        (["x"], {"sample": SampleConfig(gen_length=200)}, "max_position_embeddings"),
        (["x"], {"sample": None}, "gen-length is required"),
    ]:
        with pytest.raises(ValueError, match=match):
            analyze(model, tok, prompts, dataclasses.replace(ok, **kw))
    with pytest.raises(ValueError, match="callable"):
        analyze(model, tok, ["x"], dataclasses.replace(ok, ablation_k="1"), ablation_task=3)
    with pytest.raises(TypeError, match="AnalyzeConfig"):
        analyze(model, tok, ["x"], ok.sample)
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="at least two"):
        compare([tmp_path], tmp_path / "c")


def test_help_lists_the_analyze_options():
    result = CliRunner().invoke(app, ["analyze", "--help"])
    assert result.exit_code == 0
    for opt in ("--model", "--prompts", "--data", "--epsilon", "--scale", "--ablation-k", "--include-extra-sink",
                "--compare", "--out"):
        assert opt in result.output


@pytest.mark.slow  # ~4 s: a fresh process importing torch; `import sinkdlm` alone: tests/cli/test_cli_robust.py
def test_plain_import_without_matplotlib():
    code = "import sys, sinkdlm.analysis; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
