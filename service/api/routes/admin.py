"""Admin routes (an admin key opens them): hot reload of a model without a failed request."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from service.api.errors import ApiError
from service.api.routes.common import registry, settings
from service.api.routes.index import embedder_for, sparse_embedder, sparse_rows, sparse_vectors
from service.index import ModelStamp
from service.index.reembed import reembed
from service.manifest import CLASSIFIER, CROSS_ENCODER, EMBEDDING, SPARSE

router = APIRouter(prefix="/admin", tags=["admin"])
log = logging.getLogger("sembed.admin")
_EXPORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_reloading = asyncio.Lock()


class ReloadRequest(BaseModel):
    export: str = Field(description="an export's folder name under SEMBED_MODELS_ROOT (never a path)",
                        examples=["cosent-20261123-1200"])
    reembed: bool = Field(False, description="re-embed the collections this model stamped (a sparse model: whose "
                          "sparse vectors it made) before switching "
                          "(searches keep working throughout; writes to them wait for the switch)")


class ReembedRequest(BaseModel):
    model: str | None = Field(None, description="the served model to re-embed with (unset: the default)")


_KINDS = {EMBEDDING: "an embedding model", CROSS_ENCODER: "a cross-encoder (reranker)",
          CLASSIFIER: "a sequence classifier", SPARSE: "a sparse (SPLADE) model"}


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
    loader = request.app.state.loader
    if loader is None:
        raise ApiError(503, "this server was started without a model loader: reload is unavailable", "Unhealthy")
    async with _reloading:
        try:  # a new engine loads, warms and passes its golden check while `name` keeps serving
            staged = await loader.stage(name, export_dir)
        except Exception as e:
            raise ApiError(422, f"export {req.export!r} failed to load or verify: {e}", "Validation") from e
        serving = reg.get(name).info.kind
        if staged.info.kind != serving:  # its clients' routes and its collections need the same kind of model
            await loader.discard(staged)
            raise ApiError(422, f"export {req.export!r} is {_KINDS[staged.info.kind]} and {name} is "
                                f"{_KINDS[serving]}: a reload keeps the kind; serve it under another name "
                                "(SEMBED_MODELS)", "Validation", param="export")
        if req.reembed:
            stamp = ModelStamp(name, staged.info.graph_sha256)
            # Searches on a collection already switched find its model here until the registry switches too.
            staged_models = request.app.state.staged_models
            staged_models[stamp] = staged
            done = []
            try:
                for info in await run_in_threadpool(request.app.state.index.list_collections):
                    if info.model is not None and info.model.name == name and info.model != stamp:
                        await _reembed(request, info.name, stamp, staged)
                    elif info.sparse_model is not None and info.sparse_model.name == name \
                            and info.sparse_model != stamp:
                        if info.model is None:  # its dense vectors are the client's: nothing to embed them again
                            log.warning("collection %s keeps client vectors: its sparse vectors are not re-embedded "
                                        "(its writes and sparse searches are refused until it is created again)",
                                        info.name)
                            continue
                        dense = embedder_for(request, info.name, info)
                        await _reembed(request, info.name, info.model, dense, (stamp, staged))
                    else:
                        continue
                    done.append(info.name)
            except Exception as e:
                staged_models.pop(stamp, None)
                await loader.discard(staged)
                raise ApiError(500, f"re-embedding failed ({e}); the old model still serves. Collections "
                                    f"already re-embedded ({done}) need POST /admin/collections/<name>/reembed",
                               "Internal") from e
            previous = await loader.switch(name, staged)
            staged_models.pop(stamp, None)
        else:
            previous = await loader.switch(name, staged)
    log.info("model %s now serves %s (was %s)", name, staged.info.model, previous.model)
    return {"model": name, "export": req.export, "serving": staged.info.model, "previous": previous.model,
            "sha256": staged.info.manifest.get("onnx_sha256")}


@router.post("/collections/{name}/reembed")
async def reembed_collection(name: str, req: ReembedRequest, request: Request):
    """Re-embed a collection's stored texts with a served model (after a model change), then switch to them."""
    reg = registry(request)
    model = reg.resolve(req.model)
    served = reg.get(model)
    async with _reloading:
        result = await _reembed(request, name, ModelStamp(model, served.info.graph_sha256), served)
    return {"collection": name, "model": model, "count": result.total, "sequence": result.sequence}


async def _reembed(request: Request, name: str, stamp: ModelStamp, model,
                   sparse: tuple[ModelStamp, Any] | None = None):
    """Re-embed collection `name`: its dense vectors with `model` (stamped `stamp`), and its sparse ones, if it
    keeps them, with `sparse` (a stamp and a staged sparse model) or else the sparse model it has."""
    loop = asyncio.get_running_loop()

    def embed(texts):
        return asyncio.run_coroutine_threadsafe(model.embed(texts), loop).result().vectors

    info = await run_in_threadpool(request.app.state.index.info, name)
    embed_sparse, sparse_stamp = None, None
    if info.sparse_model is not None:  # its sparse vectors are made again too
        sparse_stamp, sparse_model = sparse if sparse is not None else (None, sparse_embedder(request, name, info))
        if sparse_model.info.dimension != info.sparse_dimension:
            raise ApiError(422, f"collection {name!r} keeps sparse vectors of {info.sparse_dimension} dimensions and "
                                f"the new sparse model makes {sparse_model.info.dimension}: create the collection "
                                "again", "Validation")

        def embed_sparse(texts):
            return sparse_rows(asyncio.run_coroutine_threadsafe(sparse_vectors(sparse_model, texts), loop).result())

    log.info("re-embedding collection %s with %s", name, stamp.describe())
    return await run_in_threadpool(reembed, request.app.state.index, name, stamp, model.info.dimension, embed,
                                   embed_sparse=embed_sparse, sparse_stamp=sparse_stamp)
