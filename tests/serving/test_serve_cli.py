"""`sinkdlm serve` as a command: one-line refusals before any work (a non-local host without a key, a port in use,
a model that does not open), and SIGTERM finishing the request in flight before the process exits."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from helpers import free_port, subprocess_env, word_tokenizer  # noqa: E402
from sinkdlm import DiffusionLM, ModelConfig  # noqa: E402
from sinkdlm.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = word_tokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=47, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=160, num_sink_tokens=1)
    directory = tmp_path_factory.mktemp("serve") / "tiny"
    DiffusionLM(cfg).save_pretrained(directory, tokenizer=tok)
    return directory


def _refused(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["serve", *map(str, args)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_refusals_are_one_line_before_any_work(model_dir, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("SINKDLM_API_KEY", raising=False)
    assert "give --api-key" in _refused(capsys, model_dir, "--host", "0.0.0.0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert "choose another --port" in _refused(capsys, tmp_path / "never-read", "--port", taken.getsockname()[1])
    assert "does not exist" in _refused(capsys, tmp_path / "missing", "--port", 0)
    assert "config.json is missing" in _refused(capsys, tmp_path, "--port", 0)
    assert "--max-batch-size must be an integer >= 1" in _refused(capsys, model_dir, "--max-batch-size", 0)


def test_sigterm_finishes_the_request_in_flight(model_dir):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sinkdlm", "serve", str(model_dir), "--port", str(port),
                             "--model-name", "tiny", "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=subprocess_env())
    try:
        assert "serving tiny on http://127.0.0.1" in proc.stdout.readline()
        answer = {}
        body = dict(model="tiny", prompt="w1 w2 w3", max_tokens=64, steps=64)

        def ask():
            answer["r"] = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)

        asker = threading.Thread(target=ask)
        asker.start()
        deadline = time.time() + 60
        while time.time() < deadline:  # until the request is being decoded
            if httpx.get(f"http://127.0.0.1:{port}/health").json()["decoding"]:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        asker.join(120)
        assert answer["r"].status_code == 200, answer["r"].text
        assert answer["r"].json()["usage"]["completion_tokens"] >= 1
        assert proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn ends by the signal it drained for
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
