"""FastAPI's native OpenTelemetry: off by default (it costs every request a provider lookup), on with
SEMBED_OPENTELEMETRY=true for deployments that configure a provider."""

from __future__ import annotations

import httpx
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine
from service.settings import Settings
from tests.conftest import LiveServer

sdk = pytest.importorskip("opentelemetry.sdk.trace")


@pytest.fixture(scope="module")
def spans():
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # process-wide, once: apps that leave telemetry off ignore it
    return exporter


@pytest.mark.parametrize("enabled", [False, True])
def test_spans_only_when_asked_for(spans, enabled):
    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(FakeBackend(name="fake")))
    spans.clear()
    with LiveServer(Settings(backend="fake", opentelemetry=enabled), registry) as server:
        r = httpx.post(server.url + "/embed", json={"inputs": ["a text"]})
        assert r.status_code == 200
    names = [s.name for s in spans.get_finished_spans()]
    if enabled:
        assert any("/embed" in n for n in names), names
    else:
        assert names == []
