"""The batching engine: concurrent requests decoded together without changing any request's tokens.

One worker thread owns the model. A request (`protocol.Job`) waits in a queue; the oldest waits at most
`batch_window_ms` for others with exactly its settings (`Job.key`: everything but the seed), and then those
requests, up to `max_batch_size` rows, are one `sinkdlm.generate` call over their prompts (left-padded, so
no query sees another row's padding) with one `torch.Generator` per row seeded from its request's seed:
every row draws from its own stream and gets exactly the tokens it gets alone (issue 67; tested). Requests
with other settings wait for a later batch. Each step's callback streams the rows whose finished prefix grew
(`Pending.events`), and ends the call when every request of the batch has gone (a client that disconnected or
ran out of time). `stop()` lets the queue run dry, then ends the thread (SIGTERM's drain).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import torch

from sinkdlm.config.commands import ServeConfig
from sinkdlm.evaluation.predictor import cut_at_stop
from sinkdlm.serving.protocol import APIError, Job

log = logging.getLogger(__name__)


class _Abandoned(Exception):
    """Every request of the running batch has gone: the call ends at its next step."""


class Pending:
    """A queued or running request: its job, and the events its HTTP handler reads on the event loop:
    ("delta", choice, text), then ("done", texts, finish reasons, completion tokens) or ("error", APIError)."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop):
        self.job, self.loop = job, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.arrived = time.monotonic()
        self.sent = [""] * len(job.rows)  # the text streamed so far, per choice

    def emit(self, *event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def cancel(self) -> None:
        self.cancelled.set()


class Engine:
    """The queue and the worker thread (see the module docstring)."""

    def __init__(self, model, tokenizer, cfg: ServeConfig):
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.pending: list[Pending] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.busy = False
        self.batches = self.rows = 0  # decoded so far (/health: rows / batches is the mean batch)
        self.thread = threading.Thread(target=self._run, name="sinkdlm-batcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Decode what is queued, then end the worker."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()

    def submit(self, job: Job) -> Pending:
        """Queue `job` (503 with Retry-After when `max_queue` requests wait already)."""
        p = Pending(job, asyncio.get_running_loop())
        with self.cond:
            if self.stopping:
                raise APIError(503, "the server is shutting down", type="server_error", headers={"Retry-After": "5"})
            if len(self.pending) >= self.cfg.max_queue:
                raise APIError(503, f"the queue is full ({self.cfg.max_queue} requests wait); retry shortly",
                               type="server_error", code="queue_full", headers={"Retry-After": "1"})
            self.pending.append(p)
            self.cond.notify_all()
        return p

    # ------------------------------------------------------------------ the worker
    def _take(self) -> list[Pending] | None:
        """The next batch: the oldest request and the later ones with its settings, after its window."""
        window = self.cfg.batch_window_ms / 1000
        with self.cond:
            while not self.pending and not self.stopping:
                self.cond.wait()
            if not self.pending:
                return None
            first = self.pending[0]
            while not self.stopping:
                rows = sum(len(p.job.rows) for p in self.pending if p.job.key == first.job.key)
                left = first.arrived + window - time.monotonic()
                if left <= 0 or rows >= self.cfg.max_batch_size:
                    break
                self.cond.wait(left)
            batch, rows = [], 0
            for p in list(self.pending):
                if p.cancelled.is_set():
                    self.pending.remove(p)
                elif p.job.key == first.job.key and rows + len(p.job.rows) <= self.cfg.max_batch_size:
                    batch.append(p)
                    rows += len(p.job.rows)
                    self.pending.remove(p)
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            if batch:
                self.busy = True
                try:
                    self._decode(batch)
                finally:
                    self.busy = False

    def _decode(self, batch: list[Pending]) -> None:
        from sinkdlm.diffusion.sampling import generate

        owners = [(p, j) for p in batch for j in range(len(p.job.rows))]  # row r of the call: choice j of p
        device = self.model.device
        generators = [torch.Generator(device=device).manual_seed(p.job.seeds[j]) for p, j in owners]

        def callback(state) -> None:
            if all(p.cancelled.is_set() for p in batch):
                raise _Abandoned
            streaming = [r for r, (p, _) in enumerate(owners) if p.job.stream and not p.cancelled.is_set()]
            if not streaming:
                return
            p0 = state.prompt_length
            still = (state.masked & ~state.committed)[:, p0:]  # [B, gen] not yet decided
            finished = (still.long().cumsum(-1) == 0).sum(-1).tolist()  # [B] the decided prefix's length
            gen = state.x[:, p0:]
            for r in streaming:
                p, j = owners[r]
                text, _, _ = self._visible(p.job, gen[r, :finished[r]].tolist(), final=False)
                if len(text) > len(p.sent[j]) and text.startswith(p.sent[j]):
                    p.emit("delta", j, text[len(p.sent[j]):])
                    p.sent[j] = text

        callback.full_logits = False  # only the block's logits: the tokens of a call without a callback
        try:  # a block model calls it once per finished block (diffusion/block_sampling.py)
            out = generate(self.model, [p.job.rows[j] for p, j in owners], batch[0].job.settings,
                           generator=generators, callback=callback, return_dict=True)
        except _Abandoned:
            return
        except Exception:  # a bug, not a request's fault: the requests learn of it, the log keeps the traceback
            log.exception("decoding a batch of %d rows failed", len(owners))
            for p in batch:
                p.emit("error", APIError(500, "the server failed to decode this request", type="server_error"))
            return
        self.batches, self.rows = self.batches + 1, self.rows + len(owners)
        rows = out.sequences[:, out.prompt_length:].tolist()
        results: dict[int, tuple[list, list, int]] = {}
        for (p, j), tokens in zip(owners, rows):
            text, stopped, used = self._visible(p.job, tokens, final=True)
            texts, reasons, total = results.setdefault(id(p), ([], [], 0))
            texts.append(text)
            reasons.append("stop" if stopped else "length")
            results[id(p)] = (texts, reasons, total + used)
        for p in batch:
            if not p.cancelled.is_set():
                p.emit("done", *results[id(p)])

    def _visible(self, job: Job, tokens: list[int], final: bool) -> tuple[str, bool, int]:
        """(the text of `tokens` so far, whether it has ended, the tokens it used): cut at the first stop id
        and stop string; a text still growing holds back a trailing partial character or stop string."""
        end = next((i for i, t in enumerate(tokens) if t in job.stops), None)
        used = len(tokens) if end is None else end
        text = self.tokenizer.decode(tokens[:used], skip_special_tokens=True)
        cut = cut_at_stop(text, job.stop)
        stopped = end is not None or len(cut) < len(text)
        if not final and not stopped:
            cut = cut.rstrip("\ufffd")  # a character whose bytes span tokens still to come
            held = max((k for s in job.stop for k in range(1, len(s)) if cut.endswith(s[:k])), default=0)
            cut = cut[:len(cut) - held]
        return cut, stopped, used
