"""The version floors: sinkdlm.versions.FLOORS agrees with pyproject.toml, and an installed release
older than a floor is one line naming the version needed (library and command line), never a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sinkdlm import versions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from floor_requirements import floor_pins  # noqa: E402


def test_floors_are_pyprojects():
    declared = dict(pin.split("==") for pin in floor_pins())
    assert {name: declared[name] for name in versions.FLOORS} == versions.FLOORS


def test_release_numbers():
    assert versions._release("2.13.0+cpu") == (2, 13, 0)
    assert versions._release("4.46.0.dev0") == (4, 46, 0)
    assert versions._release("2.5.1") < versions._release("2.6") <= versions._release("2.6.0")


def _installed(monkeypatch, **fake):
    real = versions.metadata.version
    monkeypatch.setattr(versions.metadata, "version", lambda name: fake.get(name) or real(name))


def test_current_environment_passes():
    assert versions.too_old() == []
    versions.check_versions()


def test_an_old_torch_is_one_line_naming_the_floor(monkeypatch, capsys):
    _installed(monkeypatch, torch="2.5.1", transformers="4.45.2")
    with pytest.raises(ImportError) as e:
        versions.check_versions()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == ("sinkdlm needs newer dependencies (torch 2.5.1 < 2.6, transformers 4.45.2 < 4.46): "
                   "pip install -U 'torch>=2.6' 'transformers>=4.46'")
    from sinkdlm.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "m", "--prompt", "p"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: {msg}"


def test_fsdp_on_a_torch_without_its_checkpoint_writer_is_one_line(monkeypatch):
    """torch 2.6-2.7 (inside the floor) has FSDP2 but not the writer of --fsdp's sharded checkpoints."""
    import torch.distributed.checkpoint as dcp

    from sinkdlm.training.distributed import check_launch

    monkeypatch.delattr(dcp, "HuggingFaceStorageWriter", raising=False)
    with pytest.raises(ValueError, match=r"^--fsdp needs torch>=2.8 .*pip install -U 'torch>=2.8', or drop --fsdp$"):
        check_launch(True)
    check_launch(False)  # without --fsdp nothing is asked of torch
