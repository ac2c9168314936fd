"""The text-embeddings-inference API, shape for shape: /embed, /similarity, /rerank, /tokenize, and
POST / (huggingface_hub's InferenceClient posts both of its tasks to the bare URL)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from service.api import chunking as chunks
from service.api import output_types, schemas
from service.api.errors import ApiError
from service.api.registry import ServedModel
from service.api.routes.common import (
    NumpyJSONResponse,
    check_batch,
    check_count,
    matryoshka,
    model,
    read_json,
    settings,
    timing_headers,
)
from service.ipc.messages import EmbedResult

router = APIRouter(tags=["embeddings"])


# The routes' work, on a served model: TEI's gRPC service (service/api/grpc/) calls these functions too.


async def embed_with(served: ServedModel, texts: list[str], field: str, max_batch: int, *, normalize: bool = True,
                     truncate: bool | None = None, direction: str = "Right", prompt_name: str | None = None,
                     instruction: str | None = None) -> EmbedResult:
    check_count(len(texts), max_batch, field)
    empty = next((i for i, text in enumerate(texts) if not text), None)
    if empty is not None:  # as TEI answers: 422, the input named
        raise ApiError(422, f"{field}[{empty}] is empty: every input needs text", "Validation", param=field)
    return await served.embed(texts, normalize=normalize, truncate=truncate, truncation_direction=direction.lower(),
                              prompt_name=prompt_name, instruction=instruction)


async def embed_vectors(served: ServedModel, texts: list[str], max_batch: int, *, dimensions: int | None = None,
                        normalize: bool = True, **options) -> tuple[np.ndarray, EmbedResult]:
    """/embed's answer: one vector per text, cut to `dimensions` (Matryoshka) when asked."""
    if dimensions is not None and dimensions < 1:  # the JSON schema refuses it first; gRPC's uint32 may be 0
        raise ApiError(422, f"dimensions={dimensions}: at least 1", "Validation", param="dimensions")
    result = await embed_with(served, texts, "inputs", max_batch, normalize=normalize, **options)
    return matryoshka(result.vectors, dimensions, normalize), result


async def embed_texts(request: Request, texts: list[str], field: str, *, model_name: str | None = None, **options):
    return await embed_with(model(request, model_name), texts, field, settings(request).max_client_batch_size,
                            **options)


@router.post("/embed", response_model=list[list[float]] | list[list[schemas.ChunkEmbedding]])
async def embed(req: schemas.EmbedRequest, request: Request):
    """Embed one text or a batch: one vector per input, in order (TEI's bare 2-D array); with `chunking`, per
    input a list of its chunks' {start, end, embedding}."""
    start = time.perf_counter()
    served = model(request, req.model)
    if req.embedding_type != "float":  # refused before any compute where the model cannot give it
        output_types.require(req.embedding_type, served.info, req.dimensions, req.normalize)
    if req.chunking not in (None, False):
        return await _embed_chunks(req, request, served, start)
    vectors, result = await embed_vectors(served, req.texts,
                                          settings(request).max_client_batch_size, dimensions=req.dimensions,
                                          normalize=req.normalize, truncate=req.truncate,
                                          direction=req.truncation_direction, prompt_name=req.prompt_name,
                                          instruction=req.instruction)
    vectors = output_types.convert(vectors, req.embedding_type, served.info.manifest)
    return NumpyJSONResponse(vectors, headers=timing_headers(result, time.perf_counter() - start))


async def _embed_chunks(req: schemas.EmbedRequest, request: Request, served: ServedModel, start: float):
    """/embed with `chunking` (ours): per input, a list of {start, end, embedding}, one per chunk of it (one
    spanning it all where it fits the window)."""
    config = settings(request)
    texts = req.texts
    check_count(len(texts), config.max_client_batch_size, "inputs")
    empty = next((i for i, text in enumerate(texts) if not text), None)
    if empty is not None:
        raise ApiError(422, f"inputs[{empty}] is empty: every input needs text", "Validation", param="inputs")
    spans, pieces = await chunks.cut(served, texts, req.chunking, config, "inputs", req.prompt_name, req.instruction)
    vectors, result = await embed_vectors(served, pieces, config.max_request_chunks, dimensions=req.dimensions,
                                          normalize=req.normalize, truncate=req.truncate,
                                          direction=req.truncation_direction, prompt_name=req.prompt_name,
                                          instruction=req.instruction)
    vectors = output_types.convert(vectors, req.embedding_type, served.info.manifest)
    out, row = [], 0
    for found in spans:
        out.append([{"start": a, "end": b, "embedding": vectors[row + j]} for j, (a, b) in enumerate(found)])
        row += len(found)
    return NumpyJSONResponse(out, headers=timing_headers(result, time.perf_counter() - start))


@router.post("/similarity", response_model=list[float])
async def similarity(req: schemas.SimilarityRequest, request: Request):
    """Cosine similarity between inputs.source_sentence and each of inputs.sentences, in order."""
    texts = [req.inputs.source_sentence, *req.inputs.sentences]
    result = await embed_texts(request, texts, "sentences", truncate=req.truncate, direction=req.truncation_direction,
                               prompt_name=req.prompt_name, instruction=req.instruction, model_name=req.model)
    return NumpyJSONResponse(result.vectors[1:] @ result.vectors[0], headers=timing_headers(result))


#: what turns a cross-encoder's logit into its score, as the model's CrossEncoder.predict does (the manifest names it)
SCORE_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),  # the sigmoid, without exp's overflow
    "Identity": lambda x: x, "Tanh": np.tanh}


async def rerank_scores(served: ServedModel, query: str, texts: list[str], max_batch: int, *,
                        truncate: bool | None = None, direction: str = "Right",
                        raw_scores: bool = False) -> tuple[np.ndarray, EmbedResult]:
    """Each text's score against the query, in input order. A cross-encoder export scores each (query, text)
    pair itself (its logit through the activation the model names, a sigmoid by default, or the logit with
    raw_scores, as TEI); an embedding export scores by cosine similarity to the query. Another kind is refused
    as TEI refuses it (424, "model is not a re-ranker model")"""
    if not served.info.gives_embeddings:
        check_count(len(texts), max_batch, "texts")
        result = await served.rerank(query, texts, truncate=truncate, truncation_direction=direction.lower())
        scores = result.vectors[:, 0]
        if not raw_scores:
            scores = SCORE_ACTIVATIONS[served.info.manifest.get("score_activation", "Sigmoid")](scores)
    else:
        result = await embed_with(served, [query, *texts], "texts", max_batch, truncate=truncate,
                                  direction=direction)
        scores = result.vectors[1:] @ result.vectors[0]
    return scores, result


@router.post("/rerank", response_model=list[schemas.RerankHit])
async def rerank(req: schemas.RerankRequest, request: Request):
    """The texts ranked best first, each with its input index (scored as `rerank_scores` says)."""
    scores, result = await rerank_scores(model(request, req.model), req.query, req.texts,
                                         settings(request).max_client_batch_size, truncate=req.truncate,
                                         direction=req.truncation_direction, raw_scores=req.raw_scores)
    order = np.argsort(-scores, kind="stable")
    hits = [{"index": int(i), "score": float(scores[i]), **({"text": req.texts[i]} if req.return_text else {})}
            for i in order]
    return NumpyJSONResponse(hits, headers=timing_headers(result))


@router.post("/predict", response_model=list[schemas.Prediction] | list[list[schemas.Prediction]])
async def classify(req: schemas.PredictRequest, request: Request):
    """A sequence classifier's labels for each text or pair, best first, as TEI answers: the softmax of the
    logits over the labels (a sigmoid each for a multi-label model), or the logits with raw_scores. One input
    gets one list, a batch a list per input."""
    answers, result = await predictions(model(request, req.model), req.sequences,
                                        settings(request).max_client_batch_size, truncate=req.truncate,
                                        direction=req.truncation_direction, raw_scores=req.raw_scores)
    return NumpyJSONResponse(answers if req.batched else answers[0], headers=timing_headers(result))


async def predictions(served: ServedModel, sequences: list[str | tuple[str, str]], max_batch: int, *,
                      truncate: bool | None = None, direction: str = "Right",
                      raw_scores: bool = False) -> tuple[list[list[dict]], EmbedResult]:
    """/predict's labels for each text or pair, best first: {"score", "label"} each. A reranker answers too, as
    TEI's does: its one label, its score through the activation /rerank applies (a sigmoid by default)."""
    check_count(len(sequences), max_batch, "inputs")
    result = await served.classify(sequences, truncate=truncate, truncation_direction=direction.lower())
    scores = result.vectors.astype(np.float64)
    if not raw_scores and served.info.is_cross_encoder:
        scores = SCORE_ACTIVATIONS[served.info.manifest.get("score_activation", "Sigmoid")](scores)
    elif not raw_scores and served.info.manifest.get("multi_label"):
        scores = SCORE_ACTIVATIONS["Sigmoid"](scores)
    elif not raw_scores:
        scores = np.exp(scores - scores.max(axis=1, keepdims=True))
        scores /= scores.sum(axis=1, keepdims=True)
    labels = served.info.manifest.get("id2label") or {}
    answers = [[{"score": float(row[j]), "label": labels.get(str(j), f"LABEL_{j}")}
                for j in np.argsort(-row, kind="stable")] for row in scores]
    return answers, result


@router.post("/tokenize", response_model=list[list[schemas.Token]])
async def tokenize(req: schemas.TokenizeRequest, request: Request):
    """The model's tokens for each input after its prompt, as /embed tokenises it, with character spans into
    the prompted text (special tokens have none)."""
    check_batch(request, len(req.texts), "inputs")
    served = model(request, req.model)
    return NumpyJSONResponse(await run_in_threadpool(served.token_details, req.texts, req.add_special_tokens,
                                                     req.prompt_name, req.instruction))


@router.post("/decode", response_model=list[str])
async def decode(req: schemas.DecodeRequest, request: Request):
    """The model's token ids back to text, one string per sequence (TEI's /decode)."""
    sequences = req.sequences
    check_batch(request, len(sequences), "ids")
    served = model(request, req.model)
    return NumpyJSONResponse(await run_in_threadpool(served.decode, sequences, req.skip_special_tokens))


@router.post("/embed_sparse", response_model=list[list[schemas.SparseValue]])
async def embed_sparse(req: schemas.EmbedSparseRequest, request: Request):
    """A sparse (SPLADE) model's vector of each text: its non-zero dimensions as {index, value}, indices ascending
    (TEI's /embed_sparse), at most the model's max_active_dims. Another kind of model answers 424, as TEI's."""
    start = time.perf_counter()
    check_batch(request, len(req.texts), "inputs")
    vectors, result = await model(request, req.model).embed_sparse(
        req.texts, truncate=req.truncate, truncation_direction=req.truncation_direction.lower(),
        prompt_name=req.prompt_name)
    answer = [[{"index": i, "value": v} for i, v in zip(row.indices.tolist(), row.values)] for row in vectors]
    return NumpyJSONResponse(answer, headers=timing_headers(result, time.perf_counter() - start))


@router.post("/embed_all", response_model=list[list[list[float]]])
async def embed_all(req: schemas.EmbedAllRequest, request: Request):
    """Every token's embedding of each text, special tokens included: the transformer's last hidden state, neither
    pooled nor normalised (TEI's /embed_all). A model without token output answers 424 saying why."""
    start = time.perf_counter()
    check_batch(request, len(req.texts), "inputs")
    states, result = await model(request, req.model).embed_all(
        req.texts, truncate=req.truncate, truncation_direction=req.truncation_direction.lower(),
        prompt_name=req.prompt_name)
    return NumpyJSONResponse(states, headers=timing_headers(result, time.perf_counter() - start))


@router.post("/", summary="The model's task: embed or compare (by the body's shape), classify, rerank, embed sparse",
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                 "anyOf": [{"$ref": "#/components/schemas/EmbedRequest"},
                           {"$ref": "#/components/schemas/SimilarityRequest"},
                           {"$ref": "#/components/schemas/PredictRequest"},
                           {"$ref": "#/components/schemas/RerankRequest"},
                           {"$ref": "#/components/schemas/EmbedSparseRequest"}]}}}}})
async def predict(request: Request):
    """As TEI's bare route, the task of the model (the body's `model`, else the default): a classifier's is
    /predict, a reranker's /rerank, a sparse (SPLADE) model's /embed_sparse; an embedding model's
    `{"inputs": str | [str]}` embeds (as /embed) and `{"inputs": {"source_sentence", "sentences"}}` compares (as
    /similarity). This is where huggingface_hub's InferenceClient sends its tasks (feature_extraction,
    sentence_similarity, text_classification)."""
    body = read_json(await request.body())
    inputs = body.get("inputs") if isinstance(body, dict) else None
    name = body.get("model") if isinstance(body, dict) else None
    info = model(request, name if isinstance(name, str) else None).info
    try:
        if info.is_classifier:
            return await classify(schemas.PredictRequest.model_validate(body), request)
        if info.is_cross_encoder:
            return await rerank(schemas.RerankRequest.model_validate(body), request)
        if info.is_sparse:
            return await embed_sparse(schemas.EmbedSparseRequest.model_validate(body), request)
        if isinstance(inputs, dict):
            return await similarity(schemas.SimilarityRequest.model_validate(body), request)
        return await embed(schemas.EmbedRequest.model_validate(body), request)
    except ValidationError as e:
        raise RequestValidationError(jsonable_encoder(e.errors(include_url=False))) from None
