"""The HTTP routes of `sinkdlm serve` (FastAPI): `GET /v1/models`, `POST /v1/completions`,
`POST /v1/chat/completions` (the model's chat template, ending at the end of the turn) and `GET /health`.

Every answer other than 200 is OpenAI's error body (`protocol.APIError`): 400 for a bad value or a prompt
over the context, 401 without the API key (checked on every request but /health), 404 for another model or
path, 413 for a body over `--max-body-kb`, 503 with Retry-After when the queue is full, 504 past `--timeout`
(the request's work is dropped, as when its client disconnects). A bad request is answered, never logged
with a traceback; only a server bug is (500). Streaming answers are server-sent events in OpenAI's chunk
format, one chunk each time a choice's finished prefix grows, then `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sinkdlm.config.commands import ServeConfig
from sinkdlm.serving.batcher import Engine, Pending
from sinkdlm.serving.protocol import APIError, Job, chunk, parse_job, response, usage

log = logging.getLogger(__name__)


def create_app(engine: Engine, cfg: ServeConfig, served: str, api_key: str | None) -> FastAPI:
    """The application over a started-on-startup `engine` (stopped, after the requests in flight, on shutdown)."""

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        await asyncio.to_thread(engine.stop)

    app = FastAPI(title="sinkdlm", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = engine

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    app.add_middleware(_Guard, api_key=api_key, max_bytes=cfg.max_body_kb * 1024)

    @app.get("/health")
    async def health():
        return {"status": "ok", "queued": len(engine.pending), "decoding": engine.busy, "batches": engine.batches,
                "rows": engine.rows}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served, "object": "model", "created": 0, "owned_by": "sinkdlm"}]}

    async def complete(request: Request, kind: str):
        body = await request.body()
        if len(body) > cfg.max_body_kb * 1024:  # a chunked body has no content-length to refuse it by
            raise APIError(413, f"the request body is over {cfg.max_body_kb} KiB (--max-body-kb)")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise APIError(400, "the request body is not valid JSON") from None
        job = parse_job(data, kind, engine.model, engine.tokenizer, served, cfg)
        pending = engine.submit(job)
        if job.stream:
            return StreamingResponse(_stream(pending, cfg.timeout), media_type="text/event-stream")
        return await _wait(request, pending, cfg.timeout)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, "text_completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, "chat.completion")

    return app


class _Guard:
    """The API key (every path but /health) and the declared body size, checked before a route runs. A plain ASGI
    middleware: Starlette's `BaseHTTPMiddleware` would hide a client's disconnect from `request.is_disconnected`."""

    def __init__(self, app, api_key: str | None, max_bytes: int):
        self.app, self.api_key, self.max_bytes = app, api_key, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        error = None
        if self.api_key is not None and scope["path"] != "/health":
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
                error = APIError(401, "Incorrect API key provided", code="invalid_api_key")
        size = headers.get(b"content-length")
        if error is None and size is not None and (not size.isdigit() or int(size) > self.max_bytes):
            error = APIError(413, f"the request body is over {self.max_bytes // 1024} KiB (--max-body-kb)")
        if error is None:
            return await self.app(scope, receive, send)
        await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)


def _timeout(seconds: float) -> APIError:
    return APIError(504, f"the request took longer than the server's time limit ({seconds:g} s, --timeout); its "
                         "work was dropped", type="server_error", code="timeout")


async def _wait(request: Request, pending: Pending, seconds: float):
    """A non-streaming answer: the job's "done" event, while watching for the client leaving (which cancels
    the job) and the time limit."""
    async def finished():
        while True:
            event = await pending.events.get()
            if event[0] != "delta":
                return event

    async def left():
        while not await request.is_disconnected():
            await asyncio.sleep(0.1)

    done_task, gone_task = asyncio.ensure_future(finished()), asyncio.ensure_future(left())
    try:
        await asyncio.wait({done_task, gone_task}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone_task.cancel()
    if not done_task.done():
        done_task.cancel()
        pending.cancel()
        if gone_task.done():
            return JSONResponse({}, status_code=499)  # nobody reads it
        raise _timeout(seconds)
    event = done_task.result()
    if event[0] == "error":
        raise event[1]
    _, texts, reasons, used = event
    return response(pending.job, texts, reasons, used)


async def _stream(pending: Pending, seconds: float):
    """Server-sent events: a chunk per delta, each choice's last text and finish reason, the usage chunk
    (with `stream_options.include_usage`), `[DONE]`. Leaving (the generator closed) cancels the job."""
    job: Job = pending.job
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    try:
        while True:
            try:
                event = await asyncio.wait_for(pending.events.get(), timeout=max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                pending.cancel()
                yield _sse(_timeout(seconds).body())
                break
            if event[0] == "delta":
                yield _sse(chunk(job, event[1], event[2]))
                continue
            if event[0] == "error":
                yield _sse(event[1].body())
                break
            _, texts, reasons, used = event
            for j, (text, reason) in enumerate(zip(texts, reasons)):
                rest = text[len(pending.sent[j]):] if text.startswith(pending.sent[j]) else ""
                yield _sse(chunk(job, j, rest or None, reason))
            if job.include_usage:
                yield _sse(chunk(job, None, None, used=usage(job, used)))
            break
        yield "data: [DONE]\n\n"
    finally:
        pending.cancel()  # finished, or the client left: either way nothing more is read


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
