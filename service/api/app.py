"""The application: a model registry and an index built at start, the guard, three routers.

    request → [CORS] → RequestGuard (id, API key, JSON-only, body limits, disconnects, metrics, access log)
            → HotRoutes (the JSON-body routes, called directly) or FastAPI's router
            → router (native / OpenAI / ops: validate, shape) → registry → engine → backend
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.auth import ApiKeys
from service.engine import EngineError
from service.errors import ERROR_RESPONSES, ApiError, error_body, to_api_error
from service.index import DEFAULT_COLLECTION, CollectionSpec, IndexError_, ModelStamp, open_index
from service.metrics import Metrics
from service.middleware import RequestGuard
from service.registry import ModelRegistry
from service.routes import admin, index, openai, ops, tei
from service.routes.route import HotRoutes
from service.settings import Settings

log = logging.getLogger("sembed")


def create_app(settings: Settings | None = None, registry: ModelRegistry | None = None) -> FastAPI:
    """`registry`: models already loaded (tests pass one over the fake backend); else from settings."""
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        reg = registry or await run_in_threadpool(ModelRegistry.from_settings, settings, metrics)
        for name in reg.names():
            engine = reg.get(name)
            engine.metrics = metrics
            info = engine.info
            metrics.model_info.labels(name, str(info.dimension), str(info.max_seq_length), info.device,
                                      str(info.manifest.get("onnx_sha256", ""))).set(1)
        app.state.registry = reg
        app.state.index = await run_in_threadpool(_open_index, settings, reg)
        metrics.index_documents.set(index.default_documents(app.state.index))
        log.info("serving %s", ", ".join(reg.names()))
        yield
        await run_in_threadpool(reg.stop)
        await run_in_threadpool(app.state.index.close)

    # redirect_slashes off: a path a client normalised (DELETE /index/documents/../ becomes DELETE /index/)
    # must find no route, not a redirect to one that clears the index.
    # FastAPI's native OpenTelemetry asks the global providers on every request (a visible share of the
    # event loop in a py-spy profile at concurrency 64): off unless asked for; our metrics are Prometheus.
    otel = settings.opentelemetry
    app = FastAPI(title="sembed", version="0.3.0", lifespan=lifespan, responses=ERROR_RESPONSES, redirect_slashes=False,
                  description="Sentence embeddings, similarity and FAISS search over ONNX exports.",
                  telemetry={"tracing": otel, "metrics": otel, "logs": otel, "operation_spans": otel})
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.staged_engines = {}  # model stamp → engine loaded by a reload, before the registry switches to it

    async def answer_error(request: Request, exc: Exception) -> Response:
        error = to_api_error(exc, settings.retry_after_s)
        route = request.scope.get("route")
        metrics.request_errors.labels(route.path if route else "unmatched", error.error_type).inc()
        if error.status >= 500 and error.status != 503:
            log.error("request %s failed", request.state.request_id, exc_info=exc)
        body = error_body(request.url.path, error, getattr(request.state, "request_id", None))
        return Response(orjson.dumps(body), status_code=error.status, headers=error.headers,
                        media_type="application/json")

    for kind in (ApiError, EngineError, IndexError_, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, answer_error)

    routers = (tei.router, index.router, openai.router, ops.router, admin.router)
    for router in routers:
        app.include_router(router)
    keys = ApiKeys.load(settings.api_keys, settings.api_keys_file, admin_keys=settings.admin_api_keys,
                        admin_keys_file=settings.admin_api_keys_file, metrics_public=settings.metrics_public)
    # HotRoutes takes the JsonBodyRoutes among them and leaves the rest to the router
    app.add_middleware(HotRoutes, routes=[r for router in routers for r in router.routes], answer_error=answer_error,
                       enabled=not otel)
    app.add_middleware(RequestGuard, metrics=metrics, router=app.router, max_body_bytes=settings.max_request_bytes,
                       body_timeout_s=settings.body_timeout_s, keys=keys, access_log=settings.access_log)
    if settings.cors_origins:  # outermost: a browser's preflight is answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=[o.strip() for o in settings.cors_origins.split(",")],
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"],
                           expose_headers=["x-request-id", "x-compute-time", "x-total-time"], max_age=600)
    return app


def _open_index(settings: Settings, reg: ModelRegistry):
    """The configured index, with the default collection stamped by the default model (made if absent;
    none for a reranker, which makes no vectors)."""
    index = open_index(settings.index_backend, settings.index_path, uri=settings.milvus_uri,
                       **({"fsync": settings.index_fsync, "snapshot_every_ops": settings.index_snapshot_every_ops,
                           "snapshot_every_s": settings.index_snapshot_every_s, "gpu": settings.index_gpu}
                          if settings.index_backend == "local" else {}))
    info = reg.get().info
    if info.is_cross_encoder:  # no vectors to index: no default collection (see default_collection)
        return index
    stamp = ModelStamp(reg.default, info.graph_sha256)
    index.create_collection(CollectionSpec(DEFAULT_COLLECTION, info.dimension, settings.index_type, stamp),
                            exist_ok=True)
    current = index.info(DEFAULT_COLLECTION).model
    if current != stamp:
        log.warning("the default collection was embedded by %s, not %s: text requests to it are refused until "
                    "POST /admin/collections/default/reembed", current.describe() if current else "client vectors",
                    stamp.describe())
    return index
