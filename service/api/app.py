"""An API process's application: the guard, the routers, a model registry and the index.

    request → [CORS] → RequestGuard (id, API key, JSON-only, body limits, disconnects, metrics, access log)
            → FastAPI router (native / OpenAI / Cohere / index / ops / admin: validate, shape)
            → registry: tokenise here → EngineClient → the engine process (admission, queue, model)
            → index client → the index writer process (or Milvus)

`topology` says where the engines and the index run (the supervisor's processes); tests pass a
`registry` of engines in this process instead, and an index of their own or none (opened here).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from swagger_ui_bundle import swagger_ui_path

from service import __version__
from service.api.auth import ApiKeys
from service.api.errors import ERROR_RESPONSES, ApiError, error_body, protocol_of, to_api_error
from service.api.middleware import RequestGuard
from service.api.registry import ModelRegistry
from service.api.routes import admin, cohere, index, openai, ops, tei
from service.api.topology import ModelLoader, SupervisorLoader, Topology, connect_registry
from service.index import DEFAULT_COLLECTION, CollectionSpec, ModelStamp, VectorIndexError, open_configured
from service.index.remote import IndexClient
from service.ipc.messages import EngineError
from service.metrics import ApiMetrics
from service.settings import Settings

log = logging.getLogger("sembed")


def create_app(settings: Settings | None = None, registry: ModelRegistry | None = None,
               topology: Topology | None = None, loader: ModelLoader | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = registry.metrics if registry is not None else ApiMetrics()
    if registry is None and topology is None:
        raise ValueError("create_app needs the supervisor's topology, or a registry of engines (tests)")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if registry is not None:
            reg = registry
        else:
            assert topology is not None  # create_app refuses neither
            reg = await connect_registry(topology, settings, metrics)
        for name in reg.names():
            info = reg.get(name).info
            metrics.model_info.labels(name, str(info.dimension), str(info.max_seq_length), info.device,
                                      str(info.manifest.get("onnx_sha256", ""))).set(1)
        app.state.registry = reg
        app.state.loader = loader or (SupervisorLoader(topology, settings, reg) if topology is not None else None)
        if topology is not None and topology.index_endpoint:  # the index's one writer process
            app.state.index = IndexClient(topology.index_endpoint)
        else:
            # a Milvus server (every API process talks to it), or the test's own index in this process
            app.state.index = await run_in_threadpool(open_configured, settings)
        # idempotent: every API process may ask, the first one makes it
        await run_in_threadpool(prepare_default_collection, app.state.index, settings, reg.resolve(), reg.get().info)
        await run_in_threadpool(index.count_documents, metrics, app.state.index)
        log.info("serving %s", ", ".join(reg.names()))
        grpc = None
        if settings.grpc_port:  # TEI's gRPC API beside HTTP (docs/grpc.md); grpcio loads only where it is on
            from service.api.grpc.server import GrpcServer

            grpc = app.state.grpc = await GrpcServer.start(reg, settings, keys, __version__)
        yield
        if grpc is not None:  # begun with HTTP's drain (service/api/http_server.py); finished before the engines go
            await grpc.stop(settings.shutdown_grace_s)
        await reg.close()
        await run_in_threadpool(app.state.index.close)

    # redirect_slashes off: a path a client normalised (DELETE /index/documents/../ becomes DELETE /index/)
    # must find no route, not a redirect to one that clears the index.
    # FastAPI's native OpenTelemetry asks the global providers on every request (a visible share of the
    # event loop in a py-spy profile at concurrency 64): off unless asked for; our metrics are Prometheus.
    otel = settings.opentelemetry
    # /docs from assets shipped in a package (swagger-ui-bundle), not FastAPI's CDN: it works offline
    app = FastAPI(title="sembed", version=__version__, lifespan=lifespan, responses=ERROR_RESPONSES,
                  redirect_slashes=False, openapi_url=OPENAPI_URL, docs_url=None, redoc_url=None,
                  description="Sentence embeddings, similarity and FAISS search over ONNX exports.",
                  telemetry={"tracing": otel, "metrics": otel, "logs": otel, "operation_spans": otel})
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.staged_models = {}  # model stamp → model loaded by a reload, before the registry switches to it

    async def answer_error(request: Request, exc: Exception) -> Response:
        error = to_api_error(exc, settings.retry_after_s)
        route = request.scope.get("route")
        metrics.request_errors.labels(route.path if route else "unmatched", error.error_type).inc()
        if error.status >= 500 and error.status != 503:
            log.error("request %s failed", request.state.request_id, exc_info=exc)
        body = error_body(protocol_of(route), error, getattr(request.state, "request_id", None))
        return Response(orjson.dumps(body), status_code=error.status, headers=error.headers,
                        media_type="application/json")

    for kind in (ApiError, EngineError, VectorIndexError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, answer_error)

    for router in (tei.router, index.router, openai.router, cohere.router, ops.router, admin.router):
        app.include_router(router)
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return get_swagger_ui_html(openapi_url=OPENAPI_URL, title="sembed: API",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css", swagger_favicon_url="")
    keys = ApiKeys.load(settings.api_keys, settings.api_keys_file, admin_keys=settings.admin_api_keys,
                        admin_keys_file=settings.admin_api_keys_file, metrics_public=settings.metrics_public)
    app.add_middleware(RequestGuard, metrics=metrics, router=app.router, max_body_bytes=settings.max_request_bytes,
                       body_timeout_s=settings.body_timeout_s, keys=keys, access_log=settings.access_log,
                       lean_paths=() if otel else LEAN_PATHS, error_handler=answer_error)
    if settings.cors_origins:  # outermost: a browser's preflight is answered before the key check
        app.add_middleware(CORSMiddleware, allow_origins=[o.strip() for o in settings.cors_origins.split(",")],
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"],
                           expose_headers=["x-request-id", "x-compute-time", "x-total-time"], max_age=600)
    return app


DOCS_ASSETS = "/docs-assets"
OPENAPI_URL = "/openapi.json"  # FastAPI's default, named: /docs reads it

#: POST routes the guard runs past FastAPI's stack when their body is valid (RequestGuard says how): the
#: per-text routes, where that stack was a quarter of an API process's CPU per one-text request
LEAN_PATHS = ("/embed", "/v1/embeddings")


def prepare_default_collection(index, settings: Settings, model: str, info):
    """Make the default collection, stamped by the default model, if absent (none for a reranker or classifier)."""
    if not info.gives_embeddings:  # no vectors to index: no default collection (see default_collection)
        return index
    stamp = ModelStamp(model, info.graph_sha256)
    # an existing one gains or loses its lexical index as SEMBED_INDEX_LEXICAL says
    index.create_collection(CollectionSpec(DEFAULT_COLLECTION, info.dimension, settings.index_type, stamp,
                                           lexical=settings.index_lexical), exist_ok=True)
    current = index.info(DEFAULT_COLLECTION).model
    if current != stamp:
        log.warning("the default collection was embedded by %s, not %s: text requests to it are refused until "
                    "POST /admin/collections/default/reembed", current.describe() if current else "client vectors",
                    stamp.describe())
    return index
