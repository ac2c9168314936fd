"""The search index: /index/documents, /index, /search (FAISS; embedded by the engine)."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service import schemas
from service.errors import ApiError
from service.index import Document
from service.routes.common import settings
from service.routes.tei import embed_texts as _embed

router = APIRouter(tags=["search"])


def _index(request: Request):
    return request.app.state.index


@router.post("/index/documents", response_model=schemas.AddDocumentsResponse)
async def add_documents(req: schemas.AddDocumentsRequest, request: Request):
    """Embed and index documents; an id already in the index is replaced."""
    result = await _embed(request, [d.text for d in req.documents], "documents")
    index = _index(request)
    docs = [Document(d.id, d.text, d.metadata) for d in req.documents]
    await run_in_threadpool(index.add, docs, result.vectors)
    request.app.state.metrics.index_documents.set(len(index))
    return {"added": len(req.documents), "total": len(index)}


@router.delete("/index/documents/{doc_id}", response_model=schemas.DeleteDocumentsResponse)
async def delete_document(doc_id: str, request: Request):
    index = _index(request)
    if not await run_in_threadpool(index.delete, [doc_id]):
        raise ApiError(404, f"no document with id {doc_id!r}", "NotFound")
    request.app.state.metrics.index_documents.set(len(index))
    return {"deleted": 1, "total": len(index)}


@router.delete("/index", response_model=schemas.DeleteDocumentsResponse)
async def clear_index(request: Request):
    index = _index(request)
    n = len(index)
    await run_in_threadpool(index.clear)
    request.app.state.metrics.index_documents.set(0)
    return {"deleted": n, "total": 0}


@router.post("/search", response_model=schemas.SearchResponse)
async def search(req: schemas.SearchRequest, request: Request):
    """The k nearest documents to each query by cosine similarity (exact FAISS inner product)."""
    limit = settings(request).max_search_k
    if req.k > limit:
        raise ApiError(422, f"k={req.k} exceeds the limit of {limit}", "Validation", param="k")
    result = await _embed(request, req.queries, "query")
    hits = await run_in_threadpool(_index(request).search, np.asarray(result.vectors), req.k)
    return {"results": [[vars(h) for h in row] for row in hits]}
