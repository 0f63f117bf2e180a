"""The typed configs are the one home of every option: docstrings, generated flags, fast `--help`."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sinkdlm.config import (
    MODEL_SWITCHES,
    AnalyzeConfig,
    ConvertConfig,
    EvalConfig,
    ExperimentConfig,
    GenerateConfig,
    MergeConfig,
    ModelConfig,
    TrainConfig,
    field_docs,
)
from sinkdlm.cli.options import config_parameters
from sinkdlm.cli.train_cmd import SFT_OPTIONS

SRC = str(Path(__file__).resolve().parents[2] / "src")
CONFIGS = (ModelConfig, TrainConfig, GenerateConfig, AnalyzeConfig, EvalConfig, ConvertConfig, MergeConfig,
           ExperimentConfig)
# command -> (its config, how the command generates its options)
COMMANDS = {
    "train": (TrainConfig, {"layered": True}),
    "sft": (TrainConfig, {"layered": True, **SFT_OPTIONS}),
    "generate": (GenerateConfig, {"required": ("model",)}),
    "analyze": (AnalyzeConfig, {}),
    "eval": (EvalConfig, {"required": ("model",)}),
    "convert": (ConvertConfig, {}),
    "merge": (MergeConfig, {}),
    "experiment": (ExperimentConfig, {}),
}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_field_has_a_docstring(cls):
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


def test_field_docs_reads_the_string_under_each_declaration():
    @dataclasses.dataclass
    class Example:
        a: int = 1
        """First line
        second line."""
        b: str = "x"
        c: float = 0.5  # no docstring
        """Belongs to c."""

    assert field_docs(Example) == {"a": "First line second line.", "c": "Belongs to c."}


def test_switches_are_the_fields_declared_with_switch():
    declared = [f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("switch")]
    assert [s.name for s in MODEL_SWITCHES] == declared
    assert declared[:2] == ["num_sink_tokens", "sink_position"]
    for s in MODEL_SWITCHES:  # TrainConfig's optional copy and convert's copy come from the same field
        assert getattr(TrainConfig(), s.name) is None
        assert getattr(ConvertConfig(from_hf=Path("a"), out=Path("b")), s.name) == getattr(ModelConfig(), s.name)
        assert s.help == field_docs(ModelConfig)[s.name]
    assert MODEL_SWITCHES[0].minimum == 0 and MODEL_SWITCHES[1].choices == ("front", "end")


def test_every_scalar_train_field_is_a_flag():
    """Issue 20: weight_decay, beta1/2, grad_clip, warmup_frac, eps, eval_batches... were config-file only."""
    names = {p.name for p in config_parameters(TrainConfig, layered=True)}
    config_only = {f.name for f in dataclasses.fields(TrainConfig)} - names
    assert config_only == {"model_overrides", "sft"}  # a mapping, and what `sinkdlm sft` sets
    for name in ("weight_decay", "beta1", "beta2", "grad_clip", "warmup_frac", "eps", "eval_batches", "tensorboard"):
        assert name in names


def _help_blocks(text: str) -> dict[str, str]:
    """{first long flag: its whole help block, whitespace-normalised} from click's plain help."""
    blocks: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^  (--[\w-]+)", line)
        if m:
            current = m.group(1)
            blocks[current] = line
        elif current is not None and line.startswith("   "):
            joined = blocks[current].rstrip()  # click wraps after a hyphen: "--no-" / "resume"
            blocks[current] = joined + line.strip() if re.search(r"\S-$", joined) else joined + " " + line
        else:
            current = None
    return {k: " ".join(v.split()) for k, v in blocks.items()}


def _shown_default(f: dataclasses.Field, flag: str, layered: bool) -> str | None:
    default = f.default if f.default is not dataclasses.MISSING else None
    if default is None:
        return None
    if isinstance(default, bool):  # ours (layered) names the flag; click writes "no-json"
        return (flag if default else "--no-" + flag[2:])[0 if layered else 2:]
    return str(default)


def _best_seconds(argv: list[str], env: dict[str, str], runs: int = 3) -> tuple[float, str]:
    """The best of `runs` wall times of a fresh process (the machine may be busy with other tests), its stdout."""
    times, out = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
        times.append(time.perf_counter() - start)
    return min(times), out


@pytest.fixture(scope="module")
def torch_import_seconds() -> float:
    """The baseline, timed on this machine now: a fresh process that imports torch, what --help must not pay."""
    return _best_seconds([sys.executable, "-c", "import torch"], {**os.environ, "PYTHONPATH": SRC}, runs=2)[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_every_field_with_its_default_fast(command, torch_import_seconds):
    cls, how = COMMANDS[command]
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "80", "TERM": "dumb"}
    seconds, out = _best_seconds([sys.executable, "-m", "sinkdlm", command, "--help"], env)
    # fast: under 0.5 s on a quiet machine (0.18-0.20 s measured), and on a busy one (a study beside the suite:
    # 0.57-0.73 s) still a fraction of importing torch, which slows down as much
    assert seconds < max(0.5, 0.5 * torch_import_seconds), (
        f"`sinkdlm {command} --help` took {seconds:.2f} s; importing torch took {torch_import_seconds:.2f} s")
    blocks = _help_blocks(out)
    params = {p.name: p for p in config_parameters(cls, **how)}
    assert params, command
    for f in dataclasses.fields(cls):
        if f.name not in params:
            continue
        flag = params[f.name].default.param_decls[0].split("/")[0]
        assert flag in blocks, f"{command} --help lacks {flag}"
        doc = " ".join(field_docs(cls)[f.name].split())
        assert doc[:30] in blocks[flag], (flag, blocks[flag])
        shown = "runs/sft" if (command, f.name) == ("sft", "out") else _shown_default(f, flag, how.get("layered", False))
        if f.name in how.get("required", ()) or f.default is dataclasses.MISSING or f.metadata.get("required"):
            assert "[required]" in blocks[flag], (flag, blocks[flag])
        elif shown is not None:
            assert f"[default: {shown}]" in blocks[flag], (flag, blocks[flag])


def test_config_modules_import_no_torch():
    code = "import sinkdlm.config, sinkdlm.cli, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC}, check=True,
                         capture_output=True, text=True).stdout
    assert "torch" not in json.loads(out.splitlines()[-1])


def test_train_flags_reach_the_config(tmp_path, monkeypatch):
    """A flag the user types overrides the --config file; the file overrides the defaults."""
    from typer.testing import CliRunner

    import sinkdlm.cli.train_cmd as train_cmd
    from sinkdlm.cli import app

    seen = {}
    monkeypatch.setattr(train_cmd, "_run", lambda ctx, cfg: seen.setdefault("cfg", cfg))
    (tmp_path / "c.yaml").write_text("beta2: 0.99\nweight_decay: 0.0\nnum_sink_tokens: 1\n")
    result = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "c.yaml"), "--weight-decay", "0.05",
                                      "--grad-clip", "0.5", "--gated-attention"])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert (cfg.beta2, cfg.weight_decay, cfg.grad_clip, cfg.num_sink_tokens, cfg.gated_attention) == (0.99, 0.05, 0.5, 1, True)
    assert (cfg.beta1, cfg.out, cfg.sink_position) == (0.9, "runs/train", None)
    seen.clear()
    result = CliRunner().invoke(app, ["sft", "--model", "m", "--data", "arithmetic"])
    assert result.exit_code == 0, result.output
    assert (seen["cfg"].out, seen["cfg"].init_from, seen["cfg"].sft) == ("runs/sft", "m", True)


def test_experiment_help_names_every_preset():
    from sinkdlm.experiment.presets import PRESETS

    doc = field_docs(ExperimentConfig)["preset"]
    assert sorted(doc.replace(" ", "").split("|")) == sorted(PRESETS)
    for name, recipe in PRESETS.items():  # recipes return typed configs
        preset = recipe()
        assert preset.name == name
        assert isinstance(preset.train, TrainConfig) and isinstance(preset.evaluation, EvalConfig)
        assert isinstance(preset.analysis, AnalyzeConfig) and preset.analysis.settings()["gen_length"] > 0


def test_a_held_config_is_flattened_into_flat_flags():
    """`AnalyzeConfig.sample` (a SampleConfig) is --gen-length/--steps/--block-length on the command line,
    each documented, and the command receives them gathered into a SampleConfig (None without --gen-length)."""
    from sinkdlm.cli.options import build_config
    from sinkdlm.config import SampleConfig

    params = {p.name: p.default for p in config_parameters(AnalyzeConfig)}
    assert "sample" not in params
    for name, flag in (("gen_length", "--gen-length"), ("steps", "--steps"), ("block_length", "--block-length")):
        assert params[name].param_decls[0] == flag and params[name].help and params[name].default is None
    base = {f.name: f.default for f in dataclasses.fields(AnalyzeConfig)
            if f.name != "sample" and f.default is not dataclasses.MISSING}
    built = build_config(AnalyzeConfig, {**base, "gen_length": 8, "steps": None, "block_length": 4})
    assert built.sample == SampleConfig(gen_length=8, block_length=4)
    assert build_config(AnalyzeConfig, {**base, "gen_length": None, "steps": 3, "block_length": None}).sample is None
