"""How the routes reach an engine: one interface, in process (tests) or over ZeroMQ (the service).

vLLM's `EngineCoreClient` pattern: the routes call `await client.embed(batch)` and never know
where the engine runs. `ZmqEngineClient` sends token ids as raw buffers to the engine process's
ROUTER socket and matches answers by request id; a heartbeat notices an engine that died, and
every request it held fails with EngineUnavailable (503) within a second instead of hanging.
When the supervisor restarts the engine on the same address, the socket reconnects by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any, Protocol, cast

import numpy as np
import zmq
import zmq.asyncio

from service.ipc.messages import (
    EmbedResult,
    EngineUnavailable,
    ModelInfo,
    TokenBatch,
    batch_frames,
    bundle,
    pack,
    raise_error,
    unbundle,
    unpack,
)

log = logging.getLogger("sembed.client")

#: how often a client pings its engine, and how long without an answer means it is gone
HEARTBEAT_S = 0.2
DEAD_AFTER_S = 0.8


class EngineClient(Protocol):
    info: ModelInfo

    @property
    def ready(self) -> bool: ...

    async def embed(self, batch: TokenBatch, *, normalize: bool = True,
                    timeout_s: float | None = None) -> EmbedResult: ...

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

    async def embed(self, batch: TokenBatch, *, normalize: bool = True,
                    timeout_s: float | None = None) -> EmbedResult:
        return await self.engine.embed(batch, normalize=normalize, timeout_s=timeout_s)

    async def health(self) -> None:
        await asyncio.to_thread(self.engine.backend.health)

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.stop)


class ZmqEngineClient:
    """A plain (blocking-API) DEALER socket driven by the event loop: sends never block (NOBLOCK), and
    replies are read when the socket's file descriptor turns readable, each resolving its request's future
    directly. zmq.asyncio would add a future, poller events and a flags computation to every send and
    receive; this is the API process's hottest path."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        # set by connect(), which every caller awaits before using the client
        self.info: ModelInfo  # from the engine's hello
        self._socket: zmq.Socket | None = None  # None: never connected
        self._loop: asyncio.AbstractEventLoop
        self._fd: int
        self._drain_scheduled = False
        # messages of this loop turn, (header, buffers) each, sent together
        self._outbox: list[tuple[tuple[dict[str, Any], list], asyncio.Future]] = []
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._sent_to: dict[int, int | None] = {}  # request id → the engine pid it was sent to
        self._tasks: list[asyncio.Task] = []
        self._last_pong = 0.0
        self._engine_ready = False
        self.engine_pid: int | None = None

    async def connect(self, timeout_s: float = 600.0) -> ZmqEngineClient:
        """Connect and wait for the engine's hello (it may still be loading its model)."""
        # the asyncio context's I/O thread, shared with this process's other sockets; a plain socket on it
        # (pyzmq's stubs tie socket_class to the context's own socket class; its docs allow this mix)
        context = zmq.asyncio.Context.instance()
        socket: zmq.Socket = context.socket(zmq.DEALER, socket_class=zmq.Socket)  # type: ignore[arg-type]
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for an engine that is not there: fail at once
        socket.connect(self.endpoint)
        self._socket = socket
        self._loop = asyncio.get_running_loop()
        self._fd = socket.fileno()  # getsockopt(zmq.FD), typed
        self._loop.add_reader(self._fd, self._drain)
        self._tasks = [asyncio.ensure_future(self._heartbeat())]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                header, _ = await self._call({"op": "hello"}, timeout_s=1.0)
                break
            except (EngineUnavailable, TimeoutError):
                if time.monotonic() > deadline:
                    await self.close()
                    raise EngineUnavailable(f"no engine answered at {self.endpoint} in {timeout_s:.0f} s") from None
                await asyncio.sleep(0.1)
        self.info = ModelInfo(**header["info"])
        self.engine_pid = header["pid"]
        self._last_pong = time.monotonic()
        self._engine_ready = True
        return self

    @property
    def ready(self) -> bool:
        return self._engine_ready and time.monotonic() - self._last_pong < DEAD_AFTER_S

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def embed(self, batch: TokenBatch, *, normalize: bool = True,
                    timeout_s: float | None = None) -> EmbedResult:
        header = {"op": "embed", "normalize": normalize, "timeout_s": timeout_s, "rows": len(batch)}
        reply, frames = await self._call(header, batch_frames(batch))
        vectors = np.frombuffer(frames[0], dtype="<f4").reshape(reply["shape"])
        return EmbedResult(vectors, reply["prompt_tokens"], reply["queue_s"], reply["inference_s"])

    async def health(self) -> None:
        await self._call({"op": "health"}, timeout_s=30.0)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._fail_pending("the engine client closed")
        if self._socket is not None and not self._socket.closed:
            self._loop.remove_reader(self._fd)
            self._socket.close()

    async def _call(self, header: dict[str, Any], frames: list | None = None,
                    timeout_s: float | None = None) -> tuple[dict[str, Any], list]:
        request_id = next(self._ids)
        future = self._loop.create_future()
        self._pending[request_id] = future
        self._sent_to[request_id] = self.engine_pid
        try:
            if not self._outbox:
                self._loop.call_soon(self._flush)
            self._outbox.append((({**header, "id": request_id}, frames or []), future))
            if timeout_s is None:
                reply, frames = await future
            else:
                async with asyncio.timeout(timeout_s):
                    reply, frames = await future
        except asyncio.CancelledError:
            if header["op"] == "embed":  # the caller left: the engine drops its rows not yet run
                with contextlib.suppress(zmq.ZMQError):
                    self._send([pack({"op": "cancel", "id": request_id})])
            raise
        finally:
            self._pending.pop(request_id, None)
            self._sent_to.pop(request_id, None)
        if "error" in reply:
            raise_error(reply)
        return reply, frames

    def _flush(self) -> None:
        """This loop turn's requests, in one ZeroMQ message."""
        outbox, self._outbox = self._outbox, []
        if not outbox or self._socket is None or self._socket.closed:
            return
        try:
            self._send(bundle([message for message, _ in outbox]))
        except zmq.Again:
            for _, future in outbox:
                if not future.done():
                    future.set_exception(EngineUnavailable(f"the engine at {self.endpoint} is not running "
                                                           "(restarting?)"))

    def _send(self, frames: list) -> None:
        socket = self._socket
        if socket is None:
            raise RuntimeError("ZmqEngineClient: send before connect()")
        socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        # ZeroMQ's descriptor is edge-triggered and a send may consume the edge of a reply that came
        # meanwhile: look, and read on the loop's next turn if one is there
        if not self._drain_scheduled and cast(int, socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._drain_scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Every reply waiting, until zmq.Again (the descriptor only signals a change)."""
        self._drain_scheduled = False
        socket = self._socket
        if socket is None or socket.closed:
            return
        while True:
            try:
                header_frame, *frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            for header, buffers in unbundle(unpack(header_frame.buffer), [f.buffer for f in frames]):
                if header.get("op") == "pong":
                    self._pong(header)
                    continue
                future = self._pending.get(header.get("id", 0))  # request ids start at 1
                if future is not None and not future.done():
                    future.set_result((header, buffers))

    def _pong(self, header: dict[str, Any]) -> None:
        self._last_pong = time.monotonic()
        self._engine_ready = header["ready"]
        if header["pid"] != self.engine_pid and self.engine_pid is not None:
            # a restarted engine never saw what was sent to the one that died: fail those now
            log.info("engine at %s is now pid %d (was %d)", self.endpoint, header["pid"], self.engine_pid)
            self._fail_pending("the engine process was restarted", sent_to=self.engine_pid)
            self.engine_pid = header["pid"]

    async def _heartbeat(self) -> None:
        while True:
            with contextlib.suppress(zmq.ZMQError):
                self._send([pack({"op": "ping", "id": 0})])
            await asyncio.sleep(HEARTBEAT_S)
            if self._pending and time.monotonic() - self._last_pong > DEAD_AFTER_S:
                self._fail_pending(f"the engine at {self.endpoint} stopped answering (it is being restarted)")

    def _fail_pending(self, message: str, sent_to: int | None = None) -> None:
        for request_id, future in list(self._pending.items()):
            if not future.done() and (sent_to is None or self._sent_to.get(request_id) == sent_to):
                future.set_exception(EngineUnavailable(message))
