"""How the routes reach an engine: one interface, in process (tests) or over a Unix socket (the service).

vLLM's `EngineCoreClient` pattern: the routes call `await client.embed(batch)` and never know
where the engine runs. `SocketEngineClient` sends token ids as raw buffers over its connection to the engine
process's Unix socket (framed by service/ipc/stream.py) and matches answers by request id. An engine that
dies closes the connection: every request it held fails with EngineUnavailable (503) at once; a heartbeat
notices one that hangs, within a second. When the supervisor restarts the engine on the same address, the
client reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from typing import Protocol, TypeVar, cast

import numpy as np

from service.ipc.messages import (
    Cancel,
    Embed,
    EmbedResult,
    EngineUnavailable,
    Failed,
    Frames,
    Health,
    Healthy,
    Hello,
    InferenceFailed,
    ModelInfo,
    Ping,
    Pong,
    Reply,
    Request,
    TokenBatch,
    Vectors,
    Welcome,
    batch_frames,
    bundle_requests,
    decode_replies,
    encode,
)
from service.ipc.stream import Reader, socket_path
from service.ipc.stream import encode as stream_encode

log = logging.getLogger("sembed.client")

#: how often a client pings its engine, and how long without an answer means it is gone
HEARTBEAT_S = 0.2
DEAD_AFTER_S = 0.8
#: how often a client without a connection tries again
RECONNECT_S = 0.1

R = TypeVar("R", bound=Reply)


class EngineClient(Protocol):
    info: ModelInfo

    @property
    def ready(self) -> bool: ...

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered (a replaced model's client closes once this is 0)."""
        ...

    async def embed(self, batch: TokenBatch, *, normalize: bool = True, timeout_s: float | None = None,
                    tokens: bool = False) -> EmbedResult: ...

    async def health(self) -> None: ...

    async def close(self) -> None: ...


class InProcessEngineClient:
    """The engine in this process (tests, tools): the same calls, no IPC."""

    def __init__(self, engine):
        self.engine = engine
        self.info: ModelInfo = engine.info

    @property
    def ready(self) -> bool:
        return self.engine.ready

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    async def embed(self, batch: TokenBatch, *, normalize: bool = True, timeout_s: float | None = None,
                    tokens: bool = False) -> EmbedResult:
        return await self.engine.embed(batch, normalize=normalize, timeout_s=timeout_s, tokens=tokens)

    async def health(self) -> None:
        await asyncio.to_thread(self.engine.backend.health)

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.stop)


class _Connection(asyncio.BufferedProtocol):
    """The client's side of one connection: the socket reads straight into the reader's buffer; whole messages
    go to `on_message`, and the connection's end to `on_lost`."""

    def __init__(self, on_message: Callable[[list[memoryview]], None],
                 on_lost: Callable[[_Connection], None]):
        self.on_message = on_message
        self.on_lost = on_lost
        self.reader = Reader()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        for frames in self.reader.buffer_updated(nbytes):
            self.on_message(frames)

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(self)


class SocketEngineClient:
    """One connection to an engine process, driven by the event loop: sends go to the transport's buffer and
    never block, and each reply resolves its request's future directly."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._path = socket_path(endpoint)
        # set by connect(), which every caller awaits before using the client
        self.info: ModelInfo  # from the engine's hello
        self._loop: asyncio.AbstractEventLoop
        self._transport: asyncio.Transport | None = None  # None: not connected (yet, or any more)
        self._connection: _Connection | None = None
        self._disconnected = asyncio.Event()
        self._closed = False
        # messages of this loop turn, (header, buffers) each, sent together
        self._outbox: list[tuple[tuple[Request, Frames], asyncio.Future[tuple[Reply, Frames]]]] = []
        self._ids = itertools.count(1)  # request ids start at 1: a Ping's 0 is no request's
        self._pending: dict[int, asyncio.Future[tuple[Reply, Frames]]] = {}
        self._tasks: list[asyncio.Task] = []
        self._last_pong = 0.0
        self._engine_ready = False
        self.engine_pid: int | None = None

    async def connect(self, timeout_s: float = 600.0) -> SocketEngineClient:
        """Connect and wait for the engine's hello (it may still be loading its model)."""
        self._loop = asyncio.get_running_loop()
        self._disconnected.set()
        self._tasks = [asyncio.ensure_future(self._stay_connected()), asyncio.ensure_future(self._heartbeat())]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                welcome, _ = await self._call(Hello(next(self._ids)), Welcome, timeout_s=1.0)
                break
            except (EngineUnavailable, TimeoutError):
                if time.monotonic() > deadline:
                    await self.close()
                    raise EngineUnavailable(f"no engine answered at {self.endpoint} in {timeout_s:.0f} s") from None
                await asyncio.sleep(RECONNECT_S)
        self.info = welcome.info
        self.engine_pid = welcome.pid
        self._last_pong = time.monotonic()
        self._engine_ready = True
        return self

    @property
    def ready(self) -> bool:
        return self._engine_ready and time.monotonic() - self._last_pong < DEAD_AFTER_S

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def embed(self, batch: TokenBatch, *, normalize: bool = True, timeout_s: float | None = None,
                    tokens: bool = False) -> EmbedResult:
        """`batch`'s vectors, [n, dim]; with `tokens`, every row's token states end to end, [total tokens, hidden]
        (TEI's /embed_all)."""
        request = Embed(next(self._ids), len(batch), normalize, timeout_s, tokens)
        reply, frames = await self._call(request, Vectors, batch_frames(batch))
        vectors = np.frombuffer(frames[0], dtype="<f4").reshape(reply.shape)
        return EmbedResult(vectors, reply.prompt_tokens, reply.queue_s, reply.inference_s)

    async def health(self) -> None:
        await self._call(Health(next(self._ids)), Healthy, timeout_s=30.0)

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        self._fail_pending("the engine client closed")
        if self._transport is not None:
            self._transport.close()

    async def _call(self, request: Request, expected: type[R], frames: Frames | None = None,
                    timeout_s: float | None = None) -> tuple[R, Frames]:
        """Send `request` with this loop turn's others; its answer (an `expected`), or the engine's error raised."""
        future: asyncio.Future[tuple[Reply, Frames]] = self._loop.create_future()
        self._pending[request.id] = future
        try:
            if not self._outbox:
                self._loop.call_soon(self._flush)
            self._outbox.append(((request, frames or []), future))
            if timeout_s is None:
                reply, frames = await future
            else:
                async with asyncio.timeout(timeout_s):
                    reply, frames = await future
        except asyncio.CancelledError:
            if isinstance(request, Embed):  # the caller left: the engine drops its rows not yet run
                with contextlib.suppress(EngineUnavailable):
                    self._send(encode(Cancel(request.id)))
            raise
        finally:
            self._pending.pop(request.id, None)
        if isinstance(reply, Failed):
            raise reply.exception()
        if not isinstance(reply, expected):
            raise InferenceFailed(f"the engine answered a {type(request).__name__} with a {type(reply).__name__}")
        return reply, frames

    def _flush(self) -> None:
        """This loop turn's requests, in one message."""
        outbox, self._outbox = self._outbox, []
        if not outbox:
            return
        try:
            self._send(bundle_requests([message for message, _ in outbox]))
        except EngineUnavailable as e:
            for _, future in outbox:
                if not future.done():
                    future.set_exception(e)

    def _send(self, frames: Frames) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise EngineUnavailable(f"the engine at {self.endpoint} is not running (restarting?)")
        transport.writelines(stream_encode(frames))

    def _received(self, frames: list[memoryview]) -> None:
        for reply, buffers in decode_replies(frames):
            if isinstance(reply, Pong):
                self._pong(reply)
                continue
            future = self._pending.get(reply.id)
            if future is not None and not future.done():
                future.set_result((reply, buffers))

    def _lost(self, connection: _Connection) -> None:
        if connection is not self._connection:
            return
        self._transport = self._connection = None
        self._engine_ready = False
        # what the engine held is lost with it (a restarted engine never saw it): fail it now, not at a timeout
        self._fail_pending(f"the engine at {self.endpoint} closed the connection (it is being restarted)")
        self._disconnected.set()

    async def _stay_connected(self) -> None:
        """Connect whenever there is no connection: at start, and after the engine went away."""
        while not self._closed:
            await self._disconnected.wait()
            try:
                transport, connection = await self._loop.create_unix_connection(
                    lambda: _Connection(self._received, self._lost), self._path)
            except OSError:  # not there yet, or being restarted
                await asyncio.sleep(RECONNECT_S)
                continue
            self._transport, self._connection = cast(asyncio.Transport, transport), connection
            self._disconnected.clear()

    def _pong(self, pong: Pong) -> None:
        self._last_pong = time.monotonic()
        self._engine_ready = pong.ready
        if pong.pid != self.engine_pid and self.engine_pid is not None:
            log.info("engine at %s is now pid %d (was %d)", self.endpoint, pong.pid, self.engine_pid)
            self.engine_pid = pong.pid

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(EngineUnavailable):
                self._send(encode(Ping()))
            await asyncio.sleep(HEARTBEAT_S)
            if self._pending and time.monotonic() - self._last_pong > DEAD_AFTER_S:
                self._fail_pending(f"the engine at {self.endpoint} stopped answering (it is being restarted)")

    def _fail_pending(self, message: str) -> None:
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(EngineUnavailable(message))
