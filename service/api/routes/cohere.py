"""Cohere's API, shape for shape as the cohere SDK (ClientV2, Client) sends and reads it: POST /v2/embed and
/v1/embed, /v2/rerank and /v1/rerank (the shape Jina's API and many RAG frameworks' rerankers post too),
with Cohere's error body `{"message": ...}` (the router's tag picks it: service/api/errors.py).

- `input_type` puts the model's prompt for it before each text (`INPUT_TYPE_PROMPTS`: search_query a query
  prompt, search_document a document or passage prompt, classification and clustering theirs); where the
  model has no prompt for it, the texts are embedded as they are (no prompt, not the default one: a default
  query prompt must not land on documents); unset, the model's default prompt applies, as on /embed.
- `embedding_types`: float, int8, uint8, binary, ubinary (service/api/output_types.py), and base64 (the float
  vector's little-endian float32 bytes), each its own key of `embeddings`.
- `output_dimension`: the first n dimensions, renormalised; `truncate`: NONE refuses an over-long text,
  START and END cut at that side.
- rerank scores as /rerank does (a cross-encoder's sigmoid, or an embedding model's cosine), best first.
"""

from __future__ import annotations

import time

import numpy as np
from fastapi import APIRouter, Request

from service.api import output_types, schemas
from service.api.errors import COHERE_TAG, ApiError
from service.api.output_types import base64_rows
from service.api.registry import ServedModel
from service.api.routes.common import NumpyJSONResponse, matryoshka, model, registry, settings, timing_headers
from service.api.routes.tei import embed_texts, rerank_scores
from service.ipc.messages import EmbedResult, InputTooLong

router = APIRouter(tags=[COHERE_TAG])

#: Cohere's input types → the model's prompt names that serve them, tried in order (case ignored): Cohere's own
#: names (nomic-embed's prompts), then sentence-transformers' usual ones (e5's query / passage, EmbeddingGemma's)
INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query", "retrieval-query", "retrieval.query"),
    "search_document": ("search_document", "document", "passage", "retrieval-document", "retrieval.passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def prompt_for(served: ServedModel, input_type: str | None) -> tuple[str | None, str | None]:
    """(prompt_name, instruction) for ServedModel.embed: the model's prompt for `input_type`, "" (no prompt) where
    it has none, or (None, None) without an input type (the model's default prompt)."""
    if input_type is None:
        return None, None
    prompts = {name.lower(): name for name in served.info.manifest.get("prompts") or {}}
    name = next((prompts[c] for c in INPUT_TYPE_PROMPTS[input_type] if c in prompts), None)
    return (name, None) if name is not None else (None, "")


def _meta(version: str, tokens: int) -> dict:
    return {"api_version": {"version": version}, "billed_units": {"input_tokens": tokens}}


async def _embeddings(req: schemas.CohereEmbedRequest,
                      request: Request) -> tuple[dict[str, object], list[str], EmbedResult]:
    """Each asked type's rows, by type; the texts; the engine's result (tokens, timings)."""
    if req.images or req.inputs or req.input_type == "image":
        field = "images" if req.images else "inputs" if req.inputs else "input_type"
        raise ApiError(422, f"{field}: this service embeds text only: send `texts`", "Validation", param=field)
    if not req.texts:
        raise ApiError(422, "texts: give the texts to embed (one or more)", "Validation", param="texts")
    served = model(request, req.model)
    info = served.info
    if req.max_tokens is not None and req.max_tokens < info.max_seq_length:
        raise ApiError(422, f"max_tokens={req.max_tokens}: the model embeds up to its own {info.max_seq_length} "
                            "tokens; a lower limit is not served (leave max_tokens unset)", "Validation",
                       param="max_tokens")
    if req.output_dimension is not None and info.gives_embeddings and req.output_dimension > info.dimension:
        raise ApiError(422, f"output_dimension={req.output_dimension} exceeds the model's {info.dimension}",
                       "Validation", param="output_dimension")
    types = list(dict.fromkeys(req.embedding_types or ["float"]))
    for kind in types:
        if kind != "base64":
            output_types.require(kind, info, req.output_dimension, param="embedding_types")
    prompt_name, instruction = prompt_for(served, req.input_type)
    try:
        result = await embed_texts(request, req.texts, "texts", truncate=req.truncate != "NONE",
                                   direction="Left" if req.truncate == "START" else "Right", prompt_name=prompt_name,
                                   instruction=instruction, model_name=req.model)
    except InputTooLong as e:  # in Cohere's words: its truncate field, not ours
        raise ApiError(422, str(e).replace("send truncate=true to cut it", "send truncate END or START to cut it"),
                       "Validation", param="truncate") from None
    vectors = matryoshka(result.vectors, req.output_dimension, normalize=True)
    embeddings: dict[str, object] = {
        kind: base64_rows(vectors) if kind == "base64" else output_types.convert(vectors, kind, info.manifest)
        for kind in types}
    return embeddings, req.texts, result


@router.post("/v2/embed")
async def embed_v2(req: schemas.CohereEmbedRequest, request: Request):
    """Cohere's v2 embed: `{"id", "embeddings": {type: rows}, "texts", "meta"}`."""
    start = time.perf_counter()
    embeddings, texts, result = await _embeddings(req, request)
    body = {"id": request.state.request_id, "embeddings": embeddings, "texts": texts,
            "meta": _meta("2", result.prompt_tokens), "response_type": "embeddings_by_type"}
    return NumpyJSONResponse(body, headers=timing_headers(result, time.perf_counter() - start))


@router.post("/v1/embed")
async def embed_v1(req: schemas.CohereEmbedRequest, request: Request):
    """Cohere's v1 embed: float rows as `embeddings` (response_type embeddings_floats), or by type as v2 when
    `embedding_types` is given (embeddings_by_type)."""
    start = time.perf_counter()
    embeddings, texts, result = await _embeddings(req, request)
    by_type = req.embedding_types is not None
    body = {"id": request.state.request_id, "embeddings": embeddings if by_type else embeddings["float"],
            "texts": texts, "meta": _meta("1", result.prompt_tokens),
            "response_type": "embeddings_by_type" if by_type else "embeddings_floats"}
    return NumpyJSONResponse(body, headers=timing_headers(result, time.perf_counter() - start))


async def _rerank(req: schemas.CohereRerankRequest, request: Request, version: str):
    texts = req.texts
    served = model(request, req.model)
    scores, result = await rerank_scores(served, req.query, texts, settings(request).max_client_batch_size)
    order = np.argsort(-scores, kind="stable")[:req.top_n]
    results = [{"index": int(i), "relevance_score": float(scores[i]),
                **({"document": {"text": texts[i]}} if req.return_documents else {})} for i in order]
    body = {"id": request.state.request_id, "results": results, "meta": _meta(version, result.prompt_tokens),
            # Jina's answer carries these two as well: its clients read them
            "model": registry(request).name_of(served), "usage": {"total_tokens": result.prompt_tokens}}
    return NumpyJSONResponse(body, headers=timing_headers(result))


@router.post("/v2/rerank")
async def rerank_v2(req: schemas.CohereRerankRequest, request: Request):
    """Cohere's v2 rerank: `{"id", "results": [{"index", "relevance_score"}], "meta"}`, best first, `top_n` of them;
    `return_documents` (Cohere's v1 field, still taken) adds each `document`."""
    return await _rerank(req, request, "2")


@router.post("/v1/rerank")
async def rerank_v1(req: schemas.CohereRerankRequest, request: Request):
    """Cohere's (and Jina's) v1 rerank: documents as strings or {"text": ...}; `return_documents` adds each."""
    return await _rerank(req, request, "1")
