"""The search index over HTTP: collections, documents, search; the first routes use the default collection.

Texts are embedded by the model that stamped the collection, so a collection never mixes vectors
of two models; index calls run in the thread pool (writes wait there for their group's fsync).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service.api import chunking as chunks
from service.api import schemas
from service.api.errors import ApiError
from service.api.registry import ServedModel
from service.api.routes.common import NumpyJSONResponse, check_batch, registry, settings
from service.index import (
    DEFAULT_COLLECTION,
    CollectionInfo,
    CollectionNotFound,
    CollectionSpec,
    Document,
    Hit,
    InvalidRequest,
    ModelMismatch,
    ModelStamp,
    SearchParams,
)
from service.index.base import SparseRows
from service.ipc.messages import WrongModelType

router = APIRouter(tags=["search"])


def _index(request: Request):
    return request.app.state.index


def model_stamp(request: Request, name: str | None = None) -> ModelStamp:
    """The stamp a collection embedded by served model `name` (None: the default) carries."""
    reg = registry(request)
    name = reg.resolve(name)
    info = reg.get(name).info
    if not info.gives_embeddings:
        raise WrongModelType(f"model {name} is {info.described}; it makes no vectors to index: create the "
                             "collection with vectors_only, or name an embedding model")
    return ModelStamp(name, info.graph_sha256)


def default_collection(request: Request) -> str:
    """The first routes' collection. A reranker makes no vectors, so where it is the default model the
    service made no default collection (a 1-d one stamped by it would only mislead)."""
    model_stamp(request)
    return DEFAULT_COLLECTION


def default_documents(index) -> int:
    try:
        return index.info(DEFAULT_COLLECTION).count
    except CollectionNotFound:  # the default model is a reranker
        return 0


async def _call(method, *args, **kwargs):
    """An index method, run in the thread pool (a local index's writes wait there for their fsync)."""
    return await run_in_threadpool(method, *args, **kwargs)


def embedder_for(request: Request, collection: str, info: CollectionInfo):
    """The model whose vectors the collection holds; refuses a collection another model made."""
    if info.model is None:
        raise InvalidRequest(f"collection {collection!r} holds client vectors only: send `vector`, not text")
    staged = request.app.state.staged_models.get(info.model)  # a reload re-embedding before it switches
    if staged is not None:
        return staged
    served = registry(request).names()
    current = model_stamp(request, info.model.name) if info.model.name in served else None
    if current != info.model:
        now = current.describe() if current else f"no model named {info.model.name!r}"
        raise ModelMismatch(f"collection {collection!r} was embedded by {info.model.describe()}, but the service "
                            f"now runs {now}: re-embed it (POST /admin/collections/{collection}/reembed) or use "
                            f"the model that made it")
    return registry(request).get(info.model.name)


async def _vectors(request: Request, collection: str, texts: Sequence[str | None], given: list, field: str,
                   info: CollectionInfo | None = None, owner: Sequence[int] | None = None):
    """One unit vector per row: the client's where given, else the collection's model embeds the text. `owner`:
    each row's input (a document's chunks are rows of one input; the batch limit was checked on the inputs)."""
    if owner is None:
        check_batch(request, len(texts), field)
    missing = [i for i, v in enumerate(given) if v is None]
    if info is None:
        info = await _call(_index(request).info, collection)
    if missing:
        if any(texts[i] is None for i in missing):
            raise InvalidRequest(f"each of {field} needs text to embed, or its own vector")
        embedder = embedder_for(request, collection, info)
        embedded = (await embedder.embed([texts[i] for i in missing])).vectors
    out = np.empty((len(texts), info.dimension), dtype=np.float32)
    for row, i in enumerate(missing):
        out[i] = embedded[row]
    for i, v in enumerate(given):
        if v is not None:
            where = f"{field}[{i if owner is None else owner[i]}]"
            if len(v) != info.dimension:
                raise InvalidRequest(f"{where}: vector of dimension {len(v)}; collection {collection!r} has "
                                     f"{info.dimension}")
            vec = np.asarray(v, dtype=np.float32)
            norm = float(np.linalg.norm(vec))
            if not np.isfinite(vec).all() or not np.isfinite(norm) or norm == 0:
                raise InvalidRequest(f"{where}: a vector must be finite and non-zero")
            out[i] = vec / norm
    return out


def sparse_stamp(request: Request, name: str) -> tuple[ModelStamp, int]:
    """The stamp and vocabulary (the vectors' dimension) of served sparse model `name`; a 422 naming the served
    sparse models if it is not one."""
    reg = registry(request)
    sparse = [n for n in reg.names() if reg.get(n).info.is_sparse]
    info = reg.get(name).info if name in reg.names() else None
    if info is None or not info.is_sparse:
        what = "no model served here" if info is None else f"not a sparse model (it is {info.described})"
        served = ", ".join(sparse) if sparse else "none (serve a SPLADE export beside it: SEMBED_MODELS)"
        raise ApiError(422, f"sparse_model {name!r} is {what}: the served sparse models are {served}", "Validation",
                       param="sparse_model")
    return ModelStamp(name, info.graph_sha256), info.dimension


def sparse_embedder(request: Request, collection: str, info: CollectionInfo):
    """The sparse model whose vectors the collection keeps; refuses one the service no longer runs as it was."""
    stamp = cast(ModelStamp, info.sparse_model)
    staged = request.app.state.staged_models.get(stamp)  # a reload re-embedding before it switches
    if staged is not None:
        return staged
    reg = registry(request)
    served = reg.get(stamp.name).info if stamp.name in reg.names() else None
    current = ModelStamp(stamp.name, served.graph_sha256) if served is not None and served.is_sparse else None
    if current != stamp:
        now = current.describe() if current else f"no sparse model named {stamp.name!r}"
        raise ModelMismatch(f"collection {collection!r} keeps the sparse vectors of {stamp.describe()}, but the "
                            f"service now runs {now}: serve that model under its name, or create the collection "
                            "again and write its documents again")
    return reg.get(stamp.name)


async def sparse_vectors(model: ServedModel, texts: Sequence[str | None]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Sparse model `model`'s vector of each text, (indices ascending, values); a row without text (a document
    that brought its vector alone) has none."""
    todo = [i for i, text in enumerate(texts) if text]
    out = [(np.empty(0, np.int64), np.empty(0, np.float32))] * len(texts)
    if todo:
        # a chunk is cut for the dense model's window: the sparse model truncates it to its own if smaller
        found, _ = await model.embed_sparse(
            [cast(str, texts[i]) for i in todo], truncate=True)
        for i, vector in zip(todo, found):
            out[i] = (vector.indices, vector.values)
    return out


def sparse_rows(vectors: list[tuple[np.ndarray, np.ndarray]]) -> SparseRows:
    """Sparse vectors as the index takes them: CSR arrays, a row each."""
    indptr = np.zeros(len(vectors) + 1, np.int64)
    np.cumsum([len(indices) for indices, _ in vectors], out=indptr[1:])
    if not indptr[-1]:
        return SparseRows(indptr, np.empty(0, np.int32), np.empty(0, np.float32))
    return SparseRows(indptr, np.concatenate([i for i, _ in vectors]).astype(np.int32),
                      np.concatenate([v for _, v in vectors]).astype(np.float32))


def _fields(record, include: Sequence[str]) -> dict[str, Any]:
    out = {"id": record.id}
    if isinstance(record, Hit):
        out["score"] = record.score
        if record.start is not None:  # the best chunk's span
            out["start"], out["end"] = record.start, record.end
    for name in include:
        out[name] = getattr(record, name)
    if isinstance(record, Hit) and record.chunks is not None:
        out["chunks"] = [{"start": a, "end": b, "score": score} for a, b, score in record.chunks]
    return out


async def _documents(request: Request, collection: str, req: schemas.AddDocumentsRequest):
    """The request's documents and their vectors, a row per chunk: a text the collection's model embeds is cut
    into chunks where it is longer than the model's window (and chunking is on); the whole request is refused
    (nothing written) when its chunks exceed max_request_chunks. A collection that keeps sparse vectors has its
    sparse model's vector of each chunk too (None otherwise)."""
    docs = req.documents
    check_batch(request, len(docs), "documents")
    info = await _call(_index(request).info, collection)
    config = settings(request)
    asked = chunks.wanted(req.chunking, config, config.chunking and config.index_backend == "local")
    spans: list[list[tuple[int, int]] | None] = [None] * len(docs)
    if asked is not None:
        if info.model is None and req.chunking not in (None, False):
            raise ApiError(422, f"collection {collection!r} holds client vectors: chunking applies to texts the "
                                "service embeds", "Validation", param="chunking")
        cut = [i for i, d in enumerate(docs) if d.vector is None and d.text]
        if cut and info.model is not None:
            embedder = embedder_for(request, collection, info)
            chosen = chunks.options(embedder, asked, config)
            found = await chunks.split(embedder, [cast(str, docs[i].text) for i in cut], chosen, "documents", cut)
            for i, cut_spans in zip(cut, found):
                spans[i] = cut_spans if len(cut_spans) > 1 else None  # a text that fits: one chunk, as always
    chunks.check_total(spans, config.max_request_chunks, "documents")
    texts: list[str | None] = []
    given: list = []
    owner: list[int] = []
    for i, (d, doc_spans) in enumerate(zip(docs, spans)):
        if doc_spans is None:
            texts.append(d.text)
            given.append(d.vector)
            owner.append(i)
        else:
            text = cast(str, d.text)
            texts.extend(text[a:b] for a, b in doc_spans)
            given.extend([None] * len(doc_spans))
            owner.extend([i] * len(doc_spans))
    sparse = None
    if info.sparse_model is None:
        vectors = await _vectors(request, collection, texts, given, "documents", info, owner)
    else:  # both models at once; either failing refuses the whole write
        vectors, found = await asyncio.gather(_vectors(request, collection, texts, given, "documents", info, owner),
                                              sparse_vectors(sparse_embedder(request, collection, info), texts))
        sparse = sparse_rows(found)
    return [Document(d.id, d.text or "", d.metadata, s) for d, s in zip(docs, spans)], vectors, sparse


# --- collections ---------------------------------------------------------------------------------

@router.post("/collections", response_model=schemas.CollectionOut, status_code=201)
async def create_collection(req: schemas.CreateCollectionRequest, request: Request):
    """A named collection with its own index type and quantization, stamped with the model that will embed
    its texts."""
    if req.vectors_only:
        if req.dimension is None:
            raise InvalidRequest("a vectors_only collection needs its dimension")
        spec = CollectionSpec(req.name, req.dimension, req.index_type, None, req.quantization, req.lexical)
    else:
        stamp = model_stamp(request, req.model)
        dim = registry(request).get(stamp.name).info.dimension
        if req.dimension not in (None, dim):
            raise InvalidRequest(f"model {stamp.name} makes {dim}-d vectors, not {req.dimension}")
        spec = CollectionSpec(req.name, dim, req.index_type, stamp, req.quantization, req.lexical)
    if req.sparse_model is not None:
        spec.sparse_model, spec.sparse_dimension = sparse_stamp(request, req.sparse_model)
    info = await _call(_index(request).create_collection, spec)
    _count(request, info.name, info.count)
    return NumpyJSONResponse(_collection(info), status_code=201)


@router.get("/collections", response_model=schemas.CollectionsOut)
async def list_collections(request: Request):
    return NumpyJSONResponse({"collections": [_collection(c) for c in await _call(_index(request).list_collections)]})


@router.get("/collections/{name}", response_model=schemas.CollectionOut)
async def collection_stats(name: str, request: Request):
    return NumpyJSONResponse(_collection(await _call(_index(request).info, name)))


def _confirmed(confirm: bool, what: str) -> None:
    """Whole-collection deletes need ?confirm=true: HTTP clients turn DELETE .../documents/.. into them."""
    if not confirm:
        raise ApiError(422, f"{what}: add ?confirm=true (a request for the document '..' becomes this one once a "
                            "client normalises its path)", "Validation", param="confirm")


@router.delete("/collections/{name}", response_model=schemas.DeleteDocumentsResponse)
async def drop_collection(name: str, request: Request, confirm: bool = False):
    """Drop the collection and everything in it (?confirm=true)."""
    _confirmed(confirm, f"dropping collection {name!r} deletes all its documents")
    result = await _call(_index(request).drop_collection, name)
    _count(request, name, 0)
    return NumpyJSONResponse({"deleted": result.count, "total": 0, "sequence": result.sequence})


def _collection(info: CollectionInfo) -> dict[str, Any]:
    out = dict(vars(info))
    out["model"] = vars(info.model) if info.model else None
    out["sparse_model"] = vars(info.sparse_model) if info.sparse_model else None
    return out


# --- documents -----------------------------------------------------------------------------------

@router.post("/collections/{name}/documents", response_model=schemas.AddDocumentsResponse)
async def upsert(name: str, req: schemas.AddDocumentsRequest, request: Request):
    """Add or replace documents: texts are embedded by the collection's model, or bring your vectors. A text
    longer than the model's window becomes chunks, a vector each (`chunking`; docs/long-documents.md)."""
    documents, vectors, sparse = await _documents(request, name, req)
    result = await _call(_index(request).upsert, name, documents, vectors, sparse)
    _count(request, name, result.total)
    return NumpyJSONResponse({"added": result.count, "total": result.total, "sequence": result.sequence})


@router.post("/collections/{name}/documents/get", response_model=schemas.GetDocumentsResponse)
async def get_documents(name: str, req: schemas.GetDocumentsRequest, request: Request):
    check_batch(request, len(req.ids), "ids")
    records = await _call(_index(request).get, name, req.ids, "vector" in req.include)
    found = {r.id for r in records}
    return NumpyJSONResponse({"documents": [_fields(r, req.include) for r in records],
                 "missing": [i for i in req.ids if i not in found]})


@router.get("/collections/{name}/documents/{doc_id}", response_model=schemas.DocumentOut)
async def get_document(name: str, doc_id: str, request: Request):
    records = await _call(_index(request).get, name, [doc_id], False)
    if not records:
        raise ApiError(404, f"no document with id {doc_id!r} in {name!r}", "NotFound")
    return NumpyJSONResponse(_fields(records[0], ["text", "metadata"]))


@router.post("/collections/{name}/documents/delete", response_model=schemas.DeleteDocumentsResponse)
async def delete_documents(name: str, req: schemas.DeleteRequest, request: Request):
    """Delete by ids, or every document matching a filter."""
    result = await _call(_index(request).delete, name, ids=req.ids, filter=req.filter)
    _count(request, name, result.total)
    return NumpyJSONResponse({"deleted": result.count, "total": result.total, "sequence": result.sequence})


@router.delete("/collections/{name}/documents/{doc_id}", response_model=schemas.DeleteDocumentsResponse)
async def delete_document(name: str, doc_id: str, request: Request):
    result = await _call(_index(request).delete, name, ids=[doc_id])
    if not result.count:
        raise ApiError(404, f"no document with id {doc_id!r} in {name!r}", "NotFound")
    _count(request, name, result.total)
    return NumpyJSONResponse({"deleted": 1, "total": result.total, "sequence": result.sequence})


@router.post("/collections/{name}/search", response_model=schemas.SearchResponse)
async def search(name: str, req: schemas.SearchRequest, request: Request):
    """The k nearest documents to each query by cosine similarity (or by BM25, by sparse vectors, or fused:
    `mode`), among those passing `filter`."""
    limit = settings(request).max_search_k
    if req.k > limit:
        raise ApiError(422, f"k={req.k} exceeds the limit of {limit}", "Validation", param="k")
    texts, sparse = None, None
    if req.vector is not None:
        given = req.vector if isinstance(req.vector[0], list) else [req.vector]
        queries = await _vectors(request, name, [None] * len(given), given, "vector")
    elif req.mode == "lexical":  # nothing to embed: the index ranks the stored texts by the query's words
        check_batch(request, len(req.queries), "query")
        queries, texts = None, req.queries
    elif req.mode == "dense":
        queries = await _vectors(request, name, req.queries, [None] * len(req.queries), "query")
    else:  # sparse, hybrid: the query's sparse vector where the collection keeps them (else the index refuses)
        check_batch(request, len(req.queries), "query")
        info = await _call(_index(request).info, name)
        embedded = None
        if info.sparse_model is not None:
            embedded = sparse_vectors(sparse_embedder(request, name, info), req.queries)
        if req.mode == "sparse":
            queries = None
            found = await embedded if embedded is not None else None
        else:
            texts = req.queries
            dense = _vectors(request, name, req.queries, [None] * len(req.queries), "query", info)
            queries, found = await asyncio.gather(dense, embedded) if embedded is not None else (await dense, None)
        if found is not None:
            sparse = [(indices.tolist(), values.tolist()) for indices, values in found]
    fusion = req.fusion or schemas.Fusion()
    params = SearchParams(k=req.k, filter=req.filter, score_threshold=req.score_threshold, ef_search=req.ef_search,
                          nprobe=req.nprobe, oversample=req.oversample, with_text="text" in req.include,
                          with_metadata="metadata" in req.include, with_vector="vector" in req.include,
                          with_chunks=req.chunks,
                          mode=req.mode, texts=texts, sparse_queries=sparse, rrf_k=fusion.k,
                          dense_weight=fusion.dense_weight, lexical_weight=fusion.lexical_weight,
                          sparse_weight=fusion.sparse_weight, candidates=fusion.candidates)
    hits = await _call(_index(request).search, name, queries, params)
    return NumpyJSONResponse({"results": [[_fields(h, req.include) for h in row] for row in hits]})


def _count(request: Request, name: str, total: int) -> None:
    request.app.state.metrics.index_documents.labels(collection=name).set(total)


def count_documents(metrics, index) -> None:
    """Every collection's document count into `metrics` (an API process starting: the index may hold some)."""
    for info in index.list_collections():
        metrics.index_documents.labels(collection=info.name).set(info.count)


# --- the default collection, under the first routes' names (existing clients keep working) --------

@router.post("/index/documents", response_model=schemas.AddDocumentsResponse)
async def add_documents(req: schemas.AddDocumentsRequest, request: Request):
    """Embed and index documents in the default collection; an id already there is replaced."""
    return await upsert(default_collection(request), req, request)


@router.delete("/index/documents/{doc_id}", response_model=schemas.DeleteDocumentsResponse)
async def delete_default_document(doc_id: str, request: Request):
    return await delete_document(default_collection(request), doc_id, request)


@router.delete("/index", response_model=schemas.DeleteDocumentsResponse)
async def clear_index(request: Request, confirm: bool = False):
    """Remove every document of the default collection (?confirm=true)."""
    _confirmed(confirm, "DELETE /index removes every document")
    result = await _call(_index(request).clear, default_collection(request))
    _count(request, DEFAULT_COLLECTION, 0)
    return NumpyJSONResponse({"deleted": result.count, "total": 0, "sequence": result.sequence})


@router.post("/search", response_model=schemas.SearchResponse)
async def search_default(req: schemas.SearchRequest, request: Request):
    """Search the default collection (the same body as /collections/{name}/search; modes lexical and hybrid when
    the service runs with SEMBED_INDEX_LEXICAL=true)."""
    name = default_collection(request)
    if req.mode in ("lexical", "hybrid") and not settings(request).index_lexical:
        raise ApiError(422, f"the default collection keeps no lexical index, so mode {req.mode!r} cannot search it: "
                            "start the service with SEMBED_INDEX_LEXICAL=true, or search with mode 'dense' (or a "
                            "collection created with \"lexical\": true)", "Validation", param="mode")
    if req.mode == "sparse":
        raise ApiError(422, "the default collection keeps no sparse vectors, so mode 'sparse' cannot search it: "
                            "create a collection with \"sparse_model\": <a served sparse model>, or search with "
                            "mode 'dense'", "Validation", param="mode")
    return await search(name, req, request)
