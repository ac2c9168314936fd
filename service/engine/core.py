"""The engine: from a batch of token ids to vectors, for one model on one device.

Per request (TEI's `core/src/infer.rs`, tokenisation left to the API processes): admit or refuse
by expected wait (admission.py), queue the rows, wait for the inference thread to fill them. The
answer carries the vectors and where the time went.

One inference thread per stream runs the passes: on a GPU one (a device runs one pass at a time), and
a second thread selects the next pass while the current one runs, so the device waits for Python only
to join and pad its rows; on a CPU the backend's `streams` (two by default), each pass on its share of
the cores, a lone pass on all of them (queue.py, "Streams"). A pass that fails is retried row by row,
so a bad input fails its own request and no other.
"""

from __future__ import annotations

import asyncio
import logging
import queue as threading_queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.engine.admission import Admission
from service.engine.backends import Backend, padded_length
from service.engine.queue import Batch, BatchQueue, Job
from service.ipc.messages import (
    EmbedResult,
    InferenceFailed,
    InvalidInput,
    ModelInfo,
    NotReady,
    Overloaded,
    QueueDeadline,
    TokenBatch,
    WrongModelType,
)
from service.metrics import EngineMetrics
from service.settings import Settings

log = logging.getLogger("sembed.engine")


@dataclass(frozen=True)
class EngineConfig:
    """What the engine takes from the settings (service/settings.py holds every default, and why)."""

    max_batch_tokens: int  # per pass, counted with padding
    max_batch_requests: int  # rows per forward pass
    max_padding_ratio: float  # a row joins a pass only if padded to at most this many times its own length
    max_queue_wait_s: float  # admission: a request expected to wait longer is refused (429)
    max_queued_inputs: int  # a memory bound on rows held, whatever their expected wait
    request_timeout_s: float  # a row still queued after this is dropped, its request failed
    # Assemble the next pass while the current one runs: worth it where passes take milliseconds (a GPU);
    # on a CPU a pass takes far longer than assembling one, and a request arriving meanwhile should
    # still make the very next pass.
    prefetch: bool

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides: Any) -> EngineConfig:
        """From `settings`, or from the settings' defaults with `overrides` (tests: any Settings field)."""
        s = settings or Settings(**overrides)
        return cls(max_batch_tokens=s.batch_token_budget(), max_batch_requests=s.batch_row_cap(),
                   max_padding_ratio=s.padding_ratio(), max_queue_wait_s=s.max_queue_wait_s,
                   max_queued_inputs=s.max_queued_inputs,
                   request_timeout_s=s.request_timeout_s, prefetch=s.device == "cuda")


@dataclass(frozen=True)
class EngineStats:
    """What the engine's heartbeat answer reports besides readiness."""

    in_flight: int  # rows held: queued or running
    queued_rows: int  # rows not yet in a pass
    tokens_per_s: float | None  # the measured rate admission estimates waits with (None: none measured yet)


class Engine:
    def __init__(self, backend: Backend, config: EngineConfig | None = None, metrics: EngineMetrics | None = None):
        config = config or EngineConfig.from_settings()
        self.backend = backend
        self.config = config
        self.metrics = metrics or EngineMetrics()
        self.pad_to_multiple_of = backend.pad_to_multiple_of
        self.streams = streams = backend.streams
        # a pass must hold at least one input of the model's full length; with streams, the budget is shared
        # among the passes running at once (a pass on a stream takes as long as a whole-budget pass on every core)
        full_length = padded_length(backend.info.max_seq_length, self.pad_to_multiple_of)
        budget = max(config.max_batch_tokens, full_length)
        self.queue = BatchQueue(max(budget // streams, full_length), max(1, config.max_batch_requests // streams),
                                self.pad_to_multiple_of, backend.info.max_seq_length, QueueDeadline,
                                backend.row_buckets, config.max_padding_ratio, streams)
        self.info = ModelInfo(**{**vars(backend.info), "max_batch_tokens": budget})
        self.admission = Admission(config.max_queue_wait_s)
        self._held_inputs = 0
        self._running_tokens = 0  # of the passes running now: work ahead of every new request
        self._running_lock = threading.Lock()
        self._prepared: threading_queue.Queue[Batch | None] = threading_queue.Queue(maxsize=1)
        self._threads: list[threading.Thread] = []
        self._accepting = False

    @property
    def ready(self) -> bool:
        return self._accepting and bool(self._threads) and all(t.is_alive() for t in self._threads)

    @property
    def in_flight(self) -> int:
        return self._held_inputs

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._inference_loop, name=f"infer-{self.info.model}-{k}", daemon=True)
                         for k in range(self.streams)]
        if self.config.prefetch:
            self._threads.append(threading.Thread(target=self._assemble_loop, name=f"assemble-{self.info.model}",
                                                  daemon=True))
        for thread in self._threads:
            thread.start()
        self._accepting = True

    def refuse_new(self) -> None:
        """Draining: new requests get NotReady; what is queued still runs."""
        self._accepting = False

    def stop(self) -> None:
        """Refuse new requests, let queued ones finish, then end the threads."""
        self.refuse_new()
        self.queue.close()
        for thread in self._threads:
            thread.join()

    def stats(self) -> EngineStats:
        return EngineStats(self._held_inputs, self.queue.queued_rows(), self.admission.rate)

    # --- the request path ------------------------------------------------------------------------
    def submit(self, batch: TokenBatch, *, normalize: bool = True, timeout_s: float | None = None,
               on_done: Callable[[Job], object], context: Any = None, tokens: bool = False) -> Job:
        """Admit and queue token ids already checked and truncated by the API process; `on_done(job)` is
        called once, from an engine thread. Every submitted job is `release`d once by its submitter, from
        the submitting thread (the held count is that thread's alone). With `tokens`, the job's answer is every
        row's token states end to end (TEI's /embed_all)."""
        if not self.ready:
            raise NotReady(f"model {self.info.model} is not ready")
        if len(batch) == 0:
            raise InvalidInput("no inputs")
        if tokens and not self.info.token_dimension:
            raise WrongModelType(self.info.token_refusal)
        self._admit(batch)
        job = Job(batch, self.info.token_dimension if tokens else self.info.dimension,
                  time.monotonic() + (timeout_s or self.config.request_timeout_s), on_done, context, normalize, tokens)
        self._held_inputs += job.size
        self.queue.put(job)
        return job

    def release(self, job: Job) -> None:
        """The submitter is done with `job` (answered, or its caller left: then its rows not yet run are dropped)."""
        if not job.finished:
            job.cancelled = True
        self._held_inputs -= job.size

    def result(self, job: Job) -> EmbedResult:
        """A finished job's answer, or its error raised."""
        if job.error is not None:
            raise job.error
        if job.scheduled_at is None:
            raise RuntimeError("result() of a job that never ran")
        queue_s = job.scheduled_at - job.enqueued_at
        self.metrics.queue_seconds.observe(queue_s)
        return EmbedResult(job.vectors, job.prompt_tokens, queue_s, job.inference_s)

    async def embed(self, batch: TokenBatch, *, normalize: bool = True, timeout_s: float | None = None,
                    tokens: bool = False) -> EmbedResult:
        """The same, awaited on an event loop in this process (tests, tools)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        job = self.submit(batch, normalize=normalize, timeout_s=timeout_s, tokens=tokens,
                          on_done=lambda j: loop.call_soon_threadsafe(_resolve, future))
        try:
            await future
            return self.result(job)
        finally:
            self.release(job)

    def _admit(self, batch: TokenBatch) -> None:
        n = len(batch)
        if n > self.config.max_queued_inputs:  # would never fit, however long it waited
            raise InvalidInput(f"{n} inputs in one request; this engine holds at most "
                               f"{self.config.max_queued_inputs}: split the request")
        # all the queued tokens bound its wait (O(1)); only near the limit is each request's turn weighed
        wait = self.admission.wait_for(self.queue.queued_tokens + self._running_tokens)
        if wait > self.admission.max_wait_s:
            wait = self.admission.expected_wait(batch.tokens, self.queue.remaining_tokens(), self._running_tokens)
        if wait > self.admission.max_wait_s or self._held_inputs + n > self.config.max_queued_inputs:
            self.metrics.rejected.inc()
            retry = self.admission.retry_after(wait)
            raise Overloaded(f"this request would wait about {wait:.1f} s for the model (limit "
                             f"{self.admission.max_wait_s:g} s, max_queue_wait_s): retry in {retry:.0f} s", retry)

    # --- the assembling and inference threads -----------------------------------------------------
    def _assemble_loop(self) -> None:
        """Select the next pass while the current one runs (prefetch)."""
        while (batch := self.queue.next_batch()) is not None:
            self._prepared.put(batch)
        self._prepared.put(None)

    def _inference_loop(self) -> None:
        while (batch := self._prepared.get() if self.config.prefetch else self.queue.next_batch()) is not None:
            try:
                self._run_batch(batch)
            finally:
                self.queue.done(batch)

    def _run_batch(self, batch: Batch) -> None:
        self.metrics.queue_rows.set(self.queue.queued_rows())
        # callers may have left while it waited (prefetched): their rows are dropped here, not run
        parts = [part for part in batch.parts if not (part[0].cancelled or part[0].finished)]
        if not parts:
            return
        tokens = sum(job.tokens(start, n) for job, start, n in parts)
        self._add_running(tokens)
        try:
            self._run(parts, batch.wide)
        except BaseException as e:  # never lose the thread: fail what it held and go on
            log.exception("inference pass failed unexpectedly")
            for job, _, _ in parts:
                job.fail(InferenceFailed(f"internal error in the inference thread: {type(e).__name__}"))
        finally:
            self._add_running(-tokens)

    def _add_running(self, tokens: int) -> None:
        with self._running_lock:
            self._running_tokens += tokens

    def _run(self, parts: list[tuple[Job, int, int]], wide: bool = True) -> None:
        batch = TokenBatch.concat([job.rows(start, n) for job, start, n in parts])
        seq_len = padded_length(max(job.longest(start, n) for job, start, n in parts), self.pad_to_multiple_of)
        start_time = time.perf_counter()
        states = None
        try:
            if any(job.token_states for job, _, _ in parts):  # /embed_all's rows: this pass gives token states too
                normalized, raw, states = self.backend.run_tokens(batch, seq_len, wide)
            else:
                normalized, raw = self.backend.run(batch, seq_len, wide)
        except Exception as e:
            if len(batch) > 1:  # find the culprit: each row alone gives the same bits as in the batch
                for job, start, n in parts:
                    for k in range(n):
                        self._run([(job, start + k, 1)], wide)
            else:
                log.warning("input failed in the model: %s", e)
                parts[0][0].fail(InferenceFailed(f"the model failed on an input: {e}"))
            return
        seconds = time.perf_counter() - start_time
        tokens = batch.tokens
        # admission's rate is the engine's: a pass on one stream of several runs beside the others' passes
        self.admission.observe_pass(tokens * (1 if wide else self.streams), seconds)
        self.metrics.observe_pass(len(batch), tokens, len(batch) * seq_len, seconds)
        row = 0
        for job, start, n in parts:  # a job's rows are consecutive in the pass: one slice each
            job.fill(start, normalized[row:row + n], raw[row:row + n], None if states is None else states[row:row + n],
                     seconds)
            row += n


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # done: cancelled, the caller already left
        future.set_result(None)


def measure_rate(engine: Engine, token_id: int = 1000) -> None:
    """Time one full pass (after warm-up) as admission's first estimate; until a pass is measured,
    admission has no rate and bounds only what is held."""
    backend = engine.backend
    length = min(backend.info.max_seq_length, 128)
    seq_len = padded_length(length, backend.pad_to_multiple_of)
    rows = max(1, min(engine.queue.rows_within(seq_len), engine.config.max_batch_requests))  # a pass the queue forms
    vocab = backend.info.vocab_size
    token_id = min(token_id, vocab - 1) if vocab else token_id  # a small vocabulary's ids end sooner
    batch = TokenBatch(np.full(rows * length, token_id, dtype=np.int32),
                       np.arange(0, rows * length + 1, length, dtype=np.int64))
    start = time.perf_counter()
    backend.run(batch, seq_len)
    engine.admission.observe_pass(rows * length, time.perf_counter() - start)
