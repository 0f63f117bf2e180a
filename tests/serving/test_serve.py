"""`sinkdlm serve` through the official `openai` client on an ephemeral port, with a tiny float64 DLM (issue 67).

The reference for every answer is the library: `sinkdlm.generate` on the request's prompt alone, with its seed and
settings, decoded as `generate_text` decodes. 8 concurrent requests of mixed prompt lengths, seeds and settings are
batched by the server (its /health counts the rows per batch) and each still gets exactly the reference's text.
float64 weights, so a batch's padded shapes cannot round a near-tie the other way (CONTRIBUTING's rule 3).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from sinkdlm import DiffusionLM, ModelConfig, generate  # noqa: E402
from sinkdlm.config.commands import ServeConfig  # noqa: E402
from sinkdlm.diffusion.text import decode_generated, encode_prompt, stop_token_ids  # noqa: E402
from sinkdlm.serving.server import bind, build_server  # noqa: E402

TEXTS = ["To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
         "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n",
         "And by opposing end them. To die, to sleep,\nNo more; and by a sleep to say we end\n"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NAME = "tiny"


@pytest.fixture(scope="module")
def tiny():
    from sinkdlm.data import train_bpe_tokenizer

    tok = train_bpe_tokenizer(TEXTS * 4, 300)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128, initializer_range=0.3,
                      mask_token_id=tok.mask_token_id, num_sink_tokens=1)
    return DiffusionLM(cfg).double().eval(), tok


class Running:
    """A server of `model` in a thread, on a free port of 127.0.0.1."""

    def __init__(self, model, tok, api_key=None, **settings):
        self.cfg = ServeConfig(model_name=NAME, **settings)
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = build_server(model, tok, self.cfg, api_key, NAME)
        self.thread = threading.Thread(target=self.server.run, kwargs=dict(sockets=[self.sock]), daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key or "none",
                                    max_retries=0)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def health(self) -> dict:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/health").json()


@pytest.fixture(scope="module")
def server(tiny):
    running = Running(*tiny, batch_window_ms=300, max_batch_size=8, max_tokens=64)
    yield running
    running.stop()


def reference(tiny, prompt: str | list[dict], chat: bool, seed: int, max_tokens: int, **dlm) -> str:
    """The request's text from the library, decoded alone: `generate` on its ids with its seed."""
    model, tok = tiny
    ids = encode_prompt(tok, prompt, chat)
    dlm.setdefault("steps", max_tokens)
    out = generate(model, ids, gen_length=max_tokens, seed=seed, **dlm)[0, len(ids):].tolist()
    return decode_generated(tok, out, stop_token_ids(tok, chat), 0, 0.0).text


REQUESTS = [  # (prompt, seed, max_tokens, sampling and DLM settings): mixed lengths, seeds and settings
    ("To be", 1, 8, dict(temperature=0.0)),
    ("The slings and arrows of outrageous fortune, or to take arms", 2, 8, dict(temperature=0.0)),
    ("No more", 3, 8, dict(temperature=0.9)),
    ("Whether 'tis nobler in the mind to suffer the slings", 4, 8, dict(temperature=0.9)),
    ("a sea", 5, 8, dict(temperature=0.9)),
    ("And by opposing", 6, 8, dict(temperature=0.9, top_k=5)),
    ("to sleep", 7, 8, dict(temperature=0.9, steps=4, block_length=4, remasking="random")),
    ("To die, to sleep, no more; and by a sleep", 8, 8, dict(temperature=0.9, steps=4, block_length=4,
                                                             remasking="random")),
]
DLM_KEYS = ("steps", "block_length", "remasking", "threshold", "cache")


def _ask(client, prompt, seed, max_tokens, settings):
    extra = {k: v for k, v in settings.items() if k in DLM_KEYS or k == "top_k"}
    plain = {k: v for k, v in settings.items() if k == "temperature"}
    return client.completions.create(model=NAME, prompt=prompt, seed=seed, max_tokens=max_tokens, extra_body=extra,
                                     **plain)


def test_eight_concurrent_requests_each_get_their_tokens_alone(tiny, server):
    before = server.health()
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        answers = list(pool.map(lambda r: _ask(server.client, *r), REQUESTS))
    after = server.health()
    batches, rows = after["batches"] - before["batches"], after["rows"] - before["rows"]
    assert rows == len(REQUESTS) and batches < rows  # they were batched (4 settings: at least 4 batches)
    for (prompt, seed, max_tokens, settings), answer in zip(REQUESTS, answers):
        want = reference(tiny, prompt, False, seed, max_tokens, **settings)
        assert answer.choices[0].text == want, (prompt, settings)
        assert answer.usage.completion_tokens <= max_tokens and answer.usage.prompt_tokens > 0
    assert len({a.choices[0].text for a in answers}) > 1


def test_chat_streaming_n_and_usage(tiny, server):
    messages = [{"role": "user", "content": "To be, or not to be"}]
    kw = dict(model=NAME, messages=messages, max_tokens=8, temperature=0.9, seed=11, extra_body=dict(block_length=4))
    whole = server.client.chat.completions.create(**kw)
    assert whole.choices[0].message.content == reference(tiny, messages, True, 11, 8, temperature=0.9, block_length=4)
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(server.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # the usage chunk comes last
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    two = server.client.chat.completions.create(**{**kw, "n": 2})
    assert two.choices[0].message.content == whole.choices[0].message.content  # choice j has seed + j
    assert two.choices[1].message.content == reference(tiny, messages, True, 12, 8, temperature=0.9, block_length=4)


def test_a_completion_streams_a_chunk_each_time_its_finished_prefix_grows(tiny, server):
    kw = dict(model=NAME, prompt="To be", max_tokens=16, seed=3, temperature=0.0,
              extra_body=dict(block_length=4, steps=16, remasking="random"))
    pieces = [c.choices[0].text for c in server.client.completions.create(**kw, stream=True)]
    whole = server.client.completions.create(**kw).choices[0].text
    assert "".join(pieces) == whole and len([p for p in pieces if p]) > 1


def test_models_and_health(server):
    assert [m.id for m in server.client.models.list().data] == [NAME]
    assert server.health()["status"] == "ok"


@pytest.mark.parametrize("body, status, words", [
    (dict(temperature=-1), 400, "temperature must be a finite number >= 0"),  # the CLI's sentence
    (dict(max_tokens=6, extra_body=dict(block_length=4)), 400, "max_tokens=6 is not divisible by block_length=4"),
    (dict(extra_body=dict(remasking="bogus")), 400, "remasking must be one of"),
    (dict(extra_body=dict(cache="dual")), 400, "cache=dual"),
    (dict(max_tokens=65), 400, "max_tokens must be at most 64"),
    (dict(prompt="to be " * 200), 400, "maximum context length"),
    (dict(model="gpt-4"), 404, "does not exist"),
    (dict(extra_body=dict(frobnicate=1)), 400, "Unrecognized request argument supplied: frobnicate"),
])
def test_errors_are_openai_errors(server, body, status, words):
    kw = {**dict(model=NAME, prompt="To be", max_tokens=8), **body}
    with pytest.raises(openai.APIStatusError) as exc:
        server.client.completions.create(**kw)
    assert exc.value.status_code == status and words in exc.value.body["message"], exc.value.body


def test_api_key_full_queue_and_time_limit(tiny):
    import httpx

    model, tok = tiny
    running = Running(model, tok, api_key="sekret", max_queue=1, timeout=1.0, batch_window_ms=0)
    try:
        url = f"http://127.0.0.1:{running.port}/v1/completions"
        body = dict(model=NAME, prompt="To be", max_tokens=64, steps=64)
        assert httpx.post(url, json=body).status_code == 401
        assert httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        gate = threading.Event()
        held = _hold_the_worker(running, gate)
        headers = {"Authorization": "Bearer sekret"}
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, url, json=body, headers=headers, timeout=30)
            time.sleep(0.3)  # the first request runs (held); the second waits in the queue of 1
            second = pool.submit(httpx.post, url, json=body, headers=headers, timeout=30)
            time.sleep(0.3)
            third = httpx.post(url, json=body, headers=headers)
            assert third.status_code == 503 and third.headers["retry-after"] == "1"
            assert third.json()["error"]["code"] == "queue_full"
            timed_out = first.result()
            assert timed_out.status_code == 504 and timed_out.json()["error"]["code"] == "timeout"
            gate.set()
            assert second.result().status_code in (200, 504)
        assert held
    finally:
        running.stop()


def _hold_the_worker(running, gate) -> list:
    """Make the server's next batches wait for `gate` (so a queue can fill); the list collects the held batches."""
    engine = running.server.config.app.state.engine
    held, decode = [], engine._decode

    def slow(batch):
        held.append(len(batch))
        gate.wait(10)
        decode(batch)

    engine._decode = slow
    return held


def test_random_bodies_get_400s_never_500s(tiny):
    """The command-line fuzz test's idea over HTTP: random JSON bodies are refused with an OpenAI error, never
    a 500 (a server bug) or a traceback."""
    import httpx
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    # no subnormals: a training test in this worker may have flushed them (training/cpu.py), and hypothesis then
    # cannot draw one
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_subnormal=False),
                        st.text(max_size=8))
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                                                inner, max_size=3),
                          max_leaves=6)
    keys = st.sampled_from(["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                            "n", "steps", "block_length", "remasking", "threshold", "cache", "echo", "messages", "x"])
    server = Running(*tiny, batch_window_ms=0, max_tokens=8, default_max_tokens=4)  # a valid case is quick
    url = f"http://127.0.0.1:{server.port}/v1/"

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=st.dictionaries(keys, values, max_size=6), chat=st.booleans())
    def check(body, chat):
        body = {"model": NAME, "prompt": "to be", "max_tokens": 4, **body}
        r = client.post(url + ("chat/completions" if chat else "completions"), content=json.dumps(body))
        assert r.status_code in (200, 400, 404), (body, r.status_code, r.text)
        if r.status_code != 200:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        elif not body.get("stream"):
            assert "usage" in r.json()

    client = httpx.Client(timeout=60)  # one connection pool: a client per call spends 0.3 s on its TLS context
    try:
        check()
        r = client.post(url + "completions", content=b"{not json")
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    finally:
        client.close()
        server.stop()


@pytest.mark.real_model
@pytest.mark.slow  # loading the GGUF and 4 x 12 steps of a 135M model: minutes on a busy 2-core machine
def test_the_example_model_chats_and_batches_as_alone():
    """The example SmolLM2-135M GGUF (autoregressive, float32): 4 concurrent chat requests, greedy and sampled,
    each answer the text `generate_text` gives its conversation alone (it stops at the end of the turn)."""
    from helpers import example_gguf_or_skip
    from sinkdlm.checkpoint.manager import load_model_and_tokenizer
    from sinkdlm.diffusion.text import generate_text

    model, tok = load_model_and_tokenizer(example_gguf_or_skip(), device="cpu")
    running = Running(model, tok, batch_window_ms=300)
    questions = [("What is the capital of France?", 0.0), ("Name a colour.", 0.8), ("Hi", 0.8), ("Count to three.", 0.0)]
    try:
        def ask(q):
            out = running.client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": q[0]}],
                                                         max_tokens=12, temperature=q[1], seed=5)
            return out.choices[0].message.content

        with ThreadPoolExecutor(len(questions)) as pool:
            answers = list(pool.map(ask, questions))
        assert running.health()["batches"] < len(questions)  # batched
    finally:
        running.stop()
    for (q, temperature), answer in zip(questions, answers):
        # the same float32 kernels on other batch shapes: identical here (docs/guide.md on what rounding may change)
        assert answer == generate_text(model, tok, q, chat=True, gen_length=12, temperature=temperature, seed=5).text


def test_a_client_that_leaves_cancels_its_work(tiny):
    """A request whose client disconnects while it waits is dropped: the worker never decodes it."""
    import httpx

    running = Running(*tiny, batch_window_ms=0)
    engine = running.server.config.app.state.engine
    try:
        gate = threading.Event()
        held = _hold_the_worker(running, gate)
        url = f"http://127.0.0.1:{running.port}/v1/completions"
        body = dict(model=NAME, prompt="To be", max_tokens=8)
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, url, json=body, timeout=30)  # decoded, once the gate opens
            time.sleep(0.3)
            with pytest.raises(httpx.ReadTimeout):  # waits in the queue, then its client leaves
                httpx.post(url, json={**body, "prompt": "No more"}, timeout=0.5)
            time.sleep(0.5)  # the server notices (it polls every 0.1 s)
            gate.set()
            assert first.result().status_code == 200
        time.sleep(0.3)
        assert held == [1] and engine.rows == 1 and not engine.pending  # the second was never decoded
    finally:
        running.stop()


def test_a_block_model_is_served_and_batched_as_alone(tiny):
    """A block diffusion model (docs/method.md §13): max_tokens bounds it; two concurrent requests of other prompt
    lengths and seeds each get what `generate` gives them alone; a stream grows block by block to the same text."""
    _, tok = tiny
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128, initializer_range=0.3,
                      mask_token_id=tok.mask_token_id, num_sink_tokens=1, block_size=4)
    model = DiffusionLM(cfg).double().eval()
    running = Running(model, tok, batch_window_ms=300)
    asks = [("To be or not", 1), ("The slings and arrows of outrageous fortune", 2)]
    try:
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda a: running.client.completions.create(
                model=NAME, prompt=a[0], max_tokens=8, seed=a[1], temperature=0.9).choices[0].text, asks))
        assert running.health()["batches"] == 1
        chunks = [c.choices[0].text for c in running.client.completions.create(
            model=NAME, prompt=asks[1][0], max_tokens=8, seed=asks[1][1], temperature=0.9, stream=True) if c.choices]
        assert "".join(chunks) == answers[1]
    finally:
        running.stop()
    for (prompt, seed), answer in zip(asks, answers):
        ids = encode_prompt(tok, prompt, False)
        out = generate(model, ids, max_new_tokens=8, steps=8, seed=seed, temperature=0.9)[0, len(ids):].tolist()
        assert answer == decode_generated(tok, out, stop_token_ids(tok, False), 0, 0.0).text
