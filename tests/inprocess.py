"""Engines in the test's own process: the same routes and EngineClient interface as the service, no IPC.

The service itself always runs the split (service/supervisor.py; tests/test_processes.py runs it);
these helpers let a test hold a fake backend's gate, count its passes, or swap a model in process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from service.api.client import InProcessEngineClient
from service.api.registry import ModelRegistry, ServedModel, retire
from service.engine.socket_server import load_engine
from service.settings import Settings


def registry_from_settings(settings: Settings) -> ModelRegistry:
    """Every configured export loaded, warmed, verified and started here."""
    registry = ModelRegistry(auto_truncate=settings.auto_truncate)
    for name, export_dir in settings.model_dirs():
        engine = load_engine(settings, export_dir)
        registry.add_in_process(name or engine.info.model, engine)
    return registry


class InProcessLoader:
    """What the admin reload route asks for a new model: here, an engine in this process."""

    def __init__(self, settings: Settings, registry: ModelRegistry):
        self.settings = settings
        self.registry = registry

    async def stage(self, name: str, export_dir: Path) -> ServedModel:
        engine = await asyncio.to_thread(load_engine, self.settings, export_dir)
        engine.start()
        return self.registry.served(InProcessEngineClient(engine), engine.backend.tokenizer)

    async def switch(self, name: str, staged: ServedModel):
        old = self.registry.replace(name, staged)
        asyncio.get_running_loop().create_task(retire(old, self.settings.shutdown_grace_s))
        return old.info

    async def discard(self, staged: ServedModel) -> None:
        await staged.client.close()


def app_in_process(settings: Settings):
    """The API application over engines in this process, loaded from `settings`."""
    from service.api.app import create_app

    registry = registry_from_settings(settings)
    return create_app(settings, registry, loader=InProcessLoader(settings, registry))
