"""`sinkdlm serve`: an OpenAI-compatible HTTP server over any model the other commands open.

  * `protocol.py`: a request body -> a checked `Job` (the OpenAI fields and the DLM's own, checked by the
    code that checks `generate`'s flags), the OpenAI error format, and the response bodies and chunks;
  * `batcher.py`: the batching engine: concurrent jobs with equal settings decoded in one `generate` call
    (a short window, a maximum batch), each row with its own random stream, so a request's tokens never
    depend on its batch-mates; streaming deltas, cancellation, time limits, draining;
  * `app.py`: the FastAPI routes (`/v1/models`, `/v1/completions`, `/v1/chat/completions`, `/health`);
  * `server.py`: `serve(ServeConfig)`: the checks before any work, the model, uvicorn.
It sits above `checkpoint/` and `diffusion/`; `cli/serve_cmd.py` only parses and calls `serve`.
"""
