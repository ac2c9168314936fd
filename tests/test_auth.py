"""API keys, CORS and the access log, over real HTTP on the fake backend."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine
from service.settings import Settings
from tests.conftest import LiveServer, wait_until


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    keys_file = tmp_path_factory.mktemp("secret") / "keys"
    keys_file.write_text("# mounted secret\nfile-key\n\n")
    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(FakeBackend(name="fake")))
    settings = Settings(backend="fake", api_keys="key-one, key-two", api_keys_file=keys_file, metrics_public=False,
                        cors_origins="https://app.example")
    with LiveServer(settings, registry) as server:
        yield server


def test_every_route_but_the_probes_needs_a_key(secured):
    with httpx.Client(base_url=secured.url) as c:
        for path in ("/healthz", "/readyz", "/health"):
            assert c.get(path).status_code == 200, path
        for method, path, body in (("POST", "/embed", {"inputs": "x"}), ("GET", "/info", None),
                                   ("GET", "/metrics", None), ("POST", "/search", {"query": "x"}),
                                   ("DELETE", "/index", None), ("GET", "/v1/models", None)):
            r = c.request(method, path, json=body)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"] == 'Bearer realm="sembed"'
        assert c.post("/embed", json={"inputs": "x"}).json()["error_type"] == "Unauthorized"
        wrong = c.post("/v1/embeddings", json={"input": "x"}, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        for key in ("key-one", "key-two", "file-key"):
            r = c.post("/embed", json={"inputs": "x"}, headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200, key
        assert c.get("/metrics", headers={"authorization": "Bearer file-key"}).status_code == 200
        assert c.get("/info", headers={"authorization": "Basic key-one"}).status_code == 401


def test_the_openai_client_sends_its_key(secured):
    from openai import AuthenticationError, OpenAI

    good = OpenAI(base_url=f"{secured.url}/v1", api_key="key-two", max_retries=0)
    assert len(good.embeddings.create(input="hello", model="fake").data[0].embedding) == 8
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{secured.url}/v1", api_key="key-three", max_retries=0).embeddings.create(input="x",
                                                                                                   model="fake")


def test_cors_preflight_for_allowed_origins_only(secured):
    with httpx.Client(base_url=secured.url) as c:
        headers = {"origin": "https://app.example", "access-control-request-method": "POST",
                   "access-control-request-headers": "authorization, content-type"}
        ok = c.options("/embed", headers=headers)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        other = c.options("/embed", headers={**headers, "origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_each_request_is_one_json_access_line(secured, caplog):
    with caplog.at_level(logging.INFO, logger="sembed.access"), httpx.Client(base_url=secured.url) as c:
        c.post("/embed", json={"inputs": "x"}, headers={"authorization": "Bearer key-one", "x-request-id": "trace-7"})

        def logged():  # the line is written just after the answer is sent
            lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "sembed.access"]
            return next((item for item in lines if item["request_id"] == "trace-7"), None)

        line = wait_until(logged, 10, what="the access line of request trace-7")
    assert line["status"] == 200 and line["route"] == "/embed" and line["method"] == "POST" and line["ms"] > 0


def test_the_error_shape_follows_the_routes_protocol_not_its_url():
    """An error is shaped by the route's API family (its router's tag): OpenAI's for the OpenAI routes,
    wherever they are raised (the guard's 401, validation, the engine), TEI's elsewhere."""
    from service.api.errors import ApiError, error_body, protocol_of

    error = ApiError(422, "bad", "Validation", param="input")
    openai_like = type("Route", (), {"tags": ["openai"]})()
    tei_like = type("Route", (), {"tags": ["embeddings"]})()
    assert error_body(protocol_of(openai_like), error, None) == {"error": {
        "message": "bad", "type": "invalid_request_error", "param": "input", "code": "invalid_request"}}
    assert error_body(protocol_of(tei_like), error, None) == {"error": "bad", "error_type": "Validation"}
    assert protocol_of(None) == "native"  # no route matched: ours
