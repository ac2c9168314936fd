"""Admin routes (an admin key opens them): hot reload of a model without a failed request."""

from __future__ import annotations

import asyncio
import logging
import re

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.errors import ApiError
from service.index import ModelStamp
from service.index.reembed import reembed
from service.manifest import CROSS_ENCODER, EMBEDDING
from service.registry import load_engine
from service.routes.common import registry, settings

router = APIRouter(prefix="/admin", tags=["admin"])
log = logging.getLogger("sembed.admin")
_EXPORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_reloading = asyncio.Lock()


class ReloadRequest(BaseModel):
    export: str = Field(description="an export's folder name under SEMBED_MODELS_ROOT (never a path)",
                        examples=["cosent-20261123-1200"])
    reembed: bool = Field(False, description="re-embed the collections this model stamped before switching "
                          "(searches keep working throughout; writes to them wait for the switch)")


class ReembedRequest(BaseModel):
    model: str | None = Field(None, description="the served model to re-embed with (unset: the default)")


_KINDS = {EMBEDDING: "an embedding model", CROSS_ENCODER: "a cross-encoder (reranker)"}


@router.post("/models/{name}/reload")
async def reload(name: str, req: ReloadRequest, request: Request):
    """Load the export, warm it and check its golden vectors while `name` keeps serving; then switch.

    Requests already on the old model finish there; every later one goes to the new model."""
    s = settings(request)
    reg = registry(request)
    reg.get(name)  # 404 before any work
    if s.models_root is None:
        raise ApiError(422, "reload is off: set SEMBED_MODELS_ROOT to the folder of exports it may load",
                       "Validation")
    if not _EXPORT_NAME.match(req.export) or req.export.strip(".") == "":
        raise ApiError(422, f"export {req.export!r} is not a folder name", "Validation", param="export")
    export_dir = s.models_root / req.export
    if s.backend == "onnx" and not (export_dir / "manifest.json").is_file():
        raise ApiError(404, f"no export named {req.export!r} under the models root", "NotFound", param="export")
    async with _reloading:
        try:
            engine = await run_in_threadpool(load_engine, s, export_dir, request.app.state.metrics)
        except Exception as e:
            raise ApiError(422, f"export {req.export!r} failed to load or verify: {e}", "Validation") from e
        serving = reg.get(name).info.kind
        if engine.info.kind != serving:  # its clients' routes and its collections need the same kind of model
            engine.stop()
            raise ApiError(422, f"export {req.export!r} is {_KINDS[engine.info.kind]} and {name} is {_KINDS[serving]}: "
                                "a reload keeps the kind; serve it under another name (SEMBED_MODELS)",
                           "Validation", param="export")
        engine.start()
        if req.reembed:
            stamp = ModelStamp(name, engine.info.graph_sha256)
            # Searches on a collection already switched find its model here until the registry switches too.
            staged = request.app.state.staged_engines
            staged[stamp] = engine
            done = []
            try:
                for info in await run_in_threadpool(request.app.state.index.list_collections):
                    if info.model is not None and info.model.name == name and info.model != stamp:
                        await _reembed(request, info.name, stamp, engine)
                        done.append(info.name)
            except Exception as e:
                staged.pop(stamp, None)
                engine.stop()
                raise ApiError(500, f"re-embedding failed ({e}); the old model still serves. Collections "
                                    f"already re-embedded ({done}) need POST /admin/collections/<name>/reembed",
                               "Internal") from e
            old = reg.replace(name, engine)
            staged.pop(stamp, None)
        else:
            old = reg.replace(name, engine)
        asyncio.get_running_loop().create_task(_retire(old, s.shutdown_grace_s))
    log.info("model %s now serves %s (was %s)", name, engine.info.model, old.info.model)
    return {"model": name, "export": req.export, "serving": engine.info.model, "previous": old.info.model,
            "sha256": engine.info.manifest.get("onnx_sha256")}


@router.post("/collections/{name}/reembed")
async def reembed_collection(name: str, req: ReembedRequest, request: Request):
    """Re-embed a collection's stored texts with a served model (after a model change), then switch to them."""
    reg = registry(request)
    model = req.model or reg.default
    engine = reg.get(model)
    async with _reloading:
        result = await _reembed(request, name, ModelStamp(model, engine.info.graph_sha256), engine)
    return {"collection": name, "model": model, "count": result.total, "sequence": result.sequence}


async def _reembed(request: Request, name: str, stamp: ModelStamp, engine):
    loop = asyncio.get_running_loop()

    def embed(texts):
        return asyncio.run_coroutine_threadsafe(engine.embed(texts), loop).result().vectors

    log.info("re-embedding collection %s with %s", name, stamp.describe())
    return await run_in_threadpool(reembed, request.app.state.index, name, stamp, engine.info.dimension, embed)


async def _retire(old, grace_s: float) -> None:
    """Stop the replaced engine once the requests it holds are answered (or the grace is over)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while old.in_flight and loop.time() < deadline:
        await asyncio.sleep(0.05)
    await run_in_threadpool(old.stop)
