"""The HTTP layer over the fake backend, as a hostile client would try it: labels, sizes, slow and
vanishing clients, overload, failures, and each API family's error body."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import httpx
import pytest

from service.api.registry import ModelRegistry
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine, EngineConfig
from service.settings import Settings
from tests.conftest import LiveServer, until, wait_until


@pytest.fixture(scope="module")
def fake():
    backend = FakeBackend(name="fake-a", max_seq_length=32)
    other = FakeBackend(name="fake-b", dimension=4)
    registry = ModelRegistry()
    engine = Engine(backend, EngineConfig.from_settings(max_queued_inputs=8))
    registry.add_in_process("fake-a", engine)
    registry.add_in_process("fake-b", Engine(other))
    settings = Settings(backend="fake", max_request_bytes=4096, body_timeout_s=0.5, header_timeout_s=0.5,
                        max_client_batch_size=16)
    with LiveServer(settings, registry) as server:
        server.backend, server.engine = backend, engine
        yield server


@pytest.fixture
def client(fake):
    fake.backend.gate.set()
    with httpx.Client(base_url=fake.url, timeout=10) as c:
        yield c
    fake.backend.gate.set()


def raw_request(url: str, data: bytes, read: bool = True, timeout: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        if not read:
            return b""
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and b"content-length" in b"".join(chunks).lower():
                head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                if len(body) >= length:
                    break
        return b"".join(chunks)


@pytest.mark.parametrize("label", [None, "application/x-www-form-urlencoded", "text/plain", "multipart/form-data"])
def test_bodies_a_web_page_could_send_without_preflight_get_415(client, label):
    headers = {"content-type": label} if label else {}
    for method, path in (("POST", "/embed"), ("POST", "/index/documents"), ("POST", "/v1/embeddings")):
        r = client.request(method, path, content=b'{"inputs": ["x"]}', headers=headers)
        assert r.status_code == 415, (path, r.text)
        assert "--json" in str(r.json())
    if label is None:  # httpx labels nothing when told nothing: prove the header really is absent
        raw = raw_request(client.base_url.__str__(), b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n"
                                                     b"Connection: close\r\n\r\n{\"inputs\":\"x\"}")
        assert raw.startswith(b"HTTP/1.1 415")


def test_an_integer_of_thousands_of_digits_is_a_400_not_a_crash():
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(FakeBackend()))
    with TestClient(create_app(Settings(backend="fake"), registry)) as c:
        for path in ("/embed", "/v1/embeddings", "/"):
            body = b'{"inputs": ' + b"9" * 10_000 + b"}"
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and "could not be parsed" in r.text, (path, r.text)


def test_json_labels_are_accepted(client):
    for label in ("application/json", "application/json; charset=utf-8", "application/vnd.api+json"):
        assert client.post("/embed", content=b'{"inputs": "x"}', headers={"content-type": label}).status_code == 200


@pytest.mark.parametrize("body, status, says", [
    (b'{"inputs": ["x"', 422, "not valid JSON"),
    (b"\xff\xfe{", 400, "could not be parsed"),
    (b"[" * 2000 + b"]" * 2000, 400, "could not be parsed"),  # past the parser's recursion limit
    (b"", 422, "body"),
])
def test_a_body_that_is_not_json_says_where(client, body, status, says):
    for path in ("/embed", "/similarity", "/v1/embeddings", "/search", "/"):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (path, r.text)
        message = r.json()["error"]["message"] if path.startswith("/v1/") else r.json()["error"]
        assert says in message, (path, message)


def test_body_over_the_byte_limit_gets_413_before_it_is_read(client):
    r = client.post("/embed", json={"inputs": ["x" * 5000]})
    assert r.status_code == 413 and "4096" in r.json()["error"]

    def chunks():  # no Content-Length: the limit holds while streaming too
        for _ in range(100):
            yield b"x" * 1000

    r = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_a_body_that_never_finishes_gets_408(fake):
    start = time.monotonic()
    reply = raw_request(fake.url, b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 100\r\n\r\n{\"inputs\": ")
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive" in reply
    # a timeout contract: the 408 comes at the 0.5 s body deadline, not when the client gives up; 5 s is 10x the
    # deadline, room for a loaded machine
    assert time.monotonic() - start < 5


def test_headers_that_never_finish_get_408_and_the_connection_closes(fake):
    start = time.monotonic()
    reply = raw_request(fake.url, b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
    assert reply.startswith(b"HTTP/1.1 408") and b"headers too slow" in reply
    assert time.monotonic() - start < 5  # a timeout contract, as the body's 408 above
    # a healthy keep-alive connection is not cut between its requests by the header deadline: it lives past it
    with httpx.Client(base_url=fake.url) as c:
        opened = time.monotonic()
        assert c.post("/embed", json={"inputs": "x"}).status_code == 200
        # the condition is time itself: the connection has been open longer than the 0.5 s header deadline
        wait_until(lambda: time.monotonic() > opened + 0.6, what="the connection to outlive the header deadline")
        for _ in range(2):
            assert c.post("/embed", json={"inputs": "x"}).status_code == 200


def departed(client) -> float:
    """The /embed requests counted 499 (the client left) so far."""
    found = re.search(r'sembed_requests_total\{route="/embed",status="499"\} (\S+)', client.get("/metrics").text)
    return float(found.group(1)) if found else 0.0


def test_clients_that_disconnect_take_their_texts_with_them(fake, client):
    backend = fake.backend
    backend.gate.clear()
    backend.at_gate.clear()  # set by an earlier test's pass: here it tells that the blocker's pass holds the model
    before = sum(map(len, backend.passes))
    gone = departed(client)
    blocker = []

    async def hold():  # one request holds the model, then 6 clients queue 2 texts each and hang up
        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as c:
            task = asyncio.ensure_future(c.post("/embed", json={"inputs": ["blocker"]}))
            await until(backend.at_gate.is_set, what="the blocker's pass to hold the model")
            for i in range(6):
                body = f'{{"inputs": ["gone {i} a", "gone {i} b"]}}'.encode()
                raw_request(fake.url, b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body), read=False)
            # each departure is seen (its request cancelled, counted 499) while the model is still held
            await until(lambda: departed(client) == gone + 6, what="6 requests counted 499")
            backend.gate.set()
            blocker.append(await task)

    asyncio.run(hold())
    assert blocker[0].status_code == 200
    ran = sum(map(len, backend.passes)) - before
    assert ran == 1, f"{ran - 1} texts of departed clients were embedded"
    metrics = client.get("/metrics").text
    assert 'sembed_requests_total{route="/embed",status="499"}' in metrics


def test_overload_is_an_immediate_429_with_retry_after(fake, client):
    fake.backend.gate.clear()

    async def flood():
        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as c:
            held = [asyncio.ensure_future(c.post("/embed", json={"inputs": ["a", "b", "c", "d"]})) for _ in range(2)]
            await until(lambda: fake.engine.in_flight == 8, what="8 of 8 permits taken")
            rejected = await c.post("/embed", json={"inputs": ["one more"]})
            openai = await c.post("/v1/embeddings", json={"input": "one more", "model": "fake-a"})
            # answered at once, not after the queue drains: the model is still held at the gate, nothing has run
            waiting = not any(task.done() for task in held) and fake.engine.in_flight == 8
            fake.backend.gate.set()
            return rejected, openai, waiting, await asyncio.gather(*held)

    rejected, openai, waiting, held = asyncio.run(flood())
    assert rejected.status_code == 429 and rejected.headers["retry-after"] == "1"
    assert rejected.json()["error_type"] == "Overloaded"
    assert openai.status_code == 429 and openai.json()["error"]["type"] == "rate_limit_error"
    assert waiting
    assert [r.status_code for r in held] == [200, 200]


def test_a_model_failure_is_424_with_the_request_id(client):
    r = client.post("/embed", json={"inputs": ["it will FAIL"]}, headers={"x-request-id": "abc-123"})
    assert r.status_code == 424 and r.headers["x-request-id"] == "abc-123"
    assert r.json()["error_type"] == "Backend" and r.json()["request_id"] == "abc-123"
    r = client.post("/v1/embeddings", json={"input": ["FAIL"]})
    assert r.status_code == 424 and r.json()["error"]["request_id"] == r.headers["x-request-id"]


def test_error_bodies_follow_the_api_family(client):
    native = client.post("/embed", json={"inputs": []})
    assert native.status_code == 422 and native.json()["error_type"] == "Validation"
    openai = client.post("/v1/embeddings", json={"input": []})
    assert openai.status_code == 422
    assert set(openai.json()["error"]) >= {"message", "type", "param", "code"}
    assert openai.json()["error"]["type"] == "invalid_request_error"
    missing = client.post("/v1/embeddings", json={"input": "x", "model": "gpt-nothing"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_client_batch_size_limit_is_422(client):
    r = client.post("/embed", json={"inputs": ["x"] * 17})
    assert r.status_code == 422 and "max_client_batch_size" in r.json()["error"]


def test_the_registry_serves_each_model_by_name(client):
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["fake-a", "fake-b"]
    a = client.post("/v1/embeddings", json={"input": "hello", "model": "fake-a"}).json()
    b = client.post("/v1/embeddings", json={"input": "hello", "model": "fake-b"}).json()
    assert (a["model"], len(a["data"][0]["embedding"])) == ("fake-a", 8)
    assert (b["model"], len(b["data"][0]["embedding"])) == ("fake-b", 4)
    assert a["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    default = client.post("/embed", json={"inputs": "hello"}).json()
    assert len(default) == 1 and len(default[0]) == 8  # fake-a's dimension


def test_not_ready_is_503():
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(FakeBackend()))
    with TestClient(create_app(Settings(backend="fake"), registry)) as c:
        assert c.get("/readyz").status_code == 200
        registry.get().client.engine.stop()
        for r in (c.get("/readyz"), c.post("/embed", json={"inputs": "x"})):
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error_type"] == "Unhealthy"


def test_sigterm_fails_readiness_then_drains_in_flight_requests():
    import signal
    import threading

    backend = FakeBackend()
    registry = ModelRegistry()
    registry.add_in_process("fake", Engine(backend))
    settings = Settings(backend="fake", drain_delay_s=0.5, shutdown_grace_s=10)
    server = LiveServer(settings, registry).__enter__()
    backend.gate.clear()
    answers = []
    in_flight = threading.Thread(target=lambda: answers.append(httpx.post(f"{server.url}/embed",
                                                                           json={"inputs": "slow"}, timeout=20)))
    in_flight.start()
    wait_until(backend.at_gate.is_set, 10, what="the request to reach the model")
    server.server.handle_exit(signal.SIGTERM, None)
    ready = httpx.get(f"{server.url}/readyz")
    assert ready.status_code == 503 and ready.json()["error"] == "shutting down"

    def refused() -> bool:
        try:
            httpx.get(f"{server.url}/healthz", timeout=2)
        # a connection the kernel accepted as uvicorn closed its socket is reset or dropped unanswered: refused too
        except (httpx.NetworkError, httpx.RemoteProtocolError):  # NetworkError: ConnectError, ReadError (a reset)
            return True
        return False

    wait_until(refused, 10, what="uvicorn to stop accepting after the drain delay")
    assert in_flight.is_alive() and not answers  # the request still waits
    backend.gate.set()
    in_flight.join(timeout=10)
    server.thread.join(timeout=10)
    assert [a.status_code for a in answers] == [200]  # the in-flight request was answered
    assert not server.thread.is_alive() and not registry.ready  # then the process stopped cleanly


