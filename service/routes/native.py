"""The native API: /embed, /similarity, and the FAISS index (/index/documents, /search)."""

from __future__ import annotations

import time

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service import schemas
from service.errors import ApiError
from service.index import Document
from service.routes.common import JSON, check_batch, engine, settings, timing_headers

router = APIRouter(tags=["embeddings"])
_ERRORS = {code: {"model": schemas.ErrorResponse} for code in (413, 415, 422, 424, 429, 503)}


async def _embed(request: Request, texts: list[str], field: str, normalize: bool = True,
                 truncate: bool | None = None):
    check_batch(request, len(texts), field)
    return await engine(request).embed(texts, normalize=normalize, truncate=truncate)


@router.post("/embed", response_model=schemas.EmbedResponse, responses=_ERRORS)
async def embed(req: schemas.EmbedRequest, request: Request):
    """Embed one text or a batch; texts beyond the model's max_seq_length tokens are truncated
    unless `truncate` is false."""
    start = time.perf_counter()
    result = await _embed(request, req.texts, "inputs", req.normalize, req.truncate)
    info = engine(request).info
    return JSON({"embeddings": result.vectors, "model": info.model, "dim": info.dimension},
                headers=timing_headers(result, time.perf_counter() - start))


@router.post("/similarity", response_model=schemas.SimilarityResponse, responses=_ERRORS)
async def similarity(req: schemas.SimilarityRequest, request: Request):
    """Cosine similarity between a source sentence and each of the sentences."""
    result = await _embed(request, [req.source_sentence, *req.sentences], "sentences")
    vectors = result.vectors
    return JSON({"scores": vectors[1:] @ vectors[0]}, headers=timing_headers(result))


def _index(request: Request):
    return request.app.state.index


@router.post("/index/documents", response_model=schemas.AddDocumentsResponse, responses=_ERRORS, tags=["search"])
async def add_documents(req: schemas.AddDocumentsRequest, request: Request):
    """Embed and index documents; an id already in the index is replaced."""
    result = await _embed(request, [d.text for d in req.documents], "documents")
    index = _index(request)
    docs = [Document(d.id, d.text, d.metadata) for d in req.documents]
    await run_in_threadpool(index.add, docs, result.vectors)
    request.app.state.metrics.index_documents.set(len(index))
    return {"added": len(req.documents), "total": len(index)}


@router.delete("/index/documents/{doc_id}", response_model=schemas.DeleteDocumentsResponse, tags=["search"])
async def delete_document(doc_id: str, request: Request):
    index = _index(request)
    if not await run_in_threadpool(index.delete, [doc_id]):
        raise ApiError(404, f"no document with id {doc_id!r}", "NotFound")
    request.app.state.metrics.index_documents.set(len(index))
    return {"deleted": 1, "total": len(index)}


@router.delete("/index", response_model=schemas.DeleteDocumentsResponse, tags=["search"])
async def clear_index(request: Request):
    index = _index(request)
    n = len(index)
    await run_in_threadpool(index.clear)
    request.app.state.metrics.index_documents.set(0)
    return {"deleted": n, "total": 0}


@router.post("/search", response_model=schemas.SearchResponse, responses=_ERRORS, tags=["search"])
async def search(req: schemas.SearchRequest, request: Request):
    """The k nearest documents to each query by cosine similarity (exact FAISS inner product)."""
    limit = settings(request).max_search_k
    if req.k > limit:
        raise ApiError(422, f"k={req.k} exceeds the limit of {limit}", "Validation", param="k")
    result = await _embed(request, req.queries, "query")
    hits = await run_in_threadpool(_index(request).search, np.asarray(result.vectors), req.k)
    return {"results": [[vars(h) for h in row] for row in hits]}
