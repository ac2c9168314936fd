"""The engine's connection: framing over a Unix stream socket, and an engine server with its clients on it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading

import numpy as np
import pytest

from service.api.client import SocketEngineClient
from service.engine.backends.fake import FakeBackend
from service.engine.core import Engine, EngineConfig
from service.engine.socket_server import EngineServer
from service.ipc.messages import (
    Embed,
    EngineUnavailable,
    Hello,
    ModelInfo,
    Ping,
    Vectors,
    Welcome,
    batch_frames,
    decode_replies,
    decode_requests,
    encode,
)
from service.ipc.stream import MAX_FRAMES, Reader, ask, socket_path, unwritten
from service.ipc.stream import encode as stream_encode
from tests.conftest import until, wait_until


def wire(frames) -> bytes:
    return b"".join(bytes(memoryview(b).cast("B")) for b in stream_encode(frames))


def test_messages_come_out_whole_however_the_stream_is_cut():
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    messages = [[b"header", vectors.data], [b""], [b"x" * 70_000, b"y", b""]]
    stream = b"".join(wire(m) for m in messages)
    expected = [[bytes(memoryview(f).cast("B")) for f in m] for m in messages]
    for piece in (1, 3, 4, 7, 1000, len(stream)):
        reader, out = Reader(), []
        for at in range(0, len(stream), piece):
            out += reader.feed(stream[at:at + piece])
        assert [[bytes(f) for f in m] for m in out] == expected, piece
    assert np.array_equal(np.frombuffer(out[0][1], dtype=np.float32).reshape(3, 4), vectors)


def test_a_corrupt_stream_is_refused_not_buffered():
    with pytest.raises(ValueError, match="corrupt"):
        Reader().feed((MAX_FRAMES + 1).to_bytes(4, "little"))


def test_a_partial_write_leaves_the_rest_in_order():
    buffers = [b"abc", memoryview(np.arange(2, dtype=np.float32)), b"xy"]
    everything = b"".join(bytes(memoryview(b).cast("B")) for b in buffers)
    for n in range(len(everything) + 1):
        rest = unwritten(buffers, n)
        assert b"".join(bytes(memoryview(b).cast("B")) for b in rest) == everything[n:]


def test_an_engine_endpoint_is_a_unix_socket_path():
    assert socket_path("ipc:///run/sembed/engine-1.sock") == "/run/sembed/engine-1.sock"
    with pytest.raises(ValueError, match="ipc://"):
        socket_path("tcp://127.0.0.1:5555")


class Served:
    """An engine server on the fake backend, in a thread, as an engine process runs it."""

    def __init__(self, endpoint: str, dimension: int = 8):
        self.backend = FakeBackend(dimension=dimension, max_seq_length=64)
        self.engine = Engine(self.backend, EngineConfig.from_settings(max_queue_wait_s=60))
        self.engine.start()
        self.server = EngineServer(self.engine, endpoint)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        wait_until(lambda: ask(endpoint, encode(Ping()), timeout_s=1) is not None, 10,
                   what="the engine server to answer a ping")

    def stop(self) -> None:
        self.backend.gate.set()
        self.server.stop()
        self.thread.join(10)
        self.engine.stop()


@pytest.fixture
def endpoint(tmp_path):
    return f"ipc://{tmp_path}/engine.sock"


class SilentEngine:
    """Says hello, then takes requests and never answers: an engine that is about to die."""

    def __init__(self, endpoint: str, info: ModelInfo):
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(socket_path(endpoint))
        self.listener.listen(1)
        self.info = info
        self.requests: list[Embed] = []
        self.connection: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.connection, _ = self.listener.accept()
        reader = Reader()
        with contextlib.suppress(OSError):
            while data := self.connection.recv(65536):
                for frames in reader.feed(data):
                    for request, _ in decode_requests(frames):
                        if isinstance(request, Hello):
                            self.connection.sendall(wire(encode(Welcome(request.id, self.info, 1))))
                        elif isinstance(request, Embed):
                            self.requests.append(request)

    def die(self) -> None:
        self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()
        self.listener.close()


def test_large_answers_cross_whole(endpoint):
    served = Served(endpoint, dimension=384)

    async def main():
        client = await SocketEngineClient(endpoint).connect(timeout_s=10)
        try:
            batch = served.backend.tokenize([f"w{i} w{i + 1} w{i + 2}" for i in range(256)])
            # 256 × 384 float32 answers, three at once: more than a Unix socket's buffer takes in one write
            results = await asyncio.gather(*(client.embed(batch) for _ in range(3)))
            expected, _ = served.backend.run(batch, 64)
            for result in results:
                assert result.vectors.shape == (256, 384)
                assert np.allclose(result.vectors, expected, atol=1e-6)
        finally:
            await client.close()

    try:
        asyncio.run(main())
    finally:
        served.stop()


def test_an_engine_that_dies_fails_its_requests_at_once_and_a_new_one_is_reconnected(endpoint, monkeypatch):
    import service.api.client as engine_client

    # the heartbeat would fail the request too ("stopped answering"), 0.8 s after the last pong: pushed far away,
    # only the closed connection can fail it within the wait below
    monkeypatch.setattr(engine_client, "DEAD_AFTER_S", 60)
    info = FakeBackend().info

    async def main():
        silent = SilentEngine(endpoint, info)
        client = await SocketEngineClient(endpoint).connect(timeout_s=10)
        try:
            waiting = asyncio.ensure_future(client.embed(FakeBackend().tokenize(["a b"])))
            await until(lambda: silent.requests, 10, what="the silent engine to receive the request")
            assert not waiting.done()
            silent.die()
            # at once: by the close, which the message names (the heartbeat's would say "stopped answering", and
            # is 60 s away); 5 s is a bound for a loaded machine, not a measurement
            with pytest.raises(EngineUnavailable, match="closed the connection"):
                await asyncio.wait_for(waiting, 5)
            with pytest.raises(EngineUnavailable):  # nothing there: refused at once, not queued
                await client.embed(FakeBackend().tokenize(["a b"]))
            os.unlink(socket_path(endpoint))
            restarted = await asyncio.to_thread(Served, endpoint)  # a new engine at the same address
            try:
                await until(lambda: client.ready, 10, what="the client to reconnect to the restarted engine")
                result = await client.embed(restarted.backend.tokenize(["a b"]))
                assert result.vectors.shape == (1, 8)
            finally:
                await asyncio.to_thread(restarted.stop)
        finally:
            await client.close()

    asyncio.run(main())


def test_a_connection_that_closes_drops_its_queued_rows(endpoint):
    served = Served(endpoint)
    try:
        served.backend.gate.clear()  # the first pass waits: the next request's rows stay queued
        hello = ask(endpoint, encode(Hello(0)), timeout_s=5)
        assert hello is not None
        ((welcome, _),) = decode_replies(hello)
        assert isinstance(welcome, Welcome) and welcome.info.dimension == 8
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(socket_path(endpoint))
            for request_id, text in ((1, "a b"), (2, "c d")):  # the second while the first's pass waits
                frames = batch_frames(served.backend.tokenize([text]))
                sock.sendall(wire(encode(Embed(request_id, 1), *frames)))
                assert served.backend.at_gate.wait(5)
            wait_until(lambda: served.engine.queue.queued_rows() == 1, 10, what="the second request's row queued")
            assert served.engine.in_flight == 2 and served.engine.queue.queued_rows() == 1
        # closed: the engine released both requests (the running one is answered to no one)
        wait_until(lambda: served.engine.in_flight == 0, 10, what="the engine to release both requests")
        served.backend.gate.set()
        # a later request, answered, proves the dropped row is gone: still queued, it would have run before or with it
        later = batch_frames(served.backend.tokenize(["e f g"]))
        assert ask(endpoint, encode(Embed(3, 1), *later), timeout_s=10) is not None
        # the first request's pass ([CLS] a b [SEP]), then the later one's alone: the queued row never ran
        assert served.backend.passes == [[4], [5]]
    finally:
        served.stop()


def test_asking_where_nothing_listens_answers_none(tmp_path):
    assert ask(f"ipc://{tmp_path}/nothing.sock", [b"x"], timeout_s=0.2) is None


def test_a_wake_up_read_early_never_leaves_the_engine_asleep(endpoint, monkeypatch):
    """The inference thread writes a wake-up byte only when the I/O thread is not already awake. A byte written
    while the I/O thread drains the pipe is read with it, leaving the flag set and the pipe empty: from then
    on no finished job woke the I/O thread, and every answer waited for the next message (a heartbeat, 0.2 s)
    or the select timeout (0.1 s; here 60 s, and no heartbeat)."""
    import service.api.client as engine_client
    import service.engine.socket_server as engine_server

    monkeypatch.setattr(engine_server, "POLL_MS", 60_000)
    monkeypatch.setattr(engine_client, "HEARTBEAT_S", 30)  # its pings would wake the engine too
    served = Served(endpoint)
    try:
        served.server._awake = True  # the state that race leaves: awake by the flag, nothing in the pipe

        async def main():
            client = await SocketEngineClient(endpoint).connect(timeout_s=10)
            try:
                for _ in range(3):
                    # a timeout contract: woken by its finished job, not the 60 s select timeout (20 s: room for
                    # a loaded machine, far below the timeout that the lost wake-up would wait for)
                    await asyncio.wait_for(client.embed(served.backend.tokenize(["a b"])), 20)
            finally:
                await client.close()

        asyncio.run(main())
    finally:
        served.stop()


def test_a_header_that_is_no_request_is_dropped_and_never_dispatched(endpoint, caplog):
    """The engine decodes headers into its request types only: a private method's name, the old dict shape or a
    reply is logged and dropped, nothing is called, and the connection goes on serving."""
    import msgpack

    served = Served(endpoint)
    try:
        batch = batch_frames(served.backend.tokenize(["a b"]))
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(socket_path(endpoint))
            for wrong in ([msgpack.packb({"op": "_close", "id": 1})], [msgpack.packb([7, 1])],  # 7: Pong's tag
                          [msgpack.packb({"op": "embed", "id": 2, "rows": 1}), *batch], []):  # []: no frame at all
                sock.sendall(wire(wrong))
            sock.sendall(wire(encode(Embed(3, 1), *batch)))
            reader, answers = Reader(), []
            sock.settimeout(10)
            while not answers:
                data = sock.recv(65536)
                assert data, "the engine closed the connection instead of answering the request after them"
                answers = reader.feed(data)
        ((vectors, frames),) = decode_replies(answers[0])
        assert isinstance(vectors, Vectors) and vectors.id == 3 and vectors.shape == (1, 8)
        assert sum("is not a request" in r.getMessage() for r in caplog.records) == 4
        assert served.engine.in_flight == 0 and served.backend.passes == [[4]]
    finally:
        served.stop()
