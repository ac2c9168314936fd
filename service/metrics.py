"""Prometheus metrics, on a registry of the app's own so several apps can live in one process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sembed_requests", "HTTP requests", ["route", "status"], registry=r)
        self.request_seconds = Histogram(
            "sembed_request_duration_seconds", "HTTP request latency", ["route"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.texts = Counter("sembed_embedded_texts", "texts embedded", registry=r)
        self.tokens = Counter("sembed_embedded_tokens", "non-padding tokens embedded", registry=r)
        self.batch_size = Histogram(
            "sembed_batch_size", "texts per forward pass", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r
        )
        self.inference_seconds = Histogram(
            "sembed_inference_duration_seconds", "forward pass latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_texts = Gauge("sembed_queue_texts", "texts waiting for a forward pass", registry=r)
        self.index_documents = Gauge("sembed_index_documents", "documents in the search index", registry=r)

    def observe_batch(self, size: int, tokens: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.texts.inc(size)
        self.tokens.inc(tokens)
        self.inference_seconds.observe(seconds)
