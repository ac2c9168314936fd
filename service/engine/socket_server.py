"""The engine process: one model on one device, served to the API processes over a Unix socket.

Each API process holds one connection to the engine's listening socket (service/api/client.py), messages
framed by service/ipc/stream.py. One I/O thread (this process's main thread) does all the socket work with
non-blocking sockets and one selector, as vLLM's engine core does with its sockets: it sleeps until a message
or a finished job wakes it, takes every message waiting (admitting each embed into the queue), then answers
every job the inference thread finished meanwhile. No task, future or thread hand-off per request: the
inference thread only appends a finished job to a deque, and writes one wake-up byte when the I/O thread is not
already awake. A connection that closes (its API process died) cancels the rows it had queued. The messages are
service/ipc/messages.py's structs, one handler each (`EngineServer.handlers`, by the message's type):

    Hello   → Welcome: the model's info (what the API process needs to validate and answer)
    Ping    → Pong: alive, ready, queue stats (the clients' heartbeat: a hung engine is noticed)
    Embed   → Vectors (with `tokens`: every row's token states), or Failed: a kind the client raises as the same class
    Cancel  → the caller left: its rows not yet run are dropped
    Health  → Healthy after a real forward pass (TEI's /health), or Failed
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from service.engine.backends import create_backend
from service.engine.core import Engine, EngineConfig, measure_rate
from service.engine.queue import Job
from service.ipc.messages import (
    Cancel,
    Embed,
    EngineError,
    Failed,
    Frames,
    Health,
    Healthy,
    Hello,
    Ping,
    Pong,
    Reply,
    Request,
    Vectors,
    Welcome,
    batch_from_frames,
    bundle_replies,
    decode_requests,
    encode,
)
from service.ipc.stream import MAX_BUFFERS_PER_SEND, Buffer, Reader, socket_path, unwritten
from service.ipc.stream import encode as stream_encode
from service.manifest import Manifest
from service.metrics import EngineMetrics
from service.process import settle_memory
from service.settings import Settings

log = logging.getLogger("sembed.engine")

#: the I/O thread's longest sleep: how often it looks at the stop flag if no wake-up came
POLL_MS = 100
#: room for a whole answer (256 texts × 384 floats: 393 KB) in one write, not two and a wait to be writable
SEND_BUFFER_BYTES = 4 << 20


class Peer:
    """One API process's connection: what arrived of its next message, and what could not be written yet."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = Reader()
        self.unsent: list[Buffer] = []
        self.closed = False


class EngineServer:
    def __init__(self, engine: Engine, endpoint: str):
        self.engine = engine
        self.endpoint = endpoint
        self._path = socket_path(endpoint)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._selector = selectors.DefaultSelector()
        self._peers: set[Peer] = set()
        self._jobs: dict[tuple[Peer, int], Job] = {}  # admitted, not yet answered or cancelled
        self._health_checks = 0
        # finished jobs (and health answers) from the engine's threads; the I/O thread answers them
        self._done: collections.deque[Job | tuple[Peer, Reply]] = collections.deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._awake = False  # a wake-up byte is on its way or the I/O thread is about to look: no more needed
        self._stopping = False
        # while answering a pass: (header, buffers) messages by peer
        self._bundling: dict[Peer, list[tuple[Reply, Frames]]] | None = None
        #: what each message does: the decoder admits only these types
        self.handlers: dict[type[Request], Callable[[Peer, Any, Frames], None]] = {
            Embed: self._embed, Cancel: self._cancel, Ping: self._ping, Hello: self._hello, Health: self._health_check}

    def serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):  # a socket file left by an engine that died at this address
            os.unlink(self._path)
        self._listener.bind(self._path)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_read, selectors.EVENT_READ)
        try:
            while True:
                if self._stopping:
                    # drain: requests already admitted finish and are answered; new ones get NotReady
                    self.engine.refuse_new()
                    if not self._jobs and not self._health_checks and not any(p.unsent for p in self._peers):
                        break
                for key, events in self._selector.select(POLL_MS / 1000):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif isinstance(key.data, Peer):
                        if events & selectors.EVENT_WRITE:
                            self._write(key.data, [])
                        if events & selectors.EVENT_READ:
                            self._receive(key.data)
                # every turn, not only when the pipe is readable: a byte written while the last turn drained it
                # was read with it, and the flag it set would keep every later job from writing one
                self._clear_wake()
                self._answer_done()
        finally:
            for peer in list(self._peers):
                self._close(peer)
            self._selector.close()
            self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            os.close(self._wake_read)
            os.close(self._wake_write)

    def stop(self) -> None:
        """From a signal handler or another thread: drain, then return from serve()."""
        self._stopping = True
        self._wake()

    # --- engine threads → I/O thread ------------------------------------------------------------
    def _finished(self, item: Job | tuple[Peer, Reply]) -> None:
        self._done.append(item)
        if not self._awake:
            self._wake()

    def _wake(self) -> None:
        self._awake = True
        try:
            os.write(self._wake_write, b"x")
        except (BlockingIOError, OSError):  # full: a wake-up is pending anyway; closed: serve() has returned
            pass

    def _clear_wake(self) -> None:
        # before the deque is read: a job finished after this point writes a new wake-up byte
        self._awake = False
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    # --- the I/O thread ---------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            peer = Peer(sock)
            self._peers.add(peer)
            self._selector.register(sock, selectors.EVENT_READ, peer)

    def _receive(self, peer: Peer) -> None:
        while not peer.closed:
            try:
                n = peer.sock.recv_into(peer.reader.get_buffer())
            except BlockingIOError:
                return
            except OSError:
                n = 0
            if not n:  # its API process is gone
                self._close(peer)
                return
            try:
                messages = peer.reader.buffer_updated(n)
            except ValueError:
                log.exception("an API process sent a corrupt stream; closing its connection")
                self._close(peer)
                return
            for frames in messages:
                try:
                    requests = decode_requests(frames)
                except (msgspec.DecodeError, ValueError) as e:  # not one of our messages (or none at all): never run
                    log.error("an API process sent a message that is not a request (%s): dropped", e)
                    continue
                for request, buffers in requests:
                    try:
                        self.handlers[type(request)](peer, request, buffers)
                    except Exception:  # never let one message take the server down
                        log.exception("a message to the engine failed")

    def _close(self, peer: Peer) -> None:
        """A connection gone: the rows its requests still had queued are dropped, like a caller that left."""
        if peer.closed:
            return
        peer.closed = True
        self._peers.discard(peer)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(peer.sock)
        peer.sock.close()
        for key in [key for key in self._jobs if key[0] is peer]:
            self.engine.release(self._jobs.pop(key))

    def _send(self, peer: Peer, frames: Frames) -> None:
        self._write(peer, stream_encode(frames))

    def _write(self, peer: Peer, buffers: list[Buffer]) -> None:
        """Write what the socket takes now; the rest waits for it to be writable (in order, after any earlier rest)."""
        if peer.closed:
            return
        was_waiting = bool(peer.unsent)
        unsent = peer.unsent + buffers
        try:
            while unsent:
                unsent = unwritten(unsent, peer.sock.sendmsg(unsent[:MAX_BUFFERS_PER_SEND]))
        except BlockingIOError:
            pass
        except OSError:  # the connection broke: its process is gone
            self._close(peer)
            return
        peer.unsent = unsent
        if bool(unsent) != was_waiting:
            self._selector.modify(peer.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if unsent else 0), peer)

    # --- the handlers, one per request type ---------------------------------------------------------
    def _embed(self, peer: Peer, request: Embed, frames: Frames) -> None:
        try:
            (payload,) = frames
            job = self.engine.submit(batch_from_frames(request.rows, payload), normalize=request.normalize,
                                     timeout_s=request.timeout_s, on_done=self._finished,
                                     context=(peer, request.id), tokens=request.tokens)
        except Exception as e:
            if not isinstance(e, EngineError):
                log.exception("request failed in the engine")
            self._reply(peer, Failed.of(request.id, e))
            return
        self._jobs[(peer, request.id)] = job

    def _cancel(self, peer: Peer, request: Cancel, frames: Frames) -> None:
        # the client left and is told nothing: it no longer waits
        cancelled = self._jobs.pop((peer, request.id), None)
        if cancelled is not None:
            self.engine.release(cancelled)

    def _ping(self, peer: Peer, request: Ping, frames: Frames) -> None:
        stats = self.engine.stats()
        self._reply(peer, Pong(request.id, self.engine.ready, os.getpid(), stats.in_flight, stats.queued_rows,
                               stats.tokens_per_s))

    def _hello(self, peer: Peer, request: Hello, frames: Frames) -> None:
        self._reply(peer, Welcome(request.id, self.engine.info, os.getpid()))

    def _health_check(self, peer: Peer, request: Health, frames: Frames) -> None:
        self._health_checks += 1
        threading.Thread(target=self._health, args=(peer, request.id), daemon=True).start()

    def _answer_done(self) -> None:
        self._bundling = {}
        try:
            self._answer_each()
        finally:
            bundles, self._bundling = self._bundling, None
            for peer, messages in bundles.items():  # one message per API process per pass
                self._send(peer, bundle_replies(messages))

    def _answer_each(self) -> None:
        done = self._done
        while done:
            item = done.popleft()
            if not isinstance(item, Job):  # a health check's answer
                self._health_checks -= 1
                self._reply(*item)
                continue
            peer, request_id = item.context
            if self._jobs.pop((peer, request_id), None) is not item:
                continue  # cancelled: its caller already left
            self.engine.release(item)
            try:
                result = self.engine.result(item)
            except Exception as e:
                self._reply(peer, Failed.of(request_id, e))
                continue
            vectors = result.vectors
            rows, dimension = vectors.shape
            self._reply(peer, Vectors(request_id, (rows, dimension), result.prompt_tokens, result.queue_s,
                                      result.inference_s), vectors.astype("<f4", copy=False).reshape(-1).data)

    def _health(self, peer: Peer, request_id: int) -> None:  # its own thread: a real forward pass
        answer: Reply
        try:
            self.engine.backend.health()
            answer = Healthy(request_id)
        except Exception as e:
            answer = Failed.of(request_id, EngineError(f"health check failed: {e}"))
        self._finished((peer, answer))

    def _reply(self, peer: Peer, message: Reply, *frames: Buffer) -> None:
        if self._bundling is not None:  # answering a pass: sent together at its end
            self._bundling.setdefault(peer, []).append((message, list(frames)))
            return
        self._send(peer, encode(message, *frames))


def choose_variant(settings: Settings, export_dir: str | Path) -> str:
    """The variant asked for (fp32 where the export lacks it; int8: the export's one int8 graph, the same on every
    CPU); unset, fp16 on a GPU when the export has one (only a variant that passed its quality gate is in the
    manifest), else fp32."""
    if settings.variant is not None:
        variants = Manifest.load(Path(export_dir)).variants or {}
        if settings.variant == "fp32" or settings.variant in variants:
            return settings.variant
        # a reduced-precision graph is a speed-up the export may lack (not written, or refused by its quality
        # gate): the model is still served, in fp32
        log.warning("SEMBED_VARIANT=%s, but the export at %s has no %s variant (not exported, or it failed its "
                    "quality gate at export): serving fp32", settings.variant, export_dir, settings.variant)
        return "fp32"
    if settings.device == "cuda" and settings.backend == "onnx":
        return "fp16" if "fp16" in (Manifest.load(Path(export_dir)).variants or {}) else "fp32"
    return "fp32"


def load_engine(settings: Settings, export_dir: str | Path, metrics: EngineMetrics | None = None) -> Engine:
    """Load, warm and verify one export, and time a pass for admission (slow)."""
    backend = create_backend(settings.backend, export_dir, device=settings.device,
                             intra_op_threads=settings.intra_op_threads, pad_to_multiple_of=settings.pad_to_multiple_of,
                             variant=choose_variant(settings, export_dir), spin=settings.intra_op_spinning,
                             tensorrt=settings.tensorrt, streams=settings.streams)
    backend.warmup(settings.batch_token_budget(), settings.batch_row_cap())
    backend.self_check()  # never ready on an export that does not give its recorded vectors
    engine = Engine(backend, EngineConfig.from_settings(settings), metrics)
    measure_rate(engine)
    log.info("loaded %s (dim %d) from %s on %s", engine.info.model, engine.info.dimension, export_dir,
             engine.info.device)
    return engine


def run(settings: Settings, export_dir: str, endpoint: str) -> None:
    """An engine process's main: load, serve until SIGTERM, drain, exit 0."""
    engine = load_engine(settings, export_dir, EngineMetrics())
    settle_memory()
    engine.start()
    server = EngineServer(engine, endpoint)
    # SIGTERM from the supervisor, once the API processes have drained; Ctrl-C is the supervisor's to handle
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server.serve()
    engine.stop()
