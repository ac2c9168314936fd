"""Where an API process finds the other processes: the supervisor hands each API process a Topology."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import zmq
import zmq.asyncio

from service.api.client import SocketEngineClient
from service.api.registry import ModelRegistry, ServedModel, retire
from service.ipc import control
from service.ipc.messages import ModelInfo
from service.metrics import ApiMetrics
from service.settings import Settings
from service.tokenization import Tokenizer, WordTokenizer

log = logging.getLogger("sembed.api")


@dataclass(frozen=True)
class ModelEndpoint:
    name: str
    export_dir: str  # the API process reads its tokenizer from here
    endpoint: str  # the engine process's socket, ipc://<path>


@dataclass(frozen=True)
class Topology:
    models: list[ModelEndpoint]
    index_endpoint: str | None  # the local index's writer process; None: Milvus, reached directly
    control_endpoint: str  # the supervisor: reloads are asked here...
    events_endpoint: str  # ...announced to every API process here...
    acks_endpoint: str  # ...and acknowledged here


def load_tokenizer(info: ModelInfo, export_dir: str | Path):
    """The tokenizer the engine's model names (the fake backend's words are tokens)."""
    return WordTokenizer(info.max_seq_length) if info.tokenizer == "words" else Tokenizer(export_dir)


async def connect_model(model: ModelEndpoint, timeout_s: float = 600.0):
    client = await SocketEngineClient(model.endpoint).connect(timeout_s)
    return client, load_tokenizer(client.info, model.export_dir)


async def connect_registry(topology: Topology, settings: Settings, metrics: ApiMetrics) -> ModelRegistry:
    registry = ModelRegistry(metrics, settings.auto_truncate, settings.cache_mb)
    connected = await asyncio.gather(*(connect_model(m) for m in topology.models))
    for model, (client, tokenizer) in zip(topology.models, connected):
        registry.add(model.name, client, tokenizer)
    return registry


class ModelLoader(Protocol):
    """What the admin reload route asks for: a new model staged beside the serving one, then switched to."""

    async def stage(self, name: str, export_dir: Path) -> ServedModel: ...

    async def switch(self, name: str, staged: ServedModel) -> ModelInfo:
        """Every API process serves `staged` under `name` from now on; the previous model's info."""

    async def discard(self, staged: ServedModel) -> None: ...


class SupervisorLoader:
    """Reloads across processes: the supervisor starts the new engine process, then tells every API
    process to switch (each answers once its requests go to the new engine), then drains the old one."""

    def __init__(self, topology: Topology, settings: Settings, registry: ModelRegistry):
        self.topology = topology
        self.settings = settings
        self.registry = registry
        self._staged: dict[int, ServedModel] = {}
        self._events = asyncio.ensure_future(self._follow())

    async def _request(self, message: control.Request) -> control.Reply:
        socket = zmq.asyncio.Context.instance().socket(zmq.REQ)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.topology.control_endpoint)
        try:
            await socket.send(control.encode(message))
            reply = control.decode_reply(await socket.recv())
        finally:
            socket.close()
        if isinstance(reply, control.Failed):
            raise RuntimeError(reply.error)
        return reply

    async def stage(self, name: str, export_dir: Path) -> ServedModel:
        reply = await self._request(control.Stage(name, str(export_dir)))
        assert isinstance(reply, control.Staged)
        client, tokenizer = await connect_model(ModelEndpoint(name, str(export_dir), reply.endpoint))
        staged = self.registry.served(client, tokenizer)
        staged.token = reply.token
        self._staged[reply.token] = staged
        return staged

    async def switch(self, name: str, staged: ServedModel) -> ModelInfo:
        if staged.token is None:
            raise ValueError("switch: this model was not staged by this loader")
        previous = self.registry.get(name).info
        reply = await self._request(control.Switch(staged.token))  # answered once every API process switched
        if isinstance(reply, control.Switched) and reply.unacknowledged:
            log.warning("%d API process(es) did not acknowledge the switch of %s in time", reply.unacknowledged, name)
        return previous

    async def discard(self, staged: ServedModel) -> None:
        if staged.token is None:
            raise ValueError("discard: this model was not staged by this loader")
        self._staged.pop(staged.token, None)
        await staged.client.close()
        await self._request(control.Discard(staged.token))

    async def _follow(self) -> None:
        """Apply the supervisor's switches in this process, then acknowledge."""
        context = zmq.asyncio.Context.instance()
        events = context.socket(zmq.SUB)
        events.setsockopt(zmq.SUBSCRIBE, b"")
        events.connect(self.topology.events_endpoint)
        acks = context.socket(zmq.PUSH)
        acks.setsockopt(zmq.LINGER, 1000)
        acks.connect(self.topology.acks_endpoint)
        while True:
            event = control.decode_switching(await events.recv())
            staged = self._staged.pop(event.token, None)
            if staged is None:
                model = ModelEndpoint(event.name, event.export_dir, event.endpoint)
                staged = self.registry.served(*await connect_model(model))
            old = self.registry.replace(event.name, staged)
            asyncio.ensure_future(retire(old, self.settings.shutdown_grace_s))
            await acks.send(control.encode(control.Acknowledged(event.token, os.getpid())))
