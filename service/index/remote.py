"""The local index in a process of its own: its one writer (WAL, snapshots, FAISS), reached by every
API process over ZeroMQ.

`IndexClient` has the VectorIndex interface (blocking calls, which the routes already make from
their thread pool); `IndexServer` answers each call through its handler table, in its own thread pool.
Messages are typed (service/index/messages.py): a msgspec header per call, numpy arrays as raw frames after it;
a message that is none of them is refused with `Failed` and logged, never dispatched. Errors cross as the same
VectorIndexError classes. Two calls stream: `scan` (pages pulled by the client) and `replace_collection`
(batches pushed by the client), which re-embedding uses.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from service.index import base
from service.index import messages as m
from service.ipc.stream import Buffer

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger("sembed.index")

_ERRORS = {c.__name__: c for c in (base.VectorIndexError, base.CollectionNotFound, base.CollectionExists,
                                    base.ModelMismatch, base.InvalidRequest, base.NotDurable)}
#: what replace_collection takes: documents and their vectors, a row per chunk (and their sparse vectors, where the
#: collection keeps them)
_Batch = tuple[list[base.Document], np.ndarray] | tuple[list[base.Document], np.ndarray, base.SparseRows]


class IndexClient:
    """The index in the writer process, as a VectorIndex (call from threads: one socket per thread)."""

    def __init__(self, endpoint: str, timeout_s: float = 300.0):
        self.endpoint = endpoint
        self.timeout_ms = int(timeout_s * 1000)
        self._local = threading.local()
        self._sockets: list[zmq.Socket[bytes]] = []
        self._lock = threading.Lock()

    def _socket(self) -> zmq.Socket[bytes]:
        socket: zmq.Socket[bytes] | None = getattr(self._local, "socket", None)
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

    def _call(self, request: m.Request, answer: type[m.Answer], *arrays: Buffer) -> m.Answer:
        """Send `request` (and its arrays' bytes); its `answer`, or raise the error the index process names."""
        socket = self._socket()
        socket.send_multipart(m.encode(request, *arrays), copy=False)
        try:
            reply = m.decode_reply(answer, socket.recv())
        except zmq.Again:
            raise base.NotDurable(f"the index process did not answer {type(request).__name__} in time") from None
        if isinstance(reply, m.Failed):
            error = _ERRORS.get(reply.error, base.VectorIndexError)
            raise error(reply.message, reply.status) if error is base.NotDurable else error(reply.message)
        return reply

    def create_collection(self, spec: base.CollectionSpec, exist_ok: bool = False) -> base.CollectionInfo:
        return self._call(m.CreateCollection(spec, exist_ok), m.Collection).info

    def drop_collection(self, name: str) -> base.WriteResult:
        return self._call(m.DropCollection(name), m.Written).result

    def list_collections(self) -> list[base.CollectionInfo]:
        return self._call(m.ListCollections(), m.Collections).collections

    def info(self, name: str) -> base.CollectionInfo:
        return self._call(m.Info(name), m.Collection).info

    def upsert(self, name: str, documents: list[base.Document], vectors: np.ndarray,
               sparse: base.SparseRows | None = None) -> base.WriteResult:
        described, data = m.array(np.asarray(vectors))
        sparse_described, sparse_data = m.sparse_arrays(sparse)
        return self._call(m.Upsert(name, documents, described, sparse_described), m.Written, data,
                          *sparse_data).result

    def get(self, name: str, ids: list[str], with_vector: bool = False) -> list[base.Record]:
        return self._call(m.Get(name, ids, with_vector), m.Records).records

    def delete(self, name: str, ids: list[str] | None = None,
               filter: dict[str, Any] | None = None) -> base.WriteResult:
        return self._call(m.Delete(name, ids, filter), m.Written).result

    def clear(self, name: str) -> base.WriteResult:
        return self._call(m.Clear(name), m.Written).result

    def search(self, name: str, queries: np.ndarray | None, params: base.SearchParams) -> list[list[base.Hit]]:
        if queries is None:
            return self._call(m.Search(name, None, params), m.Hits).hits
        described, data = m.array(np.asarray(queries))
        return self._call(m.Search(name, described, params), m.Hits, data).hits

    def scan(self, name: str, batch: int = 1000) -> Iterator[list[base.Record]]:
        stream = self._call(m.Scan(name, batch), m.Opened).stream
        while (records := self._call(m.Next(stream), m.Page).records) is not None:
            yield records

    def replace_collection(self, spec: base.CollectionSpec, batches: Iterable[_Batch]) -> base.WriteResult:
        stream = self._call(m.Replace(spec), m.Opened).stream
        try:
            for documents, vectors, *sparse in batches:  # (documents, vectors[, sparse vectors])
                described, data = m.array(np.asarray(vectors))
                sparse_described, sparse_data = m.sparse_arrays(sparse[0] if sparse else None)
                self._call(m.Feed(stream, documents, described, sparse_described), m.Taken, data, *sparse_data)
        except BaseException:
            self._call(m.Abort(stream), m.Taken)
            raise
        return self._call(m.End(stream), m.Written).result

    def close(self) -> None:
        with self._lock:
            for socket in self._sockets:
                socket.close()
            self._sockets.clear()


class _Aborted(Exception):
    pass


#: a replacement in progress: the queue its batches go through, and the call that ends with its WriteResult
_Replacement = tuple["queue.Queue[_Batch | _Aborted | None]", "Future[base.WriteResult]"]


class IndexServer:
    def __init__(self, index: base.VectorIndex, endpoint: str, threads: int = 8):
        self.index = index
        self.endpoint = endpoint
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="index")
        self._scans: dict[int, Iterator[list[base.Record]]] = {}
        self._replacements: dict[int, _Replacement] = {}
        self._ids = itertools.count(1)
        self._stop = asyncio.Event()
        index = self.index
        # each request's handler, given the request and its arrays
        self._handlers: dict[type[m.Request], Callable[[Any, list[np.ndarray]], m.Reply]] = {
            m.CreateCollection: lambda r, _: m.Collection(index.create_collection(r.spec, r.exist_ok)),
            m.DropCollection: lambda r, _: m.Written(index.drop_collection(r.name)),
            m.ListCollections: lambda r, _: m.Collections(index.list_collections()),
            m.Info: lambda r, _: m.Collection(index.info(r.name)),
            m.Upsert: lambda r, arrays: m.Written(index.upsert(r.name, r.documents, arrays[0],
                                                               m.sparse_rows(arrays))),
            m.Get: lambda r, _: m.Records(index.get(r.name, r.ids, r.with_vector)),
            m.Delete: lambda r, _: m.Written(index.delete(r.name, ids=r.ids, filter=r.filter)),
            m.Clear: lambda r, _: m.Written(index.clear(r.name)),
            m.Search: lambda r, arrays: m.Hits(index.search(r.name, arrays[0] if arrays else None, r.params)),
            m.Scan: self._scan,
            m.Next: self._next,
            m.Replace: self._replace,
            m.Feed: self._feed,
            m.Abort: self._abort,
            m.End: self._end,
        }

    def stop(self) -> None:
        self._stop.set()

    async def serve(self) -> None:
        socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 1000)
        socket.bind(self.endpoint)
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Future[None]] = set()

        async def handle(frames: list[zmq.Frame]) -> None:
            # [identity, REQ_CORRELATE's id, b"", header, arrays...]: the route is up to the empty delimiter
            delimiter = next((i for i, f in enumerate(frames) if not f.buffer.nbytes), None)
            if delimiter is None:
                log.error("a message to the index process without a REQ envelope: dropped")
                return
            body = [f.buffer for f in frames[delimiter + 1:]]
            reply = await loop.run_in_executor(self._pool, self.answer, body)
            await socket.send_multipart([*frames[:delimiter + 1], reply])

        receiver = None
        while not self._stop.is_set():
            receiver = receiver or asyncio.ensure_future(socket.recv_multipart(copy=False))
            stopping = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait({receiver, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if receiver in done:
                task = asyncio.ensure_future(handle(receiver.result()))
                pending.add(task)
                task.add_done_callback(pending.discard)
                receiver = None
        if receiver is not None:
            receiver.cancel()
        if pending:  # acknowledged writes are answered before the process ends
            await asyncio.wait(pending)
        socket.close()
        self._pool.shutdown(wait=True)

    def answer(self, frames: Sequence[Buffer]) -> Buffer:
        """One message's answer, encoded: its handler's reply, or Failed (a malformed message is not dispatched)."""
        reply: m.Reply
        try:
            request, arrays = m.decode_request(frames)
        except msgspec.DecodeError as e:  # ValidationError too: a tag, field or array that is none of ours
            log.error("a malformed index request refused: %s", e)
            reply = m.Failed("InvalidRequest", f"malformed index request: {e}", base.InvalidRequest.status)
        else:
            try:
                reply = self._handlers[type(request)](request, arrays)
            except base.VectorIndexError as e:
                reply = m.Failed(type(e).__name__, str(e), e.status)
            except Exception as e:
                log.exception("index call %s failed", type(request).__name__)
                reply = m.Failed("VectorIndexError", f"internal error in the index: {e}", 500)
        return m.encode(reply)[0]

    # --- the streams --------------------------------------------------------------------------------

    def _scan(self, request: m.Scan, arrays: list[np.ndarray]) -> m.Opened:
        key = next(self._ids)
        self._scans[key] = iter(self.index.scan(request.name, request.batch))
        return m.Opened(key)

    def _next(self, request: m.Next, arrays: list[np.ndarray]) -> m.Page:
        scan = self._scans.get(request.stream)
        records = None if scan is None else next(scan, None)
        if records is None:
            self._scans.pop(request.stream, None)
        return m.Page(records)

    def _replace(self, request: m.Replace, arrays: list[np.ndarray]) -> m.Opened:
        feed: queue.Queue[_Batch | _Aborted | None] = queue.Queue(maxsize=4)

        def batches() -> Iterator[_Batch]:
            while (item := feed.get()) is not None:
                if isinstance(item, _Aborted):
                    raise item
                yield item

        key = next(self._ids)
        self._replacements[key] = (feed, self._pool.submit(self.index.replace_collection, request.spec, batches()))
        return m.Opened(key)

    def _replacement(self, stream: int, end: bool = False) -> _Replacement:
        replacement = self._replacements.pop(stream, None) if end else self._replacements.get(stream)
        if replacement is None:
            raise base.InvalidRequest(f"no replacement {stream} in progress in the index process")
        return replacement

    @staticmethod
    def _put(replacement: _Replacement, item: _Batch | _Aborted | None) -> bool:
        """Queue `item` for the replacement; False if it ended first (an earlier batch failed: it takes no more)."""
        feed, done = replacement
        while True:
            try:
                feed.put(item, timeout=1.0)
                return True
            except queue.Full:
                if done.done():
                    return False

    def _feed(self, request: m.Feed, arrays: list[np.ndarray]) -> m.Taken:
        replacement = self._replacement(request.stream)
        sparse = m.sparse_rows(arrays)
        batch: _Batch = (request.documents, arrays[0]) if sparse is None else (request.documents, arrays[0], sparse)
        if not self._put(replacement, batch):  # the client aborts it next
            replacement[1].result()  # raises what stopped it
            raise base.VectorIndexError("the replacement stopped taking batches")
        return m.Taken()

    def _abort(self, request: m.Abort, arrays: list[np.ndarray]) -> m.Taken:
        replacement = self._replacements.pop(request.stream, None)
        if replacement is None:  # never opened, or already ended: nothing to abandon
            return m.Taken()
        self._put(replacement, _Aborted())
        replacement[1].exception()  # answered once it has ended: the next call finds the collection as it was
        return m.Taken()

    def _end(self, request: m.End, arrays: list[np.ndarray]) -> m.Written:
        replacement = self._replacement(request.stream, end=True)
        self._put(replacement, None)
        return m.Written(replacement[1].result())


def run(settings: Settings, endpoint: str) -> None:
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
