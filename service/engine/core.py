"""The engine: everything between a validated request and a vector, with no HTTP in it.

Per request (TEI's `core/src/infer.rs`): take one permit per input or refuse at once (the caller
answers 429); tokenise in a worker pool, so the next request's tokenisation overlaps this pass's
inference (Infinity's batch handler); queue the tokenised rows; wait for the inference thread to
fill them. The answer carries the vectors, the token count and where the time went.

One inference thread runs the passes: onnxruntime already spreads one pass over every core, so
two passes at once would only contend. A pass that fails is retried row by row, so a bad input
fails its own request and no other.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from service.backends import Backend, BackendInfo, Tokenized, padded_length
from service.metrics import Metrics
from service.queue import Batch, BatchQueue, Job

log = logging.getLogger("sembed.engine")

#: requests with fewer characters than this are tokenised on the event loop (well under 0.1 ms)
INLINE_TOKENIZATION_CHARS = 4096


class EngineError(Exception):
    """A request the engine will not or cannot serve; the routers map each kind to a status."""


class Overloaded(EngineError):
    pass


class InvalidInput(EngineError):
    pass


class InputTooLong(InvalidInput):
    pass


class NotReady(EngineError):
    pass


class InferenceFailed(EngineError):
    pass


class QueueDeadline(EngineError):
    pass


class WrongModelType(EngineError):
    """Embeddings asked of a reranker (cross-encoder), or pair scores of an embedding model."""


@dataclass(frozen=True)
class EngineConfig:
    max_batch_tokens: int = 16384  # TEI's default; counted with padding
    max_batch_requests: int = 64  # rows per forward pass
    max_concurrent_requests: int = 512  # permits, one per input: bounds what is queued and held
    max_batch_wait_ms: float = 2.0  # only while other requests are still being tokenised
    request_timeout_s: float = 60.0  # a row still queued after this is dropped, its request failed
    tokenization_workers: int = 0  # 0: one per core
    auto_truncate: bool = True  # default for requests that do not say `truncate`


@dataclass
class EmbedResult:
    vectors: np.ndarray  # [n, dim] float32, normalised or as pooled
    prompt_tokens: int
    tokenization_s: float
    queue_s: float
    inference_s: float


class Engine:
    def __init__(self, backend: Backend, config: EngineConfig = EngineConfig(), metrics: Metrics | None = None):
        self.backend = backend
        self.config = config
        self.metrics = metrics or Metrics()
        self.pad_to_multiple_of = backend.pad_to_multiple_of
        # a pass must hold at least one input of the model's full length
        budget = max(config.max_batch_tokens, padded_length(backend.info.max_seq_length, self.pad_to_multiple_of))
        self.queue = BatchQueue(budget, config.max_batch_requests, self.pad_to_multiple_of,
                                config.max_batch_wait_ms / 1000, backend.info.max_seq_length, QueueDeadline)
        self.tokenization_workers = config.tokenization_workers or min(4, os.cpu_count() or 1)
        self._tokenizers = ThreadPoolExecutor(self.tokenization_workers, thread_name_prefix="tokenize")
        self._permits = config.max_concurrent_requests
        self._thread: threading.Thread | None = None
        self._accepting = False

    @property
    def info(self) -> BackendInfo:
        return self.backend.info

    @property
    def ready(self) -> bool:
        return self._accepting and self._thread is not None and self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        return self.config.max_concurrent_requests - self._permits

    def start(self) -> None:
        self._thread = threading.Thread(target=self._inference_loop, name=f"infer-{self.info.model}", daemon=True)
        self._thread.start()
        self._accepting = True

    def stop(self) -> None:
        """Refuse new requests, let queued ones finish, then end the threads."""
        self._accepting = False
        self.queue.close()
        if self._thread is not None:
            self._thread.join()
        self._tokenizers.shutdown(wait=True)

    # --- the request path (event loop) ------------------------------------------------------------
    async def embed(self, texts: list[str] | list[list[int]], *, normalize: bool = True, truncate: bool | None = None,
                    truncation_direction: str = "right", timeout_s: float | None = None) -> EmbedResult:
        """Texts, or inputs already tokenised as the model's own token ids (taken as they are)."""
        if self.info.is_cross_encoder:
            raise WrongModelType(f"model {self.info.model} is a reranker (cross-encoder): it scores (query, text) "
                                 "pairs at /rerank and gives no embeddings")
        return await self._infer(texts, None, normalize, truncate, truncation_direction, timeout_s)

    async def rerank(self, query: str, texts: list[str], *, truncate: bool | None = None,
                     truncation_direction: str = "right", timeout_s: float | None = None) -> EmbedResult:
        """A cross-encoder's score of each (query, text) pair, in `vectors[:, 0]`: the same queue and passes
        as embeddings, each pair tokenised as one sequence."""
        if not self.info.is_cross_encoder:
            raise WrongModelType(f"model {self.info.model} is not a re-ranker (cross-encoder)")
        return await self._infer(texts, query, False, truncate, truncation_direction, timeout_s)

    async def _infer(self, texts: list[str] | list[list[int]], query: str | None, normalize: bool,
                     truncate: bool | None, truncation_direction: str, timeout_s: float | None) -> EmbedResult:
        if not self.ready:
            raise NotReady(f"model {self.info.model} is not ready")
        n = len(texts)
        if n > self.config.max_concurrent_requests:  # would wait for permits that can never be free
            raise InvalidInput(f"{n} inputs in one request; this server holds at most "
                               f"{self.config.max_concurrent_requests} in flight: split the request")
        if n > self._permits:
            self.metrics.rejected.inc()
            raise Overloaded(f"{self.in_flight} inputs in flight, room for {self._permits} more; "
                             f"this request has {n}: retry shortly")
        self._permits -= n
        # Small requests are tokenised right here: a thread hop costs more than their tokenisation.
        given_ids = bool(texts) and not isinstance(texts[0], str)
        pair_chars = len(query) * n if query is not None else 0
        pooled = not given_ids and sum(map(len, texts)) + pair_chars > INLINE_TOKENIZATION_CHARS
        if pooled:
            self.queue.expect()
        queued = False
        try:
            loop = asyncio.get_running_loop()
            truncate = self.config.auto_truncate if truncate is None else truncate
            start = time.perf_counter()
            try:
                if given_ids:
                    items = self._from_ids(texts, truncate)
                elif pooled:
                    items = await loop.run_in_executor(self._tokenizers, self._tokenize, texts, truncate,
                                                       truncation_direction, query)
                else:
                    items = self._tokenize(texts, truncate, truncation_direction, query)
            finally:
                tokenization_s = time.perf_counter() - start
            future = loop.create_future()
            deadline = time.monotonic() + (timeout_s or self.config.request_timeout_s)
            job = Job(items, self.info.dimension, deadline,
                      on_done=lambda j: loop.call_soon_threadsafe(_resolve, future, j))
            self.queue.put(job, expected=pooled)
            queued = True
            try:
                await future
            except asyncio.CancelledError:
                job.cancelled = True  # the caller left: its rows not yet run are dropped
                raise
            if job.error is not None:
                raise job.error
            queue_s = job.scheduled_at - job.enqueued_at
            self.metrics.observe_request(tokenization_s, queue_s, [i.length for i in items])
            return EmbedResult(job.normalized if normalize else job.raw, job.prompt_tokens, tokenization_s, queue_s,
                               job.inference_s)
        finally:
            if pooled and not queued:
                self.queue.unexpect()
            self._permits += n

    def _from_ids(self, inputs: list[list[int]], truncate: bool) -> list[Tokenized]:
        limit, vocab = self.info.max_seq_length, self.info.vocab_size
        items = []
        for i, ids in enumerate(inputs):
            if not ids:
                raise InvalidInput(f"inputs[{i}] is an empty list of token ids")
            if vocab is not None and not all(0 <= t < vocab for t in ids):
                raise InvalidInput(f"inputs[{i}] holds token ids outside the model's vocabulary of {vocab}")
            if len(ids) > limit and not truncate:
                raise InputTooLong(f"inputs[{i}] has {len(ids)} tokens; the model takes at most {limit}")
            items.append(Tokenized(list(ids[:limit]), None, len(ids)))
        return items

    def check_texts(self, texts: list[str], field: str = "inputs") -> None:
        """Refuse text no tokenizer can take (a lone UTF-16 surrogate) with the index of the culprit."""
        for i, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidInput(f"{field}[{i}] is not valid Unicode: {e.reason} at character {e.start}") from None

    def _tokenize(self, texts: list[str], truncate: bool, truncation_direction: str = "right",
                  query: str | None = None) -> list[Tokenized]:
        """Every input is checked here, before it can share a pass with others; with a query, each
        (query, text) pair becomes one sequence."""
        if query is None:
            self.check_texts(texts)
            items = self.backend.tokenize(texts, truncation_direction)
        else:
            self.check_texts([query], "query")
            self.check_texts(texts, "texts")
            items = self.backend.tokenize_pairs(query, texts, truncation_direction)
        if not truncate:
            limit = self.info.max_seq_length
            for i, item in enumerate(items):
                if item.truncated:
                    what = f"inputs[{i}]" if query is None else f"texts[{i}] with the query"
                    raise InputTooLong(f"{what} has {item.original_tokens} tokens; the model takes at most "
                                       f"{limit}: shorten it, or send truncate=true to cut it to {limit}")
        return items

    # --- the inference thread ---------------------------------------------------------------------
    def _inference_loop(self) -> None:
        while (batch := self.queue.next_batch()) is not None:
            self.metrics.queue_rows.set(self.queue.queued_rows())
            try:
                self._run(batch)
            except BaseException as e:  # never lose the thread: fail what it held and go on
                log.exception("inference pass failed unexpectedly")
                for job, _ in batch.rows:
                    job.fail(InferenceFailed(f"internal error in the inference thread: {type(e).__name__}"))

    def _run(self, batch: Batch) -> None:
        rows = [(job, row) for job, row in batch.rows if not (job.cancelled or job.finished)]
        if not rows:
            return
        items = [job.items[row] for job, row in rows]
        seq_len = padded_length(max(i.length for i in items), self.pad_to_multiple_of)
        start = time.perf_counter()
        try:
            normalized, raw = self.backend.run(items, seq_len)
        except Exception as e:
            if len(rows) > 1:  # find the culprit: each row alone gives the same bits as in the batch
                for row in rows:
                    self._run(Batch([row]))
            else:
                log.warning("input failed in the model: %s", e)
                rows[0][0].fail(InferenceFailed(f"the model failed on an input: {e}"))
            return
        seconds = time.perf_counter() - start
        self.metrics.observe_pass(len(rows), sum(i.length for i in items), len(rows) * seq_len, seconds)
        for job in {job for job, _ in rows}:
            job.inference_s += seconds
        for k, (job, row) in enumerate(rows):
            job.fill(row, normalized[k], raw[k])


def _resolve(future: asyncio.Future, job: Job) -> None:
    if not future.done():  # done: cancelled, the caller already left
        future.set_result(None)
