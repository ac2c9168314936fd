"""Prometheus metrics: one module names them all, whichever process records them.

Under the supervisor every process writes its samples to PROMETHEUS_MULTIPROC_DIR (set before any
process starts) and an API process's /metrics aggregates every process's files, under the same
names as in one process. In one process (tests, tools) each instance has a registry of its own.
"""

from __future__ import annotations

import os

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


#: up to this many values, observe_all calls observe() for each
SMALL_BATCH = 4


class BulkHistogram(Histogram):
    """A Histogram that also takes many values at once (its labelled children are BulkHistograms too)."""

    def observe_all(self, values: np.ndarray) -> None:
        """`observe(v)` for every v, with one write per bucket touched instead of one per value (a multiprocess
        write each: a 256-text request would pay 256). The same buckets (v <= bound) and sum. It writes the
        buckets prometheus-client's Histogram keeps (its own attributes, which a subclass shares): the library
        has no bulk observe."""
        values = np.asarray(values, dtype=np.float64)
        if values.size <= SMALL_BATCH:  # numpy's fixed cost is more than a few writes
            for value in values.tolist():
                self.observe(value)
            return
        self._raise_if_not_observable()
        bounds = self._upper_bounds  # ends with +Inf
        # the first bound >= v is v's bucket; NaN sorts past every bound, into none (as observe() puts it)
        counts = np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1)
        for bucket, count in zip(self._buckets, counts.tolist()):
            if count:
                bucket.inc(count)
        self._sum.inc(float(values.sum()))


class ApiMetrics:
    """What an API process records: HTTP requests, tokenisation, the models and the index it serves."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("sembed_requests", "HTTP requests", ["route", "status"], registry=r)
        self.request_seconds = Histogram("sembed_request_duration_seconds", "HTTP request latency", ["route"],
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.request_errors = Counter("sembed_request_errors", "error answers by kind (TEI's error types)",
                                      ["route", "error_type"], registry=r)
        self.model_info = Gauge("sembed_model_info", "the models served (value 1)",
                                ["model", "dimension", "max_seq_length", "device", "sha256"], registry=r,
                                multiprocess_mode="max")
        self.input_tokens = BulkHistogram("sembed_input_length_tokens", "tokens per input, after truncation",
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.tokenization_seconds = Histogram("sembed_tokenization_duration_seconds", "tokenisation per request",
                                              buckets=LATENCY_BUCKETS, registry=r)
        # Set by the API process that last wrote to a collection (mostrecent across processes); a dropped
        # collection reads 0 until a restart (prometheus-client cannot remove a series in multiprocess mode).
        self.index_documents = Gauge("sembed_index_documents", "documents per collection", ["collection"],
                                     registry=r, multiprocess_mode="mostrecent")
        # The vector cache (service/api/cache.py): texts answered from it, texts it lacked, and what it holds (each
        # API process has its own: the gauges sum over them)
        self.cache_hits = Counter("sembed_cache_hits", "texts answered from the vector cache", ["model"], registry=r)
        self.cache_misses = Counter("sembed_cache_misses", "texts the vector cache lacked (embedded by the engine)",
                                    ["model"], registry=r)
        self.cache_bytes = Gauge("sembed_cache_bytes", "bytes the vector caches hold", registry=r,
                                 multiprocess_mode="livesum")
        self.cache_entries = Gauge("sembed_cache_entries", "vectors the vector caches hold", registry=r,
                                   multiprocess_mode="livesum")
        self._also: list[CollectorRegistry] = []  # engines run in this process (tests, tools)

    def include(self, registry: CollectorRegistry) -> None:
        self._also.append(registry)

    def exposition(self) -> bytes:
        """Every process's samples when running under the supervisor, else this instance's own."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return b"".join(generate_latest(r) for r in (self.registry, *self._also))


class EngineMetrics:
    """What an engine process records: admission, the queue and the forward passes."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.rejected = Counter("sembed_rejected_requests", "requests refused by admission (429)", registry=r)
        self.texts = Counter("sembed_embedded_texts", "texts embedded", registry=r)
        self.tokens = Counter("sembed_embedded_tokens", "non-padding tokens embedded", registry=r)
        self.queue_seconds = Histogram("sembed_queue_duration_seconds", "wait before a request's first pass",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("sembed_batch_size", "rows per forward pass",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=r)
        self.batch_tokens = Histogram("sembed_batch_tokens", "tokens per forward pass, padding included",
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.inference_seconds = Histogram("sembed_inference_duration_seconds", "forward pass latency",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.queue_rows = Gauge("sembed_queue_size", "inputs waiting for a forward pass", registry=r,
                                multiprocess_mode="livesum")

    def observe_pass(self, rows: int, tokens: int, padded_tokens: int, seconds: float) -> None:
        self.batch_size.observe(rows)
        self.batch_tokens.observe(padded_tokens)
        self.texts.inc(rows)
        self.tokens.inc(tokens)
        self.inference_seconds.observe(seconds)
