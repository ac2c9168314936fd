"""The engine process: one model on one device, served to the API processes over ZeroMQ.

A ROUTER socket takes requests from every API process's DEALER (service/api/client.py); each
embed becomes a task on this process's event loop, awaiting the Engine (admission, queue, the
inference thread). Ops:

    hello   → the model's info (what the API process needs to validate and answer)
    ping    → pong: alive, ready, queue stats (the clients' heartbeat: a dead engine is noticed)
    embed   → vectors, or an error kind the client raises as the same class
    cancel  → the caller left: its rows not yet run are dropped
    health  → a real forward pass (TEI's /health)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import asdict
from pathlib import Path

import zmq
import zmq.asyncio

from service.engine.backends import create_backend
from service.engine.core import Engine, EngineConfig, measure_rate
from service.ipc.messages import EngineError, batch_from_frames, error_header, pack, unpack
from service.manifest import Manifest
from service.metrics import EngineMetrics
from service.settings import Settings

log = logging.getLogger("sembed.engine")


class EngineServer:
    def __init__(self, engine: Engine, endpoint: str):
        self.engine = engine
        self.endpoint = endpoint
        self._context = zmq.asyncio.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._tasks: dict[tuple[bytes, int], asyncio.Task] = {}
        self._stopping = asyncio.Event()

    async def serve(self) -> None:
        self._socket.bind(self.endpoint)
        receiver = asyncio.ensure_future(self._receive())
        await self._stopping.wait()
        # drain: requests already admitted finish and are answered; new ones get NotReady
        self.engine._accepting = False
        while self._tasks:
            await asyncio.sleep(0.01)
        receiver.cancel()
        self._socket.close()

    def stop(self) -> None:
        self._stopping.set()

    async def _receive(self) -> None:
        while True:
            identity, header_frame, *frames = await self._socket.recv_multipart(copy=False)
            header = unpack(header_frame.buffer)
            op = header["op"]
            peer = identity.bytes
            if op == "embed":
                key = (peer, header["id"])
                task = asyncio.ensure_future(self._embed(peer, header, frames))
                self._tasks[key] = task
                task.add_done_callback(lambda _, key=key: self._tasks.pop(key, None))
            elif op == "cancel":
                task = self._tasks.get((peer, header["id"]))
                if task is not None:
                    task.cancel()
            elif op == "ping":
                await self._reply(peer, {"op": "pong", "id": header["id"], "ready": self.engine.ready,
                                         "pid": os.getpid(), **self.engine.stats()})
            elif op == "hello":
                await self._reply(peer, {"op": "hello", "id": header["id"], "info": asdict(self.engine.info),
                                         "pid": os.getpid()})
            elif op == "health":
                asyncio.ensure_future(self._health(peer, header["id"]))

    async def _embed(self, peer: bytes, header: dict, frames) -> None:
        request_id = header["id"]
        try:
            batch = batch_from_frames(*(f.buffer for f in frames))
            result = await self.engine.embed(batch, normalize=header.get("normalize", True),
                                             timeout_s=header.get("timeout_s"))
        except asyncio.CancelledError:
            return  # the client left and was told nothing: it no longer waits
        except EngineError as e:
            await self._reply(peer, error_header(request_id, e))
            return
        except Exception as e:  # never let one request take the loop down
            log.exception("request failed in the engine")
            await self._reply(peer, error_header(request_id, e))
            return
        vectors = result.vectors
        await self._reply(peer, {"id": request_id, "shape": vectors.shape, "prompt_tokens": result.prompt_tokens,
                                 "queue_s": result.queue_s, "inference_s": result.inference_s},
                          memoryview(vectors.astype("<f4", copy=False).reshape(-1)))

    async def _health(self, peer: bytes, request_id: int) -> None:
        try:
            await asyncio.to_thread(self.engine.backend.health)
            await self._reply(peer, {"id": request_id, "ok": True})
        except Exception as e:
            await self._reply(peer, error_header(request_id, EngineError(f"health check failed: {e}")))

    async def _reply(self, peer: bytes, header: dict, *frames) -> None:
        await self._socket.send_multipart([peer, pack(header), *frames], copy=False)


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(max_batch_tokens=settings.batch_token_budget(), max_batch_requests=settings.batch_row_cap(),
                        max_queue_wait_s=settings.max_queue_wait_s, max_queued_inputs=settings.max_queued_inputs,
                        request_timeout_s=settings.request_timeout_s, prefetch=settings.device == "cuda")


def choose_variant(settings: Settings, export_dir: str | Path) -> str:
    """The variant asked for; unset, fp16 on a GPU when the export has one (only a variant that passed its
    quality gate is in the manifest), else fp32."""
    if settings.variant is not None:
        return settings.variant
    if settings.device == "cuda" and settings.backend == "onnx":
        return "fp16" if "fp16" in (Manifest.load(Path(export_dir)).variants or {}) else "fp32"
    return "fp32"


def load_engine(settings: Settings, export_dir: str | Path, metrics: EngineMetrics | None = None) -> Engine:
    """Load, warm and verify one export, and time a pass for admission (slow)."""
    backend = create_backend(settings.backend, export_dir, device=settings.device,
                             intra_op_threads=settings.intra_op_threads, pad_to_multiple_of=settings.pad_to_multiple_of,
                             variant=choose_variant(settings, export_dir), spin=settings.intra_op_spinning,
                             tensorrt=settings.tensorrt)
    backend.warmup()
    if hasattr(backend, "self_check"):
        backend.self_check()  # never ready on an export that does not give its recorded vectors
    engine = Engine(backend, engine_config(settings), metrics)
    measure_rate(engine)
    log.info("loaded %s (dim %d) from %s on %s", engine.info.model, engine.info.dimension, export_dir,
             engine.info.device)
    return engine


def run(settings: Settings, export_dir: str, endpoint: str) -> None:
    """An engine process's main: load, serve until SIGTERM, drain, exit 0."""
    engine = load_engine(settings, export_dir, EngineMetrics())
    engine.start()
    server = EngineServer(engine, endpoint)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # SIGTERM from the supervisor, once the API processes have drained; Ctrl-C is the supervisor's to handle
        loop.add_signal_handler(signal.SIGTERM, server.stop)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        await server.serve()

    asyncio.run(main())
    engine.stop()
