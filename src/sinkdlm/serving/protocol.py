"""The OpenAI API's side of the server: a JSON body -> a checked `Job`, the error format, the response bodies.

A body holds OpenAI's fields (`max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`, `stream`, `n`, and
`prompt` or `messages`) and, as extra fields under the command line's names, the DLM's own (`steps`,
`block_length`, `remasking`, `schedule`, `threshold`, `cache`, `alg_temp`, `eps`). They become one `SampleConfig`
checked by the code that checks `sinkdlm generate`'s flags (`check_sample_settings`, `check_rule`), so a value
the command line refuses is a 400 here with the same sentence. Every error is `APIError`, answered in OpenAI's
format `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from dataclasses import dataclass, field

from sinkdlm.config.checks import SEED_MAX, check_int, check_sample_settings, check_seed
from sinkdlm.config.commands import SampleConfig, ServeConfig
from sinkdlm.diffusion.remasking import check_rule, resolve_rule

DLM_FIELDS = ("steps", "block_length", "remasking", "schedule", "threshold", "cache", "alg_temp", "eps")
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")
# Fields clients send that change nothing here when they hold these values (anything else is refused)
NEUTRAL = {"user": None, "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None,
           "logprobs": None, "echo": False, "best_of": 1, "suffix": None, "response_format": None}


class APIError(Exception):
    """An answer other than 200, in OpenAI's error format. `headers`: e.g. Retry-After of a 503."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Job:
    """One request: its rows (prompts x n, each with its seed) and the settings they are decoded with.

    `key`: what a batch-mate must share (every setting but the seed); `stops`: the ids that end the text;
    `stop`: the stop strings; `prompts`: how many distinct prompts (for usage)."""

    kind: str  # "text_completion" | "chat.completion"
    model: str
    settings: SampleConfig
    rows: list[list[int]]  # the token ids of each row's prompt
    seeds: list[int]
    stops: tuple[int, ...]
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    prompt_tokens: int
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def key(self) -> tuple:
        return tuple(sorted((k, v) for k, v in dataclasses.asdict(self.settings).items() if k != "seed"))


def _messages_text(messages) -> list[dict]:
    """`messages` as the chat template takes them: {"role", "content"} with text content (OpenAI's list of
    `{"type": "text", "text": ...}` parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {\"role\", \"content\"} objects", param="messages")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"each message needs a string \"role\", got {m!r}"[:300], param="messages")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise APIError(400, "message content parts must be {\"type\": \"text\", \"text\": ...}", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"a message's content must be a string, got {content!r}"[:300], param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def _prompts(body: dict, tokenizer) -> list[list[int]]:
    """`prompt`: a string, a list of strings, a list of token ids or a list of such lists."""
    from sinkdlm.diffusion.text import encode_prompt

    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise APIError(400, "prompt must be a string, a list of strings or of token ids", param="prompt")
    rows = []
    for p in prompt:
        if isinstance(p, str):
            rows.append(encode_prompt(tokenizer, p, chat=False) if p else [])
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            rows.append(list(p))
        else:
            raise APIError(400, "prompt must be a string, a list of strings or of token ids", param="prompt")
    return rows


def parse_job(body, kind: str, model, tokenizer, served: str, cfg: ServeConfig) -> Job:
    """Every check of a request, before it is queued: a 400 (404 for another model) that names the field."""
    from sinkdlm.diffusion.text import encode_prompt, stop_token_ids

    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    if body.get("model") != served:
        raise APIError(404, f"The model {body.get('model')!r} does not exist; this server serves {served!r}",
                       param="model", code="model_not_found")
    text_field = "prompt" if kind == "text_completion" else "messages"
    known = {"model", text_field, "max_tokens", "max_completion_tokens", "seed", "stop", "stream", "stream_options", "n",
             *SAMPLING_FIELDS, *DLM_FIELDS}
    for name, value in body.items():
        if name not in known and not (name in NEUTRAL and value in (NEUTRAL[name], None)):
            raise APIError(400, f"Unrecognized request argument supplied: {name}", param=name)
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage"}):
        raise APIError(400, "stream_options may hold only include_usage", param="stream_options")
    causal = bool(model.config.causal)
    if kind == "chat.completion":
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, f"{served} has no chat template; use /v1/completions", param="messages")
        rows = [encode_prompt(tokenizer, _messages_text(body.get("messages")), chat=True)]
    else:
        rows = _prompts(body, tokenizer)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    max_tokens = cfg.default_max_tokens if max_tokens is None else max_tokens
    n = body.get("n", 1)
    seed = body.get("seed")
    try:
        check_int("max_tokens", max_tokens, 1)
        if max_tokens > cfg.max_tokens:
            raise ValueError(f"max_tokens must be at most {cfg.max_tokens} (the server's --max-tokens), got {max_tokens}")
        check_int("n", n, 1)
        if n * len(rows) > cfg.max_batch_size:
            raise ValueError(f"n x prompts = {n * len(rows)} rows; this server decodes at most {cfg.max_batch_size} "
                             "together (--max-batch-size)")
        seed = secrets.randbelow(SEED_MAX - n) if seed is None else check_seed(seed)
        given = {k: body[k] for k in (*SAMPLING_FIELDS, *DLM_FIELDS) if body.get(k) is not None}
        if not causal and given.get("steps") is None and given.get("threshold") is None:
            given["steps"] = max_tokens  # one token per step (LLaDA's best setting), as `sinkdlm chat`
        block_model = model.config.block_size is not None  # max_tokens bounds it: it stops at its end-of-text
        settings = SampleConfig(gen_length=max_tokens, max_new_tokens=max_tokens if block_model else None, seed=0,
                                **given)
        check_sample_settings(settings, autoregressive=causal, block_model=block_model,
                              block_size=model.config.block_size)
        if not causal:
            schedule, remasking = resolve_rule(model.config.family, settings.schedule, settings.remasking,
                                               settings.threshold)
            check_rule(schedule, remasking, threshold=settings.threshold, temperature=settings.temperature,
                       alg_temp=settings.alg_temp, top_p=settings.top_p, top_k=settings.top_k, eps=settings.eps)
    except (ValueError, TypeError) as e:  # the command line's checks: their sentence, in the API's names
        raise APIError(400, str(e).replace("gen_length", "max_tokens")) from None
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise APIError(400, "stop must be a non-empty string or a list of at most 4 of them", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"stream must be true or false, got {stream!r}", param="stream")
    for ids in rows:
        if not ids:
            raise APIError(400, "a prompt encodes to no tokens; give a non-empty prompt", param=text_field)
        if len(ids) + max_tokens > model.config.max_content_length or max(ids) >= model.config.vocab_size or min(ids) < 0:
            raise APIError(400, f"This model's maximum context length is {model.config.max_content_length} tokens; "
                                f"the prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) do not fit, or a token id "
                                "is outside the vocabulary", param=text_field, code="context_length_exceeded")
    stops = stop_token_ids(tokenizer, kind == "chat.completion")
    if causal and stops:
        settings = dataclasses.replace(settings, stop_token_ids=stops)
    return Job(kind=kind, model=served, settings=settings, rows=[r for r in rows for _ in range(n)],
               seeds=[seed + j for _ in rows for j in range(n)], stops=stops, stop=tuple(stop), stream=stream,
               include_usage=bool((opts or {}).get("include_usage")), prompt_tokens=sum(map(len, rows)))


def response(job: Job, texts: list[str], reasons: list[str], completion_tokens: int) -> dict:
    """The whole answer of a non-streaming request."""
    if job.kind == "chat.completion":
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": r, "logprobs": None}
                   for i, (t, r) in enumerate(zip(texts, reasons))]
    else:
        choices = [{"index": i, "text": t, "finish_reason": r, "logprobs": None}
                   for i, (t, r) in enumerate(zip(texts, reasons))]
    return {"id": f"{'chatcmpl' if job.kind == 'chat.completion' else 'cmpl'}-{job.id}", "object": job.kind,
            "created": job.created, "model": job.model, "choices": choices, "usage": usage(job, completion_tokens)}


def usage(job: Job, completion_tokens: int) -> dict:
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": job.prompt_tokens + completion_tokens}


def chunk(job: Job, index: int | None, text: str | None, reason: str | None = None, used: dict | None = None) -> dict:
    """One SSE chunk: a text delta of choice `index` (with its finish reason at the end), or the usage chunk."""
    chat = job.kind == "chat.completion"
    choices = []
    if index is not None:
        if chat:
            delta = {} if text is None else {"content": text}
            choices = [{"index": index, "delta": delta, "finish_reason": reason, "logprobs": None}]
        else:
            choices = [{"index": index, "text": text or "", "finish_reason": reason, "logprobs": None}]
    out = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{job.id}", "object": "chat.completion.chunk" if chat else
           "text_completion", "created": job.created, "model": job.model, "choices": choices}
    if used is not None:
        out["usage"] = used
    return out
