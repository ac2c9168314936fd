"""HTTP routes. Each one validates, hands texts to the batch queue, and shapes the answer."""

from __future__ import annotations

import logging
import time
from contextlib import asynccontextmanager

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import schemas
from service.batching import BatchQueue, QueueFullError
from service.encoder import OnnxEncoder
from service.index import Document, FaissIndex
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("sembed")

_ERRORS = {413: {"model": schemas.ErrorResponse}, 422: {"model": schemas.ErrorResponse},
           503: {"model": schemas.ErrorResponse}}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        encoder = OnnxEncoder(settings.model_dir, settings.intra_op_threads)
        encoder.embed(["warm-up"])  # onnxruntime's first run allocates; keep it off the first request
        app.state.encoder = encoder
        app.state.index = FaissIndex(encoder.dim, settings.index_path)
        metrics.index_documents.set(len(app.state.index))
        app.state.queue = BatchQueue(encoder, metrics, settings.max_batch_size, settings.batch_wait_ms,
                                     settings.max_queue_texts)
        app.state.queue.start()
        log.info("serving %s (dim %d) from %s", encoder.manifest.name, encoder.dim, settings.model_dir)
        yield
        await app.state.queue.stop()

    app = FastAPI(title="sembed", version="0.1.0", lifespan=lifespan,
                  description="Sentence embeddings, similarity and FAISS search over an ONNX export.")
    app.state.settings = settings
    app.state.metrics = metrics

    # --- errors: always a JSON body naming the problem ---------------------------------------
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        detail = [{k: e[k] for k in ("loc", "msg", "type")} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"error": "invalid request", "detail": jsonable_encoder(detail)})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        return JSONResponse(status_code=exc.status_code, content={"error": exc.detail}, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception):
        log.exception("unhandled error")
        return JSONResponse(status_code=500, content={"error": "internal error", "detail": type(exc).__name__})

    @app.middleware("http")
    async def _observe(request: Request, call_next):
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = route.path if route is not None else "unmatched"
        metrics.requests.labels(path, str(response.status_code)).inc()
        metrics.request_seconds.labels(path).observe(time.perf_counter() - start)
        return response

    # --- helpers --------------------------------------------------------------------------------
    def check_texts(texts: list[str], field: str) -> None:
        if len(texts) > settings.max_inputs_per_request:
            raise HTTPException(413, f"{len(texts)} {field} in one request; the limit is "
                                     f"{settings.max_inputs_per_request}: split the request")
        for i, text in enumerate(texts):
            if len(text) > settings.max_input_chars:
                raise HTTPException(413, f"{field}[{i}] has {len(text)} characters; the limit is "
                                         f"{settings.max_input_chars}")

    async def embed(texts: list[str], normalize: bool = True) -> np.ndarray:
        try:
            return await app.state.queue.embed(texts, normalize)
        except QueueFullError as e:
            raise HTTPException(503, str(e), headers={"Retry-After": "1"}) from e

    # --- routes ---------------------------------------------------------------------------------
    @app.post("/embed", response_model=schemas.EmbedResponse, responses=_ERRORS, tags=["embeddings"])
    async def embed_route(req: schemas.EmbedRequest):
        """Embed one text or a batch; texts beyond the model's max_seq_length tokens are truncated."""
        texts = req.texts
        check_texts(texts, "inputs")
        vectors = await embed(texts, req.normalize)
        manifest = app.state.encoder.manifest
        return {"embeddings": vectors.tolist(), "model": manifest.name, "dim": manifest.dimension}

    @app.post("/similarity", response_model=schemas.SimilarityResponse, responses=_ERRORS, tags=["embeddings"])
    async def similarity_route(req: schemas.SimilarityRequest):
        """Cosine similarity between a source sentence and each of the sentences."""
        texts = [req.source_sentence, *req.sentences]
        check_texts(texts, "sentences")
        vectors = await embed(texts)
        return {"scores": (vectors[1:] @ vectors[0]).tolist()}

    @app.post("/index/documents", response_model=schemas.AddDocumentsResponse, responses=_ERRORS, tags=["search"])
    async def add_documents_route(req: schemas.AddDocumentsRequest):
        """Embed and index documents; an id already in the index is replaced."""
        check_texts([d.text for d in req.documents], "documents")
        vectors = await embed([d.text for d in req.documents])
        index = app.state.index
        index.add([Document(d.id, d.text, d.metadata) for d in req.documents], vectors)
        metrics.index_documents.set(len(index))
        return {"added": len(req.documents), "total": len(index)}

    @app.delete("/index/documents/{doc_id}", response_model=schemas.DeleteDocumentsResponse, tags=["search"])
    async def delete_document_route(doc_id: str):
        index = app.state.index
        if not index.delete([doc_id]):
            raise HTTPException(404, f"no document with id {doc_id!r}")
        metrics.index_documents.set(len(index))
        return {"deleted": 1, "total": len(index)}

    @app.delete("/index", response_model=schemas.DeleteDocumentsResponse, tags=["search"])
    async def clear_index_route():
        index = app.state.index
        n = len(index)
        index.clear()
        metrics.index_documents.set(0)
        return {"deleted": n, "total": 0}

    @app.post("/search", response_model=schemas.SearchResponse, responses=_ERRORS, tags=["search"])
    async def search_route(req: schemas.SearchRequest):
        """The k nearest documents to each query by cosine similarity (exact FAISS inner product)."""
        if req.k > settings.max_search_k:
            raise HTTPException(422, f"k={req.k} exceeds the limit of {settings.max_search_k}")
        queries = req.queries
        check_texts(queries, "query")
        vectors = await embed(queries)
        return {"results": [[vars(h) for h in hits] for hits in app.state.index.search(vectors, req.k)]}

    @app.get("/healthz", tags=["ops"])
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"model": schemas.ErrorResponse}})
    async def readyz():
        queue = getattr(app.state, "queue", None)
        if queue is None or not queue.running:
            raise HTTPException(503, "model not loaded")
        return {"status": "ready"}

    @app.get("/metrics", tags=["ops"])
    async def metrics_route():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/info", tags=["ops"])
    async def info():
        """The served export's manifest, the index size and the request limits."""
        return {
            "manifest": app.state.encoder.manifest.model_dump(),
            "index_documents": len(app.state.index),
            "limits": {
                "max_inputs_per_request": settings.max_inputs_per_request,
                "max_input_chars": settings.max_input_chars,
                "max_search_k": settings.max_search_k,
            },
        }

    app.add_middleware(JsonBodyDefault)
    return app


class JsonBodyDefault:
    """Read request bodies as JSON unless the client says otherwise.

    `curl -d '{...}'` labels its body application/x-www-form-urlencoded; this API takes JSON only,
    so that label (or none) is treated as JSON rather than answered with a confusing 422.
    """

    _FORM = b"application/x-www-form-urlencoded"

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            ctype = dict(scope["headers"]).get(b"content-type")
            if ctype is None or ctype.split(b";")[0].strip() == self._FORM:
                ctype = b"application/json"
            scope = {**scope, "headers": [*headers, (b"content-type", ctype)]}
        await self.app(scope, receive, send)
