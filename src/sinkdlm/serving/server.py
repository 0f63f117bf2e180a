"""`serve(ServeConfig)`: every check before any work, then the model, then uvicorn until SIGTERM or Ctrl-C.

Refused in one line before a weight is read: a non-local `--host` without an API key (`--api-key` or
SINKDLM_API_KEY), a port in use (the socket is bound first and handed to uvicorn, so no other process can
take it in between), a bad limit; then a model that does not open. On SIGTERM uvicorn stops accepting,
waits for the requests in flight (up to `--timeout`), and the engine decodes what is queued before the
process exits.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

from sinkdlm.config.checks import check_int
from sinkdlm.config.commands import ServeConfig

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
API_KEY_ENV = "SINKDLM_API_KEY"


def check_serve_config(cfg: ServeConfig) -> tuple[ServeConfig, str | None]:
    """The settings' own checks, and the API key (the flag's, else the environment's)."""
    api_key = cfg.api_key if cfg.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if cfg.host not in LOCAL_HOSTS and not api_key:
        raise ValueError(f"--host {cfg.host} serves other machines: give --api-key KEY (or set {API_KEY_ENV}), "
                         "which every request must then send")
    if api_key is not None and not api_key.strip():
        raise ValueError("--api-key is empty; give a key, or leave it out on 127.0.0.1")
    check_int("--port", cfg.port, 0, 65535)
    for flag, value in (("--max-batch-size", cfg.max_batch_size), ("--max-queue", cfg.max_queue),
                        ("--max-tokens", cfg.max_tokens), ("--max-body-kb", cfg.max_body_kb)):
        check_int(flag, value, 1)
    check_int("--default-max-tokens", cfg.default_max_tokens, 1, cfg.max_tokens)
    for flag, value in (("--batch-window-ms", cfg.batch_window_ms), ("--timeout", cfg.timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
            raise ValueError(f"{flag} must be a number of {'milliseconds' if 'ms' in flag else 'seconds'} >= 0, "
                             f"got {value!r}")
    if cfg.timeout <= 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {cfg.timeout!r}")
    return cfg, api_key


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), or a one-line error when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror or e}); is another server using it? "
                         "choose another --port") from None
    sock.listen(2048)
    return sock


def build_server(model, tokenizer, cfg: ServeConfig, api_key: str | None, served: str):
    """The uvicorn server of `model` (not yet running); `server.run(sockets=[bind(...)])` runs it."""
    import uvicorn

    from sinkdlm.serving.app import create_app
    from sinkdlm.serving.batcher import Engine

    app = create_app(Engine(model, tokenizer, cfg), cfg, served, api_key)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=int(cfg.timeout) + 1)
    return uvicorn.Server(config)


def serve(cfg: ServeConfig) -> None:
    """`sinkdlm serve`: checks, the socket, the model, then serve until SIGTERM or Ctrl-C (see the module docstring)."""
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer

    cfg, api_key = check_serve_config(cfg)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ValueError(f"sinkdlm serve needs FastAPI and uvicorn ({e.name} is missing): "
                         "pip install 'sinkdlm[serve]'") from None
    sock = bind(cfg.host, cfg.port)
    try:
        model, tokenizer = load_model_and_tokenizer(cfg.model, device=cfg.device, dtype=cfg.dtype,
                                                    quantize=cfg.quantize)
        served = cfg.model_name or Path(cfg.model).name
        host, port = sock.getsockname()[:2]
        print(f"serving {served} on http://{cfg.host if cfg.port else host}:{port}/v1 "
              f"(batches of at most {cfg.max_batch_size} rows; Ctrl-C or SIGTERM stops it)", flush=True)
        build_server(model.eval(), tokenizer, dataclasses.replace(cfg, api_key=None), api_key, served).run(sockets=[sock])
    finally:
        sock.close()
