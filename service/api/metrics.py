"""Prometheus metrics, on a registry of the app's own so several apps can live in one process."""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sembed_requests", "HTTP requests", ["route", "status"], registry=r)
        self.request_seconds = Histogram(
            "sembed_request_duration_seconds", "HTTP request latency", ["route"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.request_errors = Counter("sembed_request_errors", "error answers by kind (TEI's error types)",
                                      ["route", "error_type"], registry=r)
        self.model_info = Gauge("sembed_model_info", "the models served (value 1)",
                                ["model", "dimension", "max_seq_length", "device", "sha256"], registry=r)
        self.rejected = Counter("sembed_rejected_requests", "requests refused for want of a permit (429)", registry=r)
        self.texts = Counter("sembed_embedded_texts", "texts embedded", registry=r)
        self.tokens = Counter("sembed_embedded_tokens", "non-padding tokens embedded", registry=r)
        self.input_tokens = BulkHistogram("sembed_input_length_tokens", "tokens per input, after truncation",
                                          _TOKEN_BUCKETS, r)
        self.tokenization_seconds = Histogram("sembed_tokenization_duration_seconds", "tokenisation per request",
                                              buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("sembed_queue_duration_seconds", "wait before a request's first pass",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram(
            "sembed_batch_size", "rows per forward pass", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r
        )
        self.batch_tokens = Histogram("sembed_batch_tokens", "tokens per forward pass, padding included",
                                      buckets=_TOKEN_BUCKETS, registry=r)
        self.inference_seconds = Histogram(
            "sembed_inference_duration_seconds", "forward pass latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_rows = Gauge("sembed_queue_size", "inputs waiting for a forward pass", registry=r)
        self.index_documents = Gauge("sembed_index_documents", "documents in the search index", registry=r)

    def observe_request(self, tokenization_s: float, queue_s: float, lengths: list[int]) -> None:
        self.tokenization_seconds.observe(tokenization_s)
        self.queue_seconds.observe(queue_s)
        self.input_tokens.observe_many(lengths)

    def observe_pass(self, rows: int, tokens: int, padded_tokens: int, seconds: float) -> None:
        self.batch_size.observe(rows)
        self.batch_tokens.observe(padded_tokens)
        self.texts.inc(rows)
        self.tokens.inc(tokens)
        self.inference_seconds.observe(seconds)


class BulkHistogram:
    """A histogram fed all of a request's observations at once (one per input): one lock for them all
    and a bisect per value, where a prometheus Histogram takes a whole observe() call per value."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry):
        self.name, self.documentation = name, documentation
        self._bounds = [float(b) for b in buckets]
        self._counts = [0] * (len(buckets) + 1)  # the last bucket is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, values: Sequence[float]) -> None:
        bounds, counts = self._bounds, self._counts
        with self._lock:
            for v in values:
                counts[bisect_left(bounds, v)] += 1  # Prometheus buckets are "value <= le"
            self._sum += sum(values)

    def collect(self):
        with self._lock:
            cumulative, total = list(accumulate(self._counts)), self._sum
        bounds = [*map(floatToGoString, self._bounds), "+Inf"]
        yield HistogramMetricFamily(self.name, self.documentation, sum_value=total,
                                    buckets=list(zip(bounds, cumulative)))
