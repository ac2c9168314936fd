"""The models the service holds, by name: what the routes ask for, and what makes hot swap possible.

Routes never keep an engine: they look one up per request, so replacing the registry's entry
(a reload) moves every following request to the new model while the old one drains.
"""

from __future__ import annotations

import logging

from service.backends import create_backend
from service.engine import Engine, EngineError
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("sembed.registry")


class ModelNotFound(EngineError):
    pass


class ModelRegistry:
    def __init__(self) -> None:
        self._engines: dict[str, Engine] = {}
        self.default: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics) -> ModelRegistry:
        """Load, warm and start every configured export (slow: call it off the event loop)."""
        registry = cls()
        for name, export_dir in settings.model_dirs():
            engine = load_engine(settings, export_dir, metrics)
            registry.add(name or engine.info.model, engine)
        return registry

    def add(self, name: str, engine: Engine) -> None:
        if name in self._engines:
            raise ValueError(f"two models named {name!r}")
        engine.start()
        self._engines[name] = engine
        self.default = self.default or name

    def replace(self, name: str, engine: Engine) -> Engine:
        """Put a started engine in `name`'s place; the old one is returned, still serving what it holds.

        Routes look an engine up and take its permits with no await in between, so from here on no
        request reaches the old engine: once its in-flight count is zero it can stop.
        """
        old = self.get(name)
        self._engines[name] = engine
        return old

    def get(self, name: str | None = None) -> Engine:
        if name is None:
            name = self.default
        engine = self._engines.get(name) if name is not None else None
        if engine is None:
            raise ModelNotFound(f"no model named {name!r}; this service has {self.names()}")
        return engine

    def name_of(self, engine: Engine) -> str:
        return next(n for n, e in self._engines.items() if e is engine)

    def names(self) -> list[str]:
        return list(self._engines)

    @property
    def ready(self) -> bool:
        return bool(self._engines) and all(e.ready for e in self._engines.values())

    def stop(self) -> None:
        for engine in self._engines.values():
            engine.stop()


def load_engine(settings: Settings, export_dir, metrics: Metrics) -> Engine:
    """Load, warm and verify one export; the engine is not started (slow: off the event loop)."""
    backend = create_backend(settings.backend, export_dir, device=settings.device,
                             intra_op_threads=settings.intra_op_threads,
                             pad_to_multiple_of=settings.pad_to_multiple_of, variant=settings.variant,
                             spin=settings.intra_op_spinning)
    backend.warmup()
    if hasattr(backend, "self_check"):
        backend.self_check()  # never ready on an export that does not give its recorded vectors
    log.info("loaded %s (dim %d) from %s on %s", backend.info.model, backend.info.dimension, export_dir,
             backend.info.device)
    return Engine(backend, settings.engine_config(), metrics)
