"""Dynamic batching: concurrent requests' texts share forward passes, run off the event loop.

One worker task drains the queue into batches of up to `max_batch_size` texts (waiting at most
`batch_wait_ms` for a batch to fill) and runs the encoder in a single dedicated thread:
onnxruntime already uses every core inside one run, so parallel runs would only contend.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from service.encoder import Encoder
from service.metrics import Metrics


class QueueFullError(RuntimeError):
    pass


class _Job:
    """One request's texts; rows are filled in as the batches that carry them finish."""

    def __init__(self, n: int, future: asyncio.Future):
        self.future = future
        self.normalized: list[np.ndarray | None] = [None] * n
        self.raw: list[np.ndarray | None] = [None] * n
        self.pending = n


class BatchQueue:
    def __init__(self, encoder: Encoder, metrics: Metrics, max_batch_size: int = 64,
                 batch_wait_ms: float = 2.0, max_queue_texts: int = 8192):
        self.encoder = encoder
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.batch_wait = batch_wait_ms / 1000
        self.max_queue_texts = max_queue_texts
        self._queue: asyncio.Queue[tuple[_Job, int, str]] = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder")
        self._worker: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.done()

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True)

    async def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        """Embeddings for `texts` in order; raises QueueFullError rather than queue without bound."""
        if self._queue.qsize() + len(texts) > self.max_queue_texts:
            raise QueueFullError(f"{self._queue.qsize()} texts already queued; retry later")
        job = _Job(len(texts), asyncio.get_running_loop().create_future())
        for i, text in enumerate(texts):
            self._queue.put_nowait((job, i, text))
        self.metrics.queue_texts.set(self._queue.qsize())
        await job.future
        return np.stack(job.normalized if normalize else job.raw)

    async def _next_batch(self) -> list[tuple[_Job, int, str]]:
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.batch_wait
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            self.metrics.queue_texts.set(self._queue.qsize())
            # Skip texts whose request already failed or was cancelled (client went away).
            batch = [item for item in batch if not item[0].future.done()]
            if not batch:
                continue
            # Sorting by length keeps the padding of each forward pass small.
            batch.sort(key=lambda item: len(item[2]))
            start = time.perf_counter()
            try:
                result = await loop.run_in_executor(self._executor, self.encoder.embed, [t for _, _, t in batch])
            except Exception as exc:  # a failed batch fails its requests, never the worker
                for job, _, _ in batch:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            self.metrics.observe_batch(len(batch), result.tokens, time.perf_counter() - start)
            for row, (job, i, _) in enumerate(batch):
                job.normalized[i] = result.normalized[row]
                job.raw[i] = result.raw[row]
                job.pending -= 1
                if job.pending == 0 and not job.future.done():
                    job.future.set_result(None)
