"""The local index in a process of its own: its one writer (WAL, snapshots, FAISS), reached by every
API process over ZeroMQ.

`IndexClient` has the VectorIndex interface (blocking calls, which the routes already make from
their thread pool); `IndexServer` runs each call on the index in its own thread pool. Messages are
a msgpack header naming the method, with the index's dataclasses as tagged maps and numpy arrays as
raw buffers. Errors cross as the same VectorIndexError classes. Two calls stream: `scan` (pages pulled by
the client) and `replace_collection` (batches pushed by the client), which re-embedding uses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from service.index import base

log = logging.getLogger("sembed.index")

_TYPES = {c.__name__: c for c in (base.ModelStamp, base.CollectionSpec, base.CollectionInfo, base.Document,
                                   base.Record, base.Hit, base.WriteResult, base.SearchParams)}
_ERRORS = {c.__name__: c for c in (base.VectorIndexError, base.CollectionNotFound, base.CollectionExists,
                                    base.ModelMismatch, base.InvalidRequest, base.NotDurable)}
_ARRAY = 1  # msgpack extension code: dtype, shape, raw bytes
#: the VectorIndex methods a client may call
METHODS = {"create_collection", "drop_collection", "list_collections", "info", "upsert", "get", "delete", "clear",
           "search"}


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return msgpack.ExtType(_ARRAY, msgpack.packb((array.dtype.str, array.shape, array.tobytes())))
    if dataclasses.is_dataclass(value):
        return {"__type__": type(value).__name__, **{f.name: getattr(value, f.name) for f in dataclasses.fields(value)}}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot send {type(value).__name__} to the index process")


def _ext(code: int, data: bytes) -> Any:
    dtype, shape, raw = msgpack.unpackb(data)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _object(value: dict) -> Any:
    kind = value.pop("__type__", None)
    return _TYPES[kind](**value) if kind is not None else value


def encode(message: Any) -> bytes:
    return msgpack.packb(message, default=_default, use_bin_type=True)


def decode(frame: bytes) -> Any:
    return msgpack.unpackb(frame, object_hook=_object, ext_hook=_ext, raw=False, strict_map_key=False)


class IndexClient:
    """The index in the writer process, as a VectorIndex (call from threads: one socket per thread)."""

    def __init__(self, endpoint: str, timeout_s: float = 300.0):
        self.endpoint = endpoint
        self.timeout_ms = int(timeout_s * 1000)
        self._local = threading.local()
        self._sockets: list[zmq.Socket] = []
        self._lock = threading.Lock()

    def _socket(self) -> zmq.Socket:
        socket = getattr(self._local, "socket", None)
        if socket is None:
            socket = zmq.Context.instance().socket(zmq.REQ)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVTIMEO, self.timeout_ms)
            socket.setsockopt(zmq.REQ_RELAXED, 1)  # after a timeout the next request may go out
            socket.setsockopt(zmq.REQ_CORRELATE, 1)
            socket.connect(self.endpoint)
            self._local.socket = socket
            with self._lock:
                self._sockets.append(socket)
        return socket

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        socket = self._socket()
        socket.send(encode({"method": method, "args": args, "kwargs": kwargs}))
        try:
            reply = decode(socket.recv())
        except zmq.Again:
            raise base.NotDurable(f"the index process did not answer {method} in time") from None
        if "error" in reply:
            error = _ERRORS.get(reply["error"], base.VectorIndexError)
            raise error(reply["message"], reply["status"]) if error is base.NotDurable else error(reply["message"])
        return reply["result"]

    def __getattr__(self, method: str):
        if method not in METHODS:
            raise AttributeError(method)
        return lambda *args, **kwargs: self._call(method, *args, **kwargs)

    def scan(self, name: str, batch: int = 1000):
        stream = self._call("scan", name, batch)
        while (records := self._call("_next", stream)) is not None:
            yield records

    def replace_collection(self, spec: base.CollectionSpec, batches) -> base.WriteResult:
        stream = self._call("replace_collection", spec)
        try:
            for documents, vectors in batches:
                self._call("_feed", stream, documents, vectors)
        except BaseException:
            self._call("_feed", stream, None, None, abort=True)
            raise
        return self._call("_end", stream)

    def close(self) -> None:
        with self._lock:
            for socket in self._sockets:
                socket.close()
            self._sockets.clear()


class _Aborted(Exception):
    pass


class IndexServer:
    def __init__(self, index: base.VectorIndex, endpoint: str, threads: int = 8):
        self.index = index
        self.endpoint = endpoint
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="index")
        self._streams: dict[int, Any] = {}
        self._ids = itertools.count(1)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def serve(self) -> None:
        socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 1000)
        socket.bind(self.endpoint)
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Future] = set()

        async def handle(*envelope: bytes) -> None:  # [identity, REQ_CORRELATE's id, b"", payload]
            *route, frame = envelope
            call = decode(frame)
            try:
                result = await loop.run_in_executor(self._pool, self._run, call)
                reply = {"result": result}
            except base.VectorIndexError as e:
                reply = {"error": type(e).__name__, "message": str(e), "status": e.status}
            except Exception as e:
                log.exception("index call %s failed", call.get("method"))
                reply = {"error": "VectorIndexError", "message": f"internal error in the index: {e}", "status": 500}
            await socket.send_multipart([*route, encode(reply)])

        receiver = None
        while not self._stop.is_set():
            receiver = receiver or asyncio.ensure_future(socket.recv_multipart())
            stopping = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait({receiver, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if receiver in done:
                task = asyncio.ensure_future(handle(*receiver.result()))
                pending.add(task)
                task.add_done_callback(pending.discard)
                receiver = None
        if receiver is not None:
            receiver.cancel()
        if pending:  # acknowledged writes are answered before the process ends
            await asyncio.wait(pending)
        socket.close()
        self._pool.shutdown(wait=True)

    def _run(self, call: dict) -> Any:
        method, args, kwargs = call["method"], call["args"], call["kwargs"]
        if method in METHODS:
            return getattr(self.index, method)(*args, **kwargs)
        if method == "scan":
            return self._open(iter(self.index.scan(*args)))
        if method == "_next":
            return next(self._streams[args[0]], None) if args[0] in self._streams else None
        if method == "replace_collection":
            return self._start_replace(args[0])
        if method == "_feed":
            self._streams[args[0]][0].put(_Aborted() if kwargs.get("abort") else (args[1], args[2]))
            return None
        if method == "_end":
            feed, done = self._streams.pop(args[0])
            feed.put(None)
            return done.result()
        raise base.InvalidRequest(f"unknown index call {method!r}")

    def _open(self, stream: Any) -> int:
        key = next(self._ids)
        self._streams[key] = stream
        return key

    def _start_replace(self, spec: base.CollectionSpec) -> int:
        feed: queue.Queue = queue.Queue(maxsize=4)

        def batches():
            while (item := feed.get()) is not None:
                if isinstance(item, _Aborted):
                    raise item
                yield item

        done = self._pool.submit(self.index.replace_collection, spec, batches())
        return self._open((feed, done))


def run(settings, endpoint: str) -> None:
    """The index process's main: open the index, serve until SIGTERM, close it (snapshot) and exit."""
    from service.index import open_configured

    index = open_configured(settings)
    server = IndexServer(index, endpoint)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # SIGTERM from the supervisor, once the API processes have drained; Ctrl-C is the supervisor's to handle
        loop.add_signal_handler(signal.SIGTERM, server.stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        await server.serve()

    try:
        asyncio.run(main())
    finally:
        index.close()
